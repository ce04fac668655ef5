"""`chatsite.rows.one`: a row read with fixed SQL is the instance the ORM would build."""

from __future__ import annotations

from typing import Any

import pytest
from django.forms.models import model_to_dict

from chatsite import rows
from conversations.models import Conversation, Message
from conversations.tests.factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db


def _fields(instance: Any) -> dict[str, Any]:
    return {
        field.attname: getattr(instance, field.attname)
        for field in type(instance)._meta.concrete_fields
    }


def test_a_row_reads_as_the_orms_instance_json_fields_included() -> None:
    conversation = ConversationFactory.create()
    _, answer = exchange(conversation, "Hello")
    answer.metadata = {"route": {"model": "small"}, "list": [1, 2]}
    answer.save()

    read = rows.one(Message, "id = %s", [answer.pk])
    assert read is not None and not read._state.adding
    assert _fields(read) == _fields(Message.objects.get(pk=answer.pk))
    assert read.metadata == {"route": {"model": "small"}, "list": [1, 2]}
    kept = rows.one(
        Conversation, "id = %s AND owner_id = %s", [conversation.pk, conversation.owner_id]
    )
    assert kept is not None
    assert model_to_dict(kept) == model_to_dict(Conversation.objects.get(pk=conversation.pk))


def test_no_row_is_none() -> None:
    conversation = ConversationFactory.create()
    assert rows.one(Conversation, "id = %s AND owner_id = %s", [conversation.pk, -1]) is None


def test_an_inserted_row_reads_back_as_the_instance_that_was_inserted() -> None:
    conversation = ConversationFactory.create()
    _, placeholder = exchange(conversation, "Hello")
    fresh = Message(
        conversation=conversation,
        parent=placeholder,
        role=Message.Role.USER,
        content="Again",
        metadata={"attachments": ["a.txt"]},
    )
    inserted = rows.insert(fresh)
    assert inserted is fresh and not fresh._state.adding and fresh.created_at is not None
    assert _fields(Message.objects.get(pk=fresh.pk)) == _fields(fresh)


def test_an_insert_needs_its_primary_key() -> None:
    conversation = ConversationFactory.create()
    message = Message(conversation=conversation, role=Message.Role.USER, content="x")
    message.pk = None
    with pytest.raises(ValueError, match="primary key"):
        rows.insert(message)
