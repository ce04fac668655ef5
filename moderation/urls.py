from django.urls import path

from . import views

app_name = "moderation"

urlpatterns = [
    path("warnings/<int:sanction_id>/seen/", views.warning_seen, name="warning-seen"),
]
