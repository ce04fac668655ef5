"""Factories for conversations: every tree is built through the services, so it is valid."""

from __future__ import annotations

from typing import Any

import factory

from accounts.tests.factories import UserFactory
from conversations.models import Conversation, Message
from conversations.services import Written, conversation_create, message_send


class ConversationFactory(factory.django.DjangoModelFactory[Conversation]):
    """A conversation with its root system message, made by `conversation_create`."""

    class Meta:
        model = Conversation

    owner = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"Conversation {n}")
    system_prompt = "You are a helpful assistant."

    @classmethod
    def _create(cls, model_class: type[Conversation], *args: Any, **kwargs: Any) -> Conversation:
        return conversation_create(**kwargs)


def sent(written: Written) -> tuple[Message, Message]:
    """The user message and the placeholder a send or an edit wrote."""
    assert written.user_message is not None
    return written.user_message, written.placeholder


def finish(message: Message, content: str = "An answer.") -> Message:
    """Stand in for the inference plane: write an assistant placeholder's final text."""
    message.content = content
    message.status = Message.Status.COMPLETE
    message.save(update_fields=["content", "status", "updated_at"])
    return message


def exchange(
    conversation: Conversation,
    content: str,
    *,
    parent: Message | None = None,
    answer: str | None = None,
) -> tuple[Message, Message]:
    """Send `content` and finish its answer: one full turn of the tree."""
    user_message, placeholder = sent(
        message_send(conversation=conversation, content=content, parent=parent)
    )
    return user_message, finish(placeholder, answer if answer is not None else f"Re: {content}")
