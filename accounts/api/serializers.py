from __future__ import annotations

from rest_framework import serializers

from accounts.models import ApiKey


class ApiKeySerializer(serializers.ModelSerializer[ApiKey]):
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
            "is_active",
            "scope",
            "store_conversations",
        ]
        read_only_fields = fields


class ApiKeyCreateSerializer(serializers.Serializer[None]):
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(
        choices=ApiKey.Scope.choices,
        default=ApiKey.Scope.CHAT,
        help_text=(
            "chat: the OpenAI-compatible API, conversations, messages and generations only. "
            "full: the whole account, API keys and billing included."
        ),
    )
    store_conversations = serializers.BooleanField(
        default=True,
        help_text="Keep OpenAI-compatible API requests made with this key as conversations.",
    )


class ApiKeyUpdateSerializer(serializers.Serializer[None]):
    store_conversations = serializers.BooleanField(
        help_text="Keep OpenAI-compatible API requests made with this key as conversations."
    )


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields
