"""The conversation tree.

A conversation is a tree of messages. Its root is a `system` message holding the system
prompt; every other message hangs under a parent. Editing a user message or regenerating an
answer adds a sibling, never rewrites one, so every branch stays intact. Each message
remembers which child was last viewed under it (`current_child`), so switching to a sibling
shows the deepest leaf last seen under that sibling.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower

# The text search configuration of message search (conversations/search.py). `simple`, not
# `english`: people write in many languages, and code, names and identifiers; `simple` only
# lowercases, so a word matches as typed in any language, where `english` would stem other
# languages wrongly and drop English stopwords. The index and the query must name the same
# configuration for Postgres to use the index.
SEARCH_CONFIG = "simple"


class Folder(models.Model):
    """A user's named group of conversations in the sidebar. Deleting it keeps them."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="folders"
    )
    name = models.CharField(max_length=60)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            # Two folders the user could not tell apart would be one too many.
            models.UniqueConstraint(Lower("name"), "owner", name="folder_name_unique_per_owner"),
        ]

    def __str__(self) -> str:
        return self.name


class Conversation(models.Model):
    """One chat: its owner, its model, its tree of messages and the leaf on screen."""

    class Source(models.TextChoices):
        WEB = "web", "Web chat"
        API = "api", "API"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True)
    title_set_by_user = models.BooleanField(default=False)
    model = models.CharField(max_length=100)
    system_prompt = models.TextField(blank=True)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.WEB)
    current_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Sidebar order: moves on every new message, not on renames.
    last_activity_at = models.DateTimeField(db_index=True)
    # A deleted conversation keeps only this tombstone row (its messages are gone), so that a
    # late send into it gets a clear `conversation_deleted` rather than a puzzling 404.
    deleted_at = models.DateTimeField(null=True, blank=True)
    # Where the user keeps it: a folder (at most one), pinned on top, or archived (out of the
    # main list, in the Archived view). Deleting the folder leaves the conversation outside.
    folder = models.ForeignKey(
        Folder, null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )
    pinned = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)
    # Whether the user switched any tool on in it (kept by the tool switches' owner,
    # `CONVERSATION_TOOLS_PROVIDER`'s app): a turn in one without reads no switches.
    tools_on = models.BooleanField(default=False)

    class Meta:
        ordering = ["-last_activity_at", "-id"]
        indexes = [
            # The sidebar's keyset: the main list and the Archived view, pinned first.
            models.Index(
                fields=["owner", "archived", "-pinned", "-last_activity_at", "-id"],
                name="conv_sidebar_idx",
                condition=models.Q(deleted_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.id}"


class Message(models.Model):
    """A node of the tree. Assistant messages start `queued` and end in a final status."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"

    class Status(models.TextChoices):
        QUEUED = "queued"
        STREAMING = "streaming"
        COMPLETE = "complete"
        CANCELLED = "cancelled"
        FAILED = "failed"
        BLOCKED = "blocked"

    FINAL_STATUSES = frozenset({Status.COMPLETE, Status.CANCELLED, Status.FAILED, Status.BLOCKED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # The child last viewed under this message: where a branch switch descends.
    current_child = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    model = models.CharField(max_length=100, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Tokens of `content` under the conversation's model, cached for context assembly.
    content_tokens = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(
        blank=True,
        default=dict,
        help_text=(
            "Structured parts of a message beside its text: an assistant's tool_calls, "
            "a tool result's tool_call_id and name."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation"],
                condition=models.Q(parent__isnull=True),
                name="one_root_per_conversation",
            ),
        ]
        indexes = [
            models.Index(fields=["parent", "created_at"], name="msg_siblings_idx"),
        ]
        # Message search has a GIN expression index on Postgres only (migration
        # 0004_folders_pins_archive_search): see conversations/search.py.

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL_STATUSES


class BranchSummary(models.Model):
    """A rolling summary of a branch's older turns, up to and including `through_message`.

    It belongs to the branch through that message: context assembly uses it only while
    `through_message` is an ancestor of the message being answered, so an edit that forks
    earlier never sees a summary of turns that are not on its branch.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="summaries"
    )
    through_message = models.OneToOneField(
        Message,
        on_delete=models.CASCADE,
        related_name="summary",
        help_text="The last message the summary covers (an answer ending a turn).",
    )
    content = models.TextField()
    tokens = models.PositiveIntegerField(help_text="Tokens of `content` under the model.")
    covered_messages = models.PositiveIntegerField(
        help_text="Messages of the branch the summary stands for."
    )
    model = models.CharField(max_length=100, help_text="The pool that wrote it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "branch summaries"

    def __str__(self) -> str:
        return f"Summary through {self.through_message_id}"


class Share(models.Model):
    """A read-only snapshot of a conversation's branch, served to anyone holding its link.

    `messages` is a copy taken at the moment of sharing (role, content, model, created time of
    each user message and finished answer on the branch then on screen), so later edits,
    regenerations and branch switches never change what the link shows. Nothing secret is
    stored: the link is the id signed with SECRET_KEY (conversations/share_tokens.py).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="shares")
    title = models.CharField(max_length=200)
    messages = models.JSONField(
        default=list, help_text="The snapshot: [{role, content, model, created_at}], oldest first."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["conversation", "-created_at"], name="share_conv_idx")]

    def __str__(self) -> str:
        return f"Share of {self.title}"


class Feedback(models.Model):
    """A user's thumbs up or down on one answer of their own, with an optional reason."""

    class Rating(models.TextChoices):
        UP = "up", "Thumbs up"
        DOWN = "down", "Thumbs down"

    class Reason(models.TextChoices):
        INACCURATE = "inaccurate", "Not accurate"
        UNHELPFUL = "unhelpful", "Not helpful"
        INCOMPLETE = "incomplete", "Incomplete"
        INSTRUCTIONS = "instructions", "Did not follow instructions"
        HARMFUL = "harmful", "Harmful or offensive"
        OTHER = "other", "Other"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="feedback"
    )
    rating = models.CharField(max_length=4, choices=Rating.choices)
    reason = models.CharField(max_length=16, choices=Reason.choices, blank=True)
    comment = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        verbose_name_plural = "feedback"
        constraints = [
            models.UniqueConstraint(fields=["message", "user"], name="feedback_one_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.get_rating_display()} on {self.message_id}"


class ImportJob(models.Model):
    """An upload of conversations to import (#18), and how far its Celery task has come.

    The file itself is kept in `ImportChunk` rows, so a worker on any host can read it; they
    are removed once the job ends. The task checks the whole file first, then writes every
    conversation in one transaction: a job ends `done` with all of them or `failed` with none.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        VALIDATING = "validating"
        IMPORTING = "importing"
        DONE = "done"
        FAILED = "failed"

    FINAL_STATUSES = frozenset({Status.DONE, Status.FAILED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="import_jobs"
    )
    filename = models.CharField(max_length=255, blank=True)
    size_bytes = models.PositiveBigIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    format = models.CharField(
        max_length=32, blank=True, help_text="What the file turned out to be, once read."
    )
    total = models.PositiveIntegerField(
        null=True, blank=True, help_text="Conversations in the file, once checked."
    )
    imported = models.PositiveIntegerField(default=0)
    error = models.JSONField(
        null=True, blank=True, help_text="Why it failed: {code, message, detail}."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"], name="import_owner_idx")]

    def __str__(self) -> str:
        return f"Import {self.filename or self.pk} ({self.status})"


class ImportChunk(models.Model):
    """One piece of an uploaded import file, in order."""

    job = models.ForeignKey(ImportJob, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="import_chunk_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} #{self.index}"


class Attachment(models.Model):
    """A text, Markdown or PDF file the user attached to a message (conversations/attachments.py).

    Uploaded to the conversation first (`message` empty), then claimed by the user message
    that sends it. The bytes and the extracted text live here, in Postgres, so every web host
    reads them; it goes with its conversation (`conversations.removal`). `chunks` are the
    text's pieces as `[start, end)` character offsets, and `embeddings` their unit vectors
    (float32, one row per chunk), filled once computed: context assembly retrieves the
    chunks most like the question when the whole text does not fit.
    """

    # The key of a user message's `metadata` that counts the files it carries (absent: none),
    # so that a branch without files is known as such without a query.
    METADATA_KEY = "attachments"

    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        MARKDOWN = "markdown", "Markdown"
        PDF = "pdf", "PDF"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="attachments"
    )
    message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.CASCADE, related_name="attachments"
    )
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    size = models.PositiveIntegerField(help_text="Bytes of the file as uploaded.")
    data = models.BinaryField(help_text="The file as uploaded.")
    text = models.TextField(help_text="The text the model reads (a PDF's, extracted).")
    chunks = models.JSONField(default=list, help_text="[start, end) offsets into `text`.")
    embeddings = models.BinaryField(
        null=True, blank=True, help_text="One float32 unit vector per chunk, once computed."
    )
    position = models.PositiveSmallIntegerField(
        default=0, help_text="Its place among the files of its message, as the user chose them."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["position", "created_at", "id"]

    def __str__(self) -> str:
        return self.name


class Personalization(models.Model):
    """A user's custom instructions and memory switch (conversations/memory.py).

    The instructions follow the system prompt in every web chat turn, byte for byte as
    stored, so the prompt's prefix stays cached until the user edits them.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="personalization",
    )
    instructions = models.TextField(blank=True)
    # Whether the small model may suggest facts from this user's turns.
    memory_suggestions = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"Personalization of {self.user_id}"


class MemoryFact(models.Model):
    """A fact about its owner the model is told in every web chat turn, once confirmed.

    The small model's suggestions are rows too (`suggested`), never sent until the owner
    confirms them; a dismissed one stays (`dismissed`, never shown) so it is not suggested
    again. `key` (the text folded) makes each fact one row per owner. A fact derived from a
    conversation keeps it as `conversation` and goes when the conversation does.
    """

    class Status(models.TextChoices):
        SUGGESTED = "suggested"
        CONFIRMED = "confirmed"
        DISMISSED = "dismissed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_facts"
    )
    text = models.CharField(max_length=500)
    key = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices)
    conversation = models.ForeignKey(
        Conversation,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="memory_facts",
        help_text="The conversation it was suggested from; empty for a fact the user added.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Facts are told in this order: a new one goes last, so the ones before keep their place
    # in the cached prefix.
    confirmed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["confirmed_at", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="memory_fact_unique_per_owner"),
        ]
        indexes = [
            models.Index(
                fields=["owner", "status", "confirmed_at"], name="memory_owner_status_idx"
            ),
        ]

    def __str__(self) -> str:
        return self.text[:60]
