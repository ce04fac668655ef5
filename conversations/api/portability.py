"""Export and import over the JSON API (#18): thin views over conversations/portability/.

Every conversation is fetched through `conversation_for_user` and every import job through
`import_job_for_user`: another user's is 404. Downloads are attachments; the account's zip is
streamed as it is written, through an async iterator (under ASGI Django would read a plain
iterator whole before sending it).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import ApiKey
from chatsite.auth import request_user
from chatsite.errors import ServiceError
from chatsite.schema import error_responses
from conversations import selectors
from conversations.errors import ErrorCode
from conversations.models import ImportJob
from conversations.portability import export
from conversations.portability import selectors as import_selectors
from conversations.portability import services as import_services

TAGS = ["export and import"]


class ImportErrorSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    detail = serializers.JSONField(allow_null=True)


class ImportJobSerializer(serializers.ModelSerializer[ImportJob]):
    done = serializers.SerializerMethodField(
        help_text="Conversations checked (`validating`) or written (`importing`, `done`)."
    )
    error = ImportErrorSerializer(
        allow_null=True, help_text="Why it failed (the API's error shape); null otherwise."
    )

    class Meta:
        model = ImportJob
        fields = [
            "id",
            "status",
            "filename",
            "size_bytes",
            "format",
            "total",
            "done",
            "imported",
            "error",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_done(self, job: ImportJob) -> int:
        return import_selectors.import_job_progress(job=job)


class ImportJobListSerializer(serializers.Serializer[Any]):
    results = ImportJobSerializer(many=True)


class ImportUploadSerializer(serializers.Serializer[Any]):
    file = serializers.FileField(
        required=False,
        help_text="ChatGPT's conversations.json, a conversation exported here (JSON), or the "
        "zip of all your data.",
    )


def _attachment(content: bytes | str, *, filename: str, content_type: str) -> HttpResponse:
    response = HttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class ConversationExportView(APIView):
    """`export.json`: the whole tree in the service's format; `export.md`: the branch on
    screen as Markdown. (A path, not `?format=`, which DRF keeps for its renderers.)"""

    @extend_schema(
        tags=TAGS,
        operation_id="conversations_export",
        summary="Download a conversation: export.json, the whole tree; export.md, the branch "
        "on screen as Markdown",
        responses={
            (200, "application/json"): OpenApiResponse(OpenApiTypes.OBJECT),
            (200, "text/markdown"): OpenApiResponse(OpenApiTypes.STR),
            **error_responses(404),
        },
    )
    def get(self, request: Request, conversation_id: uuid.UUID, kind: str) -> HttpResponse:
        conversation = selectors.conversation_for_user(
            user=request.user, conversation_id=conversation_id
        )
        if kind == "markdown":
            return _attachment(
                export.conversation_markdown(conversation=conversation),
                filename=export.export_filename(conversation=conversation, extension="md"),
                content_type="text/markdown; charset=utf-8",
            )
        return _attachment(
            export.conversation_json(conversation=conversation),
            filename=export.export_filename(conversation=conversation, extension="json"),
            content_type="application/json",
        )


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


async def _async_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    # Each chunk is made on Django's thread for sync code (it reads the database).
    pull = sync_to_async(_next_chunk, thread_sensitive=True)
    while True:
        chunk = await pull(chunks)
        if chunk is None:
            return
        yield chunk


class AccountExportView(APIView):
    # The account's keys and billing are in it: a chat-only key may not take it.
    required_scope = ApiKey.Scope.FULL

    @extend_schema(
        tags=TAGS,
        operation_id="account_export",
        summary="Download all your data as a zip (streamed)",
        description="Your account, API keys (name and prefix, never the key), folders, every "
        "conversation (JSON and Markdown), share links (a revoked one without its link), the "
        "feedback you gave, attached files (metadata and the files), statements and usage.",
        responses={(200, "application/zip"): OpenApiResponse(OpenApiTypes.BINARY)},
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        user = request_user(request)
        # The share links in it are absolute, on the host the export was asked of.
        site_url = request.build_absolute_uri("/").rstrip("/")
        chunks = export.account_zip(user=user, site_url=site_url)
        # Under ASGI (the edge) an async iterator, else Django would read it whole first.
        streamed = _async_chunks(chunks) if isinstance(request._request, ASGIRequest) else chunks
        response = StreamingHttpResponse(streamed, content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="chatsite-{user.pk}-export.zip"'
        return response


class ImportListView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        tags=TAGS,
        operation_id="imports_list",
        summary="Your latest imports, newest first",
        responses={200: ImportJobListSerializer},
    )
    def get(self, request: Request) -> Response:
        jobs = import_selectors.import_jobs_of(user=request.user)
        return Response({"results": ImportJobSerializer(jobs, many=True).data})

    @extend_schema(
        tags=TAGS,
        operation_id="imports_create",
        summary="Upload a file to import; the import runs in the background",
        description="Poll GET imports/{id} for `status` and `done` of `total`. Nothing is "
        "imported from a file with a fault: the job ends `failed` with its `error`.",
        request={"multipart/form-data": ImportUploadSerializer},
        responses={202: ImportJobSerializer, **error_responses(400, 413)},
    )
    def post(self, request: Request) -> Response:
        upload = request.FILES.get("file")
        if upload is None:
            raise ServiceError(
                ErrorCode.IMPORT_NO_FILE, "Send the file to import as the form field `file`."
            )
        job = import_services.import_job_create(
            owner=request_user(request),
            file=upload,
            filename=upload.name or "",
            size=upload.size or 0,
        )
        return Response(ImportJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class ImportDetailView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="imports_detail",
        summary="An import and its progress",
        responses={200: ImportJobSerializer, **error_responses(404)},
    )
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        job = import_selectors.import_job_for_user(user=request.user, job_id=job_id)
        return Response(ImportJobSerializer(job).data)
