"""Fixtures for the project package's tests."""

from conversations.tests.celery_worker import live_celery_worker  # noqa: F401 (a fixture)
