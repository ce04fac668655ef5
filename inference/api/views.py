"""Generations over the JSON API: read one, cancel one."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatsite.auth import request_user
from inference import selectors, services

from .serializers import GenerationSerializer


class GenerationDetailView(APIView):
    @extend_schema(responses=GenerationSerializer)
    def get(self, request: Request, generation_id: UUID) -> Response:
        generation = selectors.generation_for_user(
            user=request_user(request), generation_id=generation_id
        )
        return Response(GenerationSerializer(generation).data)


class GenerationCancelView(APIView):
    @extend_schema(request=None, responses=GenerationSerializer)
    def post(self, request: Request, generation_id: UUID) -> Response:
        generation = selectors.generation_for_user(
            user=request_user(request), generation_id=generation_id
        )
        generation = services.generation_cancel(generation=generation)
        return Response(GenerationSerializer(generation).data)
