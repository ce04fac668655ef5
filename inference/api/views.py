"""Generations over the JSON API: read one, cancel one."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatsite.auth import request_user
from inference import selectors, services

from .serializers import GenerationCancelSerializer, GenerationSerializer


class GenerationDetailView(APIView):
    @extend_schema(responses=GenerationSerializer)
    def get(self, request: Request, generation_id: UUID) -> Response:
        generation = selectors.generation_for_user(
            user=request_user(request), generation_id=generation_id
        )
        return Response(GenerationSerializer(generation).data)


class GenerationCancelView(APIView):
    """Stop an answer. The web chat's Stop sends JSON with the CSRF header; its beacon on
    `pagehide` cannot set headers, so it sends a form with `csrfmiddlewaretoken`, which the
    CSRF check of a session reads from the body."""

    @extend_schema(request=GenerationCancelSerializer, responses=GenerationSerializer)
    def post(self, request: Request, generation_id: UUID) -> Response:
        generation = selectors.generation_for_user(
            user=request_user(request), generation_id=generation_id
        )
        form = GenerationCancelSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        if form.validated_data["leaving"]:
            generation = services.generation_leave(
                generation=generation, page=form.validated_data["page"]
            )
        else:
            generation = services.generation_cancel(generation=generation)
        return Response(GenerationSerializer(generation).data)
