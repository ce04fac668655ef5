"""Custom instructions and memory on the settings page, in a real browser (headless Chromium
driven by Playwright) against a live edge. Every check is on what the user sees, then on
what a reload shows; the database is asked only to confirm it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import MemoryFact, Personalization
from conversations.services import conversation_create, memory_suggestions_add
from inference.tests.fixtures import LiveEdge

from .browser_conftest import browser_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_instructions_facts_and_a_suggestion_on_the_settings_page(
    open_chat: Callable[..., Any], chat_edge: LiveEdge
) -> None:
    user = browser_user()
    conversation = conversation_create(owner=user, title="Bread")
    memory_suggestions_add(
        owner_id=user.pk, conversation_id=conversation.pk, texts=["The user bakes sourdough"]
    )
    page, errors = open_chat(chat_edge.url, user)
    page.get_by_role("link", name="Settings").click()
    page.wait_for_url(f"{chat_edge.url}/settings/")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")

    # Instructions.
    page.get_by_label("Your instructions").fill("Answer in French.\nBe brief.")
    page.get_by_role("button", name="Save instructions").click()
    expect(page.locator("#instructions-note")).to_have_text("Instructions saved.")

    # A fact added, edited, then another added and deleted.
    facts = page.locator("#fact-list .fact-text")
    expect(page.locator("#fact-list")).to_have_text("Nothing remembered yet.")
    page.get_by_label("New fact").fill("The user lives in Lyon")
    page.get_by_role("button", name="Add fact").click()
    expect(facts).to_have_text(["The user lives in Lyon"])
    page.get_by_role("button", name="Edit “The user lives in Lyon”").click()
    page.get_by_label("New words for “The user lives in Lyon”").fill("The user lives in Paris")
    page.get_by_role("button", name="Save “The user lives in Lyon”").click()
    expect(facts).to_have_text(["The user lives in Paris"])
    page.get_by_label("New fact").fill("Temporary")
    page.keyboard.press("Enter")
    expect(facts).to_have_text(["The user lives in Paris", "Temporary"])
    page.get_by_role("button", name="Delete “Temporary”").click()
    expect(facts).to_have_text(["The user lives in Paris"])

    # The seeded suggestion, confirmed: it joins the facts, last.
    suggestions = page.locator("#suggestion-list .fact-text")
    expect(suggestions).to_have_text(["The user bakes sourdough"])
    page.get_by_role("button", name="Remember “The user bakes sourdough”").click()
    expect(facts).to_have_text(["The user lives in Paris", "The user bakes sourdough"])
    expect(suggestions).to_have_count(0)
    expect(page.get_by_role("heading", name="Suggested")).to_be_hidden()

    # All of it is still there after a reload.
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    expect(page.get_by_label("Your instructions")).to_have_value("Answer in French.\nBe brief.")
    expect(facts).to_have_text(["The user lives in Paris", "The user bakes sourdough"])
    expect(suggestions).to_have_count(0)
    assert errors == []

    assert Personalization.objects.get(user=user).instructions == "Answer in French.\nBe brief."
    derived = MemoryFact.objects.get(owner=user, text="The user bakes sourdough")
    assert (derived.status, derived.conversation_id) == ("confirmed", conversation.pk)


def test_the_suggestions_switch_and_a_refusal_are_shown(
    open_chat: Callable[..., Any], chat_edge: LiveEdge
) -> None:
    user = browser_user()
    page, _errors = open_chat(chat_edge.url, user)
    page.goto(f"{chat_edge.url}/settings/")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    switch = page.get_by_label("Suggest facts to remember from my messages")
    expect(switch).to_be_checked()
    switch.uncheck()
    page.get_by_label("New fact").fill("Same fact")
    page.get_by_role("button", name="Add fact").click()
    expect(page.locator("#memory-note")).to_have_text("Fact added.")
    page.get_by_label("New fact").fill("same fact.")
    page.get_by_role("button", name="Add fact").click()
    expect(page.locator("#memory-note")).to_have_text("That fact is already in your memory.")
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    expect(switch).not_to_be_checked()
