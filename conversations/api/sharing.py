"""Share links and feedback over the JSON API: thin views over services and selectors.

Every object is fetched through a `*_for_user` selector: another user's conversation, share
or message is 404, the same as one that never existed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.urls import reverse
from django.utils.decorators import method_decorator
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.abuse import abuse_limit
from chatsite.auth import request_user
from chatsite.schema import error_responses
from conversations import selectors, services
from conversations.models import Message, Share
from conversations.share_tokens import share_token

from .serializers import (
    FeedbackSerializer,
    FeedbackWriteSerializer,
    ShareListSerializer,
    ShareQuerySerializer,
    ShareSerializer,
)


def _urls(request: Request, shares: Sequence[Share]) -> dict[uuid.UUID, str]:
    """Each share's link, absolute, recomputed from its id (the database holds no token)."""
    return {
        share.pk: request.build_absolute_uri(
            reverse("conversations:shared", args=[share_token(share_id=share.pk)])
        )
        for share in shares
    }


def _share(request: Request, share: Share) -> dict[str, object]:
    return dict(ShareSerializer(share, context={"urls": _urls(request, [share])}).data)


class ConversationShareView(APIView):
    @extend_schema(
        tags=["shares"],
        operation_id="conversations_share",
        summary="Share the branch on screen as a read-only link",
        description="Copies the user messages and finished answers of the current branch, and "
        "the title; later changes to the conversation do not change the link's page.",
        request=None,
        responses={201: ShareSerializer, **error_responses(400, 404, 429)},
    )
    @method_decorator(abuse_limit("share_create"))
    def post(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id, include_deleted=True
        )
        share = services.share_create(conversation=conversation)
        return Response(_share(request, share), status=status.HTTP_201_CREATED)


class ShareListView(APIView):
    @extend_schema(
        tags=["shares"],
        operation_id="shares_list",
        summary="Your share links, newest first (revoked ones marked)",
        parameters=[ShareQuerySerializer],
        responses={200: ShareListSerializer, **error_responses(400, 404)},
    )
    def get(self, request: Request) -> Response:
        params = ShareQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        conversation = None
        if "conversation_id" in params.validated_data:
            conversation = selectors.conversation_for_user(
                user=request.user, conversation_id=params.validated_data["conversation_id"]
            )
        shares = selectors.shares_of(user=request.user, conversation=conversation)
        data = ShareSerializer(shares, many=True, context={"urls": _urls(request, shares)}).data
        return Response({"results": data})


class ShareRevokeView(APIView):
    @extend_schema(
        tags=["shares"],
        operation_id="shares_revoke",
        summary="Revoke a share link (its page is 404 from now on)",
        request=None,
        responses={200: ShareSerializer, **error_responses(404)},
    )
    def post(self, request: Request, share_id: uuid.UUID) -> Response:
        share = selectors.share_for_user(user=request.user, share_id=share_id)
        return Response(_share(request, services.share_revoke(share=share)))


def _answer(request: Request, conversation_id: uuid.UUID, message_id: uuid.UUID) -> Message:
    """The caller's message inside the URL's live conversation; 404 for anything else."""
    conversation = selectors.conversation_for_user(
        user=request.user, conversation_id=conversation_id
    )
    return selectors.message_for_user(
        user=request.user, message_id=message_id, conversation=conversation
    )


class MessageFeedbackView(APIView):
    @extend_schema(
        tags=["feedback"],
        operation_id="messages_feedback_set",
        summary="Thumbs up or down on an answer (replaces your earlier one)",
        request=FeedbackWriteSerializer,
        responses={200: FeedbackSerializer, **error_responses(400, 404, 409)},
    )
    def put(self, request: Request, conversation_id: uuid.UUID, message_id: uuid.UUID) -> Response:
        message = _answer(request, conversation_id, message_id)
        form = FeedbackWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        feedback = services.feedback_set(
            message=message,
            user=request_user(request),
            rating=form.validated_data["rating"],
            reason=form.validated_data["reason"],
            comment=form.validated_data["comment"],
        )
        return Response(FeedbackSerializer(feedback).data)

    @extend_schema(
        tags=["feedback"],
        operation_id="messages_feedback_remove",
        summary="Take back your feedback on an answer",
        responses={204: None, **error_responses(404)},
    )
    def delete(
        self, request: Request, conversation_id: uuid.UUID, message_id: uuid.UUID
    ) -> Response:
        message = _answer(request, conversation_id, message_id)
        services.feedback_remove(message=message, user=request_user(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
