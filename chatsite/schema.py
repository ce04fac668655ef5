"""What every app's OpenAPI schema shares: the one error shape, `{"error": {...}}`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    detail = serializers.JSONField(allow_null=True)


class ErrorSerializer(serializers.Serializer[Any]):
    """Every error the API answers: `{"error": {"code", "message", "detail"}}`."""

    error = ErrorDetailSerializer()


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """The schema's responses for these error statuses, all in the one error shape."""
    return {code: OpenApiResponse(ErrorSerializer) for code in statuses}
