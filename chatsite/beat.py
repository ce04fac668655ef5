"""The periodic schedule: defaults in settings, the live schedule in the database.

django-celery-beat's `DatabaseScheduler` writes every `CELERY_BEAT_SCHEDULE` entry over its
database row at each start (`update_or_create`), so a schedule staff changed in admin would
silently come back at the next deploy. This scheduler only adds the rows that are missing:
defaults seed a fresh database, and after that the admin ("Periodic tasks") is the truth.
To stop a default task, disable it there; a deleted row comes back at the next start.
"""

from __future__ import annotations

from typing import Any

from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry


class SeedOnceEntry(ModelEntry):
    """A schedule entry that creates its row from the defaults only if it does not exist."""

    @classmethod
    def from_entry(cls, name: str, app: Any = None, **entry: Any) -> SeedOnceEntry:
        task = PeriodicTask._default_manager.filter(name=name).first()
        if task is None:
            task, _ = PeriodicTask._default_manager.get_or_create(
                name=name, defaults=cls._unpack_fields(**entry)
            )
        return cls(task, app=app)


class SeedOnceDatabaseScheduler(DatabaseScheduler):
    """`DatabaseScheduler` whose defaults never overwrite what staff edited."""

    Entry = SeedOnceEntry
