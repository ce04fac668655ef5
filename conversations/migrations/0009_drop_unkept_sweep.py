"""The `/v1` sweeper of unkept conversations is gone (such answers write no conversation any
more): its periodic task row goes too, or beat would send a task nobody runs."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def drop_sweep(apps: Any, schema_editor: Any) -> None:
    periodic_task = apps.get_model("django_celery_beat", "PeriodicTask")
    periodic_task.objects.filter(
        task="conversations.openai_api.tasks.sweep_unkept_conversations"
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0008_attachments"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(drop_sweep, migrations.RunPython.noop)]
