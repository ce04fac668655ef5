"""API keys over the JSON API: list, create (the raw key is in this answer only), revoke.

Managing keys is managing the account: a full-scope key or a session (`required_scope`).
"""

from __future__ import annotations

from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import selectors, services
from accounts.abuse import abuse_limit
from accounts.models import ApiKey
from chatsite.auth import request_user

from .serializers import (
    ApiKeyCreatedSerializer,
    ApiKeyCreateSerializer,
    ApiKeySerializer,
    ApiKeyUpdateSerializer,
)


class ApiKeyListView(APIView):
    required_scope = ApiKey.Scope.FULL

    @extend_schema(responses=ApiKeySerializer(many=True))
    def get(self, request: Request) -> Response:
        keys = selectors.api_keys_for_user(user=request_user(request))
        return Response(ApiKeySerializer(keys, many=True).data)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeyCreatedSerializer})
    @method_decorator(never_cache)  # its answer holds the raw key: no cache may keep it
    @method_decorator(abuse_limit("api_key_create"))
    def post(self, request: Request) -> Response:
        form = ApiKeyCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        key, raw_key = services.api_key_create(
            user=request_user(request),
            name=form.validated_data["name"],
            scope=form.validated_data["scope"],
            store_conversations=form.validated_data["store_conversations"],
            created_with=request.auth if isinstance(request.auth, ApiKey) else None,
        )
        body = dict(ApiKeySerializer(key).data)
        body["key"] = raw_key
        return Response(body, status=status.HTTP_201_CREATED)


class ApiKeyDetailView(APIView):
    required_scope = ApiKey.Scope.FULL

    @extend_schema(responses=ApiKeySerializer)
    def get(self, request: Request, key_id: int) -> Response:
        key = selectors.api_key_for_user(user=request_user(request), key_id=key_id)
        return Response(ApiKeySerializer(key).data)

    @extend_schema(request=ApiKeyUpdateSerializer, responses=ApiKeySerializer)
    def patch(self, request: Request, key_id: int) -> Response:
        form = ApiKeyUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        key = services.api_key_update(
            user=request_user(request),
            key_id=key_id,
            store_conversations=form.validated_data["store_conversations"],
        )
        return Response(ApiKeySerializer(key).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, key_id: int) -> Response:
        services.api_key_revoke(user=request_user(request), key_id=key_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
