from django.urls import path

from . import views

urlpatterns = [
    path("api-keys", views.ApiKeyListView.as_view(), name="api-key-list"),
    path("api-keys/<int:key_id>", views.ApiKeyDetailView.as_view(), name="api-key-detail"),
]
