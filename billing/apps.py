from django.apps import AppConfig


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"

    def ready(self) -> None:
        from chatsite.catalog import catalog_rows

        from .models import Plan, PlanPool, PoolPrice, Subscription

        # Every process keeps plans, their pools, prices and who is on which plan.
        catalog_rows(Plan, PlanPool, PoolPrice, Subscription)
