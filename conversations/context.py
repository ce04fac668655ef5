"""Context assembly: the active branch fitted into the model's token budget.

Counted with the model's own tokenizer (`tokenizer.json` through the `tokenizers` package,
light enough for the web process). The system prompt and the newest user message are always
kept; older turns are dropped oldest first. What is kept is a suffix of the branch, so each
turn's prompt extends the last one and the prefix a worker cached stays valid until the
window has to slide.

The text of files attached on the branch follows the system prompt, before the turns, in at
most ATTACHMENTS_CONTEXT_SHARE of the room the system prompt and the new message leave:
whole when it fits, else the parts most relevant to the new message
(conversations/attachment_context.py).

Once a rolling summary of the branch exists (conversations/summaries.py), the prompt is the
system prompt, the first user message, the summary, then the newest turns verbatim: the
summary stands for the turns it covers, and the prefix stays the same until those newest
turns overflow again and a new summary is written.

A `preamble` (the owner's custom instructions, then their memory, conversations/memory.py)
goes right after the system prompt as system messages, the same text every turn. It is
counted in the budget; when it does not fit with the system prompt and the newest message,
its last parts go first (memory before instructions), told in `dropped_preamble`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from django.conf import settings
from tokenizers import Tokenizer

from chatsite.errors import ServiceError

# Re-exported: the tokenizer is the pool's (inference), counted here for the context.
from inference.tokens import count_tokens as count_tokens
from inference.tokens import load_tokenizer as load_tokenizer

from .errors import ErrorCode
from .models import BranchSummary, Message

# Tokens the chat template adds around each message (`<|im_start|>role\n ... <|im_end|>\n`).
MESSAGE_OVERHEAD_TOKENS = 5
# Tokens the template adds to open the assistant's answer.
REPLY_OVERHEAD_TOKENS = 3

_INCLUDED_ASSISTANT_STATUSES = {Message.Status.COMPLETE, Message.Status.CANCELLED}


@dataclass(frozen=True)
class Preamble:
    """A system text placed after the system prompt, before the turns; `kind` names it."""

    kind: str
    content: str


@dataclass
class AssembledContext:
    """The messages to send, and how many tokens they take."""

    messages: list[dict[str, Any]]
    prompt_tokens: int
    # Turns sent neither verbatim nor through the summary: a new summary is due.
    dropped_messages: int
    summary_id: UUID | None = None
    summarised_messages: int = 0
    # Kinds of the preamble left out for want of room, last first.
    dropped_preamble: list[str] = field(default_factory=list)


class AttachmentText(Protocol):
    """The text of the files attached on a branch, fitted to the room it is given."""

    def text_within(self, *, tokenizer: Tokenizer, tokens: int) -> str | None: ...


def message_tokens(tokenizer: Tokenizer, message: Message) -> int:
    """Tokens of `message`'s content, counted once and cached on the row."""
    if message.content_tokens is None:
        message.content_tokens = count_tokens(tokenizer, message.content)
        Message.objects.filter(pk=message.pk).update(content_tokens=message.content_tokens)
    return message.content_tokens


def summary_note(summary: BranchSummary) -> str:
    return f"Summary of the earlier conversation:\n{summary.content}"


def assemble_context(
    *,
    branch: Sequence[Message],
    tokenizer: Tokenizer,
    budget_tokens: int,
    summary: BranchSummary | None = None,
    preamble: Sequence[Preamble] = (),
    attachments: AttachmentText | None = None,
) -> AssembledContext:
    """Fit `branch` (root first, ending with the new user message, or with the result of a
    `/v1` client's tool call) into `budget_tokens`.

    Failed, blocked or unfinished answers are left out, and so is the user turn they
    answered, unless it is the newest one: the model sees only turns that completed.
    `summary` (one whose `through_message` is on `branch`) replaces the turns it covers,
    after the first user message, when it fits; one from another branch is ignored.
    `preamble` follows the system prompt; what of it does not fit goes, from the end.
    `attachments`: the text of the files on the branch, placed after the preamble, in the room
    the preamble leaves.
    """
    if not branch or branch[-1].role not in (Message.Role.USER, Message.Role.TOOL):
        raise ValueError("a branch to answer ends with a user message or a tool result")

    root, *turns = branch
    depth = {message.pk: index for index, message in enumerate(branch)}
    covered_through = depth.get(summary.through_message_id) if summary is not None else None
    turns = _answered_turns(turns)
    newest = turns[-1]

    fixed = REPLY_OVERHEAD_TOKENS + message_tokens(tokenizer, newest) + MESSAGE_OVERHEAD_TOKENS
    has_system = bool(root.content.strip())
    if has_system:
        fixed += message_tokens(tokenizer, root) + MESSAGE_OVERHEAD_TOKENS
    if fixed > budget_tokens:
        raise ServiceError(
            ErrorCode.CONTEXT_TOO_LONG,
            "The message and system prompt do not fit the model's context window.",
            detail={"tokens": fixed, "budget": budget_tokens},
        )

    placed = list(preamble)
    costs = [count_tokens(tokenizer, part.content) + MESSAGE_OVERHEAD_TOKENS for part in placed]
    dropped_preamble: list[str] = []
    while placed and fixed + sum(costs) > budget_tokens:
        dropped_preamble.append(placed.pop().kind)
        costs.pop()
    fixed += sum(costs)
    system_texts = [part.content for part in placed]

    if attachments is not None:
        share = int((budget_tokens - fixed) * settings.ATTACHMENTS_CONTEXT_SHARE)
        text = attachments.text_within(tokenizer=tokenizer, tokens=share - MESSAGE_OVERHEAD_TOKENS)
        if text:
            fixed += count_tokens(tokenizer, text) + MESSAGE_OVERHEAD_TOKENS
            system_texts.append(text)

    head: list[Message] = [root] if has_system else []
    note: dict[str, str] | None = None
    older = turns[:-1]
    summarised = 0
    if summary is not None and covered_through is not None:
        covered = [m for m in older if depth[m.pk] <= covered_through]
        first = covered[:1] if covered and covered[0].role == Message.Role.USER else []
        note_text = summary_note(summary)
        cost = count_tokens(tokenizer, note_text) + MESSAGE_OVERHEAD_TOKENS
        cost += sum(message_tokens(tokenizer, m) + MESSAGE_OVERHEAD_TOKENS for m in first)
        if fixed + cost <= budget_tokens:
            fixed += cost
            head += first
            note = {"role": "system", "content": note_text}
            older = [m for m in older if depth[m.pk] > covered_through]
            summarised = len(covered)

    kept: list[Message] = []
    used = fixed
    for message in reversed(older):
        cost = message_tokens(tokenizer, message) + MESSAGE_OVERHEAD_TOKENS
        if used + cost > budget_tokens:
            break
        kept.append(message)
        used += cost
    kept.reverse()
    # Never open the window on an assistant turn with its question cut off.
    while kept and kept[0].role != Message.Role.USER:
        used -= message_tokens(tokenizer, kept[0]) + MESSAGE_OVERHEAD_TOKENS
        kept.pop(0)

    selected = head + kept + [newest]
    messages = [message_dict(m) for m in selected]
    if note is not None:
        messages.insert(len(head), note)
    start = 1 if has_system else 0
    messages[start:start] = [{"role": "system", "content": text} for text in system_texts]
    return AssembledContext(
        messages=messages,
        prompt_tokens=used,
        dropped_messages=len(older) - len(kept),
        summary_id=summary.pk if note is not None and summary is not None else None,
        summarised_messages=summarised,
        dropped_preamble=dropped_preamble,
    )


def message_dict(message: Message) -> dict[str, Any]:
    """A message as the worker's chat API takes it, tool calls and results included."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == Message.Role.ASSISTANT and message.metadata.get("tool_calls"):
        data["tool_calls"] = message.metadata["tool_calls"]
    elif message.role == Message.Role.TOOL:
        data["tool_call_id"] = message.metadata.get("tool_call_id", "")
    return data


def _answered_turns(turns: list[Message]) -> list[Message]:
    kept: list[Message] = []
    for index, message in enumerate(turns):
        is_newest = index == len(turns) - 1
        if message.role == Message.Role.ASSISTANT:
            usable = message.content or message.metadata.get("tool_calls")
            if message.status in _INCLUDED_ASSISTANT_STATUSES and usable:
                kept.append(message)
            elif kept and kept[-1].role != Message.Role.SYSTEM:
                # The question that got no usable answer goes, with the tool rounds of it.
                while kept and kept[-1].role in (Message.Role.ASSISTANT, Message.Role.TOOL):
                    kept.pop()
                if kept and kept[-1].role == Message.Role.USER:
                    kept.pop()
        elif message.role in (Message.Role.USER, Message.Role.TOOL) or is_newest:
            kept.append(message)
    return kept
