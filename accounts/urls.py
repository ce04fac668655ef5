from django.contrib.auth import views as auth_views
from django.urls import path

from . import views
from .abuse import abuse_limit

app_name = "accounts"

# Django's own log-in view, limited per client IP against password guessing.
login = abuse_limit("login")(
    auth_views.LoginView.as_view(
        template_name="accounts/login.html", redirect_authenticated_user=True
    )
)

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("login/", login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api-keys/", views.api_keys, name="api-keys"),
    path("api-keys/<int:key_id>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("api-keys/<int:key_id>/storage/", views.api_key_storage, name="api-key-storage"),
]
