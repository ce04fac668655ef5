"""Share links and feedback in a real browser (headless Debian Chromium, driven by
Playwright) against a live edge. No model is needed: the answers are written as the inference
plane writes them.

Every check is on what the user (or a logged-out visitor) sees; the database is asked only to
confirm it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Feedback, Share
from conversations.services import conversation_create
from inference.tests.fixtures import LiveEdge

from .browser_conftest import browser_user, page_budget_ms
from .factories import exchange
from .test_browser import assert_inert, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_shared_link_opens_logged_out_with_the_messages_and_no_owner_data(
    browser: Any, open_chat: Callable[..., Any], chat_edge: LiveEdge, screenshots: Path
) -> None:
    user = browser_user()
    conversation = conversation_create(owner=user, title="Weekend plans")
    exchange(
        conversation,
        "Ideas? <img src=x onerror=window.__xss=1>",
        answer="**Hike** the ridge.\n\n<script>window.__xss=1</script>",
    )
    page, errors = open_chat(chat_edge.url, user, permissions=["clipboard-read", "clipboard-write"])
    page.goto(f"{chat_edge.url}/c/{conversation.pk}")
    expect(page.locator("#conversation-title")).to_have_text("Weekend plans")
    # The user shares what they see: the conversation's messages, once the page has them.
    expect(page.locator(".message")).to_have_count(2)

    page.get_by_role("button", name="Share", exact=True).click()
    page.get_by_role("button", name="Create a link").click()
    link = page.get_by_label("Link to this conversation")
    expect(link).to_have_value(re.compile(r"/s/[0-9a-f]{64}$"))
    url = link.input_value()
    page.get_by_role("button", name="Copy the link", exact=True).click()
    expect(page.get_by_role("button", name="Copy the link", exact=True)).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == url
    listed = page.locator(".share-item")
    expect(listed).to_have_count(1)
    expect(listed.locator(".share-item-title")).to_have_text("Weekend plans")
    shot(page, screenshots, "share-dialog-light")

    # A visitor with no session at all.
    visitor_context = browser.new_context()
    visitor_context.set_default_timeout(page_budget_ms())
    try:
        visitor = visitor_context.new_page()
        response = visitor.goto(url)
        assert response is not None and response.status == 200
        assert response.headers["x-robots-tag"] == "noindex, nofollow"
        assert response.headers["referrer-policy"] == "no-referrer"
        expect(visitor.get_by_role("heading", name="Weekend plans")).to_be_visible()
        messages = visitor.locator("#shared-messages .message-body")
        expect(messages).to_have_count(2)
        expect(messages.nth(0)).to_have_text("Ideas? <img src=x onerror=window.__xss=1>")
        expect(messages.nth(1).locator("strong")).to_have_text("Hike")
        expect(messages.nth(1)).to_contain_text("<script>window.__xss=1</script>")
        expect(visitor.locator('meta[name="robots"]')).to_have_attribute(
            "content", "noindex, nofollow"
        )
        assert_inert(visitor)
        shot(visitor, screenshots, "shared-page-light")
        html = visitor.content()
        assert user.username not in html and str(conversation.pk) not in html
        expect(visitor.get_by_role("link", name="Log in")).to_have_count(0)

        # Revoked by its owner: the link is gone.
        page.get_by_role("button", name="Revoke the link to “Weekend plans”").click()
        expect(listed).to_have_attribute("data-revoked", "true")
        expect(link).to_be_hidden()
        gone = visitor.goto(url)
        assert gone is not None and gone.status == 404
    finally:
        visitor_context.close()
    assert Share.objects.get(conversation=conversation).revoked_at is not None
    assert errors == []


def test_a_thumbs_down_with_a_reason_stays_after_a_reload(
    open_chat: Callable[..., Any], chat_edge: LiveEdge, screenshots: Path
) -> None:
    user = browser_user()
    conversation = conversation_create(owner=user, title="Facts")
    _, answer = exchange(conversation, "How tall is Everest?", answer="About 3 km.")
    page, errors = open_chat(chat_edge.url, user)
    page.goto(f"{chat_edge.url}/c/{conversation.pk}")
    item = page.locator(f'[data-message-id="{answer.pk}"]')
    down = item.get_by_role("button", name="Bad answer")
    up = item.get_by_role("button", name="Good answer")
    expect(down).to_have_attribute("aria-pressed", "false")

    down.click()
    item.get_by_label("Reason").select_option(label="Not accurate")
    item.get_by_label("Comment").fill("It is 8.8 km.")
    shot(page, screenshots, "feedback-reason-light")
    item.get_by_role("button", name="Send feedback").click()
    expect(down).to_have_attribute("aria-pressed", "true")
    expect(item.locator(".feedback-reason-chosen")).to_have_text("Not accurate")
    shot(page, screenshots, "feedback-down-light")

    page.reload()
    expect(down).to_have_attribute("aria-pressed", "true")
    expect(up).to_have_attribute("aria-pressed", "false")
    expect(item.locator(".feedback-reason-chosen")).to_have_text("Not accurate")
    stored = Feedback.objects.get(message=answer)
    assert (stored.rating, stored.reason, stored.comment) == ("down", "inaccurate", "It is 8.8 km.")

    # Changed to a thumbs up, then taken back.
    up.click()
    expect(up).to_have_attribute("aria-pressed", "true")
    expect(down).to_have_attribute("aria-pressed", "false")
    up.click()
    expect(up).to_have_attribute("aria-pressed", "false")
    page.reload()
    expect(up).to_have_attribute("aria-pressed", "false")
    assert not Feedback.objects.filter(message=answer).exists()
    assert errors == []
