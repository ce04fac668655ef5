"""Reads of billing that other apps share."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User


def user_tier(*, user: User) -> str:
    """The priority tier of the user's plan.

    Until plans and subscriptions exist (billing issue), every user is on the default plan.
    """
    return str(settings.DEFAULT_TIER)
