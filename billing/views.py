"""The usage page: this period's usage and cost, what is left of each limit, statements."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from chatsite.auth import request_user

from . import selectors

STATEMENTS_SHOWN = 12


@login_required
def usage(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    context = {
        "overview": selectors.usage_overview(user=user),
        "statements": selectors.statements_for_user(user=user)[:STATEMENTS_SHOWN],
    }
    return render(request, "billing/usage.html", context)
