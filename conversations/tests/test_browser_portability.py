"""Import and export in a real browser (headless Debian Chromium, driven by Playwright)
against a live edge whose imports a real Celery worker runs.

The test writes a ChatGPT-format conversations.json (tests/chatgpt_samples.py), uploads it on
the "Your data" page, watches the progress end, then opens the imported conversation and
switches between its two branches.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation, ImportJob
from inference.tests.fixtures import LiveEdge, start_edge

from . import chatgpt_samples
from .browser_conftest import browser_user
from .celery_worker import broker_url_for_tests, live_celery_worker  # noqa: F401 (a fixture)
from .test_browser import assert_inert

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def import_edge(
    _collected_static: None,
    live_celery_worker: Any,  # noqa: F811 (the fixture)
    django_db_blocker: Any,
    tmp_path: Path,
) -> Iterator[LiveEdge]:
    """An edge that queues its tasks where the test's Celery worker reads them (the session's
    edge queues on REDIS_URL's database, which the suite flushes). Stopped, its database
    sessions gone, before the worker and the test database."""
    broker = broker_url_for_tests()
    edge = start_edge(tmp_path, CELERY_BROKER_URL=broker, CELERY_RESULT_BACKEND=broker)
    yield edge
    with django_db_blocker.unblock():
        edge.stop()


def test_a_chatgpt_export_is_imported_with_progress_and_its_branches_switch(
    open_chat: Callable[..., Any], import_edge: LiveEdge, tmp_path: Path, screenshots: Path
) -> None:
    user = browser_user()
    conversations = chatgpt_samples.export_list()
    # An answer that would run if the page rendered it as HTML.
    conversations[1]["mapping"]["a"]["message"]["content"]["parts"] = [
        "Yes, capybaras swim. <img src=x onerror=window.__xss=1>"
    ]
    export = chatgpt_samples.write_export(tmp_path / "conversations.json", conversations)
    page, errors = open_chat(import_edge.url, user)
    # A chat tab left open meanwhile: its sidebar hears of the import.
    other_tab = page.context.new_page()
    other_tab.goto(f"{import_edge.url}/")
    expect(other_tab.locator("#sidebar-note")).to_have_text("No conversations yet.")

    page.get_by_role("link", name="Your data").click()
    # The page loaded, its script with it: an Import clicked before would post the form itself.
    page.wait_for_url(f"{import_edge.url}/data")
    expect(page.get_by_role("heading", name="Your data")).to_be_visible()
    page.get_by_label("File to import").set_input_files(export)
    page.get_by_role("button", name="Import", exact=True).click()
    expect(page.locator("#import-status")).to_have_text("Imported 2 conversations.")
    progress = page.locator("#import-progress")
    expect(progress).to_have_attribute("max", "2")
    expect(progress).to_have_js_property("value", 2)
    expect(page.get_by_role("list", name="Recent imports").get_by_role("listitem")).to_have_count(1)
    page.screenshot(path=str(screenshots / "import-done.png"))
    job = ImportJob.objects.get(owner=user)
    assert (job.status, job.format, job.imported) == ("done", "chatgpt", 2)
    expect(other_tab.locator("#conversation-list .conversation-link")).to_have_text(
        ["Sourdough starter", "Capybara facts"]
    )
    other_tab.close()

    page.get_by_role("link", name="Open your conversations").click()
    links = page.locator("#conversation-list .conversation-link")
    expect(links).to_have_text(["Sourdough starter", "Capybara facts"])
    links.first.click()
    expect(page.locator("#conversation-title")).to_have_text("Sourdough starter")
    answers = page.locator(".message.assistant .message-body")
    expect(answers.last).to_contain_text("25% of 480 g is 120 g of rye flour.")
    expect(answers.last.locator("strong")).to_have_text("120 g")

    # The edited question: version 2 of 2; the first version is the other branch.
    question = page.locator(".message.user").first
    expect(question.locator(".message-body")).to_have_text(
        "How much rye flour goes into a sourdough starter?"
    )
    expect(question.locator(".branch-position")).to_have_text("2/2")
    question.get_by_role("button", name="Previous version").click()
    question = page.locator(".message.user").first
    expect(question.locator(".message-body")).to_have_text(
        "How often should I feed a sourdough starter?"
    )
    expect(question.locator(".branch-position")).to_have_text("1/2")
    expect(answers.last).to_have_text("Daily, or weekly if it lives in the fridge.")
    question.get_by_role("button", name="Next version").click()
    question = page.locator(".message.user").first
    expect(question.locator(".branch-position")).to_have_text("2/2")
    expect(answers.last).to_contain_text("25% of 480 g")

    # The other conversation's answer is text, never markup.
    links.nth(1).click()
    expect(answers.last).to_contain_text("<img src=x onerror=window.__xss=1>")
    assert_inert(page)

    # Its Export menu downloads the whole tree as JSON.
    page.locator("#export-menu summary").click()
    with page.expect_download() as download:
        page.get_by_role("link", name="Whole conversation (JSON)").click()
    document = json.loads(Path(download.value.path()).read_text())
    capybaras = Conversation.objects.get(owner=user, title="Capybara facts")
    assert document["conversation"]["id"] == str(capybaras.pk)

    # All of the account's data, streamed by the edge as a zip.
    page.get_by_role("link", name="Your data").click()
    with page.expect_download() as download:
        page.get_by_role("link", name="Download all your data").click()
    with zipfile.ZipFile(download.value.path()) as archive:
        names = set(archive.namelist())
        assert f"conversations/{capybaras.pk}.json" in names
        assert len([n for n in names if n.endswith(".md")]) == 2
        assert json.loads(archive.read("account.json"))["username"] == user.username
    assert errors == []


def test_a_malformed_file_shows_its_error_and_imports_nothing(
    open_chat: Callable[..., Any], import_edge: LiveEdge, tmp_path: Path
) -> None:
    user = browser_user()
    broken = tmp_path / "conversations.json"
    broken.write_text('[{"title": "cut short", "mapping": {"a": ')
    page, errors = open_chat(import_edge.url, user)
    page.get_by_role("link", name="Your data").click()
    page.wait_for_url(f"{import_edge.url}/data")  # loaded, its script with it
    page.get_by_label("File to import").set_input_files(broken)
    page.get_by_role("button", name="Import", exact=True).click()
    expect(page.get_by_role("alert")).to_have_text("The file is not valid JSON.")
    expect(page.locator("#import-status")).to_have_text("The import failed: nothing was imported.")
    assert not Conversation.objects.filter(owner=user).exists()
    assert errors == []
