"""The attachments' part of a prompt: their chunks' embeddings, and the text that fits.

Context assembly (conversations/context.py) places the text of the files attached on the
branch after the system prompt and before the turns, within the room it gives them. When
all of it fits, it goes verbatim. When not, the chunks most like the new user message (by
the cosine of their all-MiniLM-L6-v2 embeddings, `chatsite.embeddings`) are taken, best
first, as long as they fit, and shown in document order, a gap marked where chunks were
left out.

A chunk's vectors are computed at upload (or by a Celery task for a large file); one still
missing when a message needs it is computed then and stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db.models import Case, IntegerField, Value, When
from tokenizers import Tokenizer

from chatsite import embeddings
from inference.tokens import count_tokens

from .models import Attachment, Message

INTRO = "The user attached these files:"
GAP = "[…]"
# A gap mark and the line breaks around a piece, with a token of slack.
_GAP_TOKENS = 4
# Less room than this left: no chunk can fit any more.
_SMALLEST_USEFUL_TOKENS = 16


def chunk_vectors(*, text: str, chunks: Sequence[Sequence[int]]) -> bytes:
    """The unit vectors of `text`'s `chunks`, one float32 row each, as stored."""
    vectors = embeddings.embed([text[start:end] for start, end in chunks])
    return embeddings.to_bytes(vectors)


def attachment_embed(*, attachment_id: Any) -> bool:
    """Compute and store the chunk vectors of an attachment that lacks them (idempotent);
    False if it is gone or already has them."""
    attachment = (
        Attachment.objects.filter(pk=attachment_id, embeddings__isnull=True)
        .only("id", "text", "chunks")
        .first()
    )
    if attachment is None:
        return False
    vectors = chunk_vectors(text=attachment.text, chunks=attachment.chunks)
    updated = Attachment.objects.filter(pk=attachment.pk, embeddings__isnull=True).update(
        embeddings=vectors
    )
    return bool(updated)


def attachment_context(*, branch: Sequence[Message]) -> AttachmentContext | None:
    """The files on `branch` (root first, ending with the message to answer), read for its
    newest user message; None if it has none."""
    attachments = attachments_on_branch(branch=branch)
    if not attachments:
        return None
    question = next((m.content for m in reversed(branch) if m.role == Message.Role.USER), "")
    return AttachmentContext(attachments=attachments, question=question)


def attachments_on_branch(*, branch: Sequence[Message]) -> list[Attachment]:
    """The files attached to the user messages of `branch`, in the branch's order, then in
    the order the user chose them; one query (none for a branch without files), without their
    bytes."""
    order = {
        m.pk: index
        for index, m in enumerate(branch)
        if m.role == Message.Role.USER and m.metadata.get(Attachment.METADATA_KEY)
    }
    if not order:
        return []
    turn = Case(
        *(When(message_id=pk, then=Value(index)) for pk, index in order.items()),
        output_field=IntegerField(),
    )
    return list(
        Attachment.objects.filter(message_id__in=list(order))
        .defer("data")
        .alias(turn=turn)
        .order_by("turn", "position", "created_at", "id")
    )


@dataclass
class AttachmentContext:
    """The files on a branch and the question they are read for: `text_within` gives the
    context their text, whole or retrieved, within the tokens it has room for."""

    attachments: list[Attachment]
    question: str
    # Filled by `text_within`: what it chose, for tests and logs.
    retrieved: bool = field(default=False, init=False)

    def text_within(self, *, tokenizer: Tokenizer, tokens: int) -> str | None:
        """The attachments' text in at most `tokens` tokens of `tokenizer`; None if there
        are none or not even one chunk fits."""
        if not self.attachments:
            return None
        whole = _render([(a, [[0, len(a.text)]]) for a in self.attachments])
        if count_tokens(tokenizer, whole) <= tokens:
            self.retrieved = False
            return whole
        self.retrieved = True
        if tokens < _SMALLEST_USEFUL_TOKENS:
            return None
        return self._retrieve(tokenizer, tokens)

    def _retrieve(self, tokenizer: Tokenizer, tokens: int) -> str | None:
        candidates = [
            (index, chunk_index, chunk)
            for index, attachment in enumerate(self.attachments)
            for chunk_index, chunk in enumerate(attachment.chunks)
        ]
        if not candidates:
            return None
        scores = np.concatenate([self._vectors(a) for a in self.attachments]) @ _query(
            self.question
        )
        ranked = [candidates[int(rank)] for rank in np.argsort(-scores, kind="stable")]
        # Counted piece by piece (a chunk, its gap mark, a file's heading, each with a token of
        # slack for where pieces join), best first, skipping what does not fit.
        used = count_tokens(tokenizer, INTRO) + 1
        headed: set[int] = set()
        chosen: list[tuple[int, int, list[int]]] = []
        for index, chunk_index, (start, end) in ranked:
            if tokens - used < _SMALLEST_USEFUL_TOKENS:
                break
            attachment = self.attachments[index]
            cost = count_tokens(tokenizer, attachment.text[start:end]) + _GAP_TOKENS
            if index not in headed:
                cost += count_tokens(tokenizer, _heading(attachment)) + _GAP_TOKENS
            if used + cost <= tokens:
                used += cost
                headed.add(index)
                chosen.append((index, chunk_index, [start, end]))
        # The ranking's order is kept to drop the weakest should the joined text count more.
        while chosen:
            text = self._render_chosen(sorted(chosen))
            if count_tokens(tokenizer, text) <= tokens:
                return text
            chosen.pop()
        return None

    def _render_chosen(self, chosen: list[tuple[int, int, list[int]]]) -> str:
        parts: dict[int, list[list[int]]] = {}
        for index, _, chunk in chosen:
            parts.setdefault(index, []).append(chunk)
        return _render([(self.attachments[index], spans) for index, spans in parts.items()])

    @staticmethod
    def _vectors(attachment: Attachment) -> np.ndarray:
        if attachment.embeddings is None:
            attachment.embeddings = chunk_vectors(text=attachment.text, chunks=attachment.chunks)
            Attachment.objects.filter(pk=attachment.pk).update(embeddings=attachment.embeddings)
        vectors = embeddings.from_bytes(attachment.embeddings)
        return vectors.reshape(len(attachment.chunks), embeddings.DIMENSIONS)


def _query(question: str) -> np.ndarray:
    return embeddings.embed([question])[0]


def _render(parts: list[tuple[Attachment, list[list[int]]]]) -> str:
    """The files' text: each under a heading with its name, its chosen spans in order, a
    gap marked where text between them (or before or after them) was left out."""
    sections = [INTRO]
    for attachment, spans in parts:
        text = attachment.text
        pieces: list[str] = []
        at = 0
        for start, end in spans:
            if start > at:
                pieces.append(GAP)
            pieces.append(text[start:end].strip())
            at = end
        if text[at:].strip():
            pieces.append(GAP)
        sections.append(f"{_heading(attachment)}\n" + "\n".join(pieces))
    return "\n\n".join(sections)


def _heading(attachment: Attachment) -> str:
    return f"--- {attachment.name} ---"
