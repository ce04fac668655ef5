"""Conversations and messages over the JSON API: thin views over services and selectors.

Every view fetches through a `*_for_user` selector first, so another user's conversation or
message is 404 on every method, before the body is even read.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.utils.decorators import method_decorator
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.abuse import abuse_limit
from accounts.models import ApiKey
from chatsite.auth import request_user
from chatsite.errors import ServiceError
from chatsite.schema import error_responses
from conversations import selectors, services, turns
from conversations.errors import ErrorCode
from conversations.models import Conversation, Folder, Message
from inference.selectors import generation_ids_for_messages

from .serializers import (
    BranchSwitchSerializer,
    ConversationCreateSerializer,
    ConversationDetailSerializer,
    ConversationPageSerializer,
    ConversationSerializer,
    ConversationUpdateSerializer,
    MessageCreateSerializer,
    MessageEditSerializer,
    MessageSerializer,
    SidebarQuerySerializer,
    TurnSerializer,
    message_data,
)

TAGS = ["conversations"]

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="Retrying with the same key within a day answers the same turn, charged once.",
    # As billing.services takes it: 1 to 255 printable ASCII characters.
    pattern="^[ -~]{1,255}$",
)


def _idempotency_key(request: Request) -> str | None:
    return request.headers.get("Idempotency-Key")


def _detail(conversation: Conversation) -> dict[str, Any]:
    branch = selectors.active_branch(conversation=conversation)
    positions = selectors.sibling_positions(branch=branch)
    answer_ids = [m.pk for m in branch if m.role == m.Role.ASSISTANT]
    generations = generation_ids_for_messages(message_ids=answer_ids)
    # Only the owner reaches this detail, and only the owner gives feedback here.
    feedback = selectors.feedback_of(user_id=conversation.owner_id, message_ids=answer_ids)
    attachments = selectors.attachments_by_message(messages=branch)
    serializer = ConversationDetailSerializer(
        conversation,
        context={
            "branch": branch,
            "positions": positions,
            "generations": generations,
            "feedback": feedback,
            "attachments": attachments,
        },
    )
    return dict(serializer.data)


def _turn(turn: turns.Turn) -> Response:
    generation_id = turn.generation.id
    body = {
        "user_message": message_data(turn.user_message) if turn.user_message else None,
        "assistant_message": message_data(turn.assistant_message),
        "current_leaf_id": turn.conversation.current_leaf_id,
        "generation": {
            "id": generation_id,
            "status": turn.generation.status,
            "stream_url": f"/api/v1/generations/{generation_id}/stream",
            "cancel_url": f"/api/v1/generations/{generation_id}/cancel",
        },
    }
    return Response(body, status=status.HTTP_201_CREATED)


def _message(
    request: Request,
    conversation_id: uuid.UUID,
    message_id: uuid.UUID,
    *,
    include_deleted: bool = False,
) -> Message:
    """The caller's message inside the URL's conversation; 404 for anything else.

    Writes pass `include_deleted` so the owner of a deleted conversation hears
    `conversation_deleted` from the service instead of a bare 404.
    """
    conversation = selectors.conversation_for_user(
        user=request.user, conversation_id=conversation_id, include_deleted=include_deleted
    )
    return selectors.message_for_user(
        user=request.user, message_id=message_id, conversation=conversation
    )


class ConversationListView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="conversations_list",
        summary="The sidebar: pinned first, then newest activity first",
        description="Archived conversations only with `archived=true` (the Archived view); "
        "`folder` and `pinned` narrow the list.",
        parameters=[SidebarQuerySerializer],
        responses={200: ConversationPageSerializer, **error_responses(400, 404)},
    )
    def get(self, request: Request) -> Response:
        params = SidebarQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        folder_filter: str | None = params.validated_data.get("folder")
        folder: Folder | str | None = folder_filter
        if folder_filter is not None and folder_filter != selectors.UNFILED:
            folder = selectors.folder_for_user(
                user=request.user, folder_id=uuid.UUID(folder_filter)
            )
        page = selectors.conversation_sidebar(
            user=request.user,
            query=params.validated_data.get("q", ""),
            cursor=params.validated_data.get("cursor") or None,
            limit=params.validated_data["limit"],
            folder=folder,
            pinned=params.validated_data["pinned"],
            archived=params.validated_data["archived"],
        )
        return Response(
            {
                "results": ConversationSerializer(page.conversations, many=True).data,
                "next_cursor": page.next_cursor,
            }
        )

    @extend_schema(
        tags=TAGS,
        operation_id="conversations_create",
        summary="Start a conversation",
        request=ConversationCreateSerializer,
        responses={201: ConversationDetailSerializer, **error_responses(400, 413)},
    )
    def post(self, request: Request) -> Response:
        form = ConversationCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        source = (
            Conversation.Source.API if isinstance(request.auth, ApiKey) else Conversation.Source.WEB
        )
        conversation = turns.conversation_start(
            user=request_user(request), source=source, **form.validated_data
        )
        return Response(_detail(conversation), status=status.HTTP_201_CREATED)


class ConversationDetailView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="conversations_retrieve",
        summary="A conversation with its active branch",
        responses={200: ConversationDetailSerializer, **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        return Response(_detail(conversation))

    @extend_schema(
        tags=TAGS,
        operation_id="conversations_rename",
        summary="Rename a conversation, file it in a folder, pin or archive it",
        request=ConversationUpdateSerializer,
        responses={200: ConversationSerializer, **error_responses(400, 404)},
    )
    def patch(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        form = ConversationUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        fields = form.validated_data
        if not fields:
            raise ServiceError(
                ErrorCode.NOTHING_TO_UPDATE,
                "Give a title, folder_id, pinned or archived.",
            )
        folder: Folder | services.Unset | None = services.UNSET
        if "folder_id" in fields:
            folder_id = fields["folder_id"]
            folder = (
                None
                if folder_id is None
                else selectors.folder_for_user(user=request.user, folder_id=folder_id)
            )
        if "title" in fields:
            conversation = services.conversation_rename(
                conversation=conversation, title=fields["title"]
            )
        if fields.keys() - {"title"}:
            conversation = services.conversation_organize(
                conversation=conversation,
                folder=folder,
                pinned=fields.get("pinned"),
                archived=fields.get("archived"),
            )
        return Response(ConversationSerializer(conversation).data)

    @extend_schema(
        tags=TAGS,
        operation_id="conversations_delete",
        summary="Delete a conversation and all its messages",
        responses={204: None, **error_responses(404)},
    )
    def delete(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        turns.conversation_remove(conversation=conversation)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageListView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="messages_send",
        summary="Send a message",
        description="Adds the user message under `parent_id` (default: the current leaf) and "
        "a queued assistant placeholder, which becomes the current leaf. `attachment_ids`: "
        "files uploaded to the conversation first (POST .../attachments), not yet sent.",
        request=MessageCreateSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: TurnSerializer, **error_responses(400, 403, 404, 409, 413, 422, 429)},
    )
    @method_decorator(abuse_limit("message_post"))
    def post(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id, include_deleted=True
        )
        form = MessageCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        turn = turns.turn_send(
            user=request_user(request),
            conversation=conversation,
            content=form.validated_data["content"],
            parent=form.validated_data.get("parent_id"),
            idempotency_key=_idempotency_key(request),
            attachment_ids=form.validated_data["attachment_ids"],
        )
        return _turn(turn)


class MessageDetailView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="messages_retrieve",
        summary="One message",
        responses={200: MessageSerializer, **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: uuid.UUID, message_id: uuid.UUID) -> Response:
        message = _message(request, conversation_id, message_id)
        return Response(MessageSerializer(message).data)


class MessageEditView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="messages_edit",
        summary="Edit a user message (forks a new branch)",
        request=MessageEditSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: TurnSerializer, **error_responses(400, 403, 404, 409, 413, 422, 429)},
    )
    @method_decorator(abuse_limit("message_post"))
    def post(self, request: Request, conversation_id: uuid.UUID, message_id: uuid.UUID) -> Response:
        message = _message(request, conversation_id, message_id, include_deleted=True)
        form = MessageEditSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        turn = turns.turn_edit(
            user=request_user(request),
            message=message,
            content=form.validated_data["content"],
            idempotency_key=_idempotency_key(request),
        )
        return _turn(turn)


class MessageRegenerateView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="messages_regenerate",
        summary="Regenerate an answer (adds a sibling)",
        request=None,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: TurnSerializer, **error_responses(400, 403, 404, 409, 413, 422, 429)},
    )
    @method_decorator(abuse_limit("message_post"))
    def post(self, request: Request, conversation_id: uuid.UUID, message_id: uuid.UUID) -> Response:
        message = _message(request, conversation_id, message_id, include_deleted=True)
        turn = turns.turn_regenerate(
            user=request_user(request),
            message=message,
            idempotency_key=_idempotency_key(request),
        )
        return _turn(turn)


class BranchSwitchView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="conversations_branch_switch",
        summary="Switch to a sibling's branch",
        description="Shows the branch through `message_id`, down to the deepest message "
        "last viewed under it.",
        request=BranchSwitchSerializer,
        responses={200: ConversationDetailSerializer, **error_responses(400, 404)},
    )
    def post(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        form = BranchSwitchSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        message = selectors.message_for_user(
            user=request.user,
            message_id=form.validated_data["message_id"],
            conversation=conversation,
        )
        conversation = services.branch_switch(message=message)
        return Response(_detail(conversation))
