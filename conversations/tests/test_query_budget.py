"""How many SQL statements a turn costs, held to a budget (Django's query capture): a send,
an edit and a regeneration each, and a `/v1` request (a new conversation with its messages),
for a caller who has sent before (the plan, the key and the pool are read as on any later
turn: from what the process keeps). Lower a budget when a change saves statements; a change
that needs more must say why here."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.services import api_key_create
from billing.ledger import ledger_flush
from billing.models import UsageEvent
from billing.selectors import default_plan
from chatsite import catalog
from chatsite.redis import sync_redis
from conversations.models import Conversation
from conversations.services import conversation_organize, folder_create
from inference import queue
from inference.models import Generation
from inference.services import generation_finish, pool_named
from inference.tokens import count_tokens, pool_tokenizer

from .factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db

API = "/api/v1/conversations"
# Measured when set (27, 28 and 26 before a sanction check went from two statements to one,
# 26, 27 and 25 before the plan of a user without a subscription took one statement, not two,
# 25, 26 and 24 before the plan, its pools and the pool were kept per process by
# `chatsite.catalog`, 22, 23 and 21 before the tree change wrote the new messages in one
# statement and handed its branch on instead of each step reading it again, 18, 19 and 19
# before token counts were written with the rows: a system prompt's with its conversation, a
# user message's with it, an answer's with its final text, where the context counted and
# updated them one by one on the next turn, 16, 17 and 17 before an account's standing was
# kept per process with the catalog: a send reads no sanction, 15, 16 and 16 before the API
# key was kept per process with its user: a request with a key it has seen reads none, 14, 15
# and 15 before the tree change took no savepoint inside the turn's transaction, 12, 13 and
# 13 before the tree change wrote its messages, the pointers along the branch and the
# conversation in one statement, and read whether an answer is in progress with the path,
# 9, 10 and 10 before the conversation's lock was taken by the path's read, with the
# summaries through the path, and the write itself refused a turn while an answer is in
# progress, 7, 8 and 8 before the tool switches were read only of a conversation whose row
# says one is on). A send is then four statements and the transaction's two (SAVEPOINT and
# RELEASE here, BEGIN and COMMIT in production): the conversation as its owner's, the lock
# with the path, the tree write, the generation.
SEND_BUDGET = 6
EDIT_BUDGET = 7
REGENERATE_BUDGET = 7
# The end of a kept answer whose worker reported its usage, as the scheduler writes it,
# BEGIN and COMMIT counted: its final state with its conversation (one UPDATE ...
# RETURNING) and the answer's text in one transaction; its usage event goes to the ledger's
# outbox, written in batches by the replica's flush (8 while the generation was read with a
# lock first, then updated; 7 while the usage event was written in a transaction of its own).
FINISH_BUDGET = 4
# One transaction: the conversation, all its messages in one statement, the generation (26
# when the conversation was created on its own first, and its messages written and read back
# as a send does; 8 while the sanction check read the database; 7 while each request read
# its key; 6 while the tool switches were read of a conversation with none on).
V1_BUDGET = 5
# A key that keeps nothing: no statement at all (7 while the conversation was written and
# removed again once answered, plus that removal's own statements; 1 while each request read
# its key).
UNKEPT_V1_BUDGET = 0
# The sidebar's page (the page of conversations) whatever its filters and however many rows,
# and one more for a folder filter (the folder, fetched as its owner's); one more each while
# every request read its key.
SIDEBAR_BUDGET = 1
SIDEBAR_FOLDER_BUDGET = 2
# Search: one statement for the page with its ranks and snippets (2 while every request read
# its key).
SEARCH_BUDGET = 1


@pytest.fixture(autouse=True)
def _no_foreign_catalog_change(own_catalog_version: None) -> None:
    """The catalog (plans, pools, moderation's thresholds and rules) is read again when
    another process of the suite changes it: this test's own version (`own_catalog_version`)
    keeps such a reload out of the measured request."""


@pytest.fixture
def conversation(user: Any, api_client: APIClient) -> Conversation:
    # Started through the API, as a client does (its system prompt counted as it is written).
    created = api_client.post(API, {"system_prompt": "You are a helpful assistant."})
    assert created.status_code == 201, created.content
    conversation = Conversation.objects.get(pk=created.json()["id"])
    # A first turn elsewhere, so that what a first request alone pays is not counted.
    warm = ConversationFactory.create(owner=user)
    assert api_client.post(f"{API}/{warm.pk}/messages", {"content": "hi"}).status_code == 201
    return conversation


def counted(conversation: Conversation) -> None:
    """Token counts on every message, as the service writes them (a message's with it, an
    answer's with its final text): the factories leave them to be counted later."""
    tokenizer = pool_tokenizer(pool_named(model=conversation.model))
    for message in conversation.messages.filter(content_tokens__isnull=True):
        message.content_tokens = count_tokens(tokenizer, message.content)
        message.save(update_fields=["content_tokens"])


def statements(call: Any, *, status: int = 201) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = call()
    assert response.status_code == status, response.content
    return len(captured.captured_queries), [q["sql"][:160] for q in captured.captured_queries]


def test_a_send_stays_within_its_budget(api_client: APIClient, conversation: Conversation) -> None:
    count, sql = statements(
        lambda: api_client.post(f"{API}/{conversation.pk}/messages", {"content": "hello"})
    )
    assert count <= SEND_BUDGET, "\n".join(sql)


def test_a_send_reads_each_catalog_version_once(
    api_client: APIClient, conversation: Conversation, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    read = catalog._current_version

    def counted(key: str = catalog.VERSION_KEY) -> str | None:
        reads.append(key)
        return read(key)

    monkeypatch.setattr(catalog, "_current_version", counted)
    sent = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "Name a bread."})
    assert sent.status_code == 201, sent.content
    # The plan, its pools, the pool, the user's standing, the key: one read of each version.
    assert reads and len(reads) == len(set(reads)), reads


def test_an_edit_stays_within_its_budget(api_client: APIClient, conversation: Conversation) -> None:
    question, _ = exchange(conversation, "one", answer="an answer")
    counted(conversation)
    count, sql = statements(
        lambda: api_client.post(
            f"{API}/{conversation.pk}/messages/{question.pk}/edit", {"content": "uno"}
        )
    )
    assert count <= EDIT_BUDGET, "\n".join(sql)


def test_a_regeneration_stays_within_its_budget(
    api_client: APIClient, conversation: Conversation
) -> None:
    _, answer = exchange(conversation, "one", answer="an answer")
    counted(conversation)
    count, sql = statements(
        lambda: api_client.post(f"{API}/{conversation.pk}/messages/{answer.pk}/regenerate")
    )
    assert count <= REGENERATE_BUDGET, "\n".join(sql)


# Committed for real, as the scheduler's finish is (no test transaction's savepoints).
@pytest.mark.django_db(transaction=True)
def test_a_finish_stays_within_its_budget(
    api_client: APIClient, conversation: Conversation
) -> None:
    sent = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "Name a bread."})
    assert sent.status_code == 201, sent.content
    generation_id = sent.json()["generation"]["id"]
    # The warm-up turn's answer ends first: what the process keeps (the pool, its price) is
    # read then, as it is for any finish but a process's first.
    warm = Generation.objects.exclude(pk=generation_id).get()
    generation_finish(generation_id=warm.pk, status="complete", text="Hi.", output_tokens=2)

    # The scheduler holds the job it ran.
    job = queue.read_job(sync_redis(), generation_id)
    assert job is not None, "its job is queued"

    with CaptureQueriesContext(connection) as captured:
        finished = generation_finish(
            generation_id=generation_id,
            status="complete",
            text="Sourdough.",
            finish_reason="stop",
            prompt_tokens=30,
            output_tokens=4,
            job=job,
        )

    assert finished
    sql = [q["sql"][:160] for q in captured.captured_queries]
    assert len(sql) <= FINISH_BUDGET, "\n".join(sql)
    answer = conversation.messages.get(generation__pk=generation_id)
    assert (answer.content, answer.status) == ("Sourdough.", "complete")
    # Its usage event waits in the ledger's outbox for the replica's flush a second later.
    assert not UsageEvent.objects.filter(generation_id=generation_id).exists()
    assert ledger_flush() >= 1
    event = UsageEvent.objects.get(generation_id=generation_id)
    assert (event.prompt_tokens, event.output_tokens, event.status) == (30, 4, "complete")
    generation = Generation.objects.get(pk=generation_id)
    assert (generation.status, generation.finish_reason) == ("complete", "stop")
    assert generation.output_tokens == answer.output_tokens == 4
    # Final once: a second finish writes nothing.
    assert not generation_finish(generation_id=generation_id, status="failed", text="")
    assert Generation.objects.get(pk=generation_id).status == "complete"


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "an answer"},
    {"role": "user", "content": "two"},
]


def v1_asker(user: Any, *, keep: bool) -> Any:
    default_plan()  # made by the first request otherwise: a catalog change, read again after
    raw_key = api_key_create(user=user, name="v1", store_conversations=keep)[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")

    def ask() -> Any:
        # Streamed: the view answers once the turn is queued (the stream is not read here).
        body = {"model": "smollm2-135m", "messages": HISTORY, "stream": True}
        return client.post("/v1/chat/completions", body, "application/json")

    return ask


# Committed for real: the view gives its connection back once the turn is queued.
@pytest.mark.django_db(transaction=True)
def test_a_v1_request_stays_within_its_budget(user: Any) -> None:
    ask = v1_asker(user, keep=True)
    assert ask().status_code == 200
    count, sql = statements(ask, status=200)
    assert count <= V1_BUDGET, "\n".join(sql)
    conversation = Conversation.objects.filter(owner=user).order_by("-created_at").first()
    assert conversation is not None
    # Written whole: root, the three turns, the placeholder as the leaf, tokens counted.
    branch = list(conversation.messages.order_by("created_at"))
    assert [m.role for m in branch] == ["system", "user", "assistant", "user", "assistant"]
    assert conversation.current_leaf_id == branch[-1].pk
    assert [m.parent_id for m in branch[1:]] == [m.pk for m in branch[:-1]]
    assert [m.current_child_id for m in branch[:-1]] == [m.pk for m in branch[1:]]
    assert all(m.content_tokens for m in branch[:-1]) and branch[-1].content_tokens is None


def test_token_counts_are_written_with_the_rows(
    api_client: APIClient, conversation: Conversation
) -> None:
    """What the budgets above rely on: no turn counts and updates an earlier message."""
    tokenizer = pool_tokenizer(pool_named(model=conversation.model))
    root = conversation.messages.get(role="system")
    assert root.content_tokens == count_tokens(tokenizer, root.content)

    sent = api_client.post(f"{API}/{conversation.pk}/messages", {"content": "Name a bread."})
    assert sent.status_code == 201, sent.content
    question = conversation.messages.get(pk=sent.json()["user_message"]["id"])
    assert question.content_tokens == count_tokens(tokenizer, "Name a bread.")

    generation_id = sent.json()["generation"]["id"]
    generation_finish(
        generation_id=generation_id, status="complete", text="Sourdough.", finish_reason="stop"
    )
    answer = conversation.messages.get(generation__pk=generation_id)
    assert answer.content_tokens == count_tokens(tokenizer, "Sourdough.")


@pytest.mark.parametrize(
    ("params", "budget"),
    [
        ({}, SIDEBAR_BUDGET),
        ({"pinned": "true"}, SIDEBAR_BUDGET),
        ({"archived": "true"}, SIDEBAR_BUDGET),
        ({"folder": "none"}, SIDEBAR_BUDGET),
        ({"folder": "work"}, SIDEBAR_FOLDER_BUDGET),
    ],
)
def test_a_sidebar_page_stays_within_its_budget(
    api_client: APIClient, user: Any, params: dict[str, Any], budget: int
) -> None:
    work = folder_create(owner=user, name="Work")
    for number in range(12):
        conversation = ConversationFactory.create(owner=user)
        conversation_organize(
            conversation=conversation,
            folder=work if number % 2 else None,
            pinned=number % 3 == 0,
            archived=number % 4 == 0,
        )
    if params.get("folder") == "work":
        params = {"folder": str(work.pk)}
    first = api_client.get(API, {**params, "limit": 2})
    assert first.json()["results"] and first.json()["next_cursor"], first.content
    # A page deep in the list costs what the first one does.
    count, sql = statements(
        lambda: api_client.get(API, {**params, "limit": 2, "cursor": first.json()["next_cursor"]}),
        status=200,
    )
    assert count <= budget, "\n".join(sql)


def test_a_search_page_stays_within_its_budget(api_client: APIClient, user: Any) -> None:
    for number in range(6):
        exchange(ConversationFactory.create(owner=user), f"heron {number}", answer="heron")
    assert api_client.get("/api/v1/search", {"q": "warm"}).status_code == 200
    count, sql = statements(
        lambda: api_client.get("/api/v1/search", {"q": "heron", "limit": "5"}), status=200
    )
    assert count <= SEARCH_BUDGET, "\n".join(sql)


@pytest.mark.django_db(transaction=True)
def test_a_v1_request_of_a_key_that_keeps_nothing_makes_no_statement(user: Any) -> None:
    ask = v1_asker(user, keep=False)
    assert ask().status_code == 200
    count, sql = statements(ask, status=200)
    assert count <= UNKEPT_V1_BUDGET, "\n".join(sql)
    assert not Conversation.objects.filter(owner=user).exists()
