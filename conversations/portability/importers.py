"""Reading import files, one conversation at a time, into `ParsedConversation`s.

Files may be large (a ChatGPT export of years), so nothing here holds a whole file: JSON is
read with ijson, a streaming parser, which hands over one conversation of a top-level list at
a time; a zip (the service's own export) is read member by member. Memory follows the largest
conversation, not the file.

Three shapes are read:
- the service's own JSON (`export.conversation_document`): one object, `{"format":
  "chatsite.conversation", "version": 1, "conversation": {...}, "messages": [...]}`;
- ChatGPT's `conversations.json`: a list of conversations, each a `mapping` {node id: {id,
  message, parent, children}} with a `current_node`; a list may also hold the service's own
  objects;
- the zip of `export.account_zip`: its `conversations/*.json`; ChatGPT's export zip: its
  `conversations.json`.

Everything a file says is checked here (types, ids, parents, cycles, lengths); a fault is an
`ImportFault` naming the conversation (its index in the file) and the node.
"""

from __future__ import annotations

import io
import itertools
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import IO, Any

import ijson
from django.conf import settings
from django.utils import timezone

from ..errors import ErrorCode
from ..models import Attachment, Message
from .formats import (
    FORMAT_NAME,
    FORMAT_VERSION,
    ImportFault,
    ParsedConversation,
    ParsedMessage,
    Source,
)

ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
# The file of ChatGPT's "Export data" zip that holds the conversations.
CHATGPT_MEMBER = "conversations.json"
# What a JSON file may start with before its first value (a UTF-8 byte order mark, spaces).
_LEADING = b" \t\r\n\xef\xbb\xbf"
# ChatGPT's nodes that are not part of the conversation a person sees: hidden context (custom
# instructions), the model's hidden reasoning.
CHATGPT_HIDDEN_CONTENT = frozenset(
    {"user_editable_context", "model_editable_context", "thoughts", "reasoning_recap"}
)
CHATGPT_KEPT_ROLES = frozenset({"user", "assistant"})
_TICK = timedelta(microseconds=1)
MODEL_MAX_CHARS = 100
FOLDER_NAME_MAX_CHARS = 60


def _fault(code: ErrorCode, message: str, **detail: Any) -> ImportFault:
    return ImportFault(code, message, detail=detail or None)


def _shape(message: str, **detail: Any) -> ImportFault:
    return _fault(ErrorCode.IMPORT_WRONG_SHAPE, message, **detail)


class IterStream(io.RawIOBase):
    """A readable binary stream over an iterable of byte strings, read as it is consumed."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            self._pending = piece
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def sniff(head: bytes) -> str:
    """`zip` or `json` from a file's first bytes; anything else is an unknown format."""
    if head.startswith(ZIP_MAGIC):
        return "zip"
    start = head.lstrip(_LEADING)[:1]
    if start in (b"[", b"{"):
        return "json"
    if not head.strip(_LEADING):
        raise _fault(ErrorCode.IMPORT_EMPTY, "The file is empty.")
    raise _fault(
        ErrorCode.IMPORT_UNKNOWN_FORMAT,
        "This is not a file the import reads: upload a conversation exported from here (JSON "
        "or the zip of all your data) or ChatGPT's conversations.json.",
    )


def read_file(file: IO[bytes]) -> Iterator[tuple[Source, ParsedConversation]]:
    """Every conversation of an uploaded file (seekable: a zip needs it), with its format."""
    file.seek(0)
    kind = sniff(file.read(64))
    file.seek(0)
    if kind == "zip":
        yield from read_zip(file)
    else:
        yield from read_json(file)


def read_json(stream: IO[bytes] | io.RawIOBase) -> Iterator[tuple[Source, ParsedConversation]]:
    """The conversations of a JSON file, read as a stream: a top-level list one item at a time,
    a top-level object (one conversation) whole. `stream` is left open."""
    head = stream.read(64) or b""
    if sniff(head) != "json":
        raise _fault(ErrorCode.IMPORT_UNKNOWN_FORMAT, "This file is not JSON.")
    rest = iter(lambda: stream.read(64 * 1024) or b"", b"")
    buffered = IterStream(itertools.chain([head], rest))
    is_list = head.lstrip(_LEADING)[:1] == b"["
    items = ijson.items(buffered, "item" if is_list else "", use_float=True)
    index = 0  # of the conversation being read: a fault names it
    try:
        for raw in items:
            yield _conversation(raw, index=index)
            index += 1
    except ijson.JSONError as exc:
        raise _fault(
            ErrorCode.IMPORT_INVALID_JSON,
            "The file is not valid JSON.",
            conversation=index,
            reason=str(exc)[:200],
        ) from exc


def read_zip(file: IO[bytes]) -> Iterator[tuple[Source, ParsedConversation]]:
    """The conversations of the zip of an account export (its `conversations/*.json`), or of
    the zip ChatGPT's "Export data" sends (its `conversations.json`, read as a stream)."""
    try:
        archive = zipfile.ZipFile(file)
        members = sorted(
            (info for info in archive.infolist() if _is_conversation_member(info.filename)),
            key=lambda info: info.filename,
        )
        chatgpt = next(
            (info for info in archive.infolist() if info.filename == CHATGPT_MEMBER), None
        )
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise _fault(ErrorCode.IMPORT_INVALID_ZIP, "The zip file cannot be read.") from exc
    if not members and chatgpt is not None:
        if chatgpt.file_size > settings.IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES:
            raise _fault(
                ErrorCode.IMPORT_TOO_LARGE,
                "The zip's conversations.json is too large once uncompressed.",
                max_bytes=settings.IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES,
            )
        with archive, archive.open(chatgpt) as member:
            try:
                yield from read_json(member)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise _fault(
                    ErrorCode.IMPORT_INVALID_ZIP, "The zip's conversations.json cannot be read."
                ) from exc
        return
    uncompressed = sum(info.file_size for info in members)
    if uncompressed > settings.IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES:
        raise _fault(
            ErrorCode.IMPORT_TOO_LARGE,
            "The zip's conversations are too large once uncompressed.",
            max_bytes=settings.IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES,
        )
    if not members:
        raise _fault(
            ErrorCode.IMPORT_UNKNOWN_FORMAT,
            "The zip holds neither conversations/*.json (an export of this service) nor "
            "conversations.json (ChatGPT's).",
        )
    with archive:
        for index, info in enumerate(members):
            try:
                with archive.open(info) as member:
                    raw = next(ijson.items(member, "", use_float=True), None)
            except ijson.JSONError as exc:
                raise _fault(
                    ErrorCode.IMPORT_INVALID_JSON,
                    f"{info.filename} in the zip is not valid JSON.",
                    conversation=index,
                    file=info.filename,
                ) from exc
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise _fault(
                    ErrorCode.IMPORT_INVALID_ZIP,
                    f"{info.filename} in the zip cannot be read.",
                    file=info.filename,
                ) from exc
            source, parsed = _conversation(raw, index=index)
            if source != Source.CHATSITE:
                raise _shape(f"{info.filename} is not a conversation of this service.")
            yield Source.CHATSITE_ZIP, parsed


def _is_conversation_member(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[0] == "conversations" and parts[1].endswith(".json")


def _conversation(raw: Any, *, index: int) -> tuple[Source, ParsedConversation]:
    if not isinstance(raw, dict):
        raise _shape("Each conversation must be a JSON object.", conversation=index)
    if "format" in raw:
        return Source.CHATSITE, _chatsite(raw, index=index)
    if "mapping" in raw:
        return Source.CHATGPT, _chatgpt(raw, index=index)
    raise _fault(
        ErrorCode.IMPORT_UNKNOWN_FORMAT,
        "A conversation of the file is neither this service's export (`format`) nor "
        "ChatGPT's (`mapping`).",
        conversation=index,
    )


# Times


def _time(value: Any) -> datetime | None:
    """A time of a file: epoch seconds (ChatGPT) or ISO 8601 (ours); None if absent or absurd."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float | Decimal):
        seconds = float(value)
        if not 0 < seconds < 1e11:
            return None
        return datetime.fromtimestamp(seconds, tz=UTC)
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            return None
        return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
    return None


def _stamp(messages: list[ParsedMessage], start: datetime) -> None:
    """Give every message a time that keeps the tree's order: after its parent and after the
    sibling before it (branches are shown oldest first), its own time where it has one."""
    stamps: dict[str | None, datetime] = {None: start}
    last_child: dict[str | None, datetime] = {}
    for message in messages:
        parent_stamp = stamps[message.parent]
        floor = max(parent_stamp, last_child.get(message.parent, parent_stamp))
        own = message.created_at
        stamp = own if own is not None and own > floor else floor + _TICK
        message.created_at = stamp
        stamps[message.key] = stamp
        last_child[message.parent] = stamp


# The tree


def _tree_order(
    parents: dict[str, str | None], child_order: dict[str, list[str]], *, index: int
) -> list[str]:
    """The keys of a tree given by parent pointers, in preorder (a parent before its
    children, children in `child_order` where the parent lists them, else as they came).

    A parent that is not in the tree is a wrong shape; a node that no root leads to is on a
    cycle (following its parents never ends)."""
    children: dict[str | None, list[str]] = defaultdict(list)
    for key, parent in parents.items():
        if parent is not None and parent not in parents:
            raise _shape(
                f"Node {key!r} names a parent {parent!r} that is not in the conversation.",
                conversation=index,
                node=key,
            )
        children[parent].append(key)
    for parent, keys in children.items():
        listed = child_order.get(parent) if parent is not None else None
        if listed:
            position = {child: place for place, child in enumerate(listed)}
            keys.sort(key=lambda child: position.get(child, len(position)))
    order: list[str] = []
    stack = list(reversed(children[None]))
    while stack:
        key = stack.pop()
        order.append(key)
        stack.extend(reversed(children.get(key, [])))
    if len(order) < len(parents):
        seen = set(order)
        stuck = next(key for key in parents if key not in seen)
        raise _fault(
            ErrorCode.IMPORT_CYCLE,
            "The conversation's messages form a cycle: following the parents of "
            f"{stuck!r} never reaches the start.",
            conversation=index,
            node=stuck,
        )
    return order


def _last_leaf(messages: list[ParsedMessage]) -> str | None:
    """From the root, the last child at every step: the newest branch."""
    last: dict[str | None, str] = {}
    for message in messages:
        last[message.parent] = message.key
    leaf: str | None = None
    while leaf in last:
        leaf = last[leaf]
    return leaf


# ChatGPT's conversations.json


def _chatgpt(raw: dict[str, Any], *, index: int) -> ParsedConversation:
    mapping = raw.get("mapping")
    if not isinstance(mapping, dict):
        raise _shape("`mapping` must be an object of nodes.", conversation=index)
    parents: dict[str, str | None] = {}
    child_order: dict[str, list[str]] = {}
    bodies: dict[str, Any] = {}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise _shape(f"Node {key!r} must be an object.", conversation=index, node=key)
        parent = node.get("parent")
        children = node.get("children", [])
        if parent is not None and not isinstance(parent, str):
            raise _shape(f"The parent of node {key!r} must be an id.", conversation=index, node=key)
        if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
            raise _shape(
                f"The children of node {key!r} must be a list of ids.",
                conversation=index,
                node=key,
            )
        parents[key] = parent
        child_order[key] = children
        bodies[key] = node.get("message")
    order = _tree_order(parents, child_order, index=index)

    created = _time(raw.get("create_time")) or timezone.now()
    # Each node's nearest kept node at or above it: a skipped node's children hang there.
    kept_at: dict[str | None, str | None] = {None: None}
    messages: list[ParsedMessage] = []
    for key in order:
        above = kept_at[parents[key]]
        message = _chatgpt_message(bodies[key], key=key, parent=above, index=index)
        kept_at[key] = key if message is not None else above
        if message is not None:
            messages.append(message)
    _stamp(messages, created)

    current = raw.get("current_node")
    if current is None:
        leaf = _last_leaf(messages)
    elif isinstance(current, str) and current in parents:
        leaf = kept_at[current]
    else:
        raise _shape(
            "`current_node` is not a node of the conversation.", conversation=index, node=current
        )
    updated = _time(raw.get("update_time"))
    last_stamp = max((m.created_at for m in messages if m.created_at), default=created)
    return ParsedConversation(
        title=_title(raw.get("title")),
        system_prompt="",
        model=None,  # ChatGPT's models are not ours: the conversation goes on with the default
        created_at=created,
        last_activity_at=max(updated or last_stamp, last_stamp),
        messages=messages,
        current_leaf=leaf,
        archived=raw.get("is_archived") is True,
    )


def _chatgpt_message(
    body: Any, *, key: str, parent: str | None, index: int
) -> ParsedMessage | None:
    """A node's message as ours, or None for a node a person does not see (the empty root,
    system and tool messages, hidden context, hidden reasoning, empty text)."""
    if body is None:
        return None
    where = {"conversation": index, "node": key}
    if not isinstance(body, dict):
        raise _shape(f"The message of node {key!r} must be an object.", **where)
    author = body.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    if not isinstance(role, str):
        raise _shape(f"The message of node {key!r} has no author.role.", **where)
    found = body.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    if role not in CHATGPT_KEPT_ROLES or metadata.get("is_visually_hidden_from_conversation"):
        return None
    content = body.get("content")
    content_type = content.get("content_type") if isinstance(content, dict) else None
    if not isinstance(content, dict) or not isinstance(content_type, str):
        raise _shape(f"The message of node {key!r} has no content.content_type.", **where)
    if content_type in CHATGPT_HIDDEN_CONTENT:
        return None
    text = _chatgpt_text(content, content_type, where=where)
    notes = [
        f"[Attachment not imported: {item.get('name') or 'a file'}]"
        for item in metadata.get("attachments") or []
        if isinstance(item, dict)
    ]
    text = "\n\n".join(part for part in (text, *notes) if part)
    if not text.strip():
        return None
    model = metadata.get("model_slug")
    return ParsedMessage(
        key=key,
        parent=parent,
        role=Message.Role.USER if role == "user" else Message.Role.ASSISTANT,
        content=text,
        created_at=_time(body.get("create_time")),
        model=model[:MODEL_MAX_CHARS] if isinstance(model, str) and role == "assistant" else "",
    )


def _chatgpt_text(content: dict[str, Any], content_type: str, *, where: dict[str, Any]) -> str:
    """The text of a ChatGPT message: its string parts joined; a part that is not text (an
    image, a file) is noted in its place; code as a fenced block."""
    parts = content.get("parts")
    if isinstance(parts, list):
        pieces = []
        for part in parts:
            if isinstance(part, str):
                if part:
                    pieces.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                pieces.append(part["text"])  # e.g. a voice message's transcription
            elif isinstance(part, dict):
                kind = part.get("content_type") or "attachment"
                pieces.append(f"[{str(kind).replace('_', ' ')} not imported]")
            elif part is not None:
                raise _shape("A part of a message must be text or an object.", **where)
        return "\n\n".join(pieces)
    text = content.get("text")
    if isinstance(text, str):
        if content_type == "code":
            language = content.get("language")
            fence = language if isinstance(language, str) and language != "unknown" else ""
            return f"```{fence}\n{text}\n```"
        return text
    return f"[{content_type.replace('_', ' ')} not imported]"


def _title(value: Any) -> str:
    title = " ".join(value.split()) if isinstance(value, str) else ""
    return title[: settings.TITLE_MAX_CHARS].strip()


# The service's own format


def _chatsite(raw: dict[str, Any], *, index: int) -> ParsedConversation:
    if raw.get("format") != FORMAT_NAME:
        raise _fault(
            ErrorCode.IMPORT_UNKNOWN_FORMAT,
            f"Unknown format {str(raw.get('format'))[:60]!r}: expected {FORMAT_NAME!r}.",
            conversation=index,
        )
    version = raw.get("version")
    if version != FORMAT_VERSION:
        raise _fault(
            ErrorCode.IMPORT_UNSUPPORTED_VERSION,
            f"Version {str(version)[:20]} of the format is not one this service reads "
            f"(it reads version {FORMAT_VERSION}).",
            conversation=index,
            version=version if isinstance(version, int) else None,
        )
    head = raw.get("conversation")
    rows = raw.get("messages")
    if not isinstance(head, dict) or not isinstance(rows, list):
        raise _shape("`conversation` must be an object and `messages` a list.", conversation=index)
    where: dict[str, Any] = {"conversation": index}

    system_prompt = _string(head, "system_prompt", where=where)
    if len(system_prompt) > settings.SYSTEM_PROMPT_MAX_CHARS:
        raise _shape(
            f"The system prompt is longer than {settings.SYSTEM_PROMPT_MAX_CHARS} characters.",
            **where,
        )
    model = _string(head, "model", where=where).strip()
    if len(model) > MODEL_MAX_CHARS:
        raise _shape(f"A model name may hold at most {MODEL_MAX_CHARS} characters.", **where)
    folder = head.get("folder")
    if folder is not None and not isinstance(folder, str):
        raise _shape("`folder` must be a name or null.", **where)

    root: str | None = None
    parents: dict[str, str | None] = {}
    bodies: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise _shape("Each message must be an object with a string `id`.", **where)
        key = row["id"]
        parent = row.get("parent")
        if key in parents or key == root:
            raise _shape(f"Message id {key!r} appears twice.", **where, node=key)
        if parent is None:
            if root is not None or row.get("role") != Message.Role.SYSTEM:
                raise _shape(
                    "Only the root, one `system` message, may have no parent.", **where, node=key
                )
            root = key
            continue
        if not isinstance(parent, str):
            raise _shape(f"The parent of message {key!r} must be an id.", **where, node=key)
        parents[key] = parent
        bodies[key] = row
    if root is None:
        raise _shape("The conversation has no root (a `system` message without parent).", **where)
    # Messages under the root hang under ours.
    tops = {key: (None if parent == root else parent) for key, parent in parents.items()}
    order = _tree_order(tops, {}, index=index)

    messages = [_chatsite_message(bodies[key], key, tops[key], where=where) for key in order]
    created = _time(head.get("created_at")) or timezone.now()
    _stamp(messages, created)

    current_children: dict[str | None, str] = {}
    for row in rows:
        child = row.get("current_child")
        if child is None:
            continue
        owner: str | None = None if row["id"] == root else row["id"]
        if not isinstance(child, str) or tops.get(child, "") != owner:
            raise _shape(
                f"The current child of message {row['id']!r} is not one of its children.",
                **where,
                node=row["id"],
            )
        current_children[owner] = child
    leaf = head.get("current_leaf")
    if leaf == root:
        leaf = None
    elif leaf is not None and (not isinstance(leaf, str) or leaf not in tops):
        raise _shape("`current_leaf` is not a message of the conversation.", **where)

    last_stamp = max((m.created_at for m in messages if m.created_at), default=created)
    return ParsedConversation(
        title=_title(head.get("title")),
        system_prompt=system_prompt,
        model=model or None,
        created_at=created,
        last_activity_at=max(_time(head.get("last_activity_at")) or last_stamp, last_stamp),
        messages=messages,
        current_leaf=leaf if leaf is not None else None,
        current_children=current_children,
        folder=(folder.strip()[:FOLDER_NAME_MAX_CHARS] or None) if folder else None,
        pinned=head.get("pinned") is True,
        archived=head.get("archived") is True,
    )


_IN_PROGRESS = {Message.Status.QUEUED, Message.Status.STREAMING}


def _chatsite_message(
    row: dict[str, Any], key: str, parent: str | None, *, where: dict[str, Any]
) -> ParsedMessage:
    at = {**where, "node": key}
    role = row.get("role")
    if role not in Message.Role.values or role == Message.Role.SYSTEM:
        raise _shape(f"Message {key!r} has an unknown role {str(role)[:20]!r}.", **at)
    status = row.get("status", Message.Status.COMPLETE)
    if status not in Message.Status.values:
        raise _shape(f"Message {key!r} has an unknown status {str(status)[:20]!r}.", **at)
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _shape(f"The metadata of message {key!r} must be an object.", **at)
    # Attached files are not imported: the message must not claim any (its count says whether
    # the context looks for files).
    metadata = {k: v for k, v in metadata.items() if k != Attachment.METADATA_KEY}
    model = _string(row, "model", where=at)
    tokens = [row.get("prompt_tokens"), row.get("output_tokens")]
    if any(
        t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 0) for t in tokens
    ):
        raise _shape(f"The token counts of message {key!r} must be whole numbers.", **at)
    return ParsedMessage(
        key=key,
        parent=parent,
        role=role,
        content=_string(row, "content", where=at),
        created_at=_time(row.get("created_at")),
        # An answer cut off by the export never finishes here: it is shown as stopped.
        status=Message.Status.CANCELLED if status in _IN_PROGRESS else status,
        model=model[:MODEL_MAX_CHARS],
        metadata=metadata,
        prompt_tokens=tokens[0],
        output_tokens=tokens[1],
    )


def _string(row: dict[str, Any], name: str, *, where: dict[str, Any]) -> str:
    value = row.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _shape(f"`{name}` must be a string.", **where)
    return value


__all__ = [
    "IterStream",
    "read_file",
    "read_json",
    "read_zip",
    "sniff",
]
