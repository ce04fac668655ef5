"""conversation_search: the caller's own messages, by meaning, with the real MiniLM model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatsite import embeddings
from chatsite.testing import budget
from conversations.models import Message
from conversations.removal import conversation_remove
from conversations.tests.factories import ConversationFactory, exchange
from plugins.builtin import search_index
from plugins.builtin.conversation_search import plugin
from plugins.models import MessageEmbedding
from plugins.sdk import ToolContext, ToolError
from plugins.tasks import search_index_message as index_task
from plugins.tasks import search_index_schedule

pytestmark = pytest.mark.django_db

TIME_LIMIT = budget(60)

(TOOL,) = plugin.tools


def search(user: Any, query: str, conversation: Any = None, **args: Any) -> list[dict]:
    ctx = ToolContext(
        user_id=user.pk,
        conversation_id=str(conversation.pk) if conversation else None,
        config={},
        # A failure point only (half of it for indexing what is pending): loading the model and
        # embedding a few messages take a few seconds at most.
        timeout_seconds=TIME_LIMIT,
    )
    return TOOL.handler(ctx, {"query": query, **args})["results"]


def chat(owner: Any, title: str, question: str, answer: str) -> tuple[Any, Message, Message]:
    conversation = ConversationFactory.create(owner=owner, title=title)
    asked, answered = exchange(conversation, question, answer=answer)
    return conversation, asked, answered


def test_the_relevant_conversation_ranks_first(user) -> None:
    bread, _, _ = chat(
        user,
        "Sourdough",
        "My sourdough loaf came out dense and flat. How long should the dough proof?",
        "Let the dough rise until it has grown by about half, often four to six hours.",
    )
    chat(
        user,
        "Asyncio bug",
        "My Python asyncio task never finishes, the event loop seems blocked.",
        "A blocking call inside a coroutine stalls the loop; run it in a thread.",
    )
    chat(
        user,
        "Taxes",
        "When is the deadline for filing my income tax return?",
        "Usually in mid April, unless you file for an extension.",
    )
    results = search(user, "baking bread that did not rise")
    assert results, "something is found"
    assert results[0]["conversation_id"] == str(bread.pk)
    assert results[0]["conversation_title"] == "Sourdough"
    assert {"message_id", "role", "snippet", "score", "date"} <= set(results[0])
    assert results[0]["score"] > results[-1]["score"] or len(results) == 1


def test_results_never_include_another_users_text(user, other_user) -> None:
    chat(
        other_user,
        "Secret recipe",
        "The secret ingredient of my grandmother's lasagna is nutmeg in the bechamel.",
        "Nutmeg in the bechamel sauce is a classic touch for lasagna.",
    )
    mine, _, _ = chat(
        user,
        "Pasta",
        "What goes into a good lasagna?",
        "Layers of pasta, ragu and bechamel sauce, baked until bubbling.",
    )
    # The other user's rows are indexed too, and they are the closer match to the query.
    search_index.search_index_pending(user_id=other_user.pk)
    assert MessageEmbedding.objects.filter(user=other_user).count() == 2

    results = search(user, "secret ingredient nutmeg in grandmother's lasagna", limit=10)
    assert results
    assert {r["conversation_id"] for r in results} == {str(mine.pk)}
    assert not any("nutmeg" in r["snippet"].lower() for r in results)
    assert not any("grandmother" in r["snippet"].lower() for r in results)

    theirs = search(other_user, "secret ingredient nutmeg", limit=10)
    assert any("nutmeg" in r["snippet"] for r in theirs)


def test_a_tampered_index_row_still_does_not_leak(user, other_user) -> None:
    """Even an index row wrongly carrying the caller's id is checked against the message."""
    _, secret, _ = chat(other_user, "Private", "My bank PIN is hidden in the blue notebook.", "Ok.")
    search_index.search_index_pending(user_id=other_user.pk)
    MessageEmbedding.objects.filter(message=secret).update(user=user)
    assert search(user, "where is my bank PIN", limit=10) == []


def test_deleted_conversations_are_not_searched(user) -> None:
    kept, _, _ = chat(user, "Garden", "How often should I water tomato plants?", "Every two days.")
    gone, _, _ = chat(user, "Garden 2", "Tomato plants wilting in the heat?", "Water at dawn.")
    search_index.search_index_pending(user_id=user.pk)
    conversation_remove(conversation=gone)

    results = search(user, "watering tomatoes", limit=10)
    assert {r["conversation_id"] for r in results} == {str(kept.pk)}
    assert not MessageEmbedding.objects.filter(conversation=gone).exists()


def test_the_current_conversation_is_left_out_unless_asked(user) -> None:
    here, _, _ = chat(user, "Here", "Tell me about the moons of Jupiter.", "Io, Europa, ...")
    there, _, _ = chat(user, "There", "Which planet has the moon Europa?", "Jupiter does.")
    found = {r["conversation_id"] for r in search(user, "Jupiter's moons", conversation=here)}
    assert found == {str(there.pk)}
    found = {
        r["conversation_id"]
        for r in search(user, "Jupiter's moons", conversation=here, include_current=True)
    }
    assert found == {str(here.pk), str(there.pk)}


def test_index_message_takes_finished_user_and_assistant_messages(user) -> None:
    conversation, asked, answered = chat(user, "Chess", "Best chess opening?", "The Italian.")
    root = Message.objects.get(conversation=conversation, role=Message.Role.SYSTEM)
    assert search_index.search_index_message(message_id=asked.pk) is True
    assert search_index.search_index_message(message_id=answered.pk) is True
    assert search_index.search_index_message(message_id=asked.pk) is True  # idempotent
    assert search_index.search_index_message(message_id=root.pk) is False
    row = MessageEmbedding.objects.get(message=asked)
    assert row.user_id == user.pk
    assert row.conversation_id == conversation.pk
    assert row.model_name == embeddings.MODEL_NAME
    vector = embeddings.from_bytes(row.vector)
    assert vector.shape == (embeddings.DIMENSIONS,)
    assert abs(float(vector @ vector) - 1.0) < 1e-4
    assert MessageEmbedding.objects.count() == 2


def test_unfinished_answers_are_not_indexed(user) -> None:
    from conversations.services import message_send

    conversation = ConversationFactory.create(owner=user)
    placeholder = message_send(conversation=conversation, content="A question").placeholder
    assert placeholder.status == Message.Status.QUEUED
    assert search_index.search_index_message(message_id=placeholder.pk) is False
    assert search_index.search_index_pending(user_id=user.pk) == 1  # the question only


def test_the_celery_task_indexes_after_commit(user, django_capture_on_commit_callbacks) -> None:
    _, asked, _ = chat(user, "Task", "Indexed by the task", "Sure.")
    with django_capture_on_commit_callbacks() as callbacks:
        search_index_schedule(message_id=asked.pk)
    assert len(callbacks) == 1
    assert not MessageEmbedding.objects.exists(), "nothing happens before the commit"
    assert index_task.apply(args=(str(asked.pk),)).get() is True
    assert MessageEmbedding.objects.filter(message=asked).exists()


def test_query_time_indexing_is_bounded(user, settings) -> None:
    settings.PLUGINS_SEARCH_LAZY_INDEX_LIMIT = 3
    for n in range(4):
        chat(user, f"C{n}", f"Question number {n} about rivers", f"Answer {n} about rivers")
    search(user, "rivers")
    assert MessageEmbedding.objects.filter(user=user).count() == 3
    search(user, "rivers")
    assert MessageEmbedding.objects.filter(user=user).count() == 6


def test_deleting_a_message_deletes_its_index_row(user) -> None:
    _, asked, _ = chat(user, "Gone", "Forget this", "Done.")
    search_index.search_index_message(message_id=asked.pk)
    Message.objects.filter(pk=asked.pk).delete()
    assert not MessageEmbedding.objects.filter(message_id=asked.pk).exists()


def test_snippets_are_short_and_around_the_match() -> None:
    text = "filler " * 100 + "the quantum entanglement experiment " + "filler " * 100
    extract = search_index.snippet(text, "quantum experiment")
    assert "quantum entanglement" in extract
    assert len(extract) <= search_index.SNIPPET_CHARS + 2
    assert extract.startswith("…") and extract.endswith("…")


@pytest.mark.parametrize(
    "args",
    [
        {"query": ""},
        {"query": "x" * 501},
        {"query": "ok", "limit": 0},
        {"query": "ok", "limit": 11},
    ],
)
def test_bad_arguments_get_clear_errors(user, args) -> None:
    ctx = ToolContext(user_id=user.pk, conversation_id=None, config={}, timeout_seconds=10)
    with pytest.raises(ToolError):
        TOOL.handler(ctx, args)


@pytest.mark.django_db(transaction=True)
def test_through_tool_run_the_caller_is_the_one_searched(user, other_user, settings) -> None:
    """tool_run calls the handler in its own thread (own connection): committed data only."""
    from plugins.services import tool_run

    settings.PLUGINS_TOOL_TIMEOUT_SECONDS = TIME_LIMIT  # as `search` does

    chat(other_user, "Theirs", "My passport number is in the drawer.", "Noted.")
    mine, _, _ = chat(user, "Mine", "Where did I leave my passport?", "In the drawer.")
    result = tool_run(
        user_id=user.pk,
        conversation_id=None,
        name="conversation_search",
        arguments=json.dumps({"query": "passport in the drawer", "limit": 10}),
    )
    assert result.ok, result
    found = json.loads(result.content)["results"]
    assert found
    assert {r["conversation_id"] for r in found} == {str(mine.pk)}
