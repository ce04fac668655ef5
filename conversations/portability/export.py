"""Exports: one conversation as JSON (the whole tree) or Markdown (the branch on screen), and
all of a user's data as a zip, streamed.

The JSON is the service's own versioned format, which `importers` reads back:

    {"format": "chatsite.conversation", "version": 1, "exported_at": ...,
     "conversation": {id, title, model, system_prompt, folder, pinned, archived, created_at,
                      last_activity_at, current_leaf},
     "messages": [{id, parent, role, content, status, model, created_at, updated_at,
                   current_child, metadata, prompt_tokens, output_tokens,
                   attachments: [{id, filename, kind, content_type, size}]}, ...]}

`messages` holds every message of the tree, the root (`system`, the system prompt, no parent)
first and every parent before its children. An answer moderation withheld is exported as the
owner sees it: without its text.

The zip is written while it is sent (zipstream-ng): conversations are read one at a time,
attached files in batches of at most ATTACHMENT_BATCH_BYTES, shares and feedback row by row, so
neither the zip nor the account is ever whole in memory. It holds no secret of the service: API
keys appear by name and visible prefix only. It does hold the links of the user's live shares,
which open their snapshots to anyone: the owner can copy them from the API at any time anyway.
"""

from __future__ import annotations

import json
import unicodedata
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import zipstream
from django.db.models import BinaryField, CharField, F, Func, Value
from django.urls import reverse
from django.utils import timezone

from accounts.selectors import api_keys_for_user
from billing.models import UsageEvent
from billing.selectors import plan_for_user, statements_for_user
from moderation.models import Sanction

from .. import selectors
from ..attachments import CONTENT_TYPES
from ..models import Attachment, Conversation, Feedback, Folder, Message, Share
from ..share_tokens import share_token
from .formats import FORMAT_NAME, FORMAT_VERSION

ZIP_CHUNK_BYTES = 64 * 1024
# The attached files' bytes are read in batches of about this many bytes (one larger file
# alone): a few queries for an account's files, and never more than a batch in memory.
ATTACHMENT_BATCH_BYTES = 8 * 1024 * 1024
SAFE_FILENAME_MAX_CHARS = 120


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _tree(conversation: Conversation) -> list[Message]:
    """Every message, parents first (a child is never older than its parent)."""
    return list(Message.objects.filter(conversation=conversation).order_by("created_at", "id"))


def _attachment_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": str(row["pk"]),
        "filename": row["name"],
        "kind": row["kind"],
        "content_type": CONTENT_TYPES[Attachment.Kind(row["kind"])],
        "size": row["size"],
    }


def _message_attachments(
    conversation: Conversation, messages: list[Message]
) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Each message's files (metadata only), in one query, or none when no message carries
    any (a user message's `metadata` counts its files, so that is known without a query)."""
    if not any(message.metadata.get(Attachment.METADATA_KEY) for message in messages):
        return {}
    found: dict[uuid.UUID, list[dict[str, Any]]] = {}
    rows = (
        Attachment.objects.filter(conversation=conversation, message__isnull=False)
        .order_by("position", "created_at", "id")
        .values("pk", "message_id", "name", "kind", "size")
    )
    for row in rows:
        found.setdefault(row["message_id"], []).append(_attachment_summary(row))
    return found


def conversation_document(*, conversation: Conversation) -> dict[str, Any]:
    """The conversation's whole tree in the service's own format (module docstring)."""
    folder = conversation.folder.name if conversation.folder_id and conversation.folder else None
    messages = _tree(conversation)
    attachments = _message_attachments(conversation, messages)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "exported_at": timezone.now().isoformat(),
        "conversation": {
            "id": str(conversation.pk),
            "title": conversation.title,
            "model": conversation.model,
            "system_prompt": conversation.system_prompt,
            "folder": folder,
            "pinned": conversation.pinned,
            "archived": conversation.archived,
            "created_at": _iso(conversation.created_at),
            "last_activity_at": _iso(conversation.last_activity_at),
            "current_leaf": str(conversation.current_leaf_id)
            if conversation.current_leaf_id
            else None,
        },
        "messages": [
            {
                "id": str(message.pk),
                "parent": str(message.parent_id) if message.parent_id else None,
                "role": message.role,
                "content": selectors.message_visible_content(message=message),
                "status": message.status,
                "model": message.model,
                "created_at": _iso(message.created_at),
                "updated_at": _iso(message.updated_at),
                "current_child": str(message.current_child_id)
                if message.current_child_id
                else None,
                "metadata": message.metadata,
                "prompt_tokens": message.prompt_tokens,
                "output_tokens": message.output_tokens,
                "attachments": attachments.get(message.pk, []),
            }
            for message in messages
        ],
    }


def conversation_json(*, conversation: Conversation) -> bytes:
    """`conversation_document` as a UTF-8 JSON file."""
    document = conversation_document(conversation=conversation)
    return json.dumps(document, ensure_ascii=False, indent=2).encode()


_SPEAKERS = {
    Message.Role.USER: "You",
    Message.Role.ASSISTANT: "Assistant",
    Message.Role.TOOL: "Tool result",
}


def conversation_markdown(*, conversation: Conversation) -> str:
    """The branch on screen as Markdown: title, system prompt, then each turn under a heading
    naming who spoke. Message text is written as it was (it is Markdown already)."""
    branch = selectors.active_branch(conversation=conversation)
    lines = [f"# {conversation.title or 'Untitled conversation'}", ""]
    lines += [
        f"Model: {conversation.model} · exported {timezone.now():%Y-%m-%d %H:%M} UTC",
        "",
    ]
    if conversation.system_prompt:
        lines += ["## System prompt", "", conversation.system_prompt, ""]
    for message in branch:
        if message.role == Message.Role.SYSTEM:
            continue
        speaker = _SPEAKERS.get(Message.Role(message.role), message.role)
        if message.role == Message.Role.ASSISTANT and message.model:
            speaker += f" ({message.model})"
        elif message.role == Message.Role.TOOL and message.metadata.get("name"):
            speaker += f" ({message.metadata['name']})"
        lines += [f"## {speaker}", ""]
        notice = selectors.message_notice(message=message)
        text = notice if notice is not None else message.content
        if message.role == Message.Role.TOOL:
            text = f"```\n{text}\n```"
        elif message.status in (Message.Status.CANCELLED, Message.Status.FAILED):
            text = f"{text}\n\n_({message.status})_" if text else f"_({message.status})_"
        lines += [text, ""]
        for call in message.metadata.get("tool_calls") or []:
            function = call.get("function") or {} if isinstance(call, dict) else {}
            lines += [f"_Called tool `{function.get('name', '?')}`._", ""]
    return "\n".join(lines).rstrip() + "\n"


def export_filename(*, conversation: Conversation, extension: str) -> str:
    """An ASCII file name from the title (the header needs no quoting), and the id."""
    stem = "".join(c if c.isascii() and c.isalnum() else "-" for c in conversation.title.lower())
    stem = "-".join(part for part in stem.split("-") if part)[:60] or "conversation"
    return f"{stem}-{str(conversation.pk)[:8]}.{extension}"


# All of a user's data


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, indent=2).encode()


def _account(user: Any) -> dict[str, Any]:
    plan = plan_for_user(user=user)
    return {
        "username": user.username,
        "email": user.email,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "date_joined": _iso(user.date_joined),
        "last_login": _iso(user.last_login),
        "plan": {"slug": plan.slug, "name": plan.name},
    }


def _api_keys(user: Any) -> list[dict[str, Any]]:
    # Name and visible prefix only: never the digest (`key_hash`), let alone a key.
    return [
        {
            "name": key.name,
            "prefix": key.prefix,
            "scope": key.scope,
            "store_conversations": key.store_conversations,
            "created_at": _iso(key.created_at),
            "last_used_at": _iso(key.last_used_at),
            "revoked_at": _iso(key.revoked_at),
        }
        for key in api_keys_for_user(user=user)
    ]


def _folders(user: Any) -> list[dict[str, Any]]:
    return [
        {"id": str(folder.pk), "name": folder.name, "created_at": _iso(folder.created_at)}
        for folder in Folder.objects.filter(owner_id=user.pk).order_by("name", "id")
    ]


def _statements(user: Any) -> list[dict[str, Any]]:
    return [
        {
            "period_start": statement.period_start.isoformat(),
            "period_end": statement.period_end.isoformat(),
            "plan": statement.plan_name,
            "plan_fee_micros": statement.plan_fee_micros,
            "usage_cost_micros": statement.usage_cost_micros,
            "total_micros": statement.total_micros,
            "generations": statement.generations,
            "prompt_tokens": statement.prompt_tokens,
            "output_tokens": statement.output_tokens,
            "lines": [
                {
                    "model": line.pool.name,
                    "generations": line.generations,
                    "prompt_tokens": line.prompt_tokens,
                    "output_tokens": line.output_tokens,
                    "cost_micros": line.cost_micros,
                }
                for line in statement.lines.all()
            ],
        }
        for statement in statements_for_user(user=user)
    ]


def _sanctions(user: Any) -> list[dict[str, Any]]:
    # What the account was told: warnings, suspensions, bans (not which staff member acted).
    return [
        {
            "kind": sanction.kind,
            "reason": sanction.reason,
            "created_at": _iso(sanction.created_at),
            "ends_at": _iso(sanction.ends_at),
            "lifted_at": _iso(sanction.lifted_at),
            "seen_at": _iso(sanction.seen_at),
        }
        for sanction in Sanction.objects.filter(user_id=user.pk).order_by("created_at", "id")
    ]


def _usage_lines(user: Any) -> Iterator[bytes]:
    """Every generation the user was charged for, one JSON object a line, read in batches."""
    events = (
        UsageEvent.objects.filter(user_id=user.pk)
        .order_by("occurred_at", "id")
        .values(
            "generation_id",
            "pool__name",
            "tier",
            "status",
            "prompt_tokens",
            "output_tokens",
            "cached_tokens",
            "cost_micros",
            "occurred_at",
        )
    )
    for event in events.iterator(chunk_size=2000):
        line = {
            **event,
            "model": event["pool__name"],
            "generation_id": str(event["generation_id"]),
            "occurred_at": _iso(event["occurred_at"]),
        }
        del line["pool__name"]
        yield json.dumps(line, ensure_ascii=False).encode() + b"\n"


def _conversation_file(conversation_id: Any, as_markdown: bool) -> Iterator[bytes]:
    # A generator: the conversation is read only when the zip reaches this file.
    conversation = (
        Conversation.objects.select_related("folder")
        .filter(pk=conversation_id, deleted_at__isnull=True)
        .first()
    )
    if conversation is None:  # deleted while the zip was being sent
        return
    if as_markdown:
        yield conversation_markdown(conversation=conversation).encode()
    else:
        yield conversation_json(conversation=conversation)


def _json_array(items: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """A JSON array written one element at a time, as the zip reaches it."""
    yield b"["
    separator = b"\n"
    for item in items:
        yield separator + json.dumps(item, ensure_ascii=False).encode()
        separator = b",\n"
    yield b"\n]\n"


def _shares(user: Any, site_url: str) -> Iterator[dict[str, Any]]:
    """The user's share links with their snapshots, oldest first (those of conversations in
    the trash are left out, as everywhere else)."""
    shares = Share.objects.filter(
        conversation__owner_id=user.pk, conversation__deleted_at__isnull=True
    ).order_by("created_at", "id")
    for share in shares.iterator(chunk_size=100):
        # The link is a capability: anyone holding it reads the snapshot. It goes into the
        # owner's own export (they can copy it from the share list at any time anyway), and
        # only while it works: a revoked share's link is left out.
        link = None
        if share.revoked_at is None:
            link = site_url + reverse("conversations:shared", args=[share_token(share_id=share.pk)])
        yield {
            "id": str(share.pk),
            "conversation_id": str(share.conversation_id),
            "title": share.title,
            "created_at": _iso(share.created_at),
            "revoked_at": _iso(share.revoked_at),
            "link": link,
            "messages": share.messages,
        }


def _feedback(user: Any) -> Iterator[dict[str, Any]]:
    """The thumbs the user gave on answers, oldest first."""
    rows = (
        Feedback.objects.filter(user_id=user.pk, message__conversation__deleted_at__isnull=True)
        .order_by("created_at", "id")
        .values(
            "pk",
            "message_id",
            "message__conversation_id",
            "rating",
            "reason",
            "comment",
            "created_at",
            "updated_at",
        )
    )
    for row in rows.iterator(chunk_size=2000):
        yield {
            "id": str(row["pk"]),
            "message_id": str(row["message_id"]),
            "conversation_id": str(row["message__conversation_id"]),
            "rating": row["rating"],
            "reason": row["reason"],
            "comment": row["comment"],
            "created_at": _iso(row["created_at"]),
            "updated_at": _iso(row["updated_at"]),
        }


_UNSAFE_IN_NAMES = set('/\\:*?"<>|')


def safe_filename(name: str) -> str:
    """`name` as one harmless path component: no folder separators (either kind), no control
    or format characters, no run of dots (so never `..`), no leading dot or space, at most
    SAFE_FILENAME_MAX_CHARS characters (the extension kept); `file` if nothing is left."""
    cleaned = "".join(
        "_"
        if c in _UNSAFE_IN_NAMES or unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Zl", "Zp"}
        else c
        for c in unicodedata.normalize("NFC", name)
    )
    while ".." in cleaned:
        cleaned = cleaned.replace("..", ".")
    cleaned = cleaned.strip(" .")
    if len(cleaned) > SAFE_FILENAME_MAX_CHARS:
        stem, dot, suffix = cleaned.rpartition(".")
        if dot and 0 < len(suffix) < 16:
            cleaned = f"{stem[: SAFE_FILENAME_MAX_CHARS - len(suffix) - 1]}.{suffix}"
        else:
            cleaned = cleaned[:SAFE_FILENAME_MAX_CHARS]
    return cleaned or "file"


def _attachment_rows(user: Any) -> list[Mapping[str, Any]]:
    """Every file of the user's conversations (the trash left out), metadata only: the SHA-256
    is computed by Postgres, so no file's bytes are read here."""
    digest = Func(
        Func(F("data"), function="sha256", output_field=BinaryField()),
        Value("hex"),
        function="encode",
        output_field=CharField(),
    )
    return list(
        Attachment.objects.filter(
            conversation__owner_id=user.pk, conversation__deleted_at__isnull=True
        )
        .annotate(sha256=digest)
        .order_by("conversation__created_at", "conversation_id", "created_at", "id")
        .values(
            "pk",
            "conversation_id",
            "message_id",
            "name",
            "kind",
            "size",
            "sha256",
            "created_at",
        )
    )


def _attachment_path(row: Mapping[str, Any]) -> str:
    return f"attachments/{row['conversation_id']}/{row['pk']}-{safe_filename(row['name'])}"


def _attachment_metadata(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **_attachment_summary(row),
        "sha256": row["sha256"],
        "conversation_id": str(row["conversation_id"]),
        "message_id": str(row["message_id"]) if row["message_id"] else None,
        "created_at": _iso(row["created_at"]),
        "path": _attachment_path(row),
    }


class _AttachmentBytes:
    """The files' bytes, read as the zip reaches them, a batch of files per query.

    The files are taken in the order of `rows`, the order they are added to the zip, so each
    batch is read once; at most one batch (ATTACHMENT_BATCH_BYTES, or one larger file) is held
    at a time. A file deleted since its row was read is written empty.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self._batch_of: dict[uuid.UUID, list[uuid.UUID]] = {}
        batch: list[uuid.UUID] = []
        total = 0
        for row in rows:
            if batch and total + row["size"] > ATTACHMENT_BATCH_BYTES:
                batch, total = [], 0
            batch.append(row["pk"])
            total += row["size"]
            self._batch_of[row["pk"]] = batch
        self._loaded: dict[uuid.UUID, Any] = {}

    def file(self, pk: uuid.UUID) -> Iterator[bytes]:
        # A generator: nothing is read until the zip gets to this file.
        if pk not in self._loaded:
            self._loaded = {}  # the previous batch goes before the next is read
            self._loaded = dict(
                Attachment.objects.filter(pk__in=self._batch_of[pk]).values_list("pk", "data")
            )
        data = self._loaded.pop(pk, None)
        if data is None:
            return
        view = memoryview(data)
        for start in range(0, len(view), ZIP_CHUNK_BYTES):
            yield bytes(view[start : start + ZIP_CHUNK_BYTES])


README = """\
Your data from Chatsite, exported {when} UTC.

account.json        your account and plan
api_keys.json       your API keys: name, visible prefix, scope, dates (never the key itself)
folders.json        your folders
conversations/      every conversation: <id>.json (the whole tree, in a format the import
                    reads back) and <id>.md (the branch on screen, as Markdown)
shares.json         your share links: title, dates, the snapshot each shows, and the link
                    itself while it is not revoked (anyone holding a link can read it)
feedback.json       the thumbs up or down you gave on answers, with reason and comment
attachments.json    the files you attached: name, type, size, SHA-256, message, and path here
attachments/        the files themselves: <conversation id>/<file id>-<name>
billing.json        your monthly statements
usage.jsonl         every answer you were charged for, one JSON object a line
moderation.json     warnings, suspensions and bans on your account, if any

Import the zip (or any conversations/<id>.json) back from the "Your data" page: it brings
back the conversations, not the files, shares or feedback.
"""


def account_zip(*, user: Any, site_url: str = "") -> Iterator[bytes]:
    """All of `user`'s data as a zip, produced piece by piece as it is sent (module docstring).

    Only the list of conversation ids and the files' metadata are read ahead; each file is
    read when the zip gets to it. `site_url` (scheme and host, no trailing slash) makes the
    share links absolute; without it they are paths.
    """
    archive = zipstream.ZipStream(compress_type=zipstream.ZIP_DEFLATED)
    archive.add(README.format(when=f"{timezone.now():%Y-%m-%d %H:%M}").encode(), "README.txt")
    archive.add(_json_bytes(_account(user)), "account.json")
    archive.add(_json_bytes(_api_keys(user)), "api_keys.json")
    archive.add(_json_bytes(_folders(user)), "folders.json")
    ids = Conversation.objects.filter(owner_id=user.pk, deleted_at__isnull=True).order_by(
        "created_at", "id"
    )
    for conversation_id in ids.values_list("pk", flat=True).iterator():
        archive.add(
            _conversation_file(conversation_id, False), f"conversations/{conversation_id}.json"
        )
        archive.add(
            _conversation_file(conversation_id, True), f"conversations/{conversation_id}.md"
        )
    archive.add(_json_array(_shares(user, site_url)), "shares.json")
    archive.add(_json_array(_feedback(user)), "feedback.json")
    files = _attachment_rows(user)
    archive.add(_json_bytes([_attachment_metadata(row) for row in files]), "attachments.json")
    reader = _AttachmentBytes(files)
    for row in files:
        archive.add(reader.file(row["pk"]), _attachment_path(row))
    archive.add(_json_bytes(_statements(user)), "billing.json")
    archive.add(_usage_lines(user), "usage.jsonl")
    archive.add(_json_bytes(_sanctions(user)), "moderation.json")
    return _coalesced(archive)


def _coalesced(pieces: Iterator[bytes] | zipstream.ZipStream) -> Iterator[bytes]:
    """The zip's many small pieces as chunks of about ZIP_CHUNK_BYTES: fewer writes and, on the
    edge, fewer hops between the event loop and the thread that reads the database."""
    buffer = bytearray()
    for piece in pieces:
        buffer += piece
        if len(buffer) >= ZIP_CHUNK_BYTES:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)
