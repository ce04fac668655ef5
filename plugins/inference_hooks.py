"""The plugins' subscription to the inference plane: completed answers are indexed for
`conversation_search`, with the question they answer.

Only where the index is likely to be asked soon: a web conversation whose owner's plan offers
the tool. Everything else (API conversations, kept or not, and users without the tool) is
indexed when its owner first searches (`search_index_pending`), so no embedding is computed
for an answer nobody will search, nor for a `/v1` conversation removed right after its answer.
"""

from __future__ import annotations

from conversations.finish import answer_status
from conversations.models import Conversation, Message
from conversations.selectors import question_of
from inference.hooks import InferenceHooks, Outcome
from inference.models import Generation

from .selectors import plugin_tool_open_to
from .tasks import search_index_schedule

SEARCH_TOOL = "conversation_search"


class SearchIndexHooks(InferenceHooks):
    """A completed answer and its question are embedded after commit."""

    def generation_finishing(self, *, generation: Generation, outcome: Outcome) -> None:
        if answer_status(outcome) != Message.Status.COMPLETE:
            return
        if generation.conversation.source != Conversation.Source.WEB:
            return
        if not plugin_tool_open_to(user=generation.user, name=SEARCH_TOOL):
            return
        search_index_schedule(message_id=generation.message_id)
        question = question_of(message_id=generation.message_id)
        if question is not None:
            search_index_schedule(message_id=question)
