"""The web chat's moderation, tools and live sidebar in a real browser (headless Debian
Chromium, driven by Playwright) against the running stack: a live edge, a scheduler process,
and the real vLLM workers or, where the test is about our side (an answer that turns bad, a
tool call the tiny model cannot be relied on to make), a stand-in worker.

Every check is on what the user sees: the banner, the answer's state line, the tool steps,
the sidebar; the database and the API are asked only to confirm what the page shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.db import connections
from playwright.sync_api import expect

from chatsite.testing import budget
from conversations.models import Conversation, Message
from conversations.removal import conversation_remove
from conversations.services import conversation_create
from conversations.titles import title_generate
from inference.tests.fake_worker import FakeWorker
from inference.tests.fixtures import LiveEdge, RealWorker
from moderation import engine
from moderation.categories import label
from moderation.services import user_suspend
from moderation.tests.helpers import HARMFUL, INSULT
from plugins import selectors as plugin_selectors

from .browser_conftest import (
    ScriptedWorker,
    browser_user,
    register_real_workers,
    register_workers,
)
from .factories import exchange
from .test_browser import answers, assert_inert, rendered, send, wait_final

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

T = TypeVar("T")

CALM = "The weather today is calm and mild. "
SHOWN_INSULT = "worthless idiot"
# A valid calculator expression whose comment is markup: the calculator echoes the
# expression in its result, so the result the page shows holds an <img> with a handler.
HOSTILE_EXPRESSION = "6*7 # <img src=x onerror=window.__xss=1>"


def banner(page: Any) -> Any:
    return page.locator("#banner")


# Moderation (issue 6)


def test_a_blocked_message_shows_the_refusal_and_keeps_the_draft(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
) -> None:
    register_workers([scripted_workers(pieces=["Hello."]).url])
    scheduler()
    user = browser_user()
    page, errors = open_chat(chat_edge.url, user)
    labels = [label(category) for category in engine.evaluate(HARMFUL, engine.policy()).blocked]
    assert labels, "the default rules block this text"

    send(page, HARMFUL)
    expect(banner(page)).to_be_visible()
    expect(banner(page)).to_have_attribute("data-kind", "content_blocked")
    text = page.locator("#banner-text")
    expect(text).to_contain_text("This message was not sent")
    for name in labels:
        expect(text).to_contain_text(name)
    expect(page.locator("#prompt")).to_have_value(HARMFUL)
    expect(page.locator(".message.user")).to_have_count(0)
    expect(answers(page)).to_have_count(0)
    assert not Message.objects.filter(conversation__owner=user, role=Message.Role.USER).exists()

    # The refusal is not sticky: a harmless message goes through and is answered.
    send(page, "Tell me about the weather.")
    expect(banner(page)).to_be_hidden()
    wait_final(answers(page).last, within=60)
    expect(answers(page)).to_have_count(1)
    assert rendered(answers(page).last) == "Hello."
    assert [e for e in errors if "400" not in e] == []


def test_an_answer_that_turns_bad_is_replaced_by_the_notice_for_good(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
) -> None:
    # The worker holds the answer after its calm start until the page has shown it.
    worker = scripted_workers(
        pieces=[CALM] * 4 + [INSULT] + [CALM] * 80, token_delay=0.05, hold_after=4
    )
    register_workers([worker.url])
    # Windows of 20 tokens overlapping by 5: the insult is caught mid-answer.
    scheduler(MODERATION_WINDOW_TOKENS="20", MODERATION_WINDOW_OVERLAP_TOKENS="5")
    page, errors = open_chat(chat_edge.url, browser_user())
    send(page, "Tell me about the weather.")
    answer = answers(page).last
    body = answer.locator(".message-body")
    # The answer streamed before it was withdrawn.
    expect(body).to_have_attribute("data-rendered", re.compile(re.escape((CALM * 4).strip())))
    expect(answer).to_have_attribute("data-status", "streaming")
    worker.go_on()

    expect(answer).to_have_attribute("data-status", "blocked")
    state = answer.locator(".message-state")
    expect(state).to_have_attribute("data-kind", "blocked")
    expect(state).to_have_text("This answer was withdrawn because it broke the content policy.")
    assert rendered(answer) == ""
    assert (answer.locator(".message-body").text_content() or "") == ""
    assert SHOWN_INSULT not in page.content()
    message = Message.objects.get(pk=answer.get_attribute("data-message-id"))
    assert message.status == Message.Status.BLOCKED
    assert SHOWN_INSULT in message.content, "kept for staff, not for the user"
    assert len(message.content) < len(CALM) * 80, "stopped mid-answer"

    page.reload()
    answer = answers(page).last
    expect(answer).to_have_attribute("data-status", "blocked")
    expect(answer.locator(".message-state")).to_have_text(
        "This answer was withdrawn because it broke the content policy."
    )
    assert rendered(answer) == ""
    assert SHOWN_INSULT not in page.content()
    assert errors == []


def test_a_suspended_user_sees_the_suspension_on_send(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
) -> None:
    register_workers([scripted_workers(pieces=["Hello."]).url])
    scheduler()
    user = browser_user()
    page, errors = open_chat(chat_edge.url, user)
    send(page, "Hello there.")
    wait_final(answers(page).last, within=60)

    sanction = user_suspend(user=user, by=None, hours=24, reason="test")
    assert sanction.ends_at is not None
    send(page, "Hello again.")
    expect(banner(page)).to_be_visible()
    expect(banner(page)).to_have_attribute("data-kind", "account_suspended")
    expect(page.locator("#banner-text")).to_have_text(
        f"This account is suspended until {sanction.ends_at:%Y-%m-%d %H:%M} UTC."
    )
    expect(page.locator("#prompt")).to_have_value("Hello again.")
    expect(page.locator(".message.user")).to_have_count(1)
    expect(answers(page)).to_have_count(1)
    assert Message.objects.filter(conversation__owner=user, role=Message.Role.USER).count() == 1
    assert [e for e in errors if "403" not in e] == []


# Tools (issue 8)


def _tool_states(page: Any, conversation: Conversation) -> dict[str, bool]:
    response = page.request.get(f"/api/v1/conversations/{conversation.pk}/tools")
    assert response.status == 200
    return {tool["name"]: tool["enabled"] for tool in response.json()["tools"]}


def test_the_tools_menu_lists_the_plan_tools_and_a_switch_persists(
    open_chat: Callable[..., Any], chat_edge: LiveEdge
) -> None:
    user = browser_user()
    conversation = conversation_create(owner=user, title="Sums")
    offered = [
        state.spec.name
        for state in plugin_selectors.conversation_tools(user=user, conversation=conversation)
    ]
    assert "calculator" in offered
    page, errors = open_chat(chat_edge.url, user)
    menu = page.locator("#tools-menu")
    expect(menu).to_be_hidden()  # a new chat has no tools yet

    page.get_by_role("link", name="Sums").click()
    expect(page.locator("#conversation-title")).to_have_text("Sums")
    summary = menu.locator("summary")
    expect(summary).to_have_text(f"Tools (0/{len(offered)})")
    summary.click()
    boxes = page.locator("#tools-list input[type=checkbox]")
    expect(page.locator("#tools-list .tool-name")).to_have_text(offered)
    for index in range(len(offered)):
        expect(boxes.nth(index)).not_to_be_checked()

    calculator = page.locator('#tools-list input[data-tool="calculator"]')
    calculator.check()
    expect(summary).to_have_text(f"Tools (1/{len(offered)})")
    expect(page.locator('#tools-list input[data-tool="calculator"]')).to_be_checked()
    assert _tool_states(page, conversation) == {name: name == "calculator" for name in offered}

    page.reload()
    expect(summary).to_have_text(f"Tools (1/{len(offered)})")
    summary.click()
    expect(page.locator('#tools-list input[data-tool="calculator"]')).to_be_checked()
    for name in offered:
        if name != "calculator":
            expect(page.locator(f'#tools-list input[data-tool="{name}"]')).not_to_be_checked()

    page.locator('#tools-list input[data-tool="calculator"]').uncheck()
    expect(summary).to_have_text(f"Tools (0/{len(offered)})")
    assert _tool_states(page, conversation) == dict.fromkeys(offered, False)
    assert errors == []


def test_a_tool_call_shows_as_a_collapsible_step_of_inert_text(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
) -> None:
    arguments = json.dumps({"expression": HOSTILE_EXPRESSION})
    worker = FakeWorker(tool_calls=[("calculator", arguments)], tokens=6, token_delay=0.05)
    worker.start()
    try:
        register_workers([worker.url])
        scheduler()
        user = browser_user()
        conversation = conversation_create(owner=user, title="Sums")
        page, errors = open_chat(chat_edge.url, user)
        page.goto(f"/c/{conversation.pk}")
        summary = page.locator("#tools-menu summary")
        expect(summary).to_have_text(re.compile(r"^Tools \(0/\d+\)$"))
        summary.click()
        page.locator('#tools-list input[data-tool="calculator"]').check()
        expect(summary).to_have_text(re.compile(r"^Tools \(1/\d+\)$"))
        summary.click()

        send(page, "What is 6 times 7?")
        answer = answers(page).last
        wait_final(answer, within=60)
        assert worker.requests[0].get("tools"), "the calculator was offered to the model"
        assert len(worker.requests) == 2, "one tool round, then the answer"
        _check_tool_step(page, answer)

        page.reload()
        answer = answers(page).last
        expect(answer).to_have_attribute("data-status", "complete")
        _check_tool_step(page, answer)
        assert errors == []
    finally:
        worker.stop()


def _check_tool_step(page: Any, answer: Any) -> None:
    steps = answer.locator("details.tool-step")
    expect(steps).to_have_count(1)
    step = steps.first
    expect(step).to_have_attribute("data-state", "ok")
    assert step.get_attribute("open") is None, "collapsed until opened"
    expect(step.locator(".tool-step-arguments")).to_be_hidden()
    expect(step.locator(".tool-step-name")).to_have_text("calculator")
    expect(step.locator(".tool-step-state")).to_have_text("done")
    step.locator("summary").click()
    expect(step.locator(".tool-step-arguments")).to_be_visible()
    arguments = json.loads(step.locator(".tool-step-arguments").text_content() or "")
    assert arguments == {"expression": HOSTILE_EXPRESSION}
    result = json.loads(step.locator(".tool-step-output").text_content() or "")
    assert result == {"expression": HOSTILE_EXPRESSION, "result": "42"}
    assert step.locator("img").count() == 0
    # The model's answer after the tool round, below the step.
    assert rendered(answer) == "tok0 tok1 tok2 tok3 tok4 tok5 "
    assert_inert(page)
    assert page.locator(".tool-steps img, .tool-steps script").count() == 0


# The live sidebar (issue 9)


def _in_a_thread(call: Callable[[], T]) -> T:
    """Run `call` as the Celery task would, outside Playwright's thread (whose running event
    loop forbids the `asyncio.run` of the small-model client), with its own connection."""

    def run() -> T:
        try:
            return call()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=budget(180))  # a real model's title


def test_background_titles_and_deletions_reach_the_open_page_live(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
) -> None:
    register_real_workers(real_workers, max_output_tokens=24)
    user = browser_user()
    other = conversation_create(owner=user, title="Another chat")
    untitled = conversation_create(owner=user)
    exchange(
        untitled,
        "How do I bake sourdough bread?",
        answer="Feed the starter, mix flour and water, let it rise, then bake it hot.",
    )
    page, errors = open_chat(chat_edge.url, user)
    page.goto(f"/c/{untitled.pk}")
    item = page.locator(f'[data-conversation-id="{untitled.pk}"]')
    expect(item.locator(".conversation-link")).to_have_text("New chat")
    expect(page.locator("#conversation-title")).to_have_text("New chat")
    expect(page.locator(".message.assistant")).to_have_count(1)
    page.evaluate("window.__sameDocument = true")

    title = _in_a_thread(lambda: title_generate(conversation_id=untitled.pk))
    assert title, "the model (or the question) named the conversation"
    expect(item.locator(".conversation-link")).to_have_text(title)
    expect(page.locator("#conversation-title")).to_have_text(title)
    assert page.title() == f"{title} · Chatsite"

    # Deleted elsewhere while another conversation is open: it leaves the sidebar.
    conversation_remove(conversation=other)
    expect(page.locator(f'[data-conversation-id="{other.pk}"]')).to_have_count(0)
    expect(item).to_be_visible()
    expect(page.locator("#conversation-title")).to_have_text(title)

    # The open conversation deleted elsewhere: the page leaves it for a new chat.
    conversation_remove(conversation=untitled)
    expect(item).to_have_count(0)
    expect(page.locator("#conversation-title")).to_have_text("New chat")
    expect(page.locator(".message")).to_have_count(0)
    assert page.url == f"{chat_edge.url}/"
    assert page.evaluate("window.__sameDocument") is True, "no reload"
    assert errors == []
