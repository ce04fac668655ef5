"""Message search: what is found (and what never is), ranking, safe snippets, pages, the
branch a hit opens on, and the index the query uses."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from chatsite.testing import assert_error
from conversations import search
from conversations.models import Message
from conversations.removal import conversation_remove
from conversations.search import message_search, split_marks
from conversations.selectors import active_branch
from conversations.services import conversation_organize, message_edit

from .factories import ConversationFactory, exchange, finish, sent

pytestmark = pytest.mark.django_db

SEARCH = "/api/v1/search"


def found(user: Any, query: str) -> list[str]:
    return [hit.snippet for hit in message_search(user=user, query=query).hits]


def test_user_and_assistant_text_of_the_users_own_live_conversations_is_found(
    user: Any, other_user: Any
) -> None:
    mine = ConversationFactory.create(owner=user, system_prompt="pelican in the system prompt")
    exchange(mine, "Where do pelicans nest?", answer="A pelican nests on islands.")
    theirs = ConversationFactory.create(owner=other_user)
    exchange(theirs, "pelican secrets of someone else")
    archived = ConversationFactory.create(owner=user)
    exchange(archived, "an archived pelican")
    conversation_organize(conversation=archived, archived=True)
    deleted = ConversationFactory.create(owner=user)
    exchange(deleted, "a deleted pelican")
    conversation_remove(conversation=deleted)

    hits = message_search(user=user, query="pelican").hits
    assert sorted(hit.snippet for hit in hits) == [
        "A pelican nests on islands",
        "Re: an archived pelican",
        "an archived pelican",
    ]
    assert {hit.role for hit in hits} == {"assistant", "user"}


def test_a_withheld_answer_is_never_found(user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)
    _, answer = exchange(conversation, "tell me", answer="forbidden walrus text")
    answer.status = Message.Status.BLOCKED
    answer.save(update_fields=["status"])
    assert found(user, "walrus") == []


def test_results_are_ranked_best_first(user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)
    exchange(conversation, "a", answer="Sourdough bread takes many long hours before the starter")
    exchange(conversation, "b", answer="A sourdough starter, then another sourdough starter")
    exchange(conversation, "c", answer="A sourdough starter is a culture of yeast")
    exchange(conversation, "d", answer="Rye bread")
    hits = message_search(user=user, query="sourdough starter").hits
    # Two covers of both words beat one; words close together beat words far apart.
    assert [hit.snippet for hit in hits] == [
        "A sourdough starter, then another sourdough starter",
        "A sourdough starter is a culture of yeast",
        "Sourdough bread takes many long hours before the starter",
    ]
    assert hits[0].rank > hits[1].rank > hits[2].rank


def test_snippets_mark_matches_as_offsets_into_plain_text(user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)
    exchange(conversation, "q", answer="Kiwi & \x02banana\x03 <i>kiwi</i>")
    (hit,) = message_search(user=user, query="kiwi").hits
    # A message cannot forge a match with the delimiters; they never reach the client.
    assert "banana" in hit.snippet and "\x02" not in hit.snippet and "\x03" not in hit.snippet
    assert [hit.snippet[start:end] for start, end in hit.highlights] == ["Kiwi", "kiwi"]


def test_split_marks_turns_delimiters_into_offsets() -> None:
    assert split_marks("a \x02bc\x03 d \x02é\x03") == ("a bc d é", [(2, 4), (7, 8)])


def test_pages_of_results(api_client: APIClient, user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)
    for number in range(5):
        exchange(conversation, f"otter number {number}", answer="fine")
    first = api_client.get(SEARCH, {"q": "otter", "limit": "2"}).json()
    second = api_client.get(SEARCH, {"q": "otter", "limit": "2", "cursor": first["next_cursor"]})
    third = api_client.get(
        SEARCH, {"q": "otter", "limit": "2", "cursor": second.json()["next_cursor"]}
    )
    ids = [
        hit["message_id"]
        for page in (first, second.json(), third.json())
        for hit in page["results"]
    ]
    assert len(ids) == len(set(ids)) == 5
    assert third.json()["next_cursor"] is None


def test_the_api_answers_hits_with_where_they_live(api_client: APIClient, user: Any) -> None:
    conversation = ConversationFactory.create(owner=user, title="Birds")
    question, _ = exchange(conversation, "Tell me about herons", answer="Grey birds.")
    response = api_client.get(SEARCH, {"q": "herons"})
    assert response.status_code == 200, response.content
    (hit,) = response.json()["results"]
    assert hit["message_id"] == str(question.pk)
    assert hit["conversation_id"] == str(conversation.pk)
    assert hit["conversation_title"] == "Birds"
    assert hit["snippet"] == "Tell me about herons"
    assert hit["highlights"] == [[14, 20]]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"q": "   "}, "empty_search"),
        ({"q": "x" * 201}, "search_too_long"),
        ({}, "missing_field"),
        ({"q": "a", "cursor": "!!"}, "invalid_cursor"),
        ({"q": "a", "cursor": "OTk5OTk"}, "invalid_cursor"),
        ({"q": "a", "limit": "many"}, "invalid_limit"),
    ],
)
def test_bad_searches_are_a_400_in_the_error_shape(
    api_client: APIClient, params: dict[str, Any], code: str
) -> None:
    assert_error(api_client.get(SEARCH, params), 400, code)


def test_search_syntax_in_the_query_is_never_an_error(api_client: APIClient, user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)
    exchange(conversation, "quokka")
    for query in ("quokka & | ! (", "'quokka' :*", '"quokka', "-", "or or"):
        assert api_client.get(SEARCH, {"q": query}).status_code == 200, query


def test_a_message_only_on_another_branch_is_found_and_opening_it_switches_the_branch(
    api_client: APIClient, user: Any
) -> None:
    conversation = ConversationFactory.create(owner=user)
    question, _ = exchange(conversation, "first words about capybaras", answer="Rodents.")
    edited, placeholder = sent(message_edit(message=question, content="something else"))
    finish(placeholder, "other answer")
    assert question not in active_branch(conversation=conversation)

    (hit,) = api_client.get(SEARCH, {"q": "capybaras"}).json()["results"]
    assert hit["message_id"] == str(question.pk)
    opened = api_client.post(
        f"/api/v1/conversations/{hit['conversation_id']}/branch",
        {"message_id": hit["message_id"]},
        format="json",
    )
    assert opened.status_code == 200, opened.content
    assert str(question.pk) in [m["id"] for m in opened.json()["messages"]]
    assert str(edited.pk) not in [m["id"] for m in opened.json()["messages"]]


def test_the_search_expression_is_the_one_the_gin_index_holds(user: Any) -> None:
    conversation = ConversationFactory.create(owner=user)
    exchange(conversation, "narwhal")
    # The match exactly as `message_search` spells it; with scans of the whole table ruled
    # out, Postgres can only answer it from the index if the expressions agree.
    matches = Message.objects.annotate(document=search.document()).filter(
        document=search.tsquery("narwhal")
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = matches.explain()
    assert "msg_search_idx" in plan, plan
    assert sorted(m.content for m in matches) == ["Re: narwhal", "narwhal"]
