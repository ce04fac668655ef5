"""Pages of the web chat.

One page serves both a new chat (`/`) and an existing conversation (`/c/<id>`); the
browser code in `static/js/` does the rest through the JSON API. The page carries only what
the API does not offer: the models the user's plan may use, for the picker.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.views.decorators.csrf import ensure_csrf_cookie

from billing.selectors import plan_for_user, pools_for_plan
from chatsite.auth import request_user
from chatsite.errors import NotFound
from conversations import selectors
from conversations.models import Conversation
from inference.services import generation_pages_shown
from moderation.selectors import warnings_unseen


def _chat_page(request: HttpRequest, conversation: Conversation | None) -> HttpResponse:
    user = request_user(request)
    models = [pool.name for pool in pools_for_plan(plan=plan_for_user(user=user))]
    if settings.AUTO_MODEL and settings.AUTO_MODEL_SMALL in models:
        models.append(settings.AUTO_MODEL)  # each answer by the small or the large pool
    default_model = settings.DEFAULT_MODEL if settings.DEFAULT_MODEL in models else None
    config: dict[str, Any] = {
        "conversationId": str(conversation.pk) if conversation else None,
        "models": models,
        "defaultModel": default_model or (models[0] if models else None),
        "messageMaxChars": settings.MESSAGE_MAX_CHARS,
        "loginUrl": resolve_url(settings.LOGIN_URL),
    }
    context = {
        "conversation": conversation,
        "models": models,
        "chat_config": config,
        "moderation_warnings": warnings_unseen(user=user),
    }
    generation_pages_shown(user=user)  # a beacon right after this is from a reload
    return render(request, "conversations/chat.html", context)


@login_required
@ensure_csrf_cookie
def home(request: HttpRequest) -> HttpResponse:
    """A new chat, with the model picker."""
    return _chat_page(request, None)


@login_required
@ensure_csrf_cookie
def conversation(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """One of the user's conversations; another user's is 404, as one that never existed."""
    try:
        found = selectors.conversation_for_user(
            user=request_user(request), conversation_id=conversation_id
        )
    except NotFound as exc:
        raise Http404(exc.message) from exc
    return _chat_page(request, found)


@login_required
@ensure_csrf_cookie
def settings_page(request: HttpRequest) -> HttpResponse:
    """Custom instructions and memory; the page reads and writes them through the JSON API."""
    context = {
        "instructions_max_chars": settings.INSTRUCTIONS_MAX_CHARS,
        "fact_max_chars": settings.MEMORY_FACT_MAX_CHARS,
    }
    return render(request, "conversations/settings.html", context)
