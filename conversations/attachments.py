"""Writes to attachments: text, Markdown and PDF files on a user message.

The flow: a file is uploaded to its conversation (`attachment_upload`: size checked, type
judged by its content, text extracted and chunked, the chunks embedded), which gives it an
id; the send that carries that id claims it for its user message (`attachments_claim`,
within the send's lock); until then the user may take it back (`attachment_discard`). Its
text enters the context of every answer on the branch (conversations/attachment_context.py),
and it is deleted with its conversation (conversations/removal.py).
"""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, PositiveSmallIntegerField, Sum, Value, When

from chatsite.errors import ServiceError

from .attachment_context import chunk_vectors
from .attachment_tasks import attachment_embed_later
from .attachment_text import chunk_offsets, extract_text
from .errors import ErrorCode
from .models import Attachment, Conversation, Message

NAME_MAX_CHARS = 255
# The media type each kind of file is served and exported as.
CONTENT_TYPES = {
    Attachment.Kind.PDF: "application/pdf",
    Attachment.Kind.MARKDOWN: "text/markdown; charset=utf-8",
    Attachment.Kind.TEXT: "text/plain; charset=utf-8",
}


def _clean_name(name: str) -> str:
    """The file's own name (no folders), without control characters, at most 255 characters."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c) not in {"Cc", "Cf", "Cs", "Co"})
    name = " ".join(name.split())
    if len(name) > NAME_MAX_CHARS:
        stem, dot, suffix = name.rpartition(".")
        keep = NAME_MAX_CHARS - len(suffix) - 1
        name = f"{stem[:keep]}.{suffix}" if dot and len(suffix) < 16 else name[:NAME_MAX_CHARS]
    return name or "attachment"


def attachment_check_size(*, name: str, size: int) -> None:
    """Refuse (413) a file of `size` bytes over ATTACHMENT_MAX_BYTES: an upload can be
    judged by its size before it is read."""
    if size > settings.ATTACHMENT_MAX_BYTES:
        raise ServiceError(
            ErrorCode.ATTACHMENT_TOO_LARGE,
            f"{_clean_name(name)} is larger than the {_size(settings.ATTACHMENT_MAX_BYTES)} "
            "a file may be.",
            status=413,
            detail={"max_bytes": settings.ATTACHMENT_MAX_BYTES, "bytes": size},
        )


def attachment_upload(*, conversation: Conversation, name: str, data: bytes) -> Attachment:
    """Store the file `data` (called `name`) on `conversation`, not yet on any message.

    Refused: a file over ATTACHMENT_MAX_BYTES, or one taking the conversation's files past
    ATTACHMENTS_MAX_BYTES_PER_CONVERSATION (413); a file that is neither UTF-8 text nor a PDF
    (415); a PDF that cannot be read, is locked by a password, or a file with no text (422).
    A file of at most ATTACHMENT_SYNC_EMBED_CHUNKS chunks is embedded now, a larger one by a
    Celery task after commit. The conversation's row is locked while its files are summed,
    so two uploads at once cannot both pass the cap.
    """
    name = _clean_name(name)
    attachment_check_size(name=name, size=len(data))
    extracted = extract_text(name=name, data=data)
    chunks = chunk_offsets(extracted.text, size=settings.ATTACHMENT_CHUNK_CHARS)
    vectors = None
    if len(chunks) <= settings.ATTACHMENT_SYNC_EMBED_CHUNKS:
        vectors = chunk_vectors(text=extracted.text, chunks=chunks)
    with transaction.atomic():
        _lock(conversation)
        stored = Attachment.objects.filter(conversation=conversation).aggregate(total=Sum("size"))[
            "total"
        ]
        cap = settings.ATTACHMENTS_MAX_BYTES_PER_CONVERSATION
        if (stored or 0) + len(data) > cap:
            raise ServiceError(
                ErrorCode.ATTACHMENTS_TOO_LARGE,
                f"The files of a conversation may take {_size(cap)} at most.",
                status=413,
                detail={"max_bytes": cap, "bytes": (stored or 0) + len(data)},
            )
        attachment = Attachment.objects.create(
            conversation=conversation,
            name=name,
            kind=extracted.kind,
            size=len(data),
            data=data,
            text=extracted.text,
            chunks=chunks,
            embeddings=vectors,
        )
        if vectors is None:
            attachment_embed_later(attachment_id=attachment.pk)
    return attachment


def attachment_discard(*, attachment: Attachment) -> None:
    """Take back a file not yet sent; one on a message stays with it (409)."""
    with transaction.atomic():
        _lock(attachment.conversation)
        deleted, _ = Attachment.objects.filter(pk=attachment.pk, message__isnull=True).delete()
        if not deleted:
            raise ServiceError(
                ErrorCode.ATTACHMENT_ALREADY_SENT,
                "This file was sent with a message; it stays with it.",
                status=409,
            )


def attachments_claim(
    *, conversation: Conversation, message: Message, attachment_ids: Sequence[Any]
) -> list[Attachment]:
    """Put the files `attachment_ids` (uploaded to `conversation`, not yet sent) on the new
    user `message`; the caller holds the conversation's lock. An id that is not such a file
    (another user's, another conversation's, one already sent) is 404, as a missing one;
    more than ATTACHMENTS_MAX_PER_MESSAGE is 413."""
    unknown = ServiceError(
        ErrorCode.UNKNOWN_ATTACHMENT,
        "An attachment is not a file uploaded to this conversation and not yet sent.",
        status=404,
    )
    try:
        ids = list(dict.fromkeys(uuid.UUID(str(pk)) for pk in attachment_ids))
    except ValueError as exc:
        raise unknown from exc
    if not ids:
        return []
    limit = settings.ATTACHMENTS_MAX_PER_MESSAGE
    if len(ids) > limit:
        raise ServiceError(
            ErrorCode.TOO_MANY_ATTACHMENTS,
            f"A message may carry at most {limit} files.",
            status=413,
            detail={"max_attachments": limit, "attachments": len(ids)},
        )
    attachments = list(
        Attachment.objects.filter(
            conversation=conversation, message__isnull=True, pk__in=ids
        ).defer("data", "text", "embeddings")
    )
    if len(attachments) != len(ids):
        raise unknown
    # In the order the send names them, whichever finished uploading first.
    place = {pk: index for index, pk in enumerate(ids)}
    Attachment.objects.filter(pk__in=ids).update(
        message=message,
        position=Case(
            *(When(pk=pk, then=Value(index)) for pk, index in place.items()),
            output_field=PositiveSmallIntegerField(),
        ),
    )
    for attachment in attachments:
        attachment.message = message
        attachment.position = place[attachment.pk]
    return sorted(attachments, key=lambda attachment: attachment.position)


def attachments_copy(*, source: Message, target: Message) -> list[Attachment]:
    """Give `target`, the edit of the user message `source`, copies of the files `source`
    carries: the old branch keeps its own, and either can go without the other. A copy is
    not counted against the conversation's cap (the file was let in once)."""
    copies = [
        Attachment(
            conversation_id=attachment.conversation_id,
            message=target,
            name=attachment.name,
            kind=attachment.kind,
            size=attachment.size,
            data=attachment.data,
            text=attachment.text,
            chunks=attachment.chunks,
            embeddings=attachment.embeddings,
            position=attachment.position,
        )
        for attachment in Attachment.objects.filter(message=source)
    ]
    return Attachment.objects.bulk_create(copies)


def _lock(conversation: Conversation) -> None:
    """Lock the conversation row, refusing a tombstone (as the tree's writes do)."""
    conversation.refresh_from_db(
        from_queryset=Conversation.objects.select_for_update(), fields=["deleted_at"]
    )
    if conversation.deleted_at is not None:
        raise ServiceError(ErrorCode.CONVERSATION_DELETED, "This conversation was deleted.")


def _size(size: int) -> str:
    return f"{size / (1024 * 1024):g} MB" if size >= 1024 * 1024 else f"{size / 1024:g} KB"
