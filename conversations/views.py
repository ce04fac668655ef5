"""Pages of the web chat.

One page serves both a new chat (`/`) and an existing conversation (`/c/<id>`); the
browser code in `static/js/` does the rest through the JSON API. The page carries only what
the API does not offer: the models the user's plan may use, for the picker.

A share link's page (`/s/<token>`) is open to anyone, logged out included.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

from billing.selectors import plan_for_user, pools_for_plan
from chatsite.auth import request_user
from chatsite.errors import NotFound
from conversations import selectors
from conversations.models import Conversation, Feedback
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
        "feedbackReasons": [list(choice) for choice in Feedback.Reason.choices],
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


# What the shared page gets of each message of the snapshot: nothing else reaches it.
SHARED_MESSAGE_FIELDS = ("role", "content", "model", "created_at")


@require_safe
def shared(request: HttpRequest, token: str) -> HttpResponse:
    """A shared snapshot, read-only, for anyone holding the link; 404 for a malformed, forged
    or revoked token and for a deleted conversation's share.

    The page carries the snapshot and nothing of its owner (no name, no ids), asks search
    engines not to index it, and sends no Referer from it: the link is the only secret.
    """
    try:
        share = selectors.shared_snapshot(token=token)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    data = {
        "title": share.title,
        "createdAt": share.created_at.isoformat(),
        "messages": [
            {name: str(message.get(name, "")) for name in SHARED_MESSAGE_FIELDS}
            for message in share.messages
        ],
    }
    response = render(request, "conversations/shared.html", {"share": share, "shared": data})
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"
    # A revoked link stops at once: no cache keeps serving it.
    response["Cache-Control"] = "no-store"
    return response


@login_required
@ensure_csrf_cookie
def data(request: HttpRequest) -> HttpResponse:
    """Your data (#18): download all of it as a zip; import conversations (ChatGPT's export,
    or this service's), with the import's progress (static/js/data.js)."""
    config = {"importMaxBytes": settings.IMPORT_MAX_BYTES}
    return render(request, "conversations/data.html", {"data_config": config})


@login_required
@ensure_csrf_cookie
def settings_page(request: HttpRequest) -> HttpResponse:
    """Custom instructions and memory; the page reads and writes them through the JSON API."""
    context = {
        "instructions_max_chars": settings.INSTRUCTIONS_MAX_CHARS,
        "fact_max_chars": settings.MEMORY_FACT_MAX_CHARS,
    }
    return render(request, "conversations/settings.html", context)
