"""Custom instructions and memory over the JSON API: thin views over services and selectors.

Every fact is fetched through `memory_fact_for_user`: another user's fact is 404.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatsite.auth import request_user
from chatsite.errors import ServiceError
from chatsite.schema import error_responses
from conversations import selectors, services
from conversations.errors import ErrorCode
from conversations.models import MemoryFact

from .serializers import StrictCharField

TAGS = ["memory"]


class PersonalizationSerializer(serializers.Serializer[Any]):
    instructions = serializers.CharField(
        help_text="Told to the model right after the system prompt in every web chat turn."
    )
    memory_suggestions = serializers.BooleanField(
        help_text="Whether the model may suggest facts to remember from your messages."
    )
    instructions_max_chars = serializers.IntegerField()


class PersonalizationWriteSerializer(serializers.Serializer[Any]):
    """Any of new instructions ("" clears them) and the suggestions switch; at least one."""

    instructions = StrictCharField(required=False, allow_blank=True, trim_whitespace=False)
    memory_suggestions = serializers.BooleanField(required=False)


class MemoryFactSerializer(serializers.ModelSerializer[MemoryFact]):
    conversation_id = serializers.UUIDField(
        allow_null=True, help_text="The conversation it was suggested from, if any."
    )

    class Meta:
        model = MemoryFact
        fields = ["id", "text", "status", "conversation_id", "created_at", "confirmed_at"]
        read_only_fields = fields


class MemoryListSerializer(serializers.Serializer[Any]):
    facts = MemoryFactSerializer(many=True, help_text="In the order the model is told them.")
    suggestions = MemoryFactSerializer(many=True, help_text="Awaiting your confirmation.")
    max_facts = serializers.IntegerField()


class MemoryFactWriteSerializer(serializers.Serializer[Any]):
    text = StrictCharField(allow_blank=True, trim_whitespace=False)


def _personalization(user_id: Any) -> dict[str, Any]:
    found = selectors.personalization_of(user_id=user_id)
    return {
        "instructions": found.instructions,
        "memory_suggestions": found.memory_suggestions,
        "instructions_max_chars": settings.INSTRUCTIONS_MAX_CHARS,
    }


class PersonalizationView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="personalization_read",
        summary="Your custom instructions and memory switch",
        responses={200: PersonalizationSerializer},
    )
    def get(self, request: Request) -> Response:
        return Response(_personalization(request_user(request).pk))

    @extend_schema(
        tags=TAGS,
        operation_id="personalization_update",
        summary="Set your custom instructions or memory switch",
        request=PersonalizationWriteSerializer,
        responses={200: PersonalizationSerializer, **error_responses(400)},
    )
    def patch(self, request: Request) -> Response:
        form = PersonalizationWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        if not form.validated_data:
            raise ServiceError(ErrorCode.NOTHING_TO_UPDATE, "Nothing to update was given.")
        services.personalization_update(user=request_user(request), **form.validated_data)
        return Response(_personalization(request_user(request).pk))


class MemoryListView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="memory_list",
        summary="Your memory: the facts kept and the suggestions awaiting you",
        responses={200: MemoryListSerializer},
    )
    def get(self, request: Request) -> Response:
        user_id = request_user(request).pk
        facts = selectors.memory_facts_of(user_id=user_id)
        suggestions = selectors.memory_suggestions_of(user_id=user_id)
        return Response(
            {
                "facts": MemoryFactSerializer(facts, many=True).data,
                "suggestions": MemoryFactSerializer(suggestions, many=True).data,
                "max_facts": settings.MEMORY_MAX_FACTS,
            }
        )

    @extend_schema(
        tags=TAGS,
        operation_id="memory_add",
        summary="Add a fact to your memory",
        request=MemoryFactWriteSerializer,
        responses={201: MemoryFactSerializer, **error_responses(400, 409)},
    )
    def post(self, request: Request) -> Response:
        form = MemoryFactWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        fact = services.memory_fact_add(
            owner=request_user(request), text=form.validated_data["text"]
        )
        return Response(MemoryFactSerializer(fact).data, status=status.HTTP_201_CREATED)


class MemoryFactView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="memory_edit",
        summary="Reword a fact or a suggestion",
        request=MemoryFactWriteSerializer,
        responses={200: MemoryFactSerializer, **error_responses(400, 404, 409)},
    )
    def patch(self, request: Request, fact_id: uuid.UUID) -> Response:
        fact = selectors.memory_fact_for_user(user=request.user, fact_id=fact_id)
        form = MemoryFactWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        fact = services.memory_fact_edit(fact=fact, text=form.validated_data["text"])
        return Response(MemoryFactSerializer(fact).data)

    @extend_schema(
        tags=TAGS,
        operation_id="memory_delete",
        summary="Forget a fact (or drop a suggestion)",
        responses={204: None, **error_responses(404)},
    )
    def delete(self, request: Request, fact_id: uuid.UUID) -> Response:
        fact = selectors.memory_fact_for_user(user=request.user, fact_id=fact_id)
        services.memory_fact_delete(fact=fact)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryConfirmView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="memory_confirm",
        summary="Keep a suggested fact: the model is told it from your next message",
        request=None,
        responses={200: MemoryFactSerializer, **error_responses(404, 409)},
    )
    def post(self, request: Request, fact_id: uuid.UUID) -> Response:
        fact = selectors.memory_fact_for_user(user=request.user, fact_id=fact_id)
        fact = services.memory_suggestion_confirm(fact=fact)
        return Response(MemoryFactSerializer(fact).data)


class MemoryDismissView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="memory_dismiss",
        summary="Turn a suggestion down (it is not suggested again)",
        request=None,
        responses={204: None, **error_responses(404, 409)},
    )
    def post(self, request: Request, fact_id: uuid.UUID) -> Response:
        fact = selectors.memory_fact_for_user(user=request.user, fact_id=fact_id)
        services.memory_suggestion_dismiss(fact=fact)
        return Response(status=status.HTTP_204_NO_CONTENT)
