from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"

    def ready(self) -> None:
        from chatsite.catalog import catalog_changed

        from .models import Plan, PlanPool, PoolPrice, Subscription

        # Every process keeps plans, their pools, prices and who is on which plan
        # (`chatsite.catalog`): a change to any of them makes every process read them again.
        for model in (Plan, PlanPool, PoolPrice, Subscription):
            for signal in (post_save, post_delete):
                signal.connect(
                    catalog_changed, sender=model, dispatch_uid=f"catalog-{model.__name__}"
                )
