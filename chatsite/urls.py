"""Top-level routes: pages, the JSON API under /api/v1/, its schema, the OpenAI-compatible
API under /v1/, and the admin."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts.abuse import abuse_limit

# The APIs first: Django tries routes in order and keeps the list of those it tried on the
# request, for as long as a stream lasts.
urlpatterns = [
    path("api/v1/", include("chatsite.api.urls")),
    path("v1/", include("conversations.openai_api.urls")),
    # The admin's log-in, ahead of the admin's own route, limited like the site's
    # (accounts.urls): both count against the same per-IP budget of log-in attempts.
    path("admin/login/", abuse_limit("login")(admin.site.login)),
    path("admin/", admin.site.urls),
    path("accounts/", include("accounts.urls")),
    path("billing/", include("billing.urls")),
    path("moderation/", include("moderation.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI's set-up script from its own URL (`?script`), not inline, and the page's CSS
    # from a file: the Content-Security-Policy allows neither inline (chatsite/settings.py).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="api_docs.html"),
        name="api-docs",
    ),
    path("", include("conversations.urls")),
]
