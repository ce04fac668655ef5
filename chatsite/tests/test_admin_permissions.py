"""Every admin action that writes is held to a permission: staff who may only view a model are
not offered its actions, and a POST forged past the page changes nothing; staff granted the
action's permission run it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import Model
from django.test import Client

from accounts.models import ApiKey
from accounts.services import api_key_create
from accounts.tests.factories import UserFactory
from billing import services as billing
from billing.models import Invoice, Statement
from billing.tests.factories import subscribe
from inference.models import ModelPool, Worker
from moderation import services as moderation
from moderation.engine import Verdict
from moderation.models import Flag, Sanction
from plugins.models import McpServer

pytestmark = pytest.mark.django_db

MARCH = date(2026, 3, 1)


@dataclass(frozen=True)
class AdminAction:
    """One action of a changelist: who may see the page, who may run it, and its effect."""

    changelist: str
    action: str
    view: str
    run: str
    make: Callable[[], Model]
    done: Callable[[Model], bool]

    def __str__(self) -> str:
        return self.action


def _api_key() -> ApiKey:
    key, _ = api_key_create(user=UserFactory.create(), name="someone else's key")
    return key


def _statement() -> Statement:
    user = UserFactory.create()
    subscribe(user, monthly_price_micros=1_000_000)
    return billing.statement_close(user=user, period_start=MARCH)


def _open_invoice() -> Invoice:
    return billing.invoice_issue(statement=_statement())


def _worker(state: str) -> Callable[[], Worker]:
    def make() -> Worker:
        pool, _ = ModelPool.objects.get_or_create(name="admin-pool", served_model="admin-pool")
        return Worker.objects.create(pool=pool, name="w", url="http://127.0.0.1:9", state=state)

    return make


def _mcp_server() -> McpServer:
    # Nothing listens there: a refresh that runs records its failure in `last_error`.
    return McpServer.objects.create(slug="tools", name="Tools", url="http://127.0.0.1:9/mcp")


def _flag() -> Flag:
    return moderation.flag_record(
        user=UserFactory.create(),
        conversation=None,
        message=None,
        direction=Flag.Direction.INPUT,
        excerpt="a bad text",
        verdict=Verdict(scores={"S1": 0.95}, blocked=["S1"], review=[], backends=["local"]),
        action=Flag.Action.BLOCKED,
    )


def _suspension() -> Sanction:
    return moderation.user_suspend(user=UserFactory.create(), by=None, hours=24)


def _reloaded(row: Model) -> Any:
    return type(row)._default_manager.get(pk=row.pk)


ACTIONS = [
    AdminAction(
        "/admin/accounts/apikey/",
        "revoke",
        view="accounts.view_apikey",
        run="accounts.change_apikey",
        make=_api_key,
        done=lambda key: _reloaded(key).revoked_at is not None,
    ),
    AdminAction(
        "/admin/billing/statement/",
        "issue_invoices",
        view="billing.view_statement",
        run="billing.add_invoice",
        make=_statement,
        done=lambda statement: Invoice.objects.filter(statement_id=statement.pk).exists(),
    ),
    AdminAction(
        "/admin/billing/invoice/",
        "mark_paid",
        view="billing.view_invoice",
        run="billing.change_invoice",
        make=_open_invoice,
        done=lambda invoice: _reloaded(invoice).status == Invoice.Status.PAID,
    ),
    AdminAction(
        "/admin/inference/worker/",
        "drain",
        view="inference.view_worker",
        run="inference.change_worker",
        make=_worker(Worker.State.HEALTHY),
        done=lambda worker: _reloaded(worker).state == Worker.State.DRAINING,
    ),
    AdminAction(
        "/admin/inference/worker/",
        "undrain",
        view="inference.view_worker",
        run="inference.change_worker",
        make=_worker(Worker.State.DRAINING),
        done=lambda worker: _reloaded(worker).state == Worker.State.DOWN,
    ),
    AdminAction(
        "/admin/moderation/flag/",
        "dismiss",
        view="moderation.view_flag",
        run="moderation.change_flag",
        make=_flag,
        done=lambda flag: _reloaded(flag).status == Flag.Status.DISMISSED,
    ),
    AdminAction(
        "/admin/moderation/sanction/",
        "lift",
        view="moderation.view_sanction",
        run="moderation.change_sanction",
        make=_suspension,
        done=lambda sanction: _reloaded(sanction).lifted_at is not None,
    ),
    AdminAction(
        "/admin/plugins/mcpserver/",
        "refresh_tools",
        view="plugins.view_mcpserver",
        run="plugins.change_mcpserver",
        make=_mcp_server,
        done=lambda server: _reloaded(server).last_error != "",
    ),
]


def staff_client(*permissions: str) -> Client:
    """A client logged in as a staff user (not a superuser) holding only `permissions`."""
    staff: User = UserFactory.create(is_staff=True)
    for permission in permissions:
        app_label, codename = permission.split(".")
        staff.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    client = Client()
    client.force_login(staff)
    return client


def offered(client: Client, changelist: str) -> set[str]:
    """The actions the changelist's action menu offers."""
    page = client.get(changelist)
    assert page.status_code == 200
    form = page.context["action_form"]
    return {name for name, _ in form.fields["action"].choices} if form else set()


def post_action(client: Client, case: AdminAction, row: Model) -> None:
    client.post(case.changelist, {"action": case.action, "_selected_action": [str(row.pk)]})


@pytest.mark.parametrize("case", ACTIONS, ids=str)
def test_staff_who_may_only_view_are_not_offered_the_action(case: AdminAction) -> None:
    case.make()
    viewer = staff_client(case.view)

    assert case.action not in offered(viewer, case.changelist)


@pytest.mark.parametrize("case", ACTIONS, ids=str)
def test_a_forged_post_of_the_action_by_a_viewer_changes_nothing(case: AdminAction) -> None:
    row = case.make()
    viewer = staff_client(case.view)

    post_action(viewer, case, row)

    assert not case.done(row)


@pytest.mark.parametrize("case", ACTIONS, ids=str)
def test_staff_with_the_actions_permission_run_it(case: AdminAction) -> None:
    row = case.make()
    operator = staff_client(case.view, case.run)

    assert case.action in offered(operator, case.changelist)
    post_action(operator, case, row)

    assert case.done(row)
