"""The web chat in a real browser: headless Debian Chromium, driven by Playwright, against the
running stack (a live edge, a scheduler process, and the real vLLM workers).

A scripted stand-in worker replaces the model only where the test is about how our page
handles exactly known or hostile output; queue states need no worker at all.

Screenshots of the main states go to CHATSITE_SCREENSHOTS (or a temporary folder).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import expect

from chatsite.redis import sync_redis
from chatsite.testing import budget, wait_until
from conversations.models import Conversation, Message
from conversations.removal import conversation_remove
from conversations.services import conversation_create
from inference import queue
from inference.models import Generation
from inference.tests.fixtures import LiveEdge, RealWorker

from .browser_conftest import (
    CuttableProxy,
    ScriptedWorker,
    browser_user,
    register_real_workers,
    register_workers,
)

# The browser, the live stack and the scheduler process are fixtures of browser_conftest, which
# the root conftest loads as a plugin.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FINAL = {"complete", "cancelled", "failed", "lost"}
# What a real model's answer is given, in seconds (scaled): the real workers share two CPU
# cores with everything else.
ANSWER_WITHIN = 180.0


def answers(page: Any) -> Any:
    return page.locator(".message.assistant")


def send(page: Any, text: str) -> None:
    page.locator("#prompt").fill(text)
    page.locator("#prompt").press("Enter")


def rendered(answer: Any) -> str:
    """The raw text an answer element shows (its Markdown source)."""
    return str(answer.locator(".message-body").get_attribute("data-rendered") or "")


def wait_final(answer: Any, status: str = "complete", within: float = ANSWER_WITHIN) -> None:
    """Wait for the answer to show `status`, for at most `within` seconds (scaled)."""
    expect(answer).to_have_attribute("data-status", status, timeout=budget(within) * 1000)


# Kept in the page from the first time a test looks: every state each answer is drawn in
# (its status and its text), in order, numbered across answers. A test reads what the page
# drew however late it looks: none of it depends on how often a busy machine lets it look.
# Returns the number of the latest state drawn (`after` when given) and the states of the
# answer `id` drawn after `after`, led by the one it showed then when `lead`.
_ANSWER_STATES = """([id, after, lead]) => {
  if (!window.__answers) {
    const answers = (window.__answers = { seq: 0, states: {} });
    const note = () => {
      for (const item of document.querySelectorAll(".message.assistant[data-message-id]")) {
        const body = item.querySelector(".message-body");
        const status = item.dataset.status || "";
        const text = (body && body.dataset.rendered) || "";
        const states = (answers.states[item.dataset.messageId] ??= []);
        const last = states[states.length - 1];
        if (!last || last[1] !== status || last[2] !== text) {
          states.push([++answers.seq, status, text]);
        }
      }
    };
    note();
    new MutationObserver(note).observe(document.body, {
      subtree: true,
      childList: true,
      attributes: true,
      attributeFilter: ["data-status", "data-rendered"],
    });
  }
  const since = after ?? window.__answers.seq;
  const states = window.__answers.states[id] || [];
  let next = states.findIndex((state) => state[0] > since);
  if (next < 0) next = states.length;
  return [since, states.slice(lead ? Math.max(0, next - 1) : next)];
}"""


def watch(
    answer: Any, *, until: Callable[[str, str], bool], within: float = ANSWER_WITHIN
) -> list[str]:
    """Every distinct text the answer showed from now on, in order, until `until(status,
    text)` held for a state it was drawn in; fail after `within` seconds (scaled).

    The answer is the one the locator points at: after a regenerate, the old answer until the
    new one is shown, then the new one from its first state."""
    began: int | None = None  # the page's latest state when the watch began
    watched: str | None = None  # the answer's message
    taken = 0  # the latest of its states read
    seen: list[str] = []
    last = ("", "")

    def reached() -> bool:
        nonlocal began, watched, taken, seen, last
        message_id = answer.get_attribute("data-message-id")
        if message_id is None:
            return False
        fresh = message_id != watched
        if fresh:
            watched, seen = message_id, []
        since, states = answer.page.evaluate(
            _ANSWER_STATES, [message_id, began if fresh else taken, fresh]
        )
        if began is None:
            began = since
        taken = since
        for number, status, text in states:
            taken = max(taken, number)
            last = (status, text)
            if not seen or seen[-1] != text:
                seen.append(text)
            if until(status, text):
                return True
        return False

    try:
        wait_until(reached, within=within, what="the answer's awaited state")
    except AssertionError as failure:
        raise AssertionError(f"answer stuck at {last[0]!r} with {last[1]!r}") from failure
    return seen


def stored(answer: Any) -> Message:
    return Message.objects.get(pk=answer.get_attribute("data-message-id"))


def assert_inert(page: Any) -> None:
    """Nothing the page was shown ran, and no active element reached the DOM."""
    assert page.evaluate("typeof window.__xss") == "undefined"
    bodies = page.locator(".message-body")
    for selector in ["script", "img", "iframe", "svg", "object", "embed", "form", "style"]:
        assert bodies.locator(selector).count() == 0, selector
    handlers = page.evaluate(
        """() => [...document.querySelectorAll('*')].flatMap(
            (el) => [...el.attributes].filter((a) => a.name.startsWith('on')).map((a) => a.name))"""
    )
    assert handlers == []
    assert page.locator('[href^="javascript:" i]').count() == 0


def wait_page_note_lapses(user: User) -> None:
    """Wait until a beacon from the user's page could no longer be taken for its reload
    (`STREAM_RELOAD_SECONDS` after the page was served)."""
    redis = sync_redis()
    wait_until(
        lambda: not redis.exists(queue.shown_key(user.pk)),
        within=settings.STREAM_RELOAD_SECONDS + 30,
        every=0.2,
        what="the page's note lapsing",
    )


def shot(page: Any, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"))


# With the real vLLM workers


def test_log_in_send_and_watch_a_real_answer_stream(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
    screenshots: Path,
) -> None:
    register_real_workers(real_workers, max_output_tokens=48)
    scheduler()
    user = browser_user()
    page, errors = open_chat(chat_edge.url, user)
    expect(page.locator("#model-picker")).to_have_value(settings.DEFAULT_MODEL)
    shot(page, screenshots, "new-chat-light")

    page.locator("#prompt").fill("Tell me about bread.")
    page.locator("#prompt").press("Shift+Enter")
    page.locator("#prompt").press_sequentially("Keep it short.")
    page.locator("#prompt").press("Enter")

    question = page.locator(".message.user").last
    expect(question.locator(".message-body")).to_have_text("Tell me about bread.\nKeep it short.")
    answer = answers(page).last
    seen = watch(answer, until=lambda status, _: status in FINAL)

    assert answer.get_attribute("data-status") == "complete"
    message = stored(answer)
    assert message.status == Message.Status.COMPLETE
    assert message.content.strip()
    assert seen[-1] == message.content
    partial = [text for text in seen if text and text != message.content]
    assert partial, "the answer appeared piece by piece, not at once"
    assert all(message.content.startswith(text) for text in seen)
    conversation = message.conversation
    assert page.url.endswith(f"/c/{conversation.pk}")
    expect(page.locator(f'[data-conversation-id="{conversation.pk}"]')).to_be_visible()
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#send")).to_be_visible()
    shot(page, screenshots, "answer-complete-light")

    page.reload()
    expect(answers(page).last).to_have_attribute("data-status", "complete")
    assert rendered(answers(page).last) == message.content
    expect(page.locator(".message.user .message-body")).to_have_text(
        "Tell me about bread.\nKeep it short."
    )
    assert errors == []


def test_a_real_markdown_answer_is_rendered_as_safe_markdown(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
    screenshots: Path,
) -> None:
    register_real_workers(real_workers, max_output_tokens=96)
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user())
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    send(page, "Write a Python function that adds two numbers, in a markdown code block.")
    answer = answers(page).last
    wait_final(answer)

    # The small model does not always use Markdown; ask again until an answer does.
    for attempt in range(2, 7):
        if "`" in stored(answer).content:
            break
        answer.get_by_role("button", name="Regenerate this answer").click()
        expect(answer.locator(".branch-position")).to_have_text(f"{attempt}/{attempt}")
        wait_final(answer)
    content = stored(answer).content
    assert "`" in content, f"no Markdown in five real answers, last: {content!r}"

    body = answer.locator(".message-body")
    assert rendered(answer) == content
    assert "```" not in (body.text_content() or "")
    fences = re.findall(r"^```[^\n]*\n(.*?)^```", content, flags=re.M | re.S)
    for code in fences:
        assert code.rstrip("\n") in [
            (text or "").rstrip("\n")
            for text in body.locator(".code-block code").all_text_contents()
        ]
    outside = re.sub(r"^```.*?(^```|\Z)", "", content, flags=re.M | re.S)
    for inline in re.findall(r"`([^`\n]+)`", outside):
        assert inline.strip() in [
            (t or "").strip() for t in body.locator(":not(pre) > code").all_text_contents()
        ]
    if fences:
        block = body.locator(".code-block").first
        block.get_by_role("button", name=re.compile("^Copy the")).click()
        expect(block.get_by_role("button", name=re.compile("^Copy the"))).to_have_text("Copied")
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied.rstrip("\n") == fences[0].rstrip("\n")
        assert block.locator("code.hljs").count() == 1
    assert_inert(page)
    shot(page, screenshots, "markdown-answer-light")
    assert errors == []


def test_stop_and_esc_cancel_the_answer(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
    screenshots: Path,
) -> None:
    register_real_workers(real_workers, max_output_tokens=400, lasting=True)
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user())
    send(page, "Write a very long story about a baker, with many chapters.")
    answer = answers(page).last
    watch(answer, until=lambda status, text: status == "streaming" and len(text) > 20)
    expect(page.locator("#stop")).to_be_visible()

    page.locator("#stop").click()
    wait_final(answer, "cancelled", within=60)
    expect(answer.locator(".message-state")).to_have_text("Stopped.")
    expect(page.locator("#send")).to_be_visible()
    expect(page.locator("#stop")).to_be_hidden()
    message = stored(answer)
    generation = Generation.objects.get(message=message)
    assert generation.status == Generation.Status.CANCELLED
    assert message.status == Message.Status.CANCELLED
    assert rendered(answer) == message.content
    shot(page, screenshots, "stopped-light")

    answer.get_by_role("button", name="Regenerate this answer").click()
    answer = answers(page).last
    watch(answer, until=lambda status, text: status == "streaming" and len(text) > 10)
    page.keyboard.press("Escape")
    wait_final(answer, "cancelled", within=60)
    assert Generation.objects.get(message=stored(answer)).status == Generation.Status.CANCELLED
    assert errors == []


CLOSED_TAB_WITHIN = 60  # s (scaled): the beacon's cancel reaching the answer


def test_closing_the_tab_stops_its_answer_at_once(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
) -> None:
    register_real_workers(real_workers, max_output_tokens=2000, lasting=True)
    # Graces far longer than the wait for the cancel below: only the page's beacon may stop
    # the answer.
    grace = str(int(budget(5 * CLOSED_TAB_WITHIN)))
    scheduler(STREAM_FIRST_TOKEN_GRACE_SECONDS=grace, STREAM_GRACE_SECONDS=grace)
    user = browser_user()
    page, errors = open_chat(chat_edge.url, user)
    send(page, "Write a very long story about a clockmaker, with many chapters.")
    answer = answers(page).last
    watch(answer, until=lambda status, text: status == "streaming" and len(text) > 20)
    message_id = answer.get_attribute("data-message-id")
    wait_page_note_lapses(user)  # so its beacon cannot pass for a reload's
    assert errors == []

    page.close()
    generation = Generation.objects.get(message_id=message_id)

    def final() -> bool:
        generation.refresh_from_db()
        return generation.is_final

    wait_until(final, within=CLOSED_TAB_WITHIN, every=0.2, what="the generation ending")
    assert generation.status == Generation.Status.CANCELLED
    assert generation.finish_reason == "cancelled"


def test_edit_forks_and_the_switcher_flips_branches_and_survives_reload(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
    screenshots: Path,
) -> None:
    register_real_workers(real_workers, max_output_tokens=16)
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user())
    send(page, "Name a fruit.")
    wait_final(answers(page).last)
    first_answer = stored(answers(page).last).content

    question = page.locator(".message.user").last
    question.get_by_role("button", name="Edit this message").click()
    box = question.get_by_label("Edit your message")
    box.fill("Name a colour.")
    box.press("Enter")
    question = page.locator(".message.user").last
    expect(question.locator(".branch-position")).to_have_text("2/2")
    expect(question.locator(".message-body")).to_have_text("Name a colour.")
    wait_final(answers(page).last)
    second_answer = stored(answers(page).last).content
    assert Message.objects.filter(role=Message.Role.USER).count() == 2
    shot(page, screenshots, "branch-2-of-2-light")

    question.get_by_role("button", name="Previous version").click()
    question = page.locator(".message.user").last
    expect(question.locator(".message-body")).to_have_text("Name a fruit.")
    expect(question.locator(".branch-position")).to_have_text("1/2")
    assert rendered(answers(page).last) == first_answer

    page.reload()
    question = page.locator(".message.user").last
    expect(question.locator(".message-body")).to_have_text("Name a fruit.")
    expect(question.locator(".branch-position")).to_have_text("1/2")
    assert rendered(answers(page).last) == first_answer

    question.get_by_role("button", name="Next version").click()
    question = page.locator(".message.user").last
    expect(question.locator(".message-body")).to_have_text("Name a colour.")
    expect(question.locator(".branch-position")).to_have_text("2/2")
    assert rendered(answers(page).last) == second_answer
    assert errors == []


def test_regenerate_adds_a_sibling_answer(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
) -> None:
    register_real_workers(real_workers, max_output_tokens=16)
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user())
    send(page, "Say something nice.")
    answer = answers(page).last
    wait_final(answer)
    first = stored(answer)

    answer.get_by_role("button", name="Regenerate this answer").click()
    answer = answers(page).last
    expect(answer.locator(".branch-position")).to_have_text("2/2")
    wait_final(answer)
    second = stored(answer)

    assert second.pk != first.pk
    assert second.parent_id == first.parent_id
    assert rendered(answer) == second.content
    assert page.locator(".message.user").count() == 1
    answer.get_by_role("button", name="Previous version").click()
    expect(answers(page).last.locator(".branch-position")).to_have_text("1/2")
    assert rendered(answers(page).last) == first.content
    assert errors == []


def test_reload_and_a_network_drop_mid_answer_lose_and_repeat_nothing(
    open_chat: Callable[..., Any],
    cuttable_proxy: CuttableProxy,
    real_workers: list[RealWorker],
    scheduler: Callable[..., Any],
) -> None:
    register_real_workers(real_workers, max_output_tokens=400, lasting=True)
    scheduler()
    user = browser_user()
    page, _ = open_chat(cuttable_proxy.url, user)
    streams: list[str] = []
    # The answer's own stream (the page also keeps a stream of the user's events open).
    page.on(
        "request",
        lambda r: (
            streams.append(r.url)
            if "/generations/" in r.url and urlsplit(r.url).path.endswith("/stream")
            else None
        ),
    )
    send(page, "Write a long story about a lighthouse keeper and a storm.")
    answer = answers(page).last
    seen = watch(answer, until=lambda status, text: status == "streaming" and len(text) > 30)
    # The reload alone must tell the server that the old page's beacon is not a closed tab's.
    wait_page_note_lapses(user)

    page.reload()
    answer = answers(page).last
    seen += watch(
        answer, until=lambda status, text: len(text) > len(seen[-1]) + 30 or status in FINAL
    )
    assert answer.get_attribute("data-status") == "streaming", "re-attached while streaming"
    assert len(streams) == 2

    cuttable_proxy.cut()
    expect(answer.locator(".message-state")).to_have_text("Connection lost. Reconnecting…")
    seen += watch(answer, until=lambda status, _: status in FINAL)

    assert answer.get_attribute("data-status") == "complete"
    content = stored(answer).content
    assert seen[-1] == content
    lost_or_repeated = [text for text in seen if not content.startswith(text)]
    assert lost_or_repeated == []
    assert len(streams) == 3, "the browser resumed the stream after the drop"


# Queue states: no worker has room


def test_a_queued_answer_shows_its_place_then_fails_with_regenerate(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    screenshots: Path,
) -> None:
    # The answer may wait far longer than the page takes to show it waiting, however slow the
    # machine ...
    waiting = scheduler(SCHEDULER_MAX_QUEUE_SECONDS=str(int(budget(600))))
    page, errors = open_chat(chat_edge.url, browser_user())
    send(page, "Anyone there?")
    answer = answers(page).last
    state = answer.locator(".message-state")

    expect(state).to_have_text(
        "High demand right now: your answer is waiting for a free model (position 1)."
    )
    expect(answer).to_have_attribute("data-status", "queued")
    expect(page.locator("#stop")).to_be_visible()
    shot(page, screenshots, "queued-high-demand-light")

    # ... then a scheduler that lets an answer wait a second at most takes over: this one has
    # waited longer, and is refused.
    os.killpg(waiting.pid, signal.SIGTERM)
    waiting.wait(timeout=budget(60))
    scheduler(SCHEDULER_MAX_QUEUE_SECONDS="1")
    wait_final(answer, "failed", within=60)
    expect(state).to_contain_text("Demand is high")
    expect(answer.get_by_role("button", name="Regenerate this answer")).to_be_enabled()
    assert Generation.objects.get(message=stored(answer)).status == Generation.Status.REJECTED
    shot(page, screenshots, "failed-light")

    page.reload()
    expect(answers(page).last.locator(".message-state")).to_contain_text("Demand is high")
    assert errors == []


# Our page's handling of hostile text: a scripted stand-in worker sends exactly this.

HOSTILE_ANSWER = (
    "Here is some markup:\n\n"
    '<img src=x onerror="window.__xss=1">\n\n'
    "<script>window.__xss=2</script>\n\n"
    'Inline <b onmouseover="window.__xss=3">bold</b> and <svg onload="window.__xss=4"></svg>.\n\n'
    "[a link](javascript:window.__xss=5) and ![a picture](https://example.invalid/x.png)\n\n"
    '<iframe src="javascript:window.__xss=6"></iframe>\n\n'
    "```html\n<script>window.__xss=7</script>\n```\n"
)


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_hostile_model_output_renders_as_inert_text(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
    screenshots: Path,
) -> None:
    register_workers([scripted_workers(pieces=_pieces(HOSTILE_ANSWER), token_delay=0.02).url])
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user())
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    send(page, "Show me some HTML.")
    answer = answers(page).last
    seen = watch(answer, until=lambda status, _: status in FINAL)
    assert len(seen) > 3, "the hostile text streamed in pieces"
    assert_inert(page)

    assert stored(answer).content == HOSTILE_ANSWER
    text = answer.locator(".message-body").inner_text()
    assert '<img src=x onerror="window.__xss=1">' in text
    assert "<script>window.__xss=2</script>" in text
    assert '<b onmouseover="window.__xss=3">' in text
    assert '<iframe src="javascript:window.__xss=6"></iframe>' in text
    code = answer.locator(".code-block code")
    expect(code).to_have_text("<script>window.__xss=7</script>")
    link = answer.get_by_text("a link")
    assert link.get_attribute("href") is None
    link.click()
    answer.get_by_text("bold").hover()
    picture = answer.get_by_role("link", name="a picture")
    assert picture.get_attribute("href") == "https://example.invalid/x.png"
    assert picture.get_attribute("rel") == "noopener noreferrer nofollow"
    assert not [url for url in fetched if "example.invalid" in url]
    assert_inert(page)
    shot(page, screenshots, "hostile-answer-light")
    assert errors == []


def test_hostile_user_text_and_titles_render_as_inert_text(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
) -> None:
    register_workers([scripted_workers(pieces=["Noted."]).url])
    scheduler()
    user = browser_user()
    conversation_create(owner=user, title='<img src=x onerror="window.__xss=10">Old chat')
    page, errors = open_chat(chat_edge.url, user)
    expect(page.locator(".conversation-link").first).to_have_text(
        '<img src=x onerror="window.__xss=10">Old chat'
    )

    page.locator("#prompt").fill('<img src=x onerror="window.__xss=11">')
    page.locator("#prompt").press("Shift+Enter")
    page.locator("#prompt").press_sequentially("**not bold** <script>window.__xss=12</script>")
    page.locator("#prompt").press("Enter")
    wait_final(answers(page).last)
    question = page.locator(".message.user .message-body").last
    expect(question).to_have_text(
        '<img src=x onerror="window.__xss=11">\n**not bold** <script>window.__xss=12</script>'
    )
    assert question.locator("strong").count() == 0

    title = '<svg onload="window.__xss=13"></svg><script>window.__xss=14</script>'
    conversation = Conversation.objects.get(owner=user, title="")
    item = page.locator(f'[data-conversation-id="{conversation.pk}"]')
    item.hover()
    item.get_by_role("button", name=re.compile("^Rename")).click()
    item.get_by_label("New title").fill(title)
    item.get_by_label("New title").press("Enter")
    expect(item.locator(".conversation-link")).to_have_text(title)
    expect(page.locator("#conversation-title")).to_have_text(title)
    conversation.refresh_from_db()
    assert conversation.title == title

    page.reload()
    expect(page.locator("#conversation-title")).to_have_text(title)
    assert page.title() == f"{title} · Chatsite"
    expect(page.locator(f'[data-conversation-id="{conversation.pk}"] a')).to_have_text(title)
    assert_inert(page)
    assert page.locator(".sidebar svg:not([aria-hidden])").count() == 0
    assert errors == []


# The sidebar, errors, and small screens


def test_the_sidebar_scrolls_searches_renames_and_deletes(
    open_chat: Callable[..., Any], chat_edge: LiveEdge
) -> None:
    user = browser_user()
    for index in range(45):
        conversation_create(owner=user, title=f"Trip {index:02}")
    for index in range(3):
        conversation_create(owner=user, title=f"Recipe {index}")
    page, errors = open_chat(chat_edge.url, user)
    links = page.locator(".conversation-link")
    expect(links.first).to_have_text("Recipe 2")
    expect(links).not_to_have_count(0)
    assert links.count() in (20, 40), "the first pages only, twenty at a time"

    # Scroll to the end until the next page shows: a scroll that lands while the previous
    # page is still loading is ignored by the sidebar, so one scroll per page is not enough.
    count = links.count()

    def next_page_shown() -> bool:
        if links.count() != count:
            return True
        page.locator("#conversation-nav").evaluate("(nav) => { nav.scrollTop = nav.scrollHeight; }")
        return False

    while count < 48:
        wait_until(
            next_page_shown, every=0.1, what=f"the sidebar's page after {count} conversations"
        )
        count = links.count()
    titles = links.all_text_contents()
    assert titles == [f"Recipe {i}" for i in (2, 1, 0)] + [
        f"Trip {i:02}" for i in range(44, -1, -1)
    ]

    page.get_by_label("Search conversations").fill("recipe")
    expect(links).to_have_count(3)
    renamed = Conversation.objects.get(owner=user, title="Recipe 1")
    item = page.locator(f'[data-conversation-id="{renamed.pk}"]')
    item.hover()
    item.get_by_role("button", name="Rename “Recipe 1”").click()
    item.get_by_label("New title").fill("Best bread recipe")
    item.get_by_label("New title").press("Enter")
    expect(item.locator(".conversation-link")).to_have_text("Best bread recipe")
    renamed.refresh_from_db()
    assert renamed.title == "Best bread recipe"

    item.locator(".conversation-link").click()
    expect(page.locator("#conversation-title")).to_have_text("Best bread recipe")
    page.once("dialog", lambda dialog: dialog.accept())
    item.hover()
    item.get_by_role("button", name="Delete “Best bread recipe”").click()
    expect(links).to_have_count(2)
    expect(page.locator("#conversation-title")).to_have_text("New chat")
    assert page.url.endswith("/")
    renamed.refresh_from_db()
    assert renamed.deleted_at is not None
    page.get_by_label("Search conversations").fill("")
    expect(links.first).to_have_text("Recipe 2")
    assert errors == []


def test_api_errors_are_shown_and_the_draft_is_kept(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
) -> None:
    register_workers([scripted_workers(pieces=["Hello."]).url])
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user())
    send(page, "Hi")
    wait_final(answers(page).last)

    too_long = "x" * (settings.MESSAGE_MAX_CHARS + 1)
    page.locator("#prompt").fill(too_long)
    page.locator("#prompt").press("Enter")
    expect(page.locator("#banner")).to_contain_text(
        f"at most {settings.MESSAGE_MAX_CHARS} characters"
    )
    page.get_by_role("button", name="Dismiss the message").click()
    expect(page.locator("#banner")).to_be_hidden()

    # A page that missed the deletion event (the user's event stream is cut, 204 tells
    # EventSource not to reconnect) learns of it from the refused send.
    page.route("**/api/v1/events/stream", lambda route: route.fulfill(status=204))
    page.reload()
    expect(page.locator(".message.user")).to_have_count(1)
    # The page has loaded what it reads of the conversation (the tools menu comes last):
    # deleting it earlier would make those reads 404, which is not what this test is about.
    # (A locator, not wait_for_function: the page's CSP refuses the eval that one runs.)
    expect(page.locator("#tools-list > *, #tools-note:not(:empty)").first).to_be_attached()
    conversation_remove(conversation=Conversation.objects.get())
    send(page, "Are you still there?")
    expect(page.locator("#banner-text")).to_have_text("This conversation was deleted.")
    expect(page.locator("#prompt")).to_have_value("Are you still there?")
    expect(page.locator(".message.user")).to_have_count(1)
    assert [e for e in errors if "400" not in e] == []


def test_a_phone_sized_screen_in_dark_mode_is_usable(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
    screenshots: Path,
) -> None:
    answer_text = (
        "Sure. Here is a **short** example:\n\n"
        "```python\ndef greet(name):\n    return f'Hello, {name}!'\n```\n\n"
        "- It takes a `name`\n- It returns a greeting\n"
    )
    register_workers([scripted_workers(pieces=_pieces(answer_text)).url])
    scheduler()
    user = browser_user()
    conversation_create(owner=user, title="An older chat about sourdough")
    phone = {
        "viewport": {"width": 390, "height": 844},
        "is_mobile": True,
        "has_touch": True,
        "reduced_motion": "reduce",
    }
    page, errors = open_chat(chat_edge.url, user, color_scheme="dark", **phone)

    sidebar = page.locator("#sidebar")
    toggle = page.get_by_role("button", name="Show conversations")
    expect(sidebar).to_be_hidden()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    send(page, "Show me a greeting function.")
    wait_final(answers(page).last)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = page.locator("#composer").bounding_box()
    assert box is not None and box["y"] + box["height"] <= 844 and box["width"] > 300
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(13, 17, 23)", "dark mode follows the system"
    shot(page, screenshots, "phone-dark")

    toggle.click()
    expect(sidebar).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    shot(page, screenshots, "phone-dark-sidebar")
    page.get_by_role("link", name="An older chat about sourdough").click()
    expect(sidebar).to_be_hidden()
    expect(page.locator("#conversation-title")).to_have_text("An older chat about sourdough")

    page.emulate_media(color_scheme="light")
    page.go_back()
    wait_final(answers(page).last)
    shot(page, screenshots, "phone-light")
    assert errors == []


def test_a_desktop_screen_in_dark_mode(
    open_chat: Callable[..., Any],
    chat_edge: LiveEdge,
    scheduler: Callable[..., Any],
    scripted_workers: Callable[..., ScriptedWorker],
    screenshots: Path,
) -> None:
    answer_text = (
        "## Sourdough in short\n\n1. Feed the starter.\n2. Mix, rest, fold.\n3. Bake hot.\n\n"
        "```js\nconst loaf = bake({ hydration: 0.75 });\n```\n\n> Patience is the secret.\n"
    )
    register_workers([scripted_workers(pieces=_pieces(answer_text)).url])
    scheduler()
    page, errors = open_chat(chat_edge.url, browser_user(), color_scheme="dark")
    send(page, "How do I bake sourdough?")
    answer = answers(page).last
    wait_final(answer)
    expect(answer.locator("h2")).to_have_text("Sourdough in short")
    expect(answer.locator("ol > li")).to_have_count(3)
    expect(answer.locator("blockquote")).to_have_text("Patience is the secret.")
    expect(answer.locator(".code-block .code-head")).to_contain_text("js")
    page.locator(".message.user .message-body").last.hover()
    page.locator("#prompt").focus()
    shot(page, screenshots, "desktop-dark")
    assert errors == []
