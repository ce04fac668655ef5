from django.apps import AppConfig


class AccountsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "accounts"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model

        from chatsite.catalog import catalog_rows

        from .models import ApiKey
        from .services import CREDENTIALS

        # A key revoked, changed or deleted, a user deactivated or deleted: every process
        # reads the keys afresh.
        catalog_rows(ApiKey, get_user_model(), catalog=CREDENTIALS)
