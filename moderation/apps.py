from django.apps import AppConfig


class ModerationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "moderation"

    def ready(self) -> None:
        from chatsite.catalog import catalog_rows

        from .models import CategoryThreshold, Rule, Sanction

        # Whether an account may send, the thresholds and staff's rules are read on every
        # send: kept per process, dropped on any change to one of them (`selectors`).
        catalog_rows(Sanction, CategoryThreshold, Rule)
