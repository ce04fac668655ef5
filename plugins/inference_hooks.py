"""The plugins' subscription to the inference plane: completed answers are indexed for
`conversation_search`, with the question they answer."""

from __future__ import annotations

from conversations.finish import answer_status
from conversations.models import Message
from conversations.selectors import question_of
from inference.hooks import InferenceHooks, Outcome
from inference.models import Generation

from .tasks import search_index_schedule


class SearchIndexHooks(InferenceHooks):
    """A completed answer and its question are embedded after commit."""

    def generation_finishing(self, *, generation: Generation, outcome: Outcome) -> None:
        if answer_status(outcome) != Message.Status.COMPLETE:
            return
        search_index_schedule(message_id=generation.message_id)
        question = question_of(message_id=generation.message_id)
        if question is not None:
            search_index_schedule(message_id=question)
