"""Custom instructions and memory: the services, the context they make, the suggestion task
(a real Celery worker asking a stand-in small model), deletion with the source
conversation, and the API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework.test import APIClient

from billing.tests.factories import subscribe
from chatsite.errors import ServiceError
from chatsite.redis import sync_redis
from chatsite.testing import assert_error
from conversations.context import (
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_OVERHEAD_TOKENS,
    assemble_context,
    count_tokens,
    load_tokenizer,
)
from conversations.memory import (
    INSTRUCTIONS_HEADER,
    MEMORY_HEADER,
    SUGGEST_INSTRUCTION,
    memory_suggest,
    parse_suggestions,
    personal_preamble,
)
from conversations.models import Conversation, MemoryFact
from conversations.removal import conversation_remove
from conversations.selectors import active_branch
from conversations.services import (
    conversation_create,
    memory_fact_add,
    memory_fact_edit,
    memory_suggestion_confirm,
    memory_suggestion_dismiss,
    memory_suggestions_add,
    message_send,
    personalization_update,
)
from conversations.turns import Turn, turn_send
from inference import queue
from inference.services import generation_finish
from inference.tests.fixtures import register_pool

from .celery_worker import live_celery_worker, wait_until  # noqa: F401 (a fixture)
from .factories import ConversationFactory, exchange, sent

pytestmark = pytest.mark.django_db

API = "/api/v1"
SUGGESTED = "- The user lives in Lyon.\n- The user is a night-shift nurse.\nthat is all"


def _texts(facts: list[MemoryFact]) -> list[str]:
    return [fact.text for fact in facts]


# Services.


def test_instructions_are_trimmed_capped_and_refuse_control_characters(
    user: User, settings: Any
) -> None:
    settings.INSTRUCTIONS_MAX_CHARS = 23
    saved = personalization_update(user=user, instructions="  Be brief.\r\nUse SI units. ")
    assert saved.instructions == "Be brief.\nUse SI units."
    with pytest.raises(ServiceError) as too_long:
        personalization_update(user=user, instructions="x" * 24)
    assert too_long.value.code == "instructions_too_long"
    with pytest.raises(ServiceError) as control:
        personalization_update(user=user, instructions="Be\x07 brief")
    assert control.value.code == "invalid_instructions"
    saved.refresh_from_db()
    assert saved.instructions == "Be brief.\nUse SI units."


def test_a_fact_is_one_per_owner_whatever_its_case_and_final_period(user: User) -> None:
    memory_fact_add(owner=user, text="I  live in Lyon.")
    with pytest.raises(ServiceError) as again:
        memory_fact_add(owner=user, text="i live in lyon")
    assert again.value.code == "memory_fact_exists"
    assert again.value.status == 409


def test_facts_are_capped_per_user(user: User, settings: Any) -> None:
    settings.MEMORY_MAX_FACTS = 2
    memory_fact_add(owner=user, text="one")
    memory_fact_add(owner=user, text="two")
    with pytest.raises(ServiceError) as full:
        memory_fact_add(owner=user, text="three")
    assert full.value.code == "too_many_memory_facts"
    (suggestion,) = memory_suggestions_add(
        owner_id=user.pk,
        conversation_id=ConversationFactory.create(owner=user).pk,
        texts=["four"],
    )
    with pytest.raises(ServiceError):
        memory_suggestion_confirm(fact=suggestion)


def test_suggestions_are_deduplicated_against_every_known_fact(user: User) -> None:
    conversation = ConversationFactory.create(owner=user)
    memory_fact_add(owner=user, text="The user has a dog")
    first = memory_suggestions_add(
        owner_id=user.pk,
        conversation_id=conversation.pk,
        texts=["The user has a dog.", "The user bakes", "the user BAKES.", "\x00bad", ""],
    )
    assert _texts(first) == ["The user bakes"]
    memory_suggestion_dismiss(fact=first[0])
    # Dismissed, it is not suggested again; a pending one neither.
    again = memory_suggestions_add(
        owner_id=user.pk, conversation_id=conversation.pk, texts=["The user bakes", "The user rows"]
    )
    assert _texts(again) == ["The user rows"]
    assert (
        memory_suggestions_add(
            owner_id=user.pk, conversation_id=conversation.pk, texts=["the user rows"]
        )
        == []
    )


def test_pending_suggestions_are_capped(user: User, settings: Any) -> None:
    settings.MEMORY_MAX_SUGGESTIONS = 2
    conversation = ConversationFactory.create(owner=user)
    added = memory_suggestions_add(
        owner_id=user.pk, conversation_id=conversation.pk, texts=["a", "b", "c"]
    )
    assert _texts(added) == ["a", "b"]


def test_editing_a_fact_keeps_its_place_and_refuses_a_duplicate(user: User) -> None:
    one = memory_fact_add(owner=user, text="one")
    memory_fact_add(owner=user, text="two")
    memory_fact_edit(fact=one, text="uno")
    assert personal_preamble(user_id=user.pk)[0].content == f"{MEMORY_HEADER}\n- uno\n- two"
    with pytest.raises(ServiceError) as taken:
        memory_fact_edit(fact=one, text="Two.")
    assert taken.value.code == "memory_fact_exists"


def test_the_suggestion_parser_keeps_bulleted_facts_only(settings: Any) -> None:
    settings.MEMORY_SUGGESTIONS_PER_TURN = 2
    assert parse_suggestions(SUGGESTED) == [
        "The user lives in Lyon.",
        "The user is a night-shift nurse.",
    ]
    assert parse_suggestions("NONE") == []
    assert parse_suggestions("- NONE") == []
    assert parse_suggestions("1. a\n2) b\n* c") == ["a", "b"]


# Context: order, budget, prefix.


def _personalised(user: User) -> None:
    personalization_update(user=user, instructions="Answer in French.")
    memory_fact_add(owner=user, text="The user lives in Lyon")
    memory_fact_add(owner=user, text="The user is a nurse")


def test_the_context_is_system_instructions_memory_then_the_turns(user: User) -> None:
    _personalised(user)
    conversation = ConversationFactory.create(owner=user, system_prompt="Be kind.")
    exchange(conversation, "Hi", answer="Bonjour")
    sent(message_send(conversation=conversation, content="Weather?"))
    branch = active_branch(conversation=conversation)[:-1]
    context = assemble_context(
        branch=branch,
        tokenizer=load_tokenizer(str(settings.MODEL_DIR)),
        budget_tokens=4000,
        preamble=personal_preamble(user_id=user.pk),
    )
    assert context.messages == [
        {"role": "system", "content": "Be kind."},
        {"role": "system", "content": f"{INSTRUCTIONS_HEADER}\nAnswer in French."},
        {
            "role": "system",
            "content": f"{MEMORY_HEADER}\n- The user lives in Lyon\n- The user is a nurse",
        },
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "Weather?"},
    ]
    assert context.dropped_preamble == []


def test_memory_goes_before_instructions_when_the_budget_is_short(user: User) -> None:
    _personalised(user)
    conversation = ConversationFactory.create(owner=user, system_prompt="Be kind.")
    exchange(conversation, "Hi", answer="Bonjour")
    sent(message_send(conversation=conversation, content="Weather?"))
    branch = active_branch(conversation=conversation)[:-1]
    tokenizer = load_tokenizer(str(settings.MODEL_DIR))
    preamble = personal_preamble(user_id=user.pk)

    def cost(text: str) -> int:
        return count_tokens(tokenizer, text) + MESSAGE_OVERHEAD_TOKENS

    fixed = REPLY_OVERHEAD_TOKENS + cost("Be kind.") + cost("Weather?")
    # Room for the instructions but not the memory besides: the memory goes, and the old
    # turns with it (they come after the preamble in priority).
    assert cost(preamble[1].content) > 2
    budget = fixed + cost(preamble[0].content) + 2
    context = assemble_context(
        branch=branch, tokenizer=tokenizer, budget_tokens=budget, preamble=preamble
    )
    assert context.messages == [
        {"role": "system", "content": "Be kind."},
        {"role": "system", "content": f"{INSTRUCTIONS_HEADER}\nAnswer in French."},
        {"role": "user", "content": "Weather?"},
    ]
    assert context.dropped_preamble == ["memory"]
    assert context.prompt_tokens == fixed + cost(preamble[0].content)

    # Room for neither: both go, memory first, and the message is still answered.
    context = assemble_context(
        branch=branch, tokenizer=tokenizer, budget_tokens=fixed, preamble=preamble
    )
    assert [m["content"] for m in context.messages] == ["Be kind.", "Weather?"]
    assert context.dropped_preamble == ["memory", "instructions"]


def _job_messages(turn: Turn) -> list[dict[str, Any]]:
    raw = sync_redis().hget(queue.job_key(turn.generation.id), "messages")
    assert raw is not None, "the generation was not queued"
    return list(json.loads(str(raw)))


@pytest.mark.django_db(transaction=True)
@override_settings(MEMORY_SUGGESTIONS=False)
def test_two_successive_turns_share_the_instructions_and_memory_prefix_byte_for_byte(
    user: User,
) -> None:
    subscribe(user, tier="plus")
    _personalised(user)
    conversation = conversation_create(owner=user, system_prompt="Be kind.")
    first = turn_send(user=user, conversation=conversation, content="Hi")
    first_prompt = _job_messages(first)
    generation_finish(generation_id=first.generation.id, status="complete", text="Bonjour")
    second = turn_send(user=user, conversation=conversation, content="Weather?")
    second_prompt = _job_messages(second)

    prefix = json.dumps(first_prompt[:3]).encode()
    assert json.dumps(second_prompt[:3]).encode() == prefix
    assert INSTRUCTIONS_HEADER in first_prompt[1]["content"]
    assert MEMORY_HEADER in first_prompt[2]["content"]
    # The second prompt extends the first: the cached prefix is the whole first prompt.
    assert second_prompt[: len(first_prompt)] == first_prompt


@pytest.mark.django_db(transaction=True)
@override_settings(MEMORY_SUGGESTIONS=False)
def test_a_v1_conversation_gets_neither_instructions_nor_memory(user: User) -> None:
    subscribe(user, tier="plus")
    _personalised(user)
    conversation = conversation_create(
        owner=user, system_prompt="Be kind.", source=Conversation.Source.API
    )
    turn = turn_send(user=user, conversation=conversation, content="Hi")
    assert _job_messages(turn) == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
    ]


# The suggestion task (a real Celery worker; the small model is a stand-in with known facts).


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_suggestions_are_stored_as_suggested_and_told_only_once_confirmed(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers(answer=SUGGESTED)
    register_pool(fake)
    subscribe(user, tier="plus")
    conversation = conversation_create(owner=user)
    turn = turn_send(user=user, conversation=conversation, content="I'm a nurse in Lyon.")
    generation_finish(generation_id=turn.generation.id, status="complete", text="Nice!")

    suggestions = wait_until(
        lambda: list(MemoryFact.objects.filter(owner=user).order_by("text")) or None
    )
    assert suggestions is not None  # (wait_until returns what held)
    assert [(s.text, s.status, s.conversation_id) for s in suggestions] == [
        ("The user is a night-shift nurse.", "suggested", conversation.pk),
        ("The user lives in Lyon.", "suggested", conversation.pk),
    ]
    (request,) = [r for r in fake.requests if r["messages"][0]["content"] == SUGGEST_INSTRUCTION]
    assert request["messages"][1]["content"] == "I'm a nurse in Lyon."
    # Never told to the model before the user confirms.
    assert personal_preamble(user_id=user.pk) == []
    memory_suggestion_confirm(fact=suggestions[1])
    (memory,) = personal_preamble(user_id=user.pk)
    assert memory.content == f"{MEMORY_HEADER}\n- The user lives in Lyon."


def test_no_suggestion_when_the_user_turned_them_off(user: User, fake_workers: Any) -> None:
    fake = fake_workers(answer=SUGGESTED)
    register_pool(fake)
    conversation = ConversationFactory.create(owner=user)
    _, answer = exchange(conversation, "I'm a nurse in Lyon.")
    personalization_update(user=user, memory_suggestions=False)
    assert memory_suggest(answer_id=answer.pk) == []
    assert fake.requests == []
    assert not MemoryFact.objects.exists()
    # Turned on again, the same answer gives its suggestions; asked again, no duplicates.
    personalization_update(user=user, memory_suggestions=True)
    assert len(memory_suggest(answer_id=answer.pk)) == 2
    assert memory_suggest(answer_id=answer.pk) == []
    assert MemoryFact.objects.filter(status="suggested").count() == 2


# Deletion with the source conversation.


@pytest.mark.parametrize("keep_tombstone", [True, False])
def test_deleting_the_conversation_deletes_the_memory_derived_from_it(
    user: User, keep_tombstone: bool
) -> None:
    source, other = ConversationFactory.create(owner=user), ConversationFactory.create(owner=user)
    kept, _pending = memory_suggestions_add(
        owner_id=user.pk, conversation_id=source.pk, texts=["derived", "pending"]
    )
    memory_suggestion_confirm(fact=kept)
    memory_suggestions_add(owner_id=user.pk, conversation_id=other.pk, texts=["elsewhere"])
    memory_fact_add(owner=user, text="typed by the user")

    conversation_remove(conversation=source, keep_tombstone=keep_tombstone)
    assert sorted(MemoryFact.objects.values_list("text", flat=True)) == [
        "elsewhere",
        "typed by the user",
    ]
    # No suggestion can arrive for it afterwards either.
    assert memory_suggestions_add(owner_id=user.pk, conversation_id=source.pk, texts=["x"]) == []


def test_deleting_through_the_api_deletes_the_derived_memory(
    api_client: APIClient, user: User
) -> None:
    source = ConversationFactory.create(owner=user)
    memory_suggestions_add(owner_id=user.pk, conversation_id=source.pk, texts=["derived"])
    assert api_client.delete(f"{API}/conversations/{source.pk}").status_code == 204
    assert not MemoryFact.objects.exists()


# The API.


def test_the_api_sets_instructions_and_lists_memory(api_client: APIClient, user: User) -> None:
    response = api_client.patch(
        f"{API}/personalization",
        {"instructions": "Answer in French.", "memory_suggestions": False},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "instructions": "Answer in French.",
        "memory_suggestions": False,
        "instructions_max_chars": 1500,
    }
    assert api_client.get(f"{API}/personalization").json()["instructions"] == "Answer in French."

    added = api_client.post(f"{API}/memory", {"text": "The user rows"}, format="json")
    assert added.status_code == 201
    fact = added.json()
    assert set(fact) == {"id", "text", "status", "conversation_id", "created_at", "confirmed_at"}
    assert (fact["text"], fact["status"], fact["conversation_id"]) == (
        "The user rows",
        "confirmed",
        None,
    )
    conversation = ConversationFactory.create(owner=user)
    (suggestion,) = memory_suggestions_add(
        owner_id=user.pk, conversation_id=conversation.pk, texts=["The user bakes"]
    )
    listed = api_client.get(f"{API}/memory").json()
    assert [f["text"] for f in listed["facts"]] == ["The user rows"]
    assert [(s["id"], s["conversation_id"]) for s in listed["suggestions"]] == [
        (str(suggestion.pk), str(conversation.pk))
    ]
    assert listed["max_facts"] == 50

    confirmed = api_client.post(f"{API}/memory/{suggestion.pk}/confirm")
    assert confirmed.json()["status"] == "confirmed"
    assert_error(api_client.post(f"{API}/memory/{suggestion.pk}/confirm"), 409, "not_a_suggestion")
    edited = api_client.patch(f"{API}/memory/{fact['id']}", {"text": "Rows daily"}, format="json")
    assert edited.json()["text"] == "Rows daily"
    assert api_client.delete(f"{API}/memory/{fact['id']}").status_code == 204
    assert [f["text"] for f in api_client.get(f"{API}/memory").json()["facts"]] == [
        "The user bakes"
    ]


def test_a_dismissed_suggestion_leaves_the_list(api_client: APIClient, user: User) -> None:
    conversation = ConversationFactory.create(owner=user)
    (suggestion,) = memory_suggestions_add(
        owner_id=user.pk, conversation_id=conversation.pk, texts=["The user bakes"]
    )
    assert api_client.post(f"{API}/memory/{suggestion.pk}/dismiss").status_code == 204
    assert api_client.get(f"{API}/memory").json()["suggestions"] == []
    assert_error(api_client.delete(f"{API}/memory/{suggestion.pk}"), 404, "not_found")


@pytest.mark.parametrize(
    ("call", "status", "code"),
    [
        (lambda c: c.post(f"{API}/memory", {"text": " "}, format="json"), 400, "empty_memory_fact"),
        (lambda c: c.post(f"{API}/memory", {"text": 5}, format="json"), 400, "invalid"),
        (
            lambda c: c.post(f"{API}/memory", {"text": "a\x07b"}, format="json"),
            400,
            "invalid_memory_fact",
        ),
        (
            lambda c: c.post(f"{API}/memory", {"text": "x" * 301}, format="json"),
            400,
            "memory_fact_too_long",
        ),
        (lambda c: c.patch(f"{API}/personalization", {}, format="json"), 400, "nothing_to_update"),
        (
            lambda c: c.patch(
                f"{API}/personalization", {"instructions": "\x1b[31m"}, format="json"
            ),
            400,
            "invalid_instructions",
        ),
    ],
)
def test_bad_input_is_a_4xx_in_the_error_shape(
    api_client: APIClient, call: Any, status: int, code: str
) -> None:
    response = call(api_client)
    assert response.status_code == status, response.content
    assert set(response.json()) == {"error"}
    if code != "invalid":
        assert_error(response, status, code)


def test_another_users_fact_is_not_found(
    api_client: APIClient, other_api_client: APIClient
) -> None:
    fact = api_client.post(f"{API}/memory", {"text": "mine"}, format="json").json()
    for call in (
        lambda: other_api_client.patch(f"{API}/memory/{fact['id']}", {"text": "x"}, format="json"),
        lambda: other_api_client.delete(f"{API}/memory/{fact['id']}"),
        lambda: other_api_client.post(f"{API}/memory/{fact['id']}/confirm"),
        lambda: other_api_client.post(f"{API}/memory/{fact['id']}/dismiss"),
    ):
        assert_error(call(), 404, "not_found")
    assert other_api_client.get(f"{API}/memory").json()["facts"] == []
    assert MemoryFact.objects.get().text == "mine"


def test_session_writes_to_memory_need_csrf(session_client: APIClient) -> None:
    assert session_client.post(f"{API}/memory", {"text": "x"}, format="json").status_code == 403
    refused = session_client.patch(f"{API}/personalization", {"instructions": "x"}, format="json")
    assert refused.status_code == 403
    assert not MemoryFact.objects.exists()
    assert session_client.get(f"{API}/memory").status_code == 200


def test_the_memory_list_stays_within_its_budget(
    api_client: APIClient, user: User, django_assert_max_num_queries: Any
) -> None:
    conversation = ConversationFactory.create(owner=user)
    for index in range(5):
        memory_fact_add(owner=user, text=f"fact {index}")
    memory_suggestions_add(
        owner_id=user.pk, conversation_id=conversation.pk, texts=["s1", "s2", "s3"]
    )
    api_client.get(f"{API}/memory")  # what a first request alone pays is not counted
    # The key, the facts, the suggestions: whatever their number.
    with django_assert_max_num_queries(3):
        response = api_client.get(f"{API}/memory")
    assert len(response.json()["facts"]) == 5


def test_the_settings_page_needs_a_login_and_links_from_the_chat(client: Any, user: User) -> None:
    assert client.get("/settings/").status_code == 302
    client.force_login(user)
    page = client.get("/settings/")
    assert page.status_code == 200
    assert b"js/settings.js" in page.content
    assert b'href="/settings/"' in client.get("/").content
