from __future__ import annotations

from typing import Any

from rest_framework import serializers

from inference import queue
from inference.models import Generation


class GenerationSerializer(serializers.ModelSerializer[Generation]):
    model = serializers.CharField(source="pool.name", read_only=True)
    message_id = serializers.UUIDField(read_only=True)
    conversation_id = serializers.UUIDField(read_only=True)
    stream_url = serializers.SerializerMethodField()

    class Meta:
        model = Generation
        fields = [
            "id",
            "message_id",
            "conversation_id",
            "model",
            "tier",
            "status",
            "enqueued_at",
            "admitted_at",
            "first_token_at",
            "finished_at",
            "prompt_tokens",
            "output_tokens",
            "finish_reason",
            "error_code",
            "error_message",
            "stream_url",
        ]
        read_only_fields = fields

    def get_stream_url(self, generation: Generation) -> str:
        return f"/api/v1/generations/{generation.id}/stream"


class GenerationCancelSerializer(serializers.Serializer[Any]):
    """A cancel's options: whether the page that sends it is going away, and which page."""

    leaving = serializers.BooleanField(
        required=False,
        default=False,
        help_text=(
            "Sent by a page that is going away (the web chat's beacon on pagehide): a closing "
            "page's answer stops at once unless another client reads it; a reloading page's "
            "is cancelled only if no client reads its stream again within "
            "STREAM_FIRST_TOKEN_GRACE_SECONDS. Without it, at once."
        ),
    )
    page = serializers.RegexField(
        queue.PAGE_ID_PATTERN,
        required=False,
        default="",
        help_text=(
            "The going page's own id, as it gave it when reading the stream (`?page=`): its "
            "own streams are not counted as someone else still reading."
        ),
    )
