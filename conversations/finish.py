"""The way out of a turn: what the conversation keeps of an answer the inference plane served.

`ConversationHooks` subscribes to `inference.hooks` (`settings.INFERENCE_HOOKS`). The final
text is written once, in the transaction that makes the generation final (never per token);
tool rounds are written onto the answer's branch as the scheduler runs them; the first
completed exchange asks for the conversation's title after commit, and every completed
answer in the web chat for memory suggestions from its question.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from inference.hooks import InferenceHooks, Outcome
from inference.models import Generation
from inference.services import CONTENT_FILTER, generation_lock_unfinished
from inference.tokens import count_tokens, pool_tokenizer

from .models import Conversation, Message
from .services import answers_set_route
from .tasks import memory_request_after_answer, title_request_after_answer

_MESSAGE_STATUS = {
    Generation.Status.COMPLETE: Message.Status.COMPLETE,
    Generation.Status.CANCELLED: Message.Status.CANCELLED,
    Generation.Status.FAILED: Message.Status.FAILED,
    Generation.Status.REJECTED: Message.Status.FAILED,
}


def answer_status(outcome: Outcome) -> str:
    """The status of the assistant message for how its generation ended."""
    if outcome.finish_reason == CONTENT_FILTER:
        # Moderation withdrew it: the text stays for staff, the message is `blocked`.
        return Message.Status.BLOCKED
    return _MESSAGE_STATUS[Generation.Status(outcome.status)]


def answer_write(*, generation: Generation, outcome: Outcome) -> str:
    """Write the answer's final text and status, with its token count (the next turn's
    context reads it instead of counting, and writing, it then); returns the status."""
    status = answer_status(outcome)
    Message.objects.filter(pk=generation.message_id).update(
        content=outcome.text,
        status=status,
        prompt_tokens=outcome.prompt_tokens,
        output_tokens=outcome.output_tokens,
        content_tokens=count_tokens(pool_tokenizer(generation.pool), outcome.text),
        updated_at=timezone.now(),
    )
    return status


def tool_round_write(
    *,
    generation_id: Any,
    text: str,
    tool_calls: list[dict[str, Any]],
    results: list[dict[str, Any]],
) -> bool:
    """Write one round of the tool loop onto the generation's branch; False if it ended.

    The round is the assistant message that made the calls (`text` is what it said before
    them; `metadata["tool_calls"]` the calls in OpenAI's format) and one `tool` message per
    result (`results`: `tool_call_id`, `name`, `content`, `ok`), chained between the user
    message and the answer's placeholder. The placeholder is re-parented under the last
    result, so it stays the leaf and keeps its generation; the `current_child` pointers that
    led to it lead to it again, so later context assembly walks the round in order.
    """
    conversation_id = (
        Generation.objects.filter(pk=generation_id)
        .values_list("conversation_id", flat=True)
        .first()
    )
    if conversation_id is None:
        return False
    with transaction.atomic():
        # Tree writers lock the conversation first; so do we, before the generation.
        conversation = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation_id, deleted_at__isnull=True)
            .first()
        )
        generation = generation_lock_unfinished(generation_id)
        if conversation is None or generation is None:
            return False
        placeholder = Message.objects.select_related("parent").get(pk=generation.message_id)
        parent = placeholder.parent
        if parent is None:
            raise ValueError("an answer's placeholder always has a parent")
        caller = Message.objects.create(
            conversation=conversation,
            parent=parent,
            role=Message.Role.ASSISTANT,
            content=text,
            status=Message.Status.COMPLETE,
            model=placeholder.model,
            metadata={"tool_calls": tool_calls},
            # The calls are part of what the model reads back: count them with the text.
            content_tokens=count_tokens(
                pool_tokenizer(generation.pool), text + json.dumps(tool_calls)
            ),
        )
        chain = [caller]
        for result in results:
            chain.append(
                Message.objects.create(
                    conversation=conversation,
                    parent=chain[-1],
                    role=Message.Role.TOOL,
                    content=result["content"],
                    status=Message.Status.COMPLETE,
                    metadata={
                        "tool_call_id": result["tool_call_id"],
                        "name": result["name"],
                        "ok": result["ok"],
                    },
                )
            )
        for node, child in zip(chain, [*chain[1:], placeholder], strict=True):
            node.current_child = child
        Message.objects.bulk_update(chain, ["current_child"])
        placeholder.parent = chain[-1]
        placeholder.save(update_fields=["parent", "updated_at"])
        if parent.current_child_id == placeholder.pk:
            parent.current_child = caller
            parent.save(update_fields=["current_child", "updated_at"])
    return True


class ConversationHooks(InferenceHooks):
    """The conversation's side of a generation: its message, its tool rounds, its title."""

    def generation_first_token(self, *, generation_id: Any) -> None:
        message_id = Generation.objects.filter(pk=generation_id).values_list(
            "message_id", flat=True
        )
        Message.objects.filter(pk__in=message_id, status=Message.Status.QUEUED).update(
            status=Message.Status.STREAMING, updated_at=timezone.now()
        )

    def generations_routed(self, *, generation_ids: list[str], route: dict[str, str]) -> None:
        answers_set_route(
            answers=Message.objects.filter(generation__pk__in=generation_ids), route=route
        )

    def generation_tool_round(
        self,
        *,
        generation_id: Any,
        text: str,
        tool_calls: list[dict[str, Any]],
        results: list[dict[str, Any]],
    ) -> bool:
        return tool_round_write(
            generation_id=generation_id, text=text, tool_calls=tool_calls, results=results
        )

    def generation_tool_calls(
        self, *, generation_id: Any, tool_calls: list[dict[str, Any]]
    ) -> None:
        with transaction.atomic():
            message = (
                Message.objects.select_for_update()
                .filter(generation__pk=generation_id)
                .only("metadata")
                .first()
            )
            if message is not None:
                message.metadata = {**message.metadata, "tool_calls": tool_calls}
                message.save(update_fields=["metadata", "updated_at"])

    def generation_finishing(self, *, generation: Generation, outcome: Outcome) -> None:
        status = answer_write(generation=generation, outcome=outcome)
        # The first completed exchange gets its conversation a title, after commit.
        title_request_after_answer(conversation=generation.conversation, status=status)
        # Facts about the user in the question, for them to confirm (conversations/memory.py).
        memory_request_after_answer(
            conversation=generation.conversation, answer_id=generation.message_id, status=status
        )
