"""Billing over the JSON API: the caller's usage and limits, and their statements.

The account's money: a full-scope API key or a session (`required_scope`), not a chat key.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import ApiKey
from billing import selectors
from chatsite.auth import request_user

from .serializers import StatementSerializer, UsageSerializer

TAGS = ["billing"]


class UsageView(APIView):
    required_scope = ApiKey.Scope.FULL

    @extend_schema(
        tags=TAGS,
        operation_id="billing_usage",
        summary="This period's usage and cost, and what is left of each limit",
        responses={200: UsageSerializer},
    )
    def get(self, request: Request) -> Response:
        overview = selectors.usage_overview(user=request_user(request))
        return Response(UsageSerializer(overview).data)


class StatementListView(APIView):
    required_scope = ApiKey.Scope.FULL

    @extend_schema(
        tags=TAGS,
        operation_id="billing_statements",
        summary="Monthly statements, newest first",
        responses={200: StatementSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        statements = selectors.statements_for_user(user=request_user(request))
        return Response(StatementSerializer(statements, many=True).data)
