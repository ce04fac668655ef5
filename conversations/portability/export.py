"""Exports: one conversation as JSON (the whole tree) or Markdown (the branch on screen), and
all of a user's data as a zip, streamed.

The JSON is the service's own versioned format, which `importers` reads back:

    {"format": "chatsite.conversation", "version": 1, "exported_at": ...,
     "conversation": {id, title, model, system_prompt, folder, pinned, archived, created_at,
                      last_activity_at, current_leaf},
     "messages": [{id, parent, role, content, status, model, created_at, updated_at,
                   current_child, metadata, prompt_tokens, output_tokens}, ...]}

`messages` holds every message of the tree, the root (`system`, the system prompt, no parent)
first and every parent before its children. An answer moderation withheld is exported as the
owner sees it: without its text.

The zip is written while it is sent (zipstream-ng): conversations are read one at a time, so
neither the zip nor the account is ever whole in memory. It holds no secret: API keys appear
by name and visible prefix only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import zipstream
from django.utils import timezone

from accounts.selectors import api_keys_for_user
from billing.models import UsageEvent
from billing.selectors import plan_for_user, statements_for_user
from moderation.models import Sanction

from .. import selectors
from ..models import Conversation, Folder, Message
from .formats import FORMAT_NAME, FORMAT_VERSION

ZIP_CHUNK_BYTES = 64 * 1024


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _tree(conversation: Conversation) -> list[Message]:
    """Every message, parents first (a child is never older than its parent)."""
    return list(Message.objects.filter(conversation=conversation).order_by("created_at", "id"))


def conversation_document(*, conversation: Conversation) -> dict[str, Any]:
    """The conversation's whole tree in the service's own format (module docstring)."""
    folder = conversation.folder.name if conversation.folder_id and conversation.folder else None
    messages = _tree(conversation)
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


README = """\
Your data from Chatsite, exported {when} UTC.

account.json        your account and plan
api_keys.json       your API keys: name, visible prefix, scope, dates (never the key itself)
folders.json        your folders
conversations/      every conversation: <id>.json (the whole tree, in a format the import
                    reads back) and <id>.md (the branch on screen, as Markdown)
billing.json        your monthly statements
usage.jsonl         every answer you were charged for, one JSON object a line
moderation.json     warnings, suspensions and bans on your account, if any

Import the zip (or any conversations/<id>.json) back from the "Your data" page.
"""


def account_zip(*, user: Any) -> Iterator[bytes]:
    """All of `user`'s data as a zip, produced piece by piece as it is sent (module docstring).

    Only the list of conversation ids is read ahead; each file is read when the zip gets to it.
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
