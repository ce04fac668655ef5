"""The review queue in admin: staff actions, their audit log, and the strikes policy."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from moderation import selectors, services
from moderation.engine import Verdict
from moderation.models import AuditEntry, Flag, Sanction

pytestmark = pytest.mark.django_db

VERDICT = Verdict(scores={"S1": 0.95}, blocked=["S1"], review=[], backends=["local"])


def make_flag(user: User, text: str = "a bad text") -> Flag:
    return services.flag_record(
        user=user,
        conversation=None,
        message=None,
        direction=Flag.Direction.INPUT,
        excerpt=text,
        verdict=VERDICT,
        action=Flag.Action.BLOCKED,
    )


@pytest.fixture
def admin_client(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def act(client: Client, action: str, *objects: Any, model: str = "flag") -> None:
    response = client.post(
        f"/admin/moderation/{model}/",
        {"action": action, "_selected_action": [str(o.pk) for o in objects]},
    )
    assert response.status_code == 302, response.content[:500]


def test_the_review_queue_lists_flags_with_their_context(admin_client: Client, user: User) -> None:
    make_flag(user, "the flagged words")
    response = admin_client.get("/admin/moderation/flag/?status__exact=open")
    assert response.status_code == 200
    assert b"the flagged words" in response.content and b"S1" in response.content


def test_staff_actions_are_audited(admin_client: Client, user: User, staff: User) -> None:
    dismissed, warned, suspended, banned = (make_flag(user) for _ in range(4))

    act(admin_client, "dismiss", dismissed)
    act(admin_client, "warn", warned)
    before = timezone.now()
    act(admin_client, "suspend_168h", suspended)
    after = timezone.now()
    sanction = selectors.sanction_in_force(user_id=user.pk)
    assert sanction is not None and sanction.kind == Sanction.Kind.SUSPENSION
    assert sanction.ends_at is not None
    # A week from the moment it was given, however long the request took.
    assert before + timedelta(hours=168) <= sanction.ends_at <= after + timedelta(hours=168)
    act(admin_client, "lift", sanction, model="sanction")
    assert selectors.sanction_in_force(user_id=user.pk) is None
    act(admin_client, "ban", banned)
    assert selectors.sanction_in_force(user_id=user.pk).kind == Sanction.Kind.BAN  # type: ignore[union-attr]

    dismissed.refresh_from_db()
    assert dismissed.status == Flag.Status.DISMISSED and dismissed.reviewer == staff
    actions = list(
        AuditEntry.objects.filter(actor=staff)
        .order_by("created_at", "id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "flag_dismissed",
        "flag_confirmed",
        "user_warned",
        "flag_confirmed",
        "user_suspended",
        "sanction_lifted",
        "flag_confirmed",
        "user_banned",
    ]
    assert set(AuditEntry.objects.values_list("target_user", flat=True)) == {user.pk}
    assert Sanction.objects.filter(user=user, kind=Sanction.Kind.WARNING).count() == 1


def test_the_audit_log_is_read_only(admin_client: Client, user: User, staff: User) -> None:
    flag = make_flag(user)
    services.flag_dismiss(flag=flag, reviewer=staff)
    entry = AuditEntry.objects.get()
    assert admin_client.get("/admin/moderation/auditentry/").status_code == 200
    assert admin_client.get("/admin/moderation/auditentry/add/").status_code == 403
    assert admin_client.post(f"/admin/moderation/auditentry/{entry.pk}/delete/").status_code == 403
    page = admin_client.get(f"/admin/moderation/auditentry/{entry.pk}/change/")
    assert page.status_code == 200 and b'name="action"' not in page.content


def test_strikes_suspend_automatically_as_the_system(
    user: User, staff: User, settings: Any
) -> None:
    settings.MODERATION_STRIKES_COUNT = 3
    settings.MODERATION_STRIKES_SUSPEND_HOURS = 48
    flags = [make_flag(user) for _ in range(4)]
    services.flag_dismiss(flag=flags[0], reviewer=staff)  # dismissed: no strike
    services.flag_confirm(flag=flags[1], reviewer=staff)
    services.flag_confirm(flag=flags[2], reviewer=staff)
    assert selectors.sanction_in_force(user_id=user.pk) is None

    before = timezone.now()
    services.flag_confirm(flag=flags[3], reviewer=staff)
    after = timezone.now()

    sanction = selectors.sanction_in_force(user_id=user.pk)
    assert sanction is not None and sanction.created_by is None
    assert sanction.ends_at is not None
    assert before + timedelta(hours=48) <= sanction.ends_at <= after + timedelta(hours=48)
    entry = AuditEntry.objects.get(action=AuditEntry.Action.USER_SUSPENDED)
    assert entry.actor is None and entry.target_user == user and entry.sanction == sanction
    # The slate is wiped: one more confirmed flag after the suspension is not a fourth strike.
    services.sanction_lift(sanction=sanction, by=staff)
    services.flag_confirm(flag=make_flag(user), reviewer=staff)
    assert selectors.sanction_in_force(user_id=user.pk) is None


def test_old_strikes_fall_out_of_the_window(user: User, staff: User, settings: Any) -> None:
    settings.MODERATION_STRIKES_COUNT = 2
    settings.MODERATION_STRIKES_WINDOW_DAYS = 30
    old = make_flag(user)
    services.flag_confirm(flag=old, reviewer=staff)
    Flag.objects.filter(pk=old.pk).update(reviewed_at=timezone.now() - timedelta(days=31))
    services.flag_confirm(flag=make_flag(user), reviewer=staff)
    assert selectors.sanction_in_force(user_id=user.pk) is None
