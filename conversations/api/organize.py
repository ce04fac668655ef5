"""Folders and message search over the JSON API: thin views over services and selectors.

Every folder is fetched through `folder_for_user`: another user's folder is 404.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatsite.auth import request_user
from chatsite.schema import error_responses
from conversations import search, selectors, services

from .serializers import (
    FolderListSerializer,
    FolderSerializer,
    FolderWriteSerializer,
    SearchPageSerializer,
    SearchQuerySerializer,
)

TAGS = ["folders"]


class FolderListView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="folders_list",
        summary="Your folders, by name",
        responses={200: FolderListSerializer},
    )
    def get(self, request: Request) -> Response:
        folders = selectors.folders_of(user=request.user)
        return Response({"results": FolderSerializer(folders, many=True).data})

    @extend_schema(
        tags=TAGS,
        operation_id="folders_create",
        summary="Make a folder",
        request=FolderWriteSerializer,
        responses={201: FolderSerializer, **error_responses(400, 409)},
    )
    def post(self, request: Request) -> Response:
        form = FolderWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        folder = services.folder_create(
            owner=request_user(request), name=form.validated_data["name"]
        )
        return Response(FolderSerializer(folder).data, status=status.HTTP_201_CREATED)


class FolderDetailView(APIView):
    @extend_schema(
        tags=TAGS,
        operation_id="folders_rename",
        summary="Rename a folder",
        request=FolderWriteSerializer,
        responses={200: FolderSerializer, **error_responses(400, 404, 409)},
    )
    def patch(self, request: Request, folder_id: uuid.UUID) -> Response:
        folder = selectors.folder_for_user(user=request.user, folder_id=folder_id)
        form = FolderWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        folder = services.folder_rename(folder=folder, name=form.validated_data["name"])
        return Response(FolderSerializer(folder).data)

    @extend_schema(
        tags=TAGS,
        operation_id="folders_delete",
        summary="Delete a folder (its conversations stay, in no folder)",
        responses={204: None, **error_responses(404)},
    )
    def delete(self, request: Request, folder_id: uuid.UUID) -> Response:
        folder = selectors.folder_for_user(user=request.user, folder_id=folder_id)
        services.folder_delete(folder=folder)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SearchView(APIView):
    @extend_schema(
        tags=["search"],
        operation_id="search_messages",
        summary="Search the text of your messages, best match first",
        description="User and assistant messages of your live conversations (archived "
        "included). Each hit has a plain-text `snippet` and its matches as offsets; open it "
        "with POST conversations/{id}/branch and its `message_id`.",
        parameters=[SearchQuerySerializer],
        responses={200: SearchPageSerializer, **error_responses(400, 503)},
    )
    def get(self, request: Request) -> Response:
        params = SearchQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        page = search.message_search(
            user=request.user,
            query=params.validated_data["q"],
            cursor=params.validated_data.get("cursor") or None,
            limit=params.validated_data["limit"],
        )
        results = [asdict(hit) for hit in page.hits]
        return Response(
            SearchPageSerializer({"results": results, "next_cursor": page.next_cursor}).data
        )
