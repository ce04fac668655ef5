"""Rolling summaries: long branches stay within the context budget, and cheap.

When context assembly has to drop turns no summary covers (`AssembledContext.dropped_messages`),
`tasks.summary_request_if_needed` queues `tasks.summarise_branch` after commit (one at a
time per conversation). The task folds the previous summary and the turns after it, up to a cut
that leaves the newest turns within `SUMMARY_TAIL_PERCENT` of the budget, into a new summary
stored on the branch (`BranchSummary.through_message`). Turns keep being added after the cut,
so the next summary waits until they overflow the budget again: meanwhile every prompt starts
with the same system prompt, first user message and summary, which the worker keeps cached.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction

from chatsite.redis import sync_redis
from inference import queue
from inference.tokens import pool_tokenizer

from . import small_model
from .context import (
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_OVERHEAD_TOKENS,
    _answered_turns,
    count_tokens,
    message_tokens,
)
from .models import BranchSummary, Conversation, Message
from .selectors import message_ancestry

SUMMARY_INSTRUCTION = (
    "You keep the running notes of a conversation between a user and an assistant. Write a "
    "concise summary, at most 150 words, of everything needed to continue it: the user's "
    "goals, facts, names, numbers, decisions and open questions. Plain prose, no preamble."
)
# A request stays claimed this long (the task's hard time limit and its retries fit in it).
PENDING_SECONDS = 600
# Longest quote of one message in the summariser's prompt.
MESSAGE_EXCERPT_CHARS = 4000
_SPEAKERS = {Message.Role.USER: "User", Message.Role.ASSISTANT: "Assistant"}


def summary_for_branch(
    *, branch: Sequence[Message], known: Mapping[Any, BranchSummary] | None = None
) -> BranchSummary | None:
    """The summary reaching deepest into `branch` (root first), if any lies on it. `known`:
    the summaries through the branch's messages by message id, where the caller read them
    with the branch (no statement then)."""
    depth = {message.pk: index for index, message in enumerate(branch)}
    summaries: Iterable[BranchSummary] = (
        BranchSummary.objects.filter(through_message_id__in=list(depth))
        if known is None
        else [summary for pk, summary in known.items() if pk in depth]
    )
    return max(summaries, key=lambda summary: depth[summary.through_message_id], default=None)


def summary_pending_key(conversation_id: Any) -> str:
    return queue.key("summary-pending", conversation_id)


def _cut(older: list[Message], tokenizer: Any, tail_budget: int) -> int:
    """How many of `older` to summarise: the rest, starting with a user turn, fits `tail_budget`."""
    used = 0
    start = len(older)
    for index in range(len(older) - 1, -1, -1):
        used += message_tokens(tokenizer, older[index]) + MESSAGE_OVERHEAD_TOKENS
        if used > tail_budget:
            break
        start = index
    while start < len(older) and older[start].role != Message.Role.USER:
        start += 1
    return start


def _line(message: Message) -> str:
    speaker = _SPEAKERS.get(Message.Role(message.role), message.role.title())
    return f"{speaker}: {message.content[:MESSAGE_EXCERPT_CHARS]}"


def _fit(previous: BranchSummary | None, covered: list[Message], tokenizer: Any, limit: int) -> int:
    """How many of `covered` (whole turns, oldest first) the summariser's window takes.

    What does not fit stays outside the summary, for the next one: nothing is lost.
    """
    used = count_tokens(tokenizer, previous.content) if previous is not None else 0
    fits = 0
    for index, message in enumerate(covered):
        used += count_tokens(tokenizer, _line(message)) + 2
        ends_turn = index + 1 == len(covered) or covered[index + 1].role == Message.Role.USER
        if used > limit:
            break
        if ends_turn:
            fits = index + 1
    if fits == 0:  # one turn longer than the window: its excerpt is all it can take
        fits = next(
            (i for i in range(1, len(covered)) if covered[i].role == Message.Role.USER),
            len(covered),
        )
    return fits


def _transcript(previous: BranchSummary | None, covered: list[Message]) -> str:
    head = f"Summary so far:\n{previous.content}\n\n" if previous is not None else ""
    return f"{head}Conversation to add:\n\n" + "\n\n".join(_line(m) for m in covered)


def branch_summarise(
    *, conversation_id: Any, leaf_message_id: Any, budget_tokens: int
) -> BranchSummary | None:
    """Write the summary of the branch ending at `leaf_message_id`, if one is due.

    Idempotent: a summary already stored through the same cut is returned without asking the
    model again; a deleted conversation or message gets none.
    """
    conversation = Conversation.objects.filter(pk=conversation_id, deleted_at__isnull=True).first()
    if conversation is None:
        return None
    branch = message_ancestry(message_id=leaf_message_id)
    if not branch or branch[0].conversation_id != conversation.pk:
        return None
    pool = small_model.pool_for_background(
        setting="SUMMARY_MODEL", conversation_model=conversation.model
    )
    tokenizer = pool_tokenizer(pool)
    previous = summary_for_branch(branch=branch)
    depth = {message.pk: index for index, message in enumerate(branch)}
    after = depth[previous.through_message_id] if previous is not None else 0
    turns = _answered_turns(branch[1:])
    # What every prompt sends besides the verbatim turns: the system prompt, the first user
    # message, the summary and the question being answered.
    pinned = [branch[0], *turns[:1]]
    if turns and turns[-1].role == Message.Role.USER:
        pinned.append(turns[-1])
        turns = turns[:-1]
    reserved = REPLY_OVERHEAD_TOKENS + settings.SUMMARY_MAX_TOKENS + 2 * MESSAGE_OVERHEAD_TOKENS
    reserved += sum(message_tokens(tokenizer, m) + MESSAGE_OVERHEAD_TOKENS for m in pinned)
    tail_budget = max(0, budget_tokens - reserved) * settings.SUMMARY_TAIL_PERCENT // 100
    older = [m for m in turns if depth[m.pk] > after]
    count = _cut(older, tokenizer, tail_budget)
    if count == 0:
        return None
    limit = (
        pool.context_window
        - settings.SUMMARY_MAX_TOKENS
        - 2 * count_tokens(tokenizer, SUMMARY_INSTRUCTION)
    )
    count = _fit(previous, older[:count], tokenizer, limit)
    covered, through = older[:count], older[count - 1]
    existing = BranchSummary.objects.filter(through_message=through).first()
    if existing is not None:
        return existing

    raw = small_model.complete(
        pool=pool,
        messages=[
            {"role": "system", "content": SUMMARY_INSTRUCTION},
            {"role": "user", "content": _transcript(previous, covered)},
        ],
        max_tokens=settings.SUMMARY_MAX_TOKENS,
        conversation_id=conversation.pk,
    )
    content = raw.strip()
    if not content:
        return None
    with transaction.atomic():
        # Against a deletion in the meantime: the tombstone is locked, the message re-read.
        alive = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation.pk, deleted_at__isnull=True)
            .exists()
        )
        if not alive or not Message.objects.filter(pk=through.pk).exists():
            return None
        summary, _ = BranchSummary.objects.get_or_create(
            through_message=through,
            defaults={
                "conversation": conversation,
                "content": content,
                "tokens": count_tokens(tokenizer, content),
                "covered_messages": (previous.covered_messages if previous else 0) + count,
                "model": pool.name,
            },
        )
    return summary


def summary_release(*, conversation_id: Any) -> None:
    """Let the next overflow of this conversation ask for a summary again."""
    redis = sync_redis()
    try:
        redis.delete(summary_pending_key(conversation_id))
    finally:
        redis.close()
