"""Writes to conversations: the tree of messages changes only here.

Every write to a tree locks its conversation row first (`select_for_update`), so two sends,
an edit and a branch switch on one conversation happen one after another and the tree, the
`current_child` pointers and `current_leaf` always agree. The functions that add an
assistant placeholder return it: the caller enqueues its generation after commit.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import json
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import JSONField, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from chatsite import rows
from chatsite.errors import ServiceError

from .attachments import attachments_claim, attachments_copy
from .errors import ErrorCode
from .models import (
    Attachment,
    BranchSummary,
    Conversation,
    Feedback,
    Folder,
    MemoryFact,
    Message,
    Personalization,
    Share,
)
from .selectors import LockedPath, active_branch, message_ancestry, message_ancestry_locked

IN_PROGRESS_STATUSES = (Message.Status.QUEUED, Message.Status.STREAMING)
# A user message answers the system prompt or an assistant turn, never another user turn.
USER_PARENT_ROLES = frozenset({Message.Role.SYSTEM, Message.Role.ASSISTANT})


@dataclass(frozen=True)
class Written:
    """What a turn's tree change wrote: the user's new message (None for a regeneration),
    the placeholder of its answer, shown as the new leaf, and the branch now on screen, root
    first, ending with the placeholder (the caller need not read it back)."""

    user_message: Message | None
    placeholder: Message
    branch: list[Message]
    # The summaries through the branch's messages, by message id, where the change read them
    # with the branch (None: not read; `summaries.summary_for_branch` reads them).
    summaries: dict[uuid.UUID, BranchSummary] | None = None


def _check_content(content: str) -> None:
    if not content.strip():
        raise ServiceError(ErrorCode.EMPTY_MESSAGE, "The message is empty.")
    if len(content) > settings.MESSAGE_MAX_CHARS:
        raise ServiceError(
            ErrorCode.MESSAGE_TOO_LONG,
            f"A message may hold at most {settings.MESSAGE_MAX_CHARS} characters.",
            status=413,
            detail={"max_chars": settings.MESSAGE_MAX_CHARS, "chars": len(content)},
        )


def _check_title(title: str) -> str:
    title = title.strip()
    if len(title) > settings.TITLE_MAX_CHARS:
        raise ServiceError(
            ErrorCode.TITLE_TOO_LONG,
            f"A title may hold at most {settings.TITLE_MAX_CHARS} characters.",
            detail={"max_chars": settings.TITLE_MAX_CHARS},
        )
    return title


# Set inside `turn_transaction`: the tree's writes are part of a turn's one transaction.
_IN_TURN: ContextVar[bool] = ContextVar("conversations_in_turn", default=False)


@contextlib.contextmanager
def turn_transaction() -> Iterator[None]:
    """One transaction for a turn: its tree change (`message_send`, `message_edit`,
    `message_regenerate`) and what the caller writes after it (the generation). Inside it
    the tree functions take no savepoint of their own (two round trips each): a failure
    anywhere rolls the whole turn back, which is what the turn wants."""
    token = _IN_TURN.set(True)
    try:
        with transaction.atomic():
            yield
    finally:
        _IN_TURN.reset(token)


def _tree_change() -> transaction.Atomic:
    """The transaction of a tree change: its own, or, inside `turn_transaction`, the
    turn's. Called on its own (by staff's tools, a test), a failure still leaves the
    caller's transaction usable: it has its savepoint then."""
    return transaction.atomic(savepoint=not _IN_TURN.get())


def _lock(conversation: Conversation) -> None:
    """Lock the conversation row and reload it, refusing a tombstone."""
    conversation.refresh_from_db(from_queryset=Conversation.objects.select_for_update())
    if conversation.deleted_at is not None:
        raise _deleted()


def _deleted() -> ServiceError:
    return ServiceError(ErrorCode.CONVERSATION_DELETED, "This conversation was deleted.")


def _show_leaf(conversation: Conversation, leaf: Message) -> None:
    """Put `leaf` on screen: every ancestor's `current_child` points along the path to it."""
    moved = []
    for node, child in itertools.pairwise(message_ancestry(message_id=leaf.pk)):
        if node.current_child_id != child.pk:
            node.current_child_id = child.pk
            moved.append(node)
    if moved:
        Message.objects.bulk_update(moved, ["current_child"])
    conversation.current_leaf = leaf
    conversation.save(update_fields=["current_leaf", "updated_at"])


def _locked_path(
    conversation: Conversation, message_id: Any, *, missing: ServiceError
) -> LockedPath:
    """Lock the conversation's row and read the branch from the root to its message
    `message_id` (root first), with the summaries through it, in one statement
    (`selectors.message_ancestry_locked`). A tombstone is refused, and `missing` raised if
    the message is not one of this conversation's. `message_id` None: the conversation's
    current leaf, as the lock finds it."""

    def read(start: Any) -> LockedPath | None:
        if start is None:
            return None
        return message_ancestry_locked(message_id=start, conversation_id=conversation.pk)

    start = message_id if message_id is not None else conversation.current_leaf_id
    found = read(start)
    if found is not None and message_id is None and found.current_leaf_id != start:
        # The leaf moved before the lock was ours (or the caller's copy is old): again,
        # from the leaf the locked row names.
        found = read(found.current_leaf_id)
    if found is not None:
        conversation.current_leaf_id = found.current_leaf_id
        conversation.deleted_at = found.deleted_at
    deleted = (
        found.deleted_at is not None
        if found is not None
        # Its messages went with it: the path is not there to say so.
        else Conversation.objects.filter(pk=conversation.pk, deleted_at__isnull=False).exists()
    )
    if deleted:
        raise _deleted()
    if found is None or found.path[-1].conversation_id != conversation.pk:
        raise missing
    return found


def _write_leaf(
    conversation: Conversation, path: list[Message], new: list[Message]
) -> list[Message]:
    """Write the messages `new` under `path` (the branch above them, root first) and show the
    last as the conversation's leaf, as new activity: every ancestor's `current_child` points
    along the branch. One statement for the insert, the pointers and the conversation
    (Postgres checks their references to each other at commit), where the ORM took three.
    Refused (409) while an answer in the conversation is in progress, which the caller must
    then roll back (a turn's transaction does). Returns the branch, pointers updated."""
    branch = [*path, *new]
    moved: list[Message] = []
    for node, child in itertools.pairwise(branch):
        if node.current_child_id != child.pk:
            node.current_child = child
            if not node._state.adding:
                moved.append(node)
    insert_sql, params = rows.insert_sql(Message, new)
    ctes = [f"inserted AS ({insert_sql})"]
    uuid_of = functools.partial(Message._meta.pk.get_db_prep_value, connection=connection)
    messages = connection.ops.quote_name(Message._meta.db_table)
    if moved:
        pairs = ", ".join(["(%s::uuid, %s::uuid)"] * len(moved))
        ctes.append(
            f"moved AS (UPDATE {messages} AS m SET current_child_id = v.child"  # noqa: S608
            f" FROM (VALUES {pairs}) AS v (id, child) WHERE m.id = v.id)"
        )
        for node in moved:
            params += [uuid_of(node.pk), uuid_of(node.current_child_id)]
    now = timezone.now()
    conversation.current_leaf = branch[-1]
    conversation.updated_at = conversation.last_activity_at = now
    when = Conversation._meta.get_field("updated_at").get_db_prep_value(now, connection)
    conversations = connection.ops.quote_name(Conversation._meta.db_table)
    # Names from the models, never from input; every value a bound parameter. An answer in
    # progress is looked for here, on data fresher than the lock: the turn is refused then,
    # and what this statement wrote rolls back with it.
    sql = (
        f"WITH {', '.join(ctes)} UPDATE {conversations}"  # noqa: S608
        " SET current_leaf_id = %s, updated_at = %s, last_activity_at = %s"
        f" WHERE id = %s AND NOT EXISTS (SELECT 1 FROM {messages} b"
        " WHERE b.conversation_id = %s AND b.role = %s"
        f" AND b.status IN ({', '.join(['%s'] * len(IN_PROGRESS_STATUSES))}))"
        " RETURNING id"
    )
    params += [uuid_of(branch[-1].pk), when, when, uuid_of(conversation.pk)]
    params += [uuid_of(conversation.pk), Message.Role.ASSISTANT.value, *IN_PROGRESS_STATUSES]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        shown = cursor.fetchone()
    if shown is None:
        raise ServiceError(
            ErrorCode.GENERATION_IN_PROGRESS,
            "An answer is still being generated in this conversation.",
            status=409,
        )
    rows.saved(new)
    return branch


def _placeholder(conversation: Conversation, parent: Message) -> Message:
    """The `queued` assistant message an answer will fill, not yet saved."""
    return Message(
        conversation=conversation,
        parent=parent,
        role=Message.Role.ASSISTANT,
        content="",
        status=Message.Status.QUEUED,
        model=conversation.model,
    )


def _add_turn(
    conversation: Conversation,
    found: LockedPath,
    content: str,
    count_tokens: Callable[[str], int] | None,
    attachment_ids: Sequence[Any] = (),
    carried_from: Message | None = None,
) -> Written:
    """A user message under the last of `found`'s path and its answer's placeholder, written and
    shown as the new leaf in one statement (`_write_leaf`). With `count_tokens` the message's
    token count is written with it, saving the update the context's count would cost. The
    files `attachment_ids` go on the message, and copies of those `carried_from` carries (the
    message an edit replaces); the message counts them in its metadata (`attachments`), so
    that a branch without files is known as such without a query."""
    carried = carried_from.metadata.get(Attachment.METADATA_KEY, 0) if carried_from else 0
    files = len(set(attachment_ids)) + carried
    user_message = Message(
        conversation=conversation,
        parent=found.path[-1],
        role=Message.Role.USER,
        content=content,
        status=Message.Status.COMPLETE,
        content_tokens=count_tokens(content) if count_tokens is not None else None,
        metadata={Attachment.METADATA_KEY: files} if files else {},
    )
    placeholder = _placeholder(conversation, user_message)
    branch = _write_leaf(conversation, found.path, [user_message, placeholder])
    attachments_claim(
        conversation=conversation, message=user_message, attachment_ids=attachment_ids
    )
    if carried_from is not None and carried:
        attachments_copy(source=carried_from, target=user_message)
    return Written(user_message, placeholder, branch, found.summaries)


def conversation_create(
    *,
    owner: Any,
    model: str | None = None,
    system_prompt: str = "",
    title: str = "",
    source: str = Conversation.Source.WEB,
    count_tokens: Callable[[str], int] | None = None,
) -> Conversation:
    """Start a conversation: its row and its root `system` message holding the system prompt.

    `model` defaults to `settings.DEFAULT_MODEL`; a title given here counts as set by the
    user, so automatic titling leaves it alone. `count_tokens`, the model's count, fills in
    the system prompt's token count as it is written.
    """
    conversation = conversation_new(
        owner=owner, model=model, system_prompt=system_prompt, title=title, source=source
    )
    with transaction.atomic():
        root = _root(conversation)
        if count_tokens is not None:
            root.content_tokens = count_tokens(root.content)
        conversation.current_leaf = root
        conversation.save()
        root.save()
    return conversation


def conversation_new(
    *,
    owner: Any,
    model: str | None = None,
    system_prompt: str = "",
    title: str = "",
    source: str = Conversation.Source.WEB,
) -> Conversation:
    """A conversation checked as `conversation_create` checks it, not yet saved: for a turn
    that writes it together with its first messages (`conversation_write_new_branch`)."""
    model = (model if model is not None else settings.DEFAULT_MODEL).strip()
    if not model or len(model) > Conversation._meta.get_field("model").max_length:  # type: ignore[operator]
        raise ServiceError(ErrorCode.UNKNOWN_MODEL, f"Unknown model {model!r}.")
    if len(system_prompt) > settings.SYSTEM_PROMPT_MAX_CHARS:
        raise ServiceError(
            ErrorCode.SYSTEM_PROMPT_TOO_LONG,
            f"A system prompt may hold at most {settings.SYSTEM_PROMPT_MAX_CHARS} characters.",
            status=413,
            detail={"max_chars": settings.SYSTEM_PROMPT_MAX_CHARS, "chars": len(system_prompt)},
        )
    title = _check_title(title)
    return Conversation(
        owner=owner,
        model=model,
        system_prompt=system_prompt,
        title=title,
        title_set_by_user=bool(title),
        source=source,
        last_activity_at=timezone.now(),
    )


def _root(conversation: Conversation) -> Message:
    return Message(
        conversation=conversation,
        role=Message.Role.SYSTEM,
        content=conversation.system_prompt,
        status=Message.Status.COMPLETE,
    )


def message_send(
    *,
    conversation: Conversation,
    content: str,
    parent: Message | uuid.UUID | None = None,
    count_tokens: Callable[[str], int] | None = None,
    attachment_ids: Sequence[Any] = (),
) -> Written:
    """Add a user message and the placeholder of its answer.

    The message goes under `parent` (a message of this conversation or its id; by default
    the current leaf), so a client may continue any branch. The placeholder is `queued`
    with the conversation's model and becomes the current leaf. `count_tokens`, the model's
    count, fills in the message's token count as it is written. `attachment_ids`: files
    uploaded to this conversation and not yet sent, which the message carries
    (`attachments.attachments_claim`).
    """
    _check_content(content)
    with _tree_change():
        parent_id = None if parent is None else parent.pk if isinstance(parent, Message) else parent
        found = _locked_path(
            conversation,
            parent_id,
            missing=ServiceError(
                ErrorCode.UNKNOWN_PARENT, "The parent is not a message of this conversation."
            ),
        )
        if found.path[-1].role not in USER_PARENT_ROLES:
            raise ServiceError(
                ErrorCode.INVALID_PARENT,
                f"A user message cannot follow a {found.path[-1].role} message.",
            )
        return _add_turn(conversation, found, content, count_tokens, attachment_ids)


def message_edit(
    *, message: Message, content: str, count_tokens: Callable[[str], int] | None = None
) -> Written:
    """Edit a user message: a new sibling with `content` and the placeholder of its answer
    (`count_tokens` as for `message_send`). The files the message carries go with the edit.

    The old message and everything under it stay intact, one branch switch away.
    """
    if message.role != Message.Role.USER:
        raise ServiceError(ErrorCode.NOT_A_USER_MESSAGE, "Only a user message can be edited.")
    _check_content(content)
    conversation = message.conversation
    with _tree_change():
        return _add_turn(
            conversation,
            _path_above(conversation, message),
            content,
            count_tokens,
            carried_from=message,
        )


def message_regenerate(*, message: Message) -> Written:
    """Ask again: a new `queued` assistant sibling of `message`, shown as the current leaf."""
    if message.role != Message.Role.ASSISTANT:
        raise ServiceError(
            ErrorCode.NOT_AN_ASSISTANT_MESSAGE, "Only an assistant message can be regenerated."
        )
    conversation = message.conversation
    with _tree_change():
        found = _path_above(conversation, message)
        path = _question_path(found.path)
        placeholder = _placeholder(conversation, path[-1])
        branch = _write_leaf(conversation, path, [placeholder])
    return Written(None, placeholder, branch, found.summaries)


def _path_above(conversation: Conversation, message: Message) -> LockedPath:
    """The conversation locked, and the branch from the root to `message`'s parent
    (`_locked_path`)."""
    if message.parent_id is None:
        # Only the root lacks a parent, and callers already refused it by its role.
        raise ServiceError(ErrorCode.INVALID_PARENT, "The root message has no siblings.")
    return _locked_path(
        conversation,
        message.parent_id,
        missing=ServiceError(ErrorCode.INVALID_PARENT, "The message has no parent here."),
    )


def _question_path(path: list[Message]) -> list[Message]:
    """`path` (root first, ending with an answer's parent) up to the message the answer
    replies to: above the tool rounds it made (the tool loop puts its calls and results
    between the question and the answer)."""
    end = len(path)
    while end > 1 and path[end - 1].role in (Message.Role.TOOL, Message.Role.ASSISTANT):
        end -= 1
    return path[:end]


def _last_viewed_leaf(message: Message) -> Message:
    """The deepest message reached from `message` by following `current_child` down."""
    table = connection.ops.quote_name(Message._meta.db_table)
    # The table name comes from the model, never from input; the id is a bound parameter.
    # Requiring `parent_id` to match keeps the walk inside the tree whatever the pointers say.
    sql = f"""
        WITH RECURSIVE descent (id, current_child_id, depth) AS (
            SELECT id, current_child_id, 0 FROM {table} WHERE id = %s
            UNION ALL
            SELECT m.id, m.current_child_id, descent.depth + 1
            FROM {table} m JOIN descent
                ON m.id = descent.current_child_id AND m.parent_id = descent.id
        )
        SELECT m.* FROM {table} m JOIN descent ON m.id = descent.id
        ORDER BY descent.depth DESC LIMIT 1
    """  # noqa: S608
    param = Message._meta.pk.get_db_prep_value(message.pk, connection)
    return next(iter(Message.objects.raw(sql, [param])))


def branch_switch(*, message: Message) -> Conversation:
    """Show the branch through `message`, down to the deepest leaf last viewed under it."""
    if message.parent_id is None:
        raise ServiceError(
            ErrorCode.CANNOT_SWITCH_TO_ROOT, "The system message has no siblings to switch to."
        )
    conversation = message.conversation
    with transaction.atomic():
        _lock(conversation)
        _show_leaf(conversation, _last_viewed_leaf(message))
    return conversation


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    """Give the conversation a title of the user's own; automatic titling stops for it.

    A rename does not move the conversation in the sidebar.
    """
    title = _check_title(title)
    if not title:
        raise ServiceError(ErrorCode.EMPTY_TITLE, "The title is empty.")
    with transaction.atomic():
        _lock(conversation)
        conversation.title = title
        conversation.title_set_by_user = True
        conversation.save(update_fields=["title", "title_set_by_user", "updated_at"])
    return conversation


# A turn of a branch written whole: (role, content), or (role, content, metadata) where
# metadata holds an assistant's `tool_calls` or a tool message's `tool_call_id` and `name`.
BranchTurn = tuple[str, str] | tuple[str, str, dict[str, Any]]
_BRANCH_ROLES = (Message.Role.USER, Message.Role.ASSISTANT, Message.Role.TOOL)


def _check_branch(messages: Sequence[BranchTurn]) -> None:
    if not messages or messages[-1][0] not in (Message.Role.USER, Message.Role.TOOL):
        raise ValueError("a branch to answer ends with a user message or a tool result")
    if any(message[0] not in _BRANCH_ROLES for message in messages):
        raise ValueError("a branch holds user, assistant and tool turns only")
    for message in messages:
        if len(message[1]) > settings.MESSAGE_MAX_CHARS:
            _check_content(message[1])
    if messages[-1][0] == Message.Role.USER:
        _check_content(messages[-1][1])


def conversation_write_new_branch(
    *,
    conversation: Conversation,
    messages: Sequence[BranchTurn],
    count_tokens: Callable[[str], int] | None = None,
) -> Written:
    """Save `conversation` (from `conversation_new`) with its root, `messages` as its one
    branch and the placeholder of their answer as its leaf (`user_message` is the last
    message of `messages`).

    For clients that send the whole conversation with every request (the OpenAI-compatible
    API): `messages` are the user, assistant and tool turns, oldest first, ending with the
    user turn to answer or with the results (`tool` turns) of the client's tool calls. A
    last user message must be non-empty; a tool result may be empty.

    Nobody else can see a conversation before this commits, so nothing is locked or read
    back: one row for the conversation and one statement for all its messages (Postgres
    checks the references between them at commit). `count_tokens`, if given, fills in each
    message's token count (not the placeholder's) before it is written, saving the updates
    the context's count would cost.
    """
    written = branch_new(conversation=conversation, messages=messages, count_tokens=count_tokens)
    # Within the caller's transaction, no savepoint: a failure here fails the turn whole.
    with transaction.atomic(savepoint=False):
        conversation.save(force_insert=True)
        Message.objects.bulk_create(written.branch)
    return written


def branch_new(
    *,
    conversation: Conversation,
    messages: Sequence[BranchTurn],
    count_tokens: Callable[[str], int] | None = None,
) -> Written:
    """`conversation_write_new_branch` without the write: the branch as it would be saved
    (checked, linked, counted), for a turn that keeps nothing (a `/v1` key's)."""
    _check_branch(messages)
    rows = [
        Message(
            conversation=conversation,
            role=role,
            content=content,
            status=Message.Status.COMPLETE,
            model=conversation.model if role == Message.Role.ASSISTANT else "",
            metadata=dict(rest[0]) if rest else {},
        )
        for role, content, *rest in messages
    ]
    placeholder = _placeholder(conversation, rows[-1])
    branch = [_root(conversation), *rows, placeholder]
    for above, row in itertools.pairwise(branch):
        row.parent = above
        above.current_child = row
    if count_tokens is not None:
        for message in branch[:-1]:  # the placeholder's is counted once it has its text
            message.content_tokens = count_tokens(message.content)
    conversation.current_leaf = placeholder
    return Written(rows[-1], placeholder, branch)


def answers_set_route(*, answers: QuerySet[Message], route: dict[str, str]) -> int:
    """The answers were (or will be) written by another pool than the conversation's: their
    model is that pool, and `route` (model, reason, notice) says why. One statement (jsonb
    concatenation), not a read and a write per answer."""
    return answers.update(
        model=route["model"],
        metadata=RawSQL(
            "metadata || %s::jsonb", [json.dumps({"route": route})], output_field=JSONField()
        ),
        updated_at=timezone.now(),
    )


# Folders, pins and archive: where a user keeps a conversation in the sidebar.

FOLDER_NAME_MAX_CHARS = 60


class Unset(enum.Enum):
    """A parameter not given (None means something: out of any folder)."""

    UNSET = enum.auto()


UNSET = Unset.UNSET


def _check_folder_name(name: str) -> str:
    name = " ".join(name.split())
    if not name:
        raise ServiceError(ErrorCode.EMPTY_FOLDER_NAME, "The folder name is empty.")
    if len(name) > FOLDER_NAME_MAX_CHARS:
        raise ServiceError(
            ErrorCode.FOLDER_NAME_TOO_LONG,
            f"A folder name may hold at most {FOLDER_NAME_MAX_CHARS} characters.",
            detail={"max_chars": FOLDER_NAME_MAX_CHARS},
        )
    if any(unicodedata.category(char) in {"Cc", "Cf", "Cs", "Co", "Cn"} for char in name):
        raise ServiceError(
            ErrorCode.INVALID_FOLDER_NAME, "A folder name may not hold control characters."
        )
    return name


def _name_taken() -> ServiceError:
    return ServiceError(
        ErrorCode.FOLDER_NAME_TAKEN, "You already have a folder of that name.", status=409
    )


def folder_create(*, owner: Any, name: str) -> Folder:
    """A new folder of `owner`'s, up to FOLDERS_MAX_PER_USER.

    The owner's row is locked while the folders are counted, so two creations at once cannot
    both pass the cap; the unique constraint (case-insensitive) settles two of one name.
    """
    name = _check_folder_name(name)
    try:
        with transaction.atomic():
            get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
            if Folder.objects.filter(owner_id=owner.pk).count() >= settings.FOLDERS_MAX_PER_USER:
                raise ServiceError(
                    ErrorCode.TOO_MANY_FOLDERS,
                    f"You may have at most {settings.FOLDERS_MAX_PER_USER} folders.",
                    status=409,
                    detail={"max_folders": settings.FOLDERS_MAX_PER_USER},
                )
            return Folder.objects.create(owner_id=owner.pk, name=name)
    except IntegrityError as exc:
        raise _name_taken() from exc


def folder_rename(*, folder: Folder, name: str) -> Folder:
    """Give the folder a new name, unique among its owner's (case-insensitive)."""
    folder.name = _check_folder_name(name)
    try:
        with transaction.atomic():
            folder.save(update_fields=["name"])
    except IntegrityError as exc:
        raise _name_taken() from exc
    return folder


def folder_delete(*, folder: Folder) -> None:
    """Delete the folder; its conversations stay, outside any folder (`SET_NULL`)."""
    folder.delete()


def conversation_organize(
    *,
    conversation: Conversation,
    folder: Folder | Unset | None = UNSET,
    pinned: bool | None = None,
    archived: bool | None = None,
) -> Conversation:
    """Move the conversation into `folder` (None: out of any), pin or unpin it, archive or
    unarchive it; what is not given stays. Archiving unpins, and an archived conversation
    stays unpinned: the pinned list is the top of the main list, which an archived
    conversation leaves. None of it is activity: the conversation keeps its place in time.
    """
    with transaction.atomic():
        _lock(conversation)
        update_fields = ["updated_at"]
        if not isinstance(folder, Unset):
            conversation.folder = folder
            update_fields.append("folder")
        if archived is not None:
            conversation.archived = archived
            update_fields.append("archived")
            if archived:
                conversation.pinned = False
                update_fields.append("pinned")
        if pinned is not None and not conversation.archived:
            conversation.pinned = pinned
            update_fields.append("pinned")
        conversation.save(update_fields=list(dict.fromkeys(update_fields)))
    return conversation


# Share links: a snapshot of a branch for anyone holding the link (conversations/share_tokens.py).

# What a shared page shows of an answer: the finished ones, as the chat page shows them.
SHARED_ANSWER_STATUSES = (Message.Status.COMPLETE, Message.Status.CANCELLED)


def _shown_in_share(message: Message) -> bool:
    if message.role == Message.Role.USER:
        return True
    if message.role != Message.Role.ASSISTANT or message.status not in SHARED_ANSWER_STATUSES:
        return False
    # A tool round's calls are the model's working, not its answer; the answer follows them.
    return bool(message.content) and not message.metadata.get("tool_calls")


def share_create(*, conversation: Conversation) -> Share:
    """A snapshot of the branch on screen: its user messages and finished answers (role,
    content, model, created time) and the title, copied, so that later edits, regenerations
    and branch switches leave the shared page as it was. Tool calls and results, answers
    still being written, failed or withheld by moderation, and the system prompt stay out.
    """
    with transaction.atomic():
        _lock(conversation)  # a branch switch cannot move the leaf while it is copied
        snapshot = [
            {
                "role": message.role,
                "content": message.content,
                "model": message.model if message.role == Message.Role.ASSISTANT else "",
                "created_at": message.created_at.isoformat(),
            }
            for message in active_branch(conversation=conversation)
            if _shown_in_share(message)
        ]
        if not snapshot:
            raise ServiceError(
                ErrorCode.NOTHING_TO_SHARE, "There is no message to share in this conversation."
            )
        return Share.objects.create(
            conversation=conversation,
            title=conversation.title or "Shared conversation",
            messages=snapshot,
        )


def share_revoke(*, share: Share) -> Share:
    """Stop serving the share's link (404 from now on); revoking it again changes nothing."""
    if share.revoked_at is None:
        Share.objects.filter(pk=share.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        share.refresh_from_db(fields=["revoked_at"])
    return share


# Feedback on answers: thumbs up or down, with an optional reason.

FEEDBACK_COMMENT_MAX_CHARS = 500
FEEDBACK_ANSWER_STATUSES = (Message.Status.COMPLETE, Message.Status.CANCELLED)


def _check_feedback_answer(message: Message) -> None:
    if message.role != Message.Role.ASSISTANT:
        raise ServiceError(
            ErrorCode.NOT_AN_ASSISTANT_MESSAGE, "Only an answer can be given feedback."
        )
    if message.status not in FEEDBACK_ANSWER_STATUSES or message.metadata.get("tool_calls"):
        raise ServiceError(
            ErrorCode.NOT_A_FINISHED_ANSWER,
            "Feedback is for a finished answer.",
            status=409,
            detail={"status": message.status},
        )


def feedback_set(
    *, message: Message, user: Any, rating: str, reason: str = "", comment: str = ""
) -> Feedback:
    """Give or change `user`'s feedback on an answer: one per user and answer (a second call
    replaces the first). `reason` (one of `Feedback.Reason`) goes with a thumbs down only;
    `comment` is short free text, trimmed, at most FEEDBACK_COMMENT_MAX_CHARS."""
    _check_feedback_answer(message)
    if rating not in Feedback.Rating.values:
        raise ServiceError(
            ErrorCode.INVALID_RATING,
            "The rating is up or down.",
            detail={"allowed": list(Feedback.Rating.values)},
        )
    if reason and (rating != Feedback.Rating.DOWN or reason not in Feedback.Reason.values):
        raise ServiceError(
            ErrorCode.INVALID_REASON,
            "A reason goes with a thumbs down, and is one of the listed ones.",
            detail={"allowed": list(Feedback.Reason.values)},
        )
    comment = comment.strip()
    if len(comment) > FEEDBACK_COMMENT_MAX_CHARS:
        raise ServiceError(
            ErrorCode.COMMENT_TOO_LONG,
            f"A comment may hold at most {FEEDBACK_COMMENT_MAX_CHARS} characters.",
            detail={"max_chars": FEEDBACK_COMMENT_MAX_CHARS, "chars": len(comment)},
        )
    # The unique constraint settles two first answers at once (update_or_create retries).
    feedback, _ = Feedback.objects.update_or_create(
        message=message,
        user_id=user.pk,
        defaults={"rating": rating, "reason": reason, "comment": comment},
    )
    return feedback


def feedback_remove(*, message: Message, user: Any) -> bool:
    """Take back `user`'s feedback on an answer; False if there was none."""
    deleted, _ = Feedback.objects.filter(message=message, user_id=user.pk).delete()
    return deleted > 0


# Custom instructions and memory (conversations/memory.py tells the model them). Every write
# of a user's memory locks the user's row first, so the cap and the one-row-per-fact rule
# hold when two writes meet (two tabs, a suggestion task and a confirmation).

# Line breaks and tabs are text in instructions; any other control character is not.
_INSTRUCTION_WHITESPACE = frozenset("\n\t")
_FACT_END_PUNCTUATION = ".!;, "


def _has_control(text: str, allowed: frozenset[str] = frozenset()) -> bool:
    return any(unicodedata.category(char) in {"Cc", "Cs"} and char not in allowed for char in text)


def _check_instructions(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if len(text) > settings.INSTRUCTIONS_MAX_CHARS:
        raise ServiceError(
            ErrorCode.INSTRUCTIONS_TOO_LONG,
            f"Custom instructions may hold at most {settings.INSTRUCTIONS_MAX_CHARS} characters.",
            detail={"max_chars": settings.INSTRUCTIONS_MAX_CHARS, "chars": len(text)},
        )
    if _has_control(text, _INSTRUCTION_WHITESPACE):
        raise ServiceError(
            ErrorCode.INVALID_INSTRUCTIONS,
            "Custom instructions may not hold control characters.",
        )
    return text


def memory_fact_clean(text: str) -> str:
    """A fact as it is kept: one line, spaces collapsed; a refusal if it is empty, too long
    or holds control characters."""
    text = " ".join(text.split())
    if not text:
        raise ServiceError(ErrorCode.EMPTY_MEMORY_FACT, "The fact is empty.")
    if len(text) > settings.MEMORY_FACT_MAX_CHARS:
        raise ServiceError(
            ErrorCode.MEMORY_FACT_TOO_LONG,
            f"A fact may hold at most {settings.MEMORY_FACT_MAX_CHARS} characters.",
            detail={"max_chars": settings.MEMORY_FACT_MAX_CHARS, "chars": len(text)},
        )
    if _has_control(text):
        raise ServiceError(ErrorCode.INVALID_MEMORY_FACT, "A fact may not hold control characters.")
    return text


def memory_fact_key(text: str) -> str:
    """What makes two facts one: case, spacing and closing punctuation aside."""
    return " ".join(text.casefold().split()).rstrip(_FACT_END_PUNCTUATION)


def _lock_user(user_id: Any) -> None:
    get_user_model().objects.select_for_update().filter(pk=user_id).first()


def _check_room(user_id: Any) -> None:
    confirmed = MemoryFact.objects.filter(owner_id=user_id, status=MemoryFact.Status.CONFIRMED)
    if confirmed.count() >= settings.MEMORY_MAX_FACTS:
        raise ServiceError(
            ErrorCode.TOO_MANY_MEMORY_FACTS,
            f"Memory holds at most {settings.MEMORY_MAX_FACTS} facts: delete one first.",
            status=409,
            detail={"max_facts": settings.MEMORY_MAX_FACTS},
        )


def _fact_exists() -> ServiceError:
    return ServiceError(
        ErrorCode.MEMORY_FACT_EXISTS, "That fact is already in your memory.", status=409
    )


def personalization_update(
    *, user: Any, instructions: str | None = None, memory_suggestions: bool | None = None
) -> Personalization:
    """Set the user's custom instructions (trimmed; line breaks kept) and whether the small
    model may suggest memory from their turns; what is not given stays."""
    fields = ["updated_at"]
    with transaction.atomic():
        found, _ = Personalization.objects.select_for_update().get_or_create(user_id=user.pk)
        if instructions is not None:
            found.instructions = _check_instructions(instructions)
            fields.append("instructions")
        if memory_suggestions is not None:
            found.memory_suggestions = memory_suggestions
            fields.append("memory_suggestions")
        found.save(update_fields=fields)
    return found


def memory_fact_add(*, owner: Any, text: str) -> MemoryFact:
    """A fact the user adds, told to the model from the next turn, up to MEMORY_MAX_FACTS.
    A pending or dismissed suggestion of the same fact becomes this fact (the user's words,
    linked to no conversation)."""
    text = memory_fact_clean(text)
    key = memory_fact_key(text)
    with transaction.atomic():
        _lock_user(owner.pk)
        found = MemoryFact.objects.filter(owner_id=owner.pk, key=key).first()
        if found is not None and found.status == MemoryFact.Status.CONFIRMED:
            raise _fact_exists()
        _check_room(owner.pk)
        now = timezone.now()
        if found is None:
            return MemoryFact.objects.create(
                owner_id=owner.pk,
                text=text,
                key=key,
                status=MemoryFact.Status.CONFIRMED,
                confirmed_at=now,
            )
        found.text, found.status, found.conversation, found.confirmed_at = (
            text,
            MemoryFact.Status.CONFIRMED,
            None,
            now,
        )
        found.save(update_fields=["text", "status", "conversation", "confirmed_at"])
        return found


def memory_fact_edit(*, fact: MemoryFact, text: str) -> MemoryFact:
    """New words for a fact or a pending suggestion; it keeps its place and its conversation.
    A hidden row of the same fact (a pending or dismissed suggestion) gives way."""
    text = memory_fact_clean(text)
    key = memory_fact_key(text)
    with transaction.atomic():
        _lock_user(fact.owner_id)
        other = MemoryFact.objects.filter(owner_id=fact.owner_id, key=key).exclude(pk=fact.pk)
        if other.filter(status=MemoryFact.Status.CONFIRMED).exists():
            raise _fact_exists()
        other.delete()
        fact.text, fact.key = text, key
        fact.save(update_fields=["text", "key"])
    return fact


def memory_fact_delete(*, fact: MemoryFact) -> None:
    """Forget a fact (or a pending suggestion): the model is not told it from the next turn."""
    fact.delete()


def memory_suggestion_confirm(*, fact: MemoryFact) -> MemoryFact:
    """Keep a suggested fact: the model is told it from the next turn, after the others."""
    with transaction.atomic():
        _lock_user(fact.owner_id)
        fact.refresh_from_db(fields=["status"])
        if fact.status != MemoryFact.Status.SUGGESTED:
            raise ServiceError(
                ErrorCode.NOT_A_SUGGESTION, "That fact is not a pending suggestion.", status=409
            )
        _check_room(fact.owner_id)
        fact.status, fact.confirmed_at = MemoryFact.Status.CONFIRMED, timezone.now()
        fact.save(update_fields=["status", "confirmed_at"])
    return fact


def memory_suggestion_dismiss(*, fact: MemoryFact) -> None:
    """Turn a suggestion down. The row stays, hidden, so the same fact is not suggested again
    (it goes with its conversation)."""
    with transaction.atomic():
        _lock_user(fact.owner_id)
        updated = MemoryFact.objects.filter(pk=fact.pk, status=MemoryFact.Status.SUGGESTED).update(
            status=MemoryFact.Status.DISMISSED
        )
        if not updated:
            raise ServiceError(
                ErrorCode.NOT_A_SUGGESTION, "That fact is not a pending suggestion.", status=409
            )


def memory_suggestions_add(
    *, owner_id: Any, conversation_id: Any, texts: Sequence[str]
) -> list[MemoryFact]:
    """Store the small model's suggestions from a turn of `conversation_id`, for the owner to
    confirm or dismiss; returns the new ones. A text that is not a valid fact, one the owner
    already has in any state (kept, pending or dismissed) and any past MEMORY_MAX_SUGGESTIONS
    pending are left out."""
    candidates: dict[str, str] = {}
    for raw in texts:
        try:
            text = memory_fact_clean(raw)
        except ServiceError:
            continue
        candidates.setdefault(memory_fact_key(text), text)
    if not candidates:
        return []
    with transaction.atomic():
        # Locked as a removal locks it: a conversation being deleted leaves no suggestion.
        live = Conversation.objects.select_for_update().filter(
            pk=conversation_id, deleted_at__isnull=True
        )
        if not live.exists():
            return []
        _lock_user(owner_id)
        known = set(
            MemoryFact.objects.filter(owner_id=owner_id, key__in=candidates).values_list(
                "key", flat=True
            )
        )
        pending = MemoryFact.objects.filter(
            owner_id=owner_id, status=MemoryFact.Status.SUGGESTED
        ).count()
        room = max(settings.MEMORY_MAX_SUGGESTIONS - pending, 0)
        fresh = [(key, text) for key, text in candidates.items() if key not in known][:room]
        return MemoryFact.objects.bulk_create(
            [
                MemoryFact(
                    owner_id=owner_id,
                    text=text,
                    key=key,
                    status=MemoryFact.Status.SUGGESTED,
                    conversation_id=conversation_id,
                )
                for key, text in fresh
            ]
        )
