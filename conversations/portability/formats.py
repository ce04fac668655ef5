"""What the importers read a file into, whatever its format: conversations ready to write.

Both importers (the service's own JSON, ChatGPT's `conversations.json`) turn each conversation
of a file into a `ParsedConversation`: its messages in tree order (every parent before its
children, siblings oldest first), with times that keep that order, and the branch that was on
screen. A fault of the file is an `ImportFault`, in the API's one error shape.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatsite.errors import ServiceError

# The service's own format: one conversation, its whole tree.
FORMAT_NAME = "chatsite.conversation"
FORMAT_VERSION = 1


class Source(enum.StrEnum):
    """What an import file turned out to be."""

    CHATSITE = "chatsite"
    CHATSITE_ZIP = "chatsite_zip"
    CHATGPT = "chatgpt"


class ImportFault(ServiceError):
    """The file cannot be imported: nothing of it is written. `detail` says where."""


@dataclass
class ParsedMessage:
    """A message of an imported tree. `key` is its id in the file; `parent` the key of the
    message it answers, None for one under the root (the system prompt)."""

    key: str
    parent: str | None
    role: str
    content: str
    # Set by the importer to a time that keeps the tree's order (None only while reading).
    created_at: datetime | None
    status: str = "complete"
    model: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass
class ParsedConversation:
    """A conversation ready to write: `messages` in tree order, `current_leaf` the key of
    the message on screen (None: the root), `current_children` each message's last viewed
    child where the file says (the key None stands for the root)."""

    title: str
    system_prompt: str
    model: str | None
    created_at: datetime
    last_activity_at: datetime
    messages: list[ParsedMessage]
    current_leaf: str | None
    current_children: dict[str | None, str] = field(default_factory=dict)
    folder: str | None = None
    pinned: bool = False
    archived: bool = False
