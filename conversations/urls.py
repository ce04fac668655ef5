from django.urls import path

from . import views

app_name = "conversations"

urlpatterns = [
    path("", views.home, name="home"),
    path("c/<uuid:conversation_id>", views.conversation, name="conversation"),
    path("s/<str:token>", views.shared, name="shared"),
    path("data", views.data, name="data"),
    path("settings/", views.settings_page, name="settings"),
]
