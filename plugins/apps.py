from django.apps import AppConfig


class PluginsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "plugins"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
