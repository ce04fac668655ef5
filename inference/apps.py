from django.apps import AppConfig

from .hooks import get_hooks


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"

    def ready(self) -> None:
        # A wrong dotted path stops every process at start (ImproperlyConfigured), not the
        # first generation that would have needed it.
        get_hooks()
        # Here, not at the top: the scheduler package imports the models, which cannot be
        # imported before the app registry is ready (Django's rule for AppConfig modules).
        from .scheduler.guard import configured_guard
        from .scheduler.placement import configured_policy
        from .scheduler.tools import configured_runner

        configured_policy()
        configured_runner()
        configured_guard()

        from chatsite.catalog import catalog_rows

        from .models import ModelPool, Worker

        # Every process keeps the pools by name; every scheduler replica the fleet.
        catalog_rows(ModelPool, Worker)
