"""Shapes of the per-conversation tool switches in the JSON API."""

from __future__ import annotations

from rest_framework import serializers


class ConversationToolSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    plugin = serializers.CharField(help_text="The plugin's slug, or mcp:<server> for MCP tools.")
    enabled = serializers.BooleanField(help_text="Whether the model may call it here.")


class ConversationToolListSerializer(serializers.Serializer):
    tools = ConversationToolSerializer(many=True)


class ConversationToolSwitchSerializer(serializers.Serializer):
    tools = serializers.DictField(
        child=serializers.BooleanField(),
        allow_empty=False,
        help_text='Tool name to on/off, e.g. {"calculator": false}.',
    )
