from __future__ import annotations

from rest_framework import serializers

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
