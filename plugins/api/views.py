"""The tools of a conversation over the JSON API: which the plan offers, which are on."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatsite.schema import error_responses
from conversations.models import Conversation
from conversations.selectors import conversation_for_user
from plugins import selectors, services

from .serializers import ConversationToolListSerializer, ConversationToolSwitchSerializer

TAGS = ["tools"]


def _tools(user: Any, conversation: Conversation) -> dict[str, Any]:
    return {
        "tools": [
            {
                "name": state.spec.name,
                "description": state.spec.description,
                "plugin": state.spec.plugin,
                "enabled": state.enabled,
            }
            for state in selectors.conversation_tools(user=user, conversation=conversation)
        ]
    }


class ConversationToolsView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="conversation_tools_list",
        summary="The tools of a conversation",
        description="Every tool your plan offers, and whether the model may call it here.",
        responses={200: ConversationToolListSerializer, **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        return Response(_tools(request.user, conversation))

    @extend_schema(
        tags=TAGS,
        operation_id="conversation_tools_switch",
        summary="Switch tools on or off in a conversation",
        request=ConversationToolSwitchSerializer,
        responses={
            200: ConversationToolListSerializer,
            **error_responses(400, 404),
        },
    )
    def patch(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        form = ConversationToolSwitchSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.conversation_tools_set(
            user=request.user, conversation=conversation, switches=form.validated_data["tools"]
        )
        return Response(_tools(request.user, conversation))
