"""The headers of issue 16: a strict Content-Security-Policy on every page, with nothing inline
on the pages for it to block (the site's, the admin's, the API docs); HSTS over HTTPS; and
the fixed nosniff, frame and referrer policies."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chatsite.tests.ratelimit_window import one_ratelimit_window
from conversations.services import conversation_create

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

STRICT = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}

# Script elements a browser does not run, so the policy has nothing to say about them.
DATA_SCRIPT_TYPES = {"application/json", "application/ld+json"}


def directives(header: str) -> dict[str, list[str]]:
    parsed: dict[str, list[str]] = {}
    for part in header.split(";"):
        name, *sources = part.split()
        parsed[name] = sources
    return parsed


class _InlineFinder(HTMLParser):
    """What a strict policy would block on a page: inline script bodies, <style> elements,
    style="" and on*="" attributes, javascript: URLs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._in_inline_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name == "style":
                self.found.append(f'<{tag} style="{value}">')
            if (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value}>")
        if tag == "style":
            self.found.append("<style> element")
        if tag == "script":
            kind = (named.get("type") or "").lower()
            self._in_inline_script = named.get("src") is None and kind not in DATA_SCRIPT_TYPES

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_inline_script = False

    def handle_data(self, data: str) -> None:
        if self._in_inline_script and data.strip():
            self.found.append(f"inline script: {data.strip()[:80]}")


def blocked_on(html: str) -> list[str]:
    finder = _InlineFinder()
    finder.feed(html)
    return finder.found


def assert_strict_page(response: Any) -> None:
    assert response.status_code == 200, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("text/html")
    assert directives(response["Content-Security-Policy"]) == STRICT
    assert blocked_on(response.content.decode()) == []


@pytest.fixture
def staff() -> User:
    user: User = User.objects.create_superuser("root", "root@example.com", "a long password")
    return user


@pytest.fixture
def staff_client(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def test_the_finder_sees_what_the_policy_blocks() -> None:
    page = (
        '<script>alert(1)</script><script type="module">x()</script><style>p{}</style>'
        '<p style="color: red" onclick="x()"><a href="javascript:x()">a</a></p>'
    )
    assert len(blocked_on(page)) == 6
    allowed = (
        '<script type="module" src="/static/js/app.js"></script>'
        '<script id="c" type="application/json">{"a": 1}</script>'
    )
    assert blocked_on(allowed) == []


def test_the_site_pages_carry_the_strict_policy_and_nothing_inline(
    staff_client: Client, staff: User
) -> None:
    conversation = conversation_create(owner=staff)
    for path in [
        "/",
        f"/c/{conversation.id}",
        reverse("accounts:api-keys"),
        reverse("billing:usage"),
    ]:
        assert_strict_page(staff_client.get(path))


def test_the_pages_before_log_in_carry_the_strict_policy() -> None:
    for path in [reverse("accounts:login"), reverse("accounts:signup"), "/admin/login/"]:
        assert_strict_page(Client().get(path))


def test_a_refused_log_in_page_carries_the_strict_policy(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "login": "1/m"}
    one_ratelimit_window(monkeypatch)
    client = Client(HTTP_ACCEPT="text/html")
    form = {"username": "nobody", "password": "wrong"}
    client.post(reverse("accounts:login"), form)
    refused = client.post(reverse("accounts:login"), form)
    assert refused.status_code == 429
    assert directives(refused["Content-Security-Policy"]) == STRICT
    assert "Too many attempts" in refused.content.decode()
    assert blocked_on(refused.content.decode()) == []


def test_every_admin_list_and_form_works_under_the_strict_policy(
    staff_client: Client, staff: User
) -> None:
    """Django's admin has nothing inline on these pages, so it needs no exception."""
    paths = ["/admin/", reverse("admin:auth_user_change", args=[staff.pk])]
    for model, model_admin in admin.site._registry.items():
        info = (model._meta.app_label, model._meta.model_name)
        paths.append(reverse("admin:{}_{}_changelist".format(*info)))
        if model_admin.has_add_permission(staff_client.get("/admin/").wsgi_request):
            paths.append(reverse("admin:{}_{}_add".format(*info)))
    assert len(paths) > 10
    for path in paths:
        response = staff_client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        assert directives(response["Content-Security-Policy"]) == STRICT, path
        assert blocked_on(response.content.decode()) == [], path


def test_the_api_docs_load_their_script_from_this_origin() -> None:
    page = Client().get(reverse("api-docs"))
    assert_strict_page(page)
    html = page.content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', html)
    assert any("swagger-ui-bundle.js" in src for src in scripts)
    setup = [src for src in scripts if src.startswith("/api/docs/")]
    assert len(setup) == 1, scripts
    assert '<link rel="stylesheet" href="/static/css/api-docs.css">' in html

    script = Client().get(setup[0].replace("&amp;", "&"))
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle(" in script.content.decode()
    assert "/api/schema/" in script.content.decode()


def test_api_answers_carry_the_policy_and_the_fixed_headers(api_client: Any) -> None:
    response = api_client.get("/api/v1/conversations")
    assert response.status_code == 200
    assert directives(response["Content-Security-Policy"]) == STRICT
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"


def test_hsts_goes_out_over_https_only(settings: Any, user: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 31_536_000
    client = Client()
    client.force_login(user)
    assert "Strict-Transport-Security" not in client.get("/")
    secure = client.get("/", secure=True)
    assert secure["Strict-Transport-Security"] == "max-age=31536000"


def test_behind_a_proxy_its_https_header_counts_as_https(settings: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_SSL_REDIRECT = True
    client = Client()
    plain = client.get(reverse("accounts:login"))
    assert plain.status_code == 301
    assert plain["Location"] == "https://testserver/accounts/login/"
    forwarded = client.get(reverse("accounts:login"), headers={"X-Forwarded-Proto": "https"})
    assert forwarded.status_code == 200
    assert forwarded["Strict-Transport-Security"] == "max-age=600; includeSubDomains"


def test_the_scripts_evaluate_no_strings_and_set_no_style_attributes() -> None:
    """What the policy would block in our own scripts, which the page tests cannot see
    (markup made at run time)."""
    forbidden = re.compile(
        r"\beval\(|new Function\b|setTimeout\(\s*[\"'`]|setAttribute\(\s*[\"']style[\"']"
        r"|\bstyle=|javascript:|\.cssText\b|\bon[a-z]+=\""
    )
    scripts = sorted((ROOT / "static" / "js").rglob("*.js"))
    assert scripts
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in scripts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line) and not line.lstrip().startswith("//")
    ]
    assert found == []
