"""Fixtures of the browser tests: Debian's Chromium driven by Playwright against the live stack.

The stack is a real edge (`live_edge`) on the test database, a scheduler subprocess
(Playwright's sync API owns the main thread's event loop, so the scheduler cannot run in it)
and either the real vLLM workers or, where a test is about our page's handling of hostile or
exactly known output, a stand-in worker that sends the text it is given.

Import what a test module uses from here: `from .browser_conftest import ...`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.core.management import call_command

from chatsite.testing import budget, wait_until
from inference import queue
from inference.models import ModelPool, Worker
from inference.tests.fake_worker import FakeWorker
from inference.tests.fixtures import (
    LiveEdge,
    RealWorker,
    test_database_url,
    wait_for_sessions_to_end,
)

__all__ = [
    "PASSWORD",
    "CuttableProxy",
    "ScriptedWorker",
    "_collected_static",
    "browser",
    "browser_user",
    "chat_edge",
    "cuttable_proxy",
    "log_in",
    "open_chat",
    "page_budget_ms",
    "scheduler",
    "screenshots",
    "scripted_workers",
]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
PASSWORD = "correct horse battery staple"


def page_budget_ms() -> float:
    """How long the page is given to show what a test waits for (Playwright's milliseconds)."""
    return budget(60) * 1000


class ScriptedWorker(FakeWorker):
    """A stand-in vLLM worker that streams the given pieces of text, one per chunk.

    With `hold_after=n` it stops after the first n pieces until the test calls `go_on()`, so
    that a test can see what the page shows at that point however slow the machine is.
    """

    def __init__(
        self, *, pieces: list[str], token_delay: float = 0.02, hold_after: int | None = None
    ) -> None:
        self.pieces = list(pieces)
        self.hold_after = hold_after
        self._go_on = threading.Event()
        super().__init__(tokens=len(pieces), token_delay=token_delay)

    def go_on(self) -> None:
        """Let an answer held at `hold_after` pieces go on."""
        self._go_on.set()

    def stop(self) -> None:
        self._go_on.set()
        super().stop()

    def _handler(self) -> Any:
        base: Any = super()._handler()
        worker = self

        class Handler(base):
            def _stream(self, body: dict[str, Any], mode: str) -> None:
                for index, piece in enumerate(worker.pieces):
                    if index == worker.hold_after:
                        # Given up after the budget: the test then fails on what it expected.
                        worker._go_on.wait(budget(120))
                    delta = {"content": piece}
                    self._event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                    time.sleep(worker.token_delay)
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                usage = {
                    "prompt_tokens": 11,
                    "completion_tokens": len(worker.pieces),
                    "total_tokens": 11 + len(worker.pieces),
                }
                self._event({"choices": [], "usage": usage})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

        return Handler


@pytest.fixture
def scripted_workers() -> Iterator[Callable[..., ScriptedWorker]]:
    """Start scripted stand-in workers; each is stopped after the test."""
    started: list[ScriptedWorker] = []

    def start(
        *, pieces: list[str], token_delay: float = 0.02, hold_after: int | None = None
    ) -> ScriptedWorker:
        worker = ScriptedWorker(pieces=pieces, token_delay=token_delay, hold_after=hold_after)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def register_workers(
    urls: list[str],
    *,
    pool_name: str | None = None,
    max_output_tokens: int = 64,
    sampling_defaults: dict[str, Any] | None = None,
) -> ModelPool:
    """Serve `pool_name` (the site's default model unless named) from the workers at `urls`."""
    pool, _ = ModelPool.objects.get_or_create(
        name=pool_name or settings.DEFAULT_MODEL,
        defaults={"served_model": settings.DEFAULT_MODEL},
    )
    pool.max_output_tokens = max_output_tokens
    pool.sampling_defaults = sampling_defaults or {}
    pool.save(update_fields=["max_output_tokens", "sampling_defaults"])
    for url in urls:
        Worker.objects.create(
            pool=pool,
            name=f"{pool.name}-{Worker.objects.count()}",
            url=url,
            state=Worker.State.HEALTHY,
        )
    return pool


def register_real_workers(
    workers: list[RealWorker], *, max_output_tokens: int, lasting: bool = False
) -> ModelPool:
    """The real workers as the default model's pool. `lasting`: every answer is written to
    `max_output_tokens` (the model may not end it sooner), for a test that needs an answer
    still being written a while after it began: a sampled story sometimes ends in 150 tokens."""
    return register_workers(
        [w.url for w in workers],
        max_output_tokens=max_output_tokens,
        sampling_defaults={"min_tokens": max_output_tokens} if lasting else None,
    )


class CuttableProxy:
    """A loopback TCP proxy in front of the edge. `cut()` drops every open connection at once,
    as a failing network does, while new connections still get through."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.connections: set[socket.socket] = set()
        self.cuts = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CuttableProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.close()
        self.cut()

    def cut(self) -> None:
        with self._lock:
            victims = list(self.connections)
        for sock in victims:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.cuts += 1

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections |= {client, upstream}
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        try:
            while True:
                readable, _, _ = select.select(list(peers), [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self.connections -= set(peers)
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def cuttable_proxy(chat_edge: LiveEdge) -> Iterator[CuttableProxy]:
    """The live edge behind a proxy whose connections the test can cut."""
    proxy = CuttableProxy(int(chat_edge.url.rsplit(":", 1)[1])).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def _collected_static() -> None:
    call_command("collectstatic", interactive=False, verbosity=0)


@pytest.fixture
def chat_edge(_collected_static: None, live_edge: LiveEdge) -> LiveEdge:
    """The live edge, started after the static files were collected.

    With DEBUG off, WhiteNoise indexes STATIC_ROOT once, when the edge starts; pytest sets up
    `_collected_static` first because it comes first in this fixture's arguments. Function
    scoped like `live_edge`, whose teardown waits for the edge to be idle before the flush.
    """
    return live_edge


SCHEDULER_DB_APPLICATION = "chatsite-test-scheduler"


def _stack_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": test_database_url(SCHEDULER_DB_APPLICATION),
        "REDIS_URL": settings.REDIS_URL,
        "DEBUG": "0",
        "SCHEDULER_HEALTH_INTERVAL_MS": "250",
        **extra,
    }


@pytest.fixture
def scheduler(
    transactional_db: Any, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start one scheduler replica as a subprocess (`python manage.py run_scheduler`).

    Call it after registering the test's workers; keyword arguments are extra settings
    (environment variables), e.g. `SCHEDULER_MAX_QUEUE_SECONDS="4"`.

    It requests `transactional_db`, so this teardown (the process stopped, and its database
    sessions gone) runs before the test database is flushed.
    """
    started: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "scheduler.log"

    def start(**extra: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_scheduler", "--replica-id", "browser-tests"],
            cwd=settings.BASE_DIR,
            env=_stack_env(**extra),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        redis = queue.sync_redis()

        def up() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the scheduler exited:\n{log.read_text()[-3000:]}")
            return bool(redis.exists(queue.key("replica", "browser-tests")))

        try:
            wait_until(up, within=120, every=0.1, what="the scheduler's start")
        except AssertionError:
            pytest.fail(f"the scheduler did not start:\n{log.read_text()[-3000:]}")
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    # Shown by pytest with a failing test's report.
    print(f"scheduler log ({log}):", *log.read_text().splitlines()[-40:], sep="\n")
    for process in started:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if started:
        wait_for_sessions_to_end(SCHEDULER_DB_APPLICATION)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium (scripts/setup-browser.sh installs it), for one test module.

    Playwright's sync API keeps an event loop marked as running in this thread while it is
    started, so Django would refuse the tests' own ORM calls as "async"; they are plain
    sequential calls here, so that check is switched off while the browser runs, and only then.
    """
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: run scripts/setup-browser.sh"
        if os.environ.get("CHATSITE_E2E_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import expect, sync_playwright

    # Playwright's 5 s for an expectation is short on a 2-core machine whose vLLM workers,
    # edge and scheduler share it with the browser: a page that does what it should, late,
    # would fail. An expectation returns as soon as the page shows what it waits for, so a
    # budget for a slow machine (chatsite.testing) makes no test pass that should fail.
    expect.set_options(timeout=page_budget_ms())
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    finally:
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tests save screenshots of the main states (CHATSITE_SCREENSHOTS, or a temp dir)."""
    folder = os.environ.get("CHATSITE_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def browser_user(username: str | None = None) -> User:
    """A user who can log in to the live edge.

    The suite hashes passwords with MD5 for speed, but the edge runs with the site's own
    hashers, which refuse MD5; so this user's hash is the site's default one.
    """
    hasher = PBKDF2PasswordHasher()
    return User.objects.create(
        username=username or f"browser-{uuid.uuid4().hex[:8]}",
        password=hasher.encode(PASSWORD, hasher.salt()),
    )


def log_in(page: Any, base_url: str, user: User, password: str = PASSWORD) -> None:
    """Log in through the real form and land on the chat page."""
    page.goto(f"{base_url}/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")
    page.locator("#prompt").wait_for()


@pytest.fixture
def open_chat(browser: Any, live_edge: LiveEdge) -> Iterator[Callable[..., tuple[Any, list[str]]]]:
    """Open a fresh browser context logged in as a user on the chat page: returns the page
    and the list its console errors go to. The contexts close after the test.

    It requests `live_edge` although the page is given its URL: the pages' streams must be
    closed before the edge's teardown waits for it to go idle, ahead of the flush.
    """
    contexts: list[Any] = []

    def open_page(base_url: str, user: User, **context_options: Any) -> tuple[Any, list[str]]:
        options = {
            "viewport": {"width": 1280, "height": 860},
            "color_scheme": "light",
            **context_options,
        }
        context = browser.new_context(base_url=base_url, **options)
        # Clicks, fills and navigations wait for their element or page within the same budget.
        context.set_default_timeout(page_budget_ms())
        contexts.append(context)
        page = context.new_page()
        errors = console_errors(page)
        log_in(page, base_url, user)
        return page, errors

    yield open_page
    for context in contexts:
        context.close()


def console_errors(page: Any) -> list[str]:
    """Collect the page's console errors and uncaught exceptions as they happen."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(json.dumps(str(e))))
    return errors
