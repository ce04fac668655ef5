"""Folders, pins, archive and message search in a real browser (headless Debian Chromium,
driven by Playwright) against a live edge. No model is needed: the answers are written as the
inference plane writes them, so what is checked is the sidebar and the search dialog.

Every check is on what the user sees; the database is asked only to confirm it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation, Folder
from conversations.services import conversation_create, message_edit
from inference.tests.fixtures import LiveEdge

from .browser_conftest import browser_user
from .factories import exchange, finish, sent
from .test_browser import assert_inert

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def row(page: Any, conversation: Conversation) -> Any:
    return page.locator(f'[data-conversation-id="{conversation.pk}"]')


def test_folders_pins_and_the_archive_in_the_sidebar_by_keyboard(
    open_chat: Callable[..., Any], chat_edge: LiveEdge
) -> None:
    user = browser_user()
    alpha, beta, _gamma = (
        conversation_create(owner=user, title=t) for t in ("Alpha", "Beta", "Gamma")
    )
    page, errors = open_chat(chat_edge.url, user)
    links = page.locator("#conversation-list .conversation-link")
    expect(links).to_have_text(["Gamma", "Beta", "Alpha"])

    # A folder, then Alpha moved into it from the row's folder menu.
    page.once("dialog", lambda dialog: dialog.accept("Work"))
    page.get_by_role("button", name="New folder").click()
    folder_button = page.get_by_role("button", name="Work", exact=True)
    expect(folder_button).to_be_visible()
    row(page, alpha).get_by_label("Folder of “Alpha”").select_option(label="Work")
    group = page.locator(".folder-group", has=folder_button)
    expect(group.locator(".conversation-link")).to_have_text(["Alpha"])
    expect(links).to_have_text(["Gamma", "Beta"])

    # Beta pinned with the keyboard: it goes on top, under Pinned.
    row(page, beta).get_by_role("button", name="Pin “Beta”").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#pinned-list .conversation-link")).to_have_text(["Beta"])
    expect(page.get_by_role("heading", name="Pinned")).to_be_visible()
    expect(links).to_have_text(["Gamma"])

    # Collapsing the folder hides its conversations; expanding shows them again.
    folder_button.press("Enter")
    expect(folder_button).to_have_attribute("aria-expanded", "false")
    expect(group.locator(".conversation-link")).to_be_hidden()
    folder_button.press("Enter")
    expect(group.locator(".conversation-link")).to_have_text(["Alpha"])

    # Alpha archived: out of the main list, in the Archived view, and back again.
    row(page, alpha).get_by_role("button", name="Archive “Alpha”").focus()
    page.keyboard.press("Enter")
    expect(row(page, alpha)).to_have_count(0)
    page.get_by_role("button", name="Archived").click()
    expect(page.get_by_role("button", name="Archived")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#conversation-list .conversation-link")).to_have_text(["Alpha"])
    row(page, alpha).get_by_role("button", name="Unarchive “Alpha”").click()
    expect(page.locator("#sidebar-note")).to_have_text("No archived conversations.")
    page.get_by_role("button", name="Archived").click()
    expect(group.locator(".conversation-link")).to_have_text(["Alpha"])

    # Deleting the folder keeps its conversation, now outside any folder.
    page.once("dialog", lambda dialog: dialog.accept())
    group.hover()
    page.get_by_role("button", name="Delete folder “Work”").click()
    expect(page.locator(".folder-group")).to_have_count(0)
    expect(links).to_have_text(["Gamma", "Alpha"])

    stored = {c.title: c for c in Conversation.objects.filter(owner=user)}
    assert stored["Beta"].pinned and not stored["Alpha"].archived
    assert stored["Alpha"].folder_id is None and stored["Alpha"].deleted_at is None
    assert not Folder.objects.filter(owner=user).exists()
    assert errors == []


def test_a_search_result_opens_its_conversation_on_the_branch_that_holds_it(
    open_chat: Callable[..., Any], chat_edge: LiveEdge
) -> None:
    user = browser_user()
    conversation = conversation_create(owner=user, title="Animals")
    question, _ = exchange(
        conversation, "Do capybaras <img src=x onerror=window.__xss=1> swim?", answer="Yes."
    )
    # An edit forks: the capybara question is no longer on screen.
    edited, placeholder = sent(message_edit(message=question, content="Tell me about otters"))
    finish(placeholder, "Otters hold hands.")
    other = conversation_create(owner=user, title="Elsewhere")
    exchange(other, "nothing to find", answer="Indeed.")

    page, errors = open_chat(chat_edge.url, user)
    page.locator(f'[data-conversation-id="{other.pk}"] .conversation-link').click()
    expect(page.locator("#conversation-title")).to_have_text("Elsewhere")

    page.get_by_role("button", name="Search messages").click()
    page.get_by_label("Words to find in your messages").fill("capybaras")
    page.get_by_label("Words to find in your messages").press("Enter")
    results = page.locator(".search-result-open")
    expect(results).to_have_count(1)
    expect(results.first.locator("mark")).to_have_text(["capybaras"])
    expect(results.first).to_contain_text("Animals · You")
    assert results.first.locator("img").count() == 0

    results.first.press("Enter")
    expect(page.locator("#conversation-title")).to_have_text("Animals")
    hit = page.locator(f'[data-message-id="{question.pk}"]')
    expect(hit).to_have_class("message user search-hit")
    expect(hit).to_be_focused()
    expect(hit).to_be_in_viewport()
    expect(page.locator(f'[data-message-id="{edited.pk}"]')).to_have_count(0)
    assert page.url.endswith(f"/c/{conversation.pk}")
    assert_inert(page)

    conversation.refresh_from_db()
    assert conversation.current_leaf is not None
    assert conversation.current_leaf.parent_id == question.pk
    assert errors == []
