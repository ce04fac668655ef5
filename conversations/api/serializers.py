"""Shapes of conversations and messages on the JSON API, and of the bodies it accepts.

Input serializers only check types and presence; the rules (empty, too long, which parent)
belong to the services, so every client gets the same answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from conversations.models import Attachment, Conversation, Feedback, Folder, Message, Share
from conversations.search import SEARCH_MAX_LIMIT
from conversations.selectors import (
    SIDEBAR_MAX_LIMIT,
    UNFILED,
    SiblingPosition,
    attachments_by_message,
    message_notice,
    message_visible_content,
)


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of turning them into text."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    """A UUIDField that takes only the text form, not integers."""

    def to_internal_value(self, data: Any) -> uuid.UUID:
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class AttachmentSerializer(serializers.ModelSerializer[Attachment]):
    """A file on a message (or uploaded, not yet sent: `message_id` null)."""

    conversation_id = serializers.UUIDField(read_only=True)
    message_id = serializers.UUIDField(read_only=True, allow_null=True)
    url = serializers.SerializerMethodField(help_text="Downloads the file as uploaded.")

    def get_url(self, attachment: Attachment) -> str:
        return (
            f"/api/v1/conversations/{attachment.conversation_id}"
            f"/attachments/{attachment.pk}/content"
        )

    class Meta:
        model = Attachment
        fields = ["id", "conversation_id", "message_id", "name", "kind", "size", "url"]
        read_only_fields = fields


class AttachmentUploadSerializer(serializers.Serializer[Any]):
    file = serializers.FileField(
        allow_empty_file=True, help_text="A text, Markdown or PDF file, as multipart form data."
    )


class MessageSerializer(serializers.ModelSerializer[Message]):
    conversation_id = serializers.UUIDField(read_only=True)
    parent_id = serializers.UUIDField(read_only=True, allow_null=True)
    content = serializers.SerializerMethodField(
        help_text="Empty for an answer moderation withheld (`blocked`); see `notice`."
    )
    notice = serializers.SerializerMethodField(
        help_text="Why the text is withheld (a `blocked` answer); null otherwise."
    )

    def get_content(self, message: Message) -> str:
        return message_visible_content(message=message)

    def get_notice(self, message: Message) -> str | None:
        return message_notice(message=message)

    route = serializers.SerializerMethodField(
        help_text=(
            "Set when the overload policy had another model write the answer: its `model`, "
            "the `reason` (high_demand) and the `notice` the page shows; null otherwise."
        )
    )

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_route(self, message: Message) -> dict[str, str] | None:
        return _route(message)

    tool_calls = serializers.SerializerMethodField(
        help_text="An assistant's tool calls (the tool loop): id, name, arguments (JSON text)."
    )
    tool = serializers.SerializerMethodField(
        help_text="A `tool` message's call: call_id, name and ok; null for other roles."
    )

    @extend_schema_field(serializers.ListField(child=serializers.DictField(), allow_null=True))
    def get_tool_calls(self, message: Message) -> list[dict[str, str]] | None:
        return _tool_calls(message)

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_tool(self, message: Message) -> dict[str, Any] | None:
        return _tool(message)

    attachments = serializers.SerializerMethodField(
        help_text="The files a user message carries; empty for other roles."
    )

    @extend_schema_field(AttachmentSerializer(many=True))
    def get_attachments(self, message: Message) -> Any:
        # A list passes them all in its context (one query); a single message reads its own.
        if "attachments" in self.context:
            return AttachmentSerializer(
                self.context["attachments"].get(message.pk, []), many=True
            ).data
        return _own_attachments(message)

    class Meta:
        model = Message
        fields = [
            "id",
            "conversation_id",
            "parent_id",
            "role",
            "content",
            "notice",
            "route",
            "tool_calls",
            "tool",
            "attachments",
            "status",
            "model",
            "prompt_tokens",
            "output_tokens",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


def _route(message: Message) -> dict[str, str] | None:
    route = message.metadata.get("route") if message.role == Message.Role.ASSISTANT else None
    if not isinstance(route, dict):
        return None
    return {name: str(route.get(name, "")) for name in ("model", "reason", "notice")}


def _tool_calls(message: Message) -> list[dict[str, str]] | None:
    calls = message.metadata.get("tool_calls") if message.role == Message.Role.ASSISTANT else None
    if not calls:
        return None
    return [
        {
            "id": str(call.get("id", "")),
            "name": str(call.get("function", {}).get("name", "")),
            "arguments": str(call.get("function", {}).get("arguments", "")),
        }
        for call in calls
    ]


def _tool(message: Message) -> dict[str, Any] | None:
    if message.role != Message.Role.TOOL:
        return None
    return {
        "call_id": str(message.metadata.get("tool_call_id", "")),
        "name": str(message.metadata.get("name", "")),
        "ok": bool(message.metadata.get("ok", True)),
    }


def _own_attachments(message: Message) -> Any:
    """The files one message carries, read on their own (none read when it carries none)."""
    found = attachments_by_message(messages=[message]).get(message.pk)
    return AttachmentSerializer(found, many=True).data if found else []


# Formats a time as the serializers' own fields do (ISO 8601, UTC as `Z`).
_TIME = serializers.DateTimeField(read_only=True)


def message_data(message: Message) -> dict[str, Any]:
    """`MessageSerializer(message).data`, built without DRF's fields: a ModelSerializer
    builds its fields anew for every instance, which cost a tenth of a send's CPU (the
    turn's two messages in its answer). A test pins the two to the same JSON."""
    return {
        "id": str(message.pk),
        "conversation_id": str(message.conversation_id),
        "parent_id": None if message.parent_id is None else str(message.parent_id),
        "role": message.role,
        "content": message_visible_content(message=message),
        "notice": message_notice(message=message),
        "route": _route(message),
        "tool_calls": _tool_calls(message),
        "tool": _tool(message),
        "attachments": _own_attachments(message),
        "status": message.status,
        "model": message.model,
        "prompt_tokens": message.prompt_tokens,
        "output_tokens": message.output_tokens,
        "created_at": _TIME.to_representation(message.created_at),
        "updated_at": _TIME.to_representation(message.updated_at),
    }


class BranchMessageSerializer(MessageSerializer):
    """A message on the active branch with its place among its siblings (`< 2/3 >`)."""

    # Reads `positions` from the context: message id -> `SiblingPosition`, and
    # `generations`: assistant message id -> generation id.
    sibling_index = serializers.SerializerMethodField(help_text="1-based, oldest first.")
    sibling_count = serializers.SerializerMethodField()
    sibling_ids = serializers.SerializerMethodField(help_text="Every sibling, oldest first.")
    generation_id = serializers.SerializerMethodField(
        help_text="The generation that produced (or is producing) this answer."
    )
    feedback = serializers.SerializerMethodField(
        help_text="Your thumbs on this answer (rating, reason, comment); null if none."
    )

    class Meta(MessageSerializer.Meta):
        fields = [
            *MessageSerializer.Meta.fields,
            "sibling_index",
            "sibling_count",
            "sibling_ids",
            "generation_id",
            "feedback",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_feedback(self, message: Message) -> dict[str, str] | None:
        feedback: Feedback | None = self.context.get("feedback", {}).get(message.pk)
        if feedback is None:
            return None
        return {"rating": feedback.rating, "reason": feedback.reason, "comment": feedback.comment}

    def get_generation_id(self, message: Message) -> str | None:
        generation_id = self.context.get("generations", {}).get(message.pk)
        return str(generation_id) if generation_id else None

    def _position(self, message: Message) -> SiblingPosition:
        position: SiblingPosition = self.context["positions"][message.pk]
        return position

    def get_sibling_index(self, message: Message) -> int:
        return self._position(message).index

    def get_sibling_count(self, message: Message) -> int:
        return self._position(message).count

    @extend_schema_field(serializers.ListField(child=serializers.UUIDField()))
    def get_sibling_ids(self, message: Message) -> list[uuid.UUID]:
        return list(self._position(message).sibling_ids)


class ConversationSerializer(serializers.ModelSerializer[Conversation]):
    current_leaf_id = serializers.UUIDField(read_only=True, allow_null=True)
    folder_id = serializers.UUIDField(read_only=True, allow_null=True)

    class Meta:
        model = Conversation
        fields = [
            "id",
            "title",
            "title_set_by_user",
            "model",
            "system_prompt",
            "source",
            "current_leaf_id",
            "folder_id",
            "pinned",
            "archived",
            "created_at",
            "updated_at",
            "last_activity_at",
        ]
        read_only_fields = fields


class ConversationDetailSerializer(ConversationSerializer):
    """A conversation with its active branch, root first."""

    # Reads `branch` (messages, root first) and `positions` (aligned) from the context.
    messages = serializers.SerializerMethodField()

    class Meta(ConversationSerializer.Meta):
        fields = [*ConversationSerializer.Meta.fields, "messages"]
        read_only_fields = fields

    @extend_schema_field(BranchMessageSerializer(many=True))
    def get_messages(self, conversation: Conversation) -> Any:
        branch: list[Message] = self.context["branch"]
        positions = dict(zip([m.pk for m in branch], self.context["positions"], strict=True))
        context = {
            "positions": positions,
            "generations": self.context.get("generations", {}),
            "feedback": self.context.get("feedback", {}),
            "attachments": self.context.get("attachments", {}),
        }
        return BranchMessageSerializer(branch, many=True, context=context).data


class ConversationPageSerializer(serializers.Serializer[Any]):
    results = ConversationSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Pass as ?cursor= for more.")


class FolderFilterField(serializers.CharField):
    """A folder's id, or `none` for the conversations in no folder."""

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if value != UNFILED:
            try:
                uuid.UUID(value)
            except ValueError:
                self.fail("invalid")
        return value


class SidebarQuerySerializer(serializers.Serializer[Any]):
    q = serializers.CharField(required=False, allow_blank=True, help_text="Title search.")
    cursor = serializers.CharField(required=False, allow_blank=True)
    limit = serializers.IntegerField(
        required=False, default=20, help_text=f"Page size, 1 to {SIDEBAR_MAX_LIMIT}."
    )
    folder = FolderFilterField(
        required=False,
        help_text=f"Only this folder's conversations, or `{UNFILED}` for those in no folder.",
        error_messages={"invalid": f"A folder id or `{UNFILED}`."},
    )
    pinned = serializers.BooleanField(
        required=False, allow_null=True, default=None, help_text="Only pinned (or unpinned)."
    )
    archived = serializers.BooleanField(
        required=False,
        default=False,
        help_text="The Archived view: archived conversations instead of the main list.",
    )


class ConversationCreateSerializer(serializers.Serializer[Any]):
    model = StrictCharField(required=False, help_text="Defaults to the site's default model.")
    system_prompt = StrictCharField(
        required=False, allow_blank=True, trim_whitespace=False, default=""
    )
    title = StrictCharField(required=False, allow_blank=True, default="")


class ConversationUpdateSerializer(serializers.Serializer[Any]):
    """Any of a new title, a folder (null: out of any), pinned, archived; at least one."""

    title = StrictCharField(required=False, allow_blank=True)
    folder_id = StrictUUIDField(
        required=False, allow_null=True, help_text="A folder of yours, or null for none."
    )
    pinned = serializers.BooleanField(required=False)
    archived = serializers.BooleanField(
        required=False, help_text="Archiving unpins; the conversation leaves the main list."
    )


class FolderSerializer(serializers.ModelSerializer[Folder]):
    class Meta:
        model = Folder
        fields = ["id", "name", "created_at"]
        read_only_fields = fields


class FolderWriteSerializer(serializers.Serializer[Any]):
    name = StrictCharField(allow_blank=True, trim_whitespace=False)


class FolderListSerializer(serializers.Serializer[Any]):
    results = FolderSerializer(many=True)


class SearchQuerySerializer(serializers.Serializer[Any]):
    q = serializers.CharField(
        allow_blank=True,
        trim_whitespace=False,
        help_text='Words, "a phrase", -excluded, or: as a web search takes them.',
    )
    cursor = serializers.CharField(required=False, allow_blank=True)
    limit = serializers.IntegerField(
        required=False, default=20, help_text=f"Page size, 1 to {SEARCH_MAX_LIMIT}."
    )


class SearchHitSerializer(serializers.Serializer[Any]):
    message_id = serializers.UUIDField()
    conversation_id = serializers.UUIDField()
    conversation_title = serializers.CharField()
    role = serializers.CharField()
    created_at = serializers.DateTimeField()
    rank = serializers.FloatField(help_text="ts_rank_cd: higher is better.")
    snippet = serializers.CharField(help_text="Plain text around the matches (never HTML).")
    highlights = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        help_text="The matches as [start, end) offsets in Unicode code points into `snippet`.",
    )


class SearchPageSerializer(serializers.Serializer[Any]):
    results = SearchHitSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Pass as ?cursor= for more.")


class MessageCreateSerializer(serializers.Serializer[Any]):
    content = StrictCharField(allow_blank=True, trim_whitespace=False)
    parent_id = StrictUUIDField(
        required=False, allow_null=True, help_text="Defaults to the current leaf."
    )
    attachment_ids = serializers.ListField(
        child=StrictUUIDField(),
        required=False,
        default=list,
        max_length=100,
        help_text="Files uploaded to this conversation (POST .../attachments), not yet sent.",
    )


class MessageEditSerializer(serializers.Serializer[Any]):
    content = StrictCharField(allow_blank=True, trim_whitespace=False)


class BranchSwitchSerializer(serializers.Serializer[Any]):
    message_id = StrictUUIDField(help_text="The sibling to show.")


class TurnGenerationSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    status = serializers.CharField()
    stream_url = serializers.CharField(help_text="Server-Sent Events of the answer.")
    cancel_url = serializers.CharField()


class TurnSerializer(serializers.Serializer[Any]):
    """A new user message, the placeholder of its answer, and the generation producing it."""

    user_message = MessageSerializer(allow_null=True, help_text="Null for a regeneration.")
    assistant_message = MessageSerializer(help_text="Queued; its text arrives by generation.")
    current_leaf_id = serializers.UUIDField()
    generation = TurnGenerationSerializer()


class ShareSerializer(serializers.ModelSerializer[Share]):
    """A share link of the caller's: `url` opens it for anyone until it is revoked."""

    conversation_id = serializers.UUIDField(read_only=True)
    revoked = serializers.SerializerMethodField()
    # Reads `urls` from the context: share id -> the link's absolute URL.
    url = serializers.SerializerMethodField()

    class Meta:
        model = Share
        fields = ["id", "conversation_id", "title", "url", "revoked", "created_at", "revoked_at"]
        read_only_fields = fields

    def get_revoked(self, share: Share) -> bool:
        return share.revoked_at is not None

    def get_url(self, share: Share) -> str:
        url: str = self.context["urls"][share.pk]
        return url


class ShareListSerializer(serializers.Serializer[Any]):
    results = ShareSerializer(many=True)


class ShareQuerySerializer(serializers.Serializer[Any]):
    conversation_id = serializers.UUIDField(required=False, help_text="Only this conversation's.")


class FeedbackSerializer(serializers.ModelSerializer[Feedback]):
    message_id = serializers.UUIDField(read_only=True)

    class Meta:
        model = Feedback
        fields = ["message_id", "rating", "reason", "comment", "created_at", "updated_at"]
        read_only_fields = fields


class FeedbackWriteSerializer(serializers.Serializer[Any]):
    rating = StrictCharField(help_text="up or down", trim_whitespace=False)
    reason = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="With a thumbs down: " + ", ".join(Feedback.Reason.values),
    )
    comment = StrictCharField(
        required=False, allow_blank=True, default="", trim_whitespace=False, help_text="Short."
    )
