"""The web chat's pages, through Django's test client: who may see them and what they carry."""

from __future__ import annotations

import json
import re
import uuid
from html.parser import HTMLParser
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from billing.models import Plan, PlanPool, Subscription
from chatsite.catalog import catalog_changed
from conversations.removal import conversation_remove
from conversations.services import conversation_create
from inference.models import ModelPool

pytestmark = pytest.mark.django_db

HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


class _Tags(HTMLParser):
    """Every start tag of a page with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(html)
    return parser.tags


def _config(html: str) -> dict[str, Any]:
    match = re.search(r'<script id="chat-config" type="application/json">(.*?)</script>', html)
    assert match, "the page carries its config as JSON"
    config: dict[str, Any] = json.loads(match.group(1))
    return config


def _picker_options(html: str) -> list[str]:
    return [attrs["value"] or "" for tag, attrs in _tags(html) if tag == "option"]


def _assert_no_active_markup(html: str) -> None:
    """Nothing on the page runs but our own module: no inline script, handler or js: URL."""
    for tag, attrs in _tags(html):
        for name, value in attrs.items():
            assert not name.startswith("on"), f"inline handler {name} on <{tag}>"
            assert not (value or "").strip().lower().startswith("javascript:"), (tag, name)
        if tag == "script":
            assert attrs.get("src") or attrs.get("type") == "application/json", attrs
    assert "<img" not in html


@pytest.fixture
def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("path", ["/", f"/c/{uuid.uuid4()}"])
def test_the_chat_pages_require_login(client: Client, path: str) -> None:
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


def test_the_chat_page_renders_the_app_for_a_logged_in_user(logged_in: Client) -> None:
    response = logged_in.get("/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="prompt"' in html
    assert 'type="module" src="/static/js/app.js"' in html
    assert "csrftoken" in response.cookies, "the page's script sends the CSRF cookie back"
    config = _config(html)
    assert config["conversationId"] is None
    assert config["defaultModel"] == settings.DEFAULT_MODEL
    assert config["messageMaxChars"] == settings.MESSAGE_MAX_CHARS
    _assert_no_active_markup(html)


def test_the_model_picker_lists_only_the_pools_of_the_users_tier(logged_in: Client) -> None:
    ModelPool.objects.create(name="small-free", served_model="small", tiers=["free", "plus"])
    ModelPool.objects.create(name="large-pro", served_model="large", tiers=["pro"])
    ModelPool.objects.create(name="retired", served_model="old", tiers=["free"], is_active=False)

    html = logged_in.get("/").content.decode()

    # And `auto`, each answer by the small or the large pool, since the tier has the small one.
    offered = sorted(["small-free", settings.DEFAULT_MODEL, settings.AUTO_MODEL])
    assert sorted(_picker_options(html)) == offered
    assert sorted(_config(html)["models"]) == offered
    selected = [
        attrs["value"] for tag, attrs in _tags(html) if tag == "option" and "selected" in attrs
    ]
    assert selected == [settings.DEFAULT_MODEL]
    assert "large-pro" not in html
    assert "retired" not in html


def test_the_model_picker_follows_a_plan_that_lists_its_pools(logged_in: Client, user: Any) -> None:
    ModelPool.objects.create(name="small-free", served_model="small", tiers=["free"])
    pro = ModelPool.objects.create(name="large-pro", served_model="large", tiers=["pro"])
    plan = Plan.objects.get(slug="pro")
    PlanPool.objects.create(plan=plan, pool=pro)
    Subscription.objects.create(user=user, plan=plan)

    html = logged_in.get("/").content.decode()

    assert _picker_options(html) == ["large-pro"]
    assert _config(html)["defaultModel"] == "large-pro"


def test_the_page_says_so_when_the_plan_has_no_model(logged_in: Client) -> None:
    ModelPool.objects.update(tiers=["pro"])
    catalog_changed()  # update() sends no signal

    html = logged_in.get("/").content.decode()

    assert _picker_options(html) == []
    assert "No model is available on your plan" in html
    prompt = next(attrs for tag, attrs in _tags(html) if attrs.get("id") == "prompt")
    assert "disabled" in prompt
    assert _config(html)["defaultModel"] is None


def test_a_conversation_page_shows_its_title_as_text(logged_in: Client, user: Any) -> None:
    conversation = conversation_create(owner=user, title=HOSTILE)

    response = logged_in.get(f"/c/{conversation.pk}")

    assert response.status_code == 200
    html = response.content.decode()
    assert "&lt;img src=x onerror=&quot;window.__xss=1&quot;&gt;" in html
    assert _config(html)["conversationId"] == str(conversation.pk)
    _assert_no_active_markup(html)
    assert html.count("<script") == 2, "only the JSON config and the app module"


def test_data_in_the_page_config_cannot_close_its_script_tag(logged_in: Client) -> None:
    ModelPool.objects.create(name="x</script><img src=x onerror=alert(1)>", served_model="x")

    html = logged_in.get("/").content.decode()

    assert "</script><img" not in html
    assert "x</script><img src=x onerror=alert(1)>" in _config(html)["models"]
    _assert_no_active_markup(html)


def test_another_users_conversation_page_is_404(logged_in: Client, other_user: Any) -> None:
    conversation = conversation_create(owner=other_user, title="Not yours")

    response = logged_in.get(f"/c/{conversation.pk}")

    assert response.status_code == 404
    assert b"Not yours" not in response.content


def test_a_deleted_conversation_page_is_404(logged_in: Client, user: Any) -> None:
    conversation = conversation_create(owner=user, title="Gone")
    conversation_remove(conversation=conversation)

    assert logged_in.get(f"/c/{conversation.pk}").status_code == 404


def test_the_vendored_libraries_ship_with_their_licenses() -> None:
    vendor = settings.BASE_DIR / "static" / "vendor"
    for library, entry in [
        ("marked", "marked.esm.js"),
        ("dompurify", "purify.es.mjs"),
        ("highlight", "highlight.min.js"),
    ]:
        assert (vendor / library / entry).stat().st_size > 10_000
        assert (vendor / library / "LICENSE").read_text().strip()


def test_the_data_page_offers_the_export_and_the_import(client: Client, user: Any) -> None:
    client.force_login(user)
    page = client.get("/data")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/api/v1/export"' in html
    assert 'id="import-file"' in html
    assert "js/data.js" in html
    assert "<script>" not in html  # the strict CSP: no inline script


def test_the_data_page_needs_a_login(client: Client) -> None:
    response = client.get("/data")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
