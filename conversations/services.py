"""Writes to conversations: the tree of messages changes only here.

Every write to a tree locks its conversation row first (`select_for_update`), so two sends,
an edit and a branch switch on one conversation happen one after another and the tree, the
`current_child` pointers and `current_leaf` always agree. The functions that add an
assistant placeholder return it: the caller enqueues its generation after commit.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from chatsite.errors import ServiceError

from .errors import ErrorCode
from .models import Conversation, Message
from .selectors import message_ancestry

IN_PROGRESS_STATUSES = (Message.Status.QUEUED, Message.Status.STREAMING)
# A user message answers the system prompt or an assistant turn, never another user turn.
USER_PARENT_ROLES = frozenset({Message.Role.SYSTEM, Message.Role.ASSISTANT})


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


def _lock(conversation: Conversation) -> None:
    """Lock the conversation row and reload it, refusing a tombstone."""
    conversation.refresh_from_db(from_queryset=Conversation.objects.select_for_update())
    if conversation.deleted_at is not None:
        raise ServiceError(ErrorCode.CONVERSATION_DELETED, "This conversation was deleted.")


def _check_idle(conversation: Conversation) -> None:
    """Refuse a new turn while an answer in this conversation is still being generated."""
    busy = Message.objects.filter(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status__in=IN_PROGRESS_STATUSES,
    ).exists()
    if busy:
        raise ServiceError(
            ErrorCode.GENERATION_IN_PROGRESS,
            "An answer is still being generated in this conversation.",
            status=409,
        )


def _show_leaf(conversation: Conversation, leaf: Message, *, new_activity: bool) -> None:
    """Put `leaf` on screen: every ancestor's `current_child` points along the path to it."""
    path = message_ancestry(message_id=leaf.pk)
    moved = []
    for node, child in itertools.pairwise(path):
        if node.current_child_id != child.pk:
            node.current_child_id = child.pk
            moved.append(node)
    if moved:
        Message.objects.bulk_update(moved, ["current_child"])
    conversation.current_leaf = leaf
    update_fields = ["current_leaf", "updated_at"]
    if new_activity:
        conversation.last_activity_at = timezone.now()
        update_fields.append("last_activity_at")
    conversation.save(update_fields=update_fields)


def _parent_of(message: Message) -> Message:
    parent = message.parent
    if parent is None:
        # Only the root lacks a parent, and callers already refused it by its role.
        raise ServiceError(ErrorCode.INVALID_PARENT, "The root message has no siblings.")
    return parent


def _add_assistant_placeholder(conversation: Conversation, parent: Message) -> Message:
    return Message.objects.create(
        conversation=conversation,
        parent=parent,
        role=Message.Role.ASSISTANT,
        content="",
        status=Message.Status.QUEUED,
        model=conversation.model,
    )


def _add_turn(conversation: Conversation, parent: Message, content: str) -> tuple[Message, Message]:
    """A user message under `parent` and its answer's placeholder, shown as the new leaf."""
    user_message = Message.objects.create(
        conversation=conversation,
        parent=parent,
        role=Message.Role.USER,
        content=content,
        status=Message.Status.COMPLETE,
    )
    placeholder = _add_assistant_placeholder(conversation, user_message)
    user_message.current_child = placeholder
    user_message.save(update_fields=["current_child"])
    _show_leaf(conversation, placeholder, new_activity=True)
    return user_message, placeholder


def conversation_create(
    *,
    owner: Any,
    model: str | None = None,
    system_prompt: str = "",
    title: str = "",
    source: str = Conversation.Source.WEB,
) -> Conversation:
    """Start a conversation: its row and its root `system` message holding the system prompt.

    `model` defaults to `settings.DEFAULT_MODEL`; a title given here counts as set by the
    user, so automatic titling leaves it alone.
    """
    conversation = conversation_new(
        owner=owner, model=model, system_prompt=system_prompt, title=title, source=source
    )
    with transaction.atomic():
        root = _root(conversation)
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
        id=uuid.uuid4(),
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
        id=uuid.uuid4(),
        conversation=conversation,
        role=Message.Role.SYSTEM,
        content=conversation.system_prompt,
        status=Message.Status.COMPLETE,
    )


def message_send(
    *, conversation: Conversation, content: str, parent: Message | uuid.UUID | None = None
) -> tuple[Message, Message]:
    """Add a user message and the placeholder of its answer; return both.

    The message goes under `parent` (a message of this conversation or its id; by default
    the current leaf), so a client may continue any branch. The placeholder is `queued`
    with the conversation's model and becomes the current leaf.
    """
    _check_content(content)
    with transaction.atomic():
        _lock(conversation)
        if parent is None:
            parent_id = conversation.current_leaf_id
        else:
            parent_id = parent.pk if isinstance(parent, Message) else parent
        parent_message = (
            Message.objects.filter(conversation=conversation, pk=parent_id).first()
            if parent_id is not None
            else None
        )
        if parent_message is None:
            raise ServiceError(
                ErrorCode.UNKNOWN_PARENT, "The parent is not a message of this conversation."
            )
        if parent_message.role not in USER_PARENT_ROLES:
            raise ServiceError(
                ErrorCode.INVALID_PARENT,
                f"A user message cannot follow a {parent_message.role} message.",
            )
        _check_idle(conversation)
        return _add_turn(conversation, parent_message, content)


def message_edit(*, message: Message, content: str) -> tuple[Message, Message]:
    """Edit a user message: a new sibling with `content` and the placeholder of its answer.

    The old message and everything under it stay intact, one branch switch away.
    """
    if message.role != Message.Role.USER:
        raise ServiceError(ErrorCode.NOT_A_USER_MESSAGE, "Only a user message can be edited.")
    _check_content(content)
    conversation = message.conversation
    with transaction.atomic():
        _lock(conversation)
        _check_idle(conversation)
        return _add_turn(conversation, _parent_of(message), content)


def message_regenerate(*, message: Message) -> Message:
    """Ask again: a new `queued` assistant sibling of `message`, shown as the current leaf."""
    if message.role != Message.Role.ASSISTANT:
        raise ServiceError(
            ErrorCode.NOT_AN_ASSISTANT_MESSAGE, "Only an assistant message can be regenerated."
        )
    conversation = message.conversation
    with transaction.atomic():
        _lock(conversation)
        _check_idle(conversation)
        placeholder = _add_assistant_placeholder(conversation, _question_of(message))
        _show_leaf(conversation, placeholder, new_activity=True)
    return placeholder


def _question_of(answer: Message) -> Message:
    """The message an answer replies to, above the tool rounds it made (the tool loop puts
    its calls and results between the question and the answer)."""
    parent = _parent_of(answer)
    while parent.role in (Message.Role.TOOL, Message.Role.ASSISTANT) and parent.parent:
        parent = parent.parent
    return parent


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
        _show_leaf(conversation, _last_viewed_leaf(message), new_activity=False)
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


def _branch_rows(conversation: Conversation, messages: Sequence[BranchTurn]) -> list[Message]:
    """`messages` as rows of `conversation`, each the reply to the one before it (the first
    one's parent is left to the caller)."""
    rows = [
        Message(
            id=uuid.uuid4(),
            conversation=conversation,
            role=role,
            content=content,
            status=Message.Status.COMPLETE,
            model=conversation.model if role == Message.Role.ASSISTANT else "",
            metadata=dict(rest[0]) if rest else {},
        )
        for role, content, *rest in messages
    ]
    for above, row in itertools.pairwise(rows):
        row.parent = above
        above.current_child = row
    return rows


def conversation_write_branch(
    *, conversation: Conversation, messages: Sequence[BranchTurn]
) -> tuple[Message, Message]:
    """Write `messages` as one linear branch under the current leaf, then the placeholder of
    its answer, shown as the new leaf; return the last message written and the placeholder.

    For clients that send the whole conversation with every request (the OpenAI-compatible
    API): `messages` are the user, assistant and tool turns, oldest first, ending with the
    user turn to answer or with the results (`tool` turns) of the client's tool calls. A
    last user message must be non-empty; a tool result may be empty.
    """
    _check_branch(messages)
    with transaction.atomic():
        _lock(conversation)
        _check_idle(conversation)
        leaf_id = conversation.current_leaf_id
        parent_message = (
            Message.objects.filter(conversation=conversation, pk=leaf_id).first()
            if leaf_id is not None
            else None
        )
        if parent_message is None:
            raise ServiceError(
                ErrorCode.UNKNOWN_PARENT, "The conversation has no message to follow."
            )
        rows = _branch_rows(conversation, messages)
        rows[0].parent = parent_message
        Message.objects.bulk_create(rows)
        placeholder = _add_assistant_placeholder(conversation, rows[-1])
        rows[-1].current_child = placeholder
        rows[-1].save(update_fields=["current_child"])
        _show_leaf(conversation, placeholder, new_activity=True)
    return rows[-1], placeholder


def conversation_write_new_branch(
    *,
    conversation: Conversation,
    messages: Sequence[BranchTurn],
    count_tokens: Callable[[str], int] | None = None,
) -> list[Message]:
    """Save `conversation` (from `conversation_new`) with its root, `messages` as its one
    branch (as `conversation_write_branch` takes them) and the placeholder of their answer
    as its leaf; return the branch, root first, ending with the placeholder.

    Nobody else can see a conversation before this commits, so nothing is locked or read
    back: one row for the conversation and one statement for all its messages (Postgres
    checks the references between them at commit). `count_tokens`, if given, fills in each
    message's token count (not the placeholder's) before it is written, saving the updates
    the context's count would cost.
    """
    _check_branch(messages)
    root = _root(conversation)
    rows = _branch_rows(conversation, messages)
    placeholder = Message(
        id=uuid.uuid4(),
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        content="",
        status=Message.Status.QUEUED,
        model=conversation.model,
    )
    branch = [root, *rows, placeholder]
    for above, row in itertools.pairwise(branch):
        row.parent = above
        above.current_child = row
    if count_tokens is not None:
        for message in branch[:-1]:  # the placeholder's is counted once it has its text
            message.content_tokens = count_tokens(message.content)
    conversation.current_leaf = placeholder
    # Within the caller's transaction, no savepoint: a failure here fails the turn whole.
    with transaction.atomic(savepoint=False):
        conversation.save(force_insert=True)
        Message.objects.bulk_create(branch)
    return branch
