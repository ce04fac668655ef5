"""Attachments over the JSON API: upload to a conversation, download, take back unsent.

Every view fetches the conversation through `conversation_for_user` and the file through
`attachment_for_user`: another user's conversation or file is 404 on every method. The file
is sent with a message by naming its id in `attachment_ids` of POST .../messages.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatsite.errors import ServiceError
from chatsite.schema import error_responses
from conversations import attachments, selectors
from conversations.errors import ErrorCode
from conversations.models import Attachment

from .serializers import AttachmentSerializer, AttachmentUploadSerializer

TAGS = ["attachments"]


class AttachmentListView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        tags=TAGS,
        operation_id="attachments_upload",
        summary="Upload a text, Markdown or PDF file to a conversation",
        description="The file's type is judged by its content: a PDF pypdf can read, or "
        "UTF-8 text. Send it with a message by naming its `id` in `attachment_ids`.",
        request={"multipart/form-data": AttachmentUploadSerializer},
        responses={201: AttachmentSerializer, **error_responses(400, 404, 409, 413, 415, 422)},
    )
    def post(self, request: Request, conversation_id: uuid.UUID) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id, include_deleted=True
        )
        upload = request.FILES.get("file")
        if upload is None:
            raise ServiceError(ErrorCode.NO_FILE, "Send the file as the form field `file`.")
        name = upload.name or ""
        # Refused by its size alone before its bytes are read.
        attachments.attachment_check_size(name=name, size=upload.size or 0)
        attachment = attachments.attachment_upload(
            conversation=conversation, name=name, data=upload.read()
        )
        return Response(AttachmentSerializer(attachment).data, status=status.HTTP_201_CREATED)


class AttachmentDetailView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="attachments_retrieve",
        summary="One file of a conversation",
        responses={200: AttachmentSerializer, **error_responses(404)},
    )
    def get(
        self, request: Request, conversation_id: uuid.UUID, attachment_id: uuid.UUID
    ) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        attachment = selectors.attachment_for_user(
            user=request.user, attachment_id=attachment_id, conversation=conversation
        )
        return Response(AttachmentSerializer(attachment).data)

    @extend_schema(
        tags=TAGS,
        operation_id="attachments_discard",
        summary="Take back a file not yet sent",
        responses={204: None, **error_responses(404, 409)},
    )
    def delete(
        self, request: Request, conversation_id: uuid.UUID, attachment_id: uuid.UUID
    ) -> Response:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        attachment = selectors.attachment_for_user(
            user=request.user, attachment_id=attachment_id, conversation=conversation
        )
        attachments.attachment_discard(attachment=attachment)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AttachmentContentView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="attachments_download",
        summary="Download a file as it was uploaded",
        responses={200: OpenApiResponse(description="The file's bytes."), **error_responses(404)},
    )
    def get(
        self, request: Request, conversation_id: uuid.UUID, attachment_id: uuid.UUID
    ) -> HttpResponse:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        attachment = selectors.attachment_for_user(
            user=request.user,
            attachment_id=attachment_id,
            conversation=conversation,
            with_data=True,
        )
        content_type = attachments.CONTENT_TYPES[Attachment.Kind(attachment.kind)]
        response = HttpResponse(bytes(attachment.data), content_type=content_type)
        # Always a download, never rendered in the site's origin.
        response.headers["Content-Disposition"] = _disposition(attachment.name)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def _disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "'")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name)}"
