"""Pages of billing."""

from django.urls import path

from . import views

app_name = "billing"

urlpatterns = [
    path("usage/", views.usage, name="usage"),
]
