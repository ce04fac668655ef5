"""Context assembly: the active branch fitted into the model's token budget.

Counted with the model's own tokenizer (`tokenizer.json` through the `tokenizers` package,
light enough for the web process). The system prompt and the newest user message are always
kept; older turns are dropped oldest first. What is kept is a suffix of the branch, so each
turn's prompt extends the last one and the prefix a worker cached stays valid until the
window has to slide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from chatsite.errors import ServiceError

from .errors import ErrorCode
from .models import Message

# Tokens the chat template adds around each message (`<|im_start|>role\n ... <|im_end|>\n`).
MESSAGE_OVERHEAD_TOKENS = 5
# Tokens the template adds to open the assistant's answer.
REPLY_OVERHEAD_TOKENS = 3

_INCLUDED_ASSISTANT_STATUSES = {Message.Status.COMPLETE, Message.Status.CANCELLED}


@lru_cache(maxsize=8)
def load_tokenizer(folder: str) -> Tokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ServiceError(
            ErrorCode.TOKENIZER_MISSING,
            "The model's tokenizer is not prepared; run `python manage.py prepare_model`.",
            status=503,
        )
    return Tokenizer.from_file(str(path))


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


@dataclass
class AssembledContext:
    """The messages to send, and how many tokens they take."""

    messages: list[dict[str, str]]
    prompt_tokens: int
    dropped_messages: int


def message_tokens(tokenizer: Tokenizer, message: Message) -> int:
    """Tokens of `message`'s content, counted once and cached on the row."""
    if message.content_tokens is None:
        message.content_tokens = count_tokens(tokenizer, message.content)
        Message.objects.filter(pk=message.pk).update(content_tokens=message.content_tokens)
    return message.content_tokens


def assemble_context(
    *, branch: Sequence[Message], tokenizer: Tokenizer, budget_tokens: int
) -> AssembledContext:
    """Fit `branch` (root first, ending with the new user message) into `budget_tokens`.

    Failed, blocked or unfinished answers are left out, and so is the user turn they
    answered, unless it is the newest one: the model sees only turns that completed.
    """
    if not branch or branch[-1].role != Message.Role.USER:
        raise ValueError("a branch to answer ends with a user message")

    root, *turns = branch
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

    kept: list[Message] = []
    used = fixed
    for message in reversed(turns[:-1]):
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

    selected = ([root] if has_system else []) + kept + [newest]
    return AssembledContext(
        messages=[{"role": m.role, "content": m.content} for m in selected],
        prompt_tokens=used,
        dropped_messages=len(turns) - 1 - len(kept),
    )


def _answered_turns(turns: list[Message]) -> list[Message]:
    kept: list[Message] = []
    for index, message in enumerate(turns):
        is_newest = index == len(turns) - 1
        if message.role == Message.Role.ASSISTANT:
            if message.status in _INCLUDED_ASSISTANT_STATUSES and message.content:
                kept.append(message)
            elif kept and kept[-1].role == Message.Role.USER:
                kept.pop()  # the question that got no usable answer
        elif message.role == Message.Role.USER or is_newest:
            kept.append(message)
    return kept
