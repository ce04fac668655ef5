"""Custom instructions and memory: what the model is told about the user in every turn of
the web chat, and the small model's suggestions of facts to remember.

What the model sees (`personal_preamble`, placed by `context.assemble_context` right after
the system prompt): the instructions, then the confirmed facts in the order they were kept,
each as one system message whose text is the same bytes every turn until the user changes
it, so a worker's cached prefix survives from turn to turn. A new fact goes last.

Only the web chat and the JSON API's conversations get them. The OpenAI-compatible `/v1`
does not, as OpenAI's own API does not apply ChatGPT's custom instructions or memory: a
`/v1` client sends the whole prompt it means and gets an answer to exactly that.

Suggestions: after an answer completes in a web conversation whose owner has them on,
`tasks.suggest_memory` asks the small pool for lasting facts about the user in the question
(`memory_suggest`). They are stored as `suggested` and are never told to the model until the
user confirms one on the settings page; a dismissed one is not suggested again. Deleting the
conversation deletes the facts and suggestions derived from it.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db.models import DateTimeField, IntegerField, UUIDField, Value

from . import selectors, services, small_model
from .context import Preamble
from .models import Conversation, MemoryFact, Message, Personalization

INSTRUCTIONS_HEADER = "The user's custom instructions for you:"
MEMORY_HEADER = "What you remember about the user (facts they asked you to keep):"

SUGGEST_INSTRUCTION = (
    "You pick out lasting facts about the user from their message: their name, work, "
    "location, preferences, ongoing projects. Ignore questions, one-off requests and "
    "anything about other people. Reply with at most three facts, one per line, each "
    "starting with '- ' and written as a short sentence about 'the user'. If there is "
    "none, reply NONE."
)
# How much of the user's message the suggestion prompt quotes.
EXCERPT_CHARS = 2000

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


def instructions_text(instructions: str) -> str:
    return f"{INSTRUCTIONS_HEADER}\n{instructions}"


def memory_text(facts: list[str]) -> str:
    return MEMORY_HEADER + "".join(f"\n- {fact}" for fact in facts)


def personal_preamble(*, user_id: Any) -> list[Preamble]:
    """The instructions and the confirmed facts of `user_id`, in the order they are told
    (and kept when the budget is short), read in one statement: it is on every turn's path."""
    instructions = (
        Personalization.objects.filter(user_id=user_id)
        .exclude(instructions="")
        .values_list(
            Value(0, output_field=IntegerField()),
            "instructions",
            Value(None, output_field=DateTimeField()),
            Value(None, output_field=UUIDField()),
        )
    )
    facts = MemoryFact.objects.filter(
        owner_id=user_id, status=MemoryFact.Status.CONFIRMED
    ).values_list(Value(1, output_field=IntegerField()), "text", "confirmed_at", "id")
    rows = sorted(
        instructions.union(facts, all=True), key=lambda row: (row[0], row[2] or 0, str(row[3]))
    )
    preamble: list[Preamble] = []
    if rows and rows[0][0] == 0:
        preamble.append(Preamble(kind="instructions", content=instructions_text(rows[0][1])))
    texts = [row[1] for row in rows if row[0] == 1]
    if texts:
        preamble.append(Preamble(kind="memory", content=memory_text(texts)))
    return preamble


def parse_suggestions(raw: str) -> list[str]:
    """The facts of the small model's answer: its bulleted lines, at most
    MEMORY_SUGGESTIONS_PER_TURN; nothing for NONE or for prose without bullets."""
    facts: list[str] = []
    for line in raw.splitlines():
        if not _BULLET.match(line):
            continue
        text = _BULLET.sub("", line).strip().strip("\"'`*")
        if text and text.upper().rstrip(".") != "NONE":
            facts.append(text)
    return facts[: settings.MEMORY_SUGGESTIONS_PER_TURN]


def memory_suggest(*, answer_id: Any) -> list[MemoryFact]:
    """Ask the small model for facts about the user in the question `answer_id` answered and
    store them as suggestions; returns the new ones. Nothing when the messages, or their
    conversation, are gone, or the owner turned suggestions off. Idempotent: a repeat finds
    the same facts known and adds none."""
    if not settings.MEMORY_SUGGESTIONS:
        return []
    message_id = selectors.question_of(message_id=answer_id)
    if message_id is None:
        return []
    message = (
        Message.objects.filter(
            pk=message_id,
            role=Message.Role.USER,
            conversation__deleted_at__isnull=True,
            conversation__source=Conversation.Source.WEB,
        )
        .select_related("conversation")
        .first()
    )
    if message is None:
        return []
    conversation = message.conversation
    enabled = (
        Personalization.objects.filter(user_id=conversation.owner_id)
        .values_list("memory_suggestions", flat=True)
        .first()
    )
    if enabled is False:
        return []
    pool = small_model.pool_for_background(
        setting="MEMORY_MODEL", conversation_model=conversation.model
    )
    raw = small_model.complete(
        pool=pool,
        messages=[
            {"role": "system", "content": SUGGEST_INSTRUCTION},
            {"role": "user", "content": message.content[:EXCERPT_CHARS]},
        ],
        max_tokens=settings.MEMORY_MAX_TOKENS,
        conversation_id=conversation.pk,
    )
    return services.memory_suggestions_add(
        owner_id=conversation.owner_id,
        conversation_id=conversation.pk,
        texts=parse_suggestions(raw),
    )
