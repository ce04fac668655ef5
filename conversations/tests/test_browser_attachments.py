"""Attachments in a real browser (headless Debian Chromium, driven by Playwright) against a
live edge: files chosen with the composer's Attach button, a refused one shown with its
reason, and the sent message showing its files. No model is needed: the answer stays queued.

Every check is on what the user sees; the database is asked only to confirm it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Attachment, Message
from conversations.services import conversation_create
from inference.tests.fixtures import LiveEdge

from .attachment_files import PNG_BYTES, pdf_with_text
from .browser_conftest import browser_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def choose_files(page: Any, paths: list[Path]) -> None:
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach text, Markdown or PDF files").click()
    chooser.value.set_files([str(path) for path in paths])


def test_files_attached_in_the_composer_go_with_the_message_and_a_refused_one_says_why(
    open_chat: Callable[..., Any], chat_edge: LiveEdge, tmp_path: Path
) -> None:
    user = browser_user()
    conversation = conversation_create(owner=user, title="Reading")
    notes = tmp_path / "notes.md"
    notes.write_text("# Plan\n\nThe meeting moved to <b>Thursday</b>.\n", encoding="utf-8")
    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_with_text("Quarterly report", "Revenue grew by nine percent."))
    disguised = tmp_path / "photo.txt"
    disguised.write_bytes(PNG_BYTES)

    page, errors = open_chat(chat_edge.url, user)
    page.locator(f'[data-conversation-id="{conversation.pk}"] .conversation-link').click()
    expect(page.locator("#conversation-title")).to_have_text("Reading")

    choose_files(page, [notes, report, disguised])
    tray = page.get_by_role("list", name="Files to send")
    chips = tray.locator(".attachment-chip")
    expect(chips.locator(".attachment-name")).to_have_text(["notes.md", "report.pdf", "photo.txt"])
    # Ready once uploaded, read and embedded (the edge embeds a small file in the request):
    # within the page's budget for a slow machine (browser_conftest.page_budget_ms).
    expect(tray.locator('[data-state="ready"]')).to_have_count(2)
    refused = tray.locator('[data-state="refused"]')
    expect(refused.get_by_role("alert")).to_contain_text("neither UTF-8 text nor a PDF")
    expect(chips.first.locator(".attachment-size")).to_have_text(f"{notes.stat().st_size} B")

    # A refused file stops the send until it is removed.
    page.get_by_role("textbox", name="Message").fill("What do these say?")
    page.get_by_role("button", name="Send the message").click()
    expect(page.locator("#banner-text")).to_contain_text("Some files were refused (photo.txt)")
    assert not Message.objects.filter(conversation=conversation, role="user").exists()

    page.get_by_role("button", name="Remove photo.txt").click()
    expect(chips).to_have_count(2)
    page.get_by_role("button", name="Send the message").click()

    sent = page.locator(".message.user").get_by_role("list", name="Attached files")
    expect(sent.locator(".attachment-name")).to_have_text(["notes.md", "report.pdf"])
    expect(tray).to_be_hidden()
    link = sent.get_by_role("link", name="report.pdf")
    href = link.get_attribute("href") or ""
    assert href.endswith("/content")
    # The chip's link downloads the file as it was uploaded, with the page's own session.
    download = page.request.get(href)
    assert download.status == 200
    assert download.body() == report.read_bytes()
    # The message's text is text, never markup, and the file's name is text too.
    expect(page.locator(".message.user .message-body")).to_have_text("What do these say?")

    message = Message.objects.get(conversation=conversation, role="user")
    stored = Attachment.objects.filter(conversation=conversation).order_by("position")
    assert [(a.name, a.message_id) for a in stored] == [
        ("notes.md", message.pk),
        ("report.pdf", message.pk),
    ]
    # The refused upload answered 415, which the browser logs; nothing else went wrong.
    assert [e for e in errors if "415" not in e] == []


def test_a_new_chat_uploads_its_files_once_it_exists(
    open_chat: Callable[..., Any], chat_edge: LiveEdge, tmp_path: Path
) -> None:
    user = browser_user()
    notes = tmp_path / "todo.txt"
    notes.write_text("Buy milk.\n", encoding="utf-8")

    page, errors = open_chat(chat_edge.url, user)
    choose_files(page, [notes])
    tray = page.get_by_role("list", name="Files to send")
    expect(tray.locator('[data-state="waiting"] .attachment-name')).to_have_text(["todo.txt"])
    page.get_by_role("textbox", name="Message").fill("Summarise my list")
    page.get_by_role("button", name="Send the message").click()

    sent = page.locator(".message.user").get_by_role("list", name="Attached files")
    expect(sent.locator(".attachment-name")).to_have_text(["todo.txt"])
    attachment = Attachment.objects.get(conversation__owner=user)
    assert attachment.message is not None and attachment.text == "Buy milk.\n"
    assert errors == []
