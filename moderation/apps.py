from django.apps import AppConfig


class ModerationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "moderation"

    def ready(self) -> None:
        from chatsite.catalog import catalog_rows

        from .models import Sanction

        # Whether an account may send is read on every send: kept per process, dropped on
        # any change to a sanction (`selectors.sanction_blocking`).
        catalog_rows(Sanction)
