"""The JSON API, version 1: each app's `api` package contributes its routes."""

from django.urls import include, path

# The generations' routes (a stream's) first: see chatsite/urls.py.
urlpatterns = [
    path("", include("inference.api.urls")),
    path("", include("accounts.api.urls")),
    path("", include("conversations.api.urls")),
    path("", include("billing.api.urls")),
    path("", include("plugins.api.urls")),
]
