"""The default free plan every user without a subscription is on, and two paid examples.

Staff edit them in admin; the limits are per user.
"""

from django.db import migrations

PLANS = [
    {
        "slug": "free",
        "name": "Free",
        "tier": "free",
        "monthly_price_micros": 0,
        "requests_per_minute": 20,
        "tokens_per_minute": 40_000,
        "max_concurrent": 2,
        "max_output_tokens": 1024,
        "message_cap": 40,
        "message_cap_window_seconds": 3 * 3600,
        "is_default": True,
    },
    {
        "slug": "plus",
        "name": "Plus",
        "tier": "plus",
        "monthly_price_micros": 20_000_000,
        "requests_per_minute": 60,
        "tokens_per_minute": 200_000,
        "max_concurrent": 4,
        "max_output_tokens": 2048,
        "message_cap": 80,
        "message_cap_window_seconds": 3 * 3600,
        "is_default": False,
    },
    {
        "slug": "pro",
        "name": "Pro",
        "tier": "pro",
        "monthly_price_micros": 200_000_000,
        "requests_per_minute": 300,
        "tokens_per_minute": 1_000_000,
        "max_concurrent": 16,
        "max_output_tokens": 4096,
        "message_cap": None,
        "message_cap_window_seconds": 3 * 3600,
        "is_default": False,
    },
]


def create_plans(apps, schema_editor):
    Plan = apps.get_model("billing", "Plan")
    for plan in PLANS:
        Plan.objects.get_or_create(slug=plan["slug"], defaults=plan)


def remove_plans(apps, schema_editor):
    Plan = apps.get_model("billing", "Plan")
    Plan.objects.filter(slug__in=[plan["slug"] for plan in PLANS], subscriptions=None).delete()


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(create_plans, remove_plans)]
