"""`message_data`, the send's answer built without DRF's fields, says what `MessageSerializer`
says of every kind of message, to the byte of its JSON."""

from __future__ import annotations

import pytest
from rest_framework.renderers import JSONRenderer

from conversations.api.serializers import MessageSerializer, message_data
from conversations.models import Attachment, Message
from conversations.services import message_send

from .factories import ConversationFactory, exchange, finish, sent

pytestmark = pytest.mark.django_db


def _same(message: Message) -> None:
    message.refresh_from_db()
    render = JSONRenderer().render
    assert render(message_data(message)) == render(MessageSerializer(message).data)


def test_a_turns_messages_read_the_same_as_the_serializers() -> None:
    conversation = ConversationFactory.create()
    user_message, placeholder = sent(message_send(conversation=conversation, content="Hi"))
    _same(user_message)
    _same(placeholder)
    finish(placeholder)
    asked, answered = exchange(conversation, "And then?")
    _same(asked)
    _same(answered)
    _same(Message.objects.get(conversation=conversation, role=Message.Role.SYSTEM))


def test_routes_tool_calls_tools_blocked_answers_and_files_read_the_same() -> None:
    conversation = ConversationFactory.create()
    user_message, answer = exchange(conversation, "Look it up")
    answer.metadata = {
        "route": {"model": "small", "reason": "high_demand", "notice": "Busy."},
        "tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": '{"q": 1}'}}],
    }
    answer.prompt_tokens, answer.output_tokens, answer.model = 12, 7, "big"
    answer.save()
    _same(answer)
    answer.status = Message.Status.BLOCKED
    answer.save()
    _same(answer)
    tool = Message.objects.create(
        conversation=conversation,
        parent=answer,
        role=Message.Role.TOOL,
        content="42",
        metadata={"tool_call_id": "c1", "name": "search", "ok": False},
    )
    _same(tool)
    for position, name in enumerate(["a.txt", "b.md"]):
        Attachment.objects.create(
            conversation=conversation,
            message=user_message,
            name=name,
            kind=Attachment.Kind.TEXT,
            size=3,
            data=b"abc",
            text="abc",
            position=position,
        )
    user_message.metadata = {Attachment.METADATA_KEY: ["a.txt", "b.md"]}
    user_message.save()
    _same(user_message)
