"""Account pages: sign-up, and API keys (log-in and log-out are Django's own views)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from chatsite.auth import request_user
from chatsite.errors import NotFound, ServiceError

from . import selectors, services
from .abuse import abuse_limit
from .models import ApiKey


@require_http_methods(["GET", "POST"])
@abuse_limit("signup")
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("/")
    form: UserCreationForm[User] = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("/")
    return render(request, "accounts/signup.html", {"form": form})


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100)
    # Chat only unless asked (ApiKey's docstring says why); a form without it is chat.
    scope = forms.TypedChoiceField(
        choices=ApiKey.Scope.choices,
        initial=ApiKey.Scope.CHAT,
        required=False,
        empty_value=ApiKey.Scope.CHAT,
        label="Scope",
    )
    store_conversations = forms.BooleanField(
        required=False,
        initial=True,
        label="Keep OpenAI API requests as conversations",
    )


# never_cache (no-store): the answer to a create holds the new raw key; no cache may keep it.
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
@abuse_limit("api_key_create")
def api_keys(request: HttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        try:
            _, new_key = services.api_key_create(
                user=request_user(request),
                name=form.cleaned_data["name"],
                scope=form.cleaned_data["scope"],
                store_conversations=form.cleaned_data["store_conversations"],
            )
        except ServiceError as exc:
            form.add_error(None, exc.message)
        else:
            form = ApiKeyForm()
    keys = selectors.api_keys_for_user(user=request_user(request))
    return render(
        request, "accounts/api_keys.html", {"form": form, "keys": keys, "new_key": new_key}
    )


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    try:
        key = services.api_key_revoke(user=request_user(request), key_id=key_id)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    messages.success(request, f"Revoked {key.name}.")
    return redirect("accounts:api-keys")


@login_required
@require_POST
def api_key_storage(request: HttpRequest, key_id: int) -> HttpResponse:
    """Turn keeping the OpenAI-compatible API's conversations on or off for one key."""
    store = request.POST.get("store_conversations") == "on"
    try:
        key = services.api_key_update(
            user=request_user(request), key_id=key_id, store_conversations=store
        )
    except NotFound as exc:
        raise Http404(exc.message) from exc
    state = "kept" if key.store_conversations else "not kept"
    messages.success(request, f"Requests with {key.name} are now {state} as conversations.")
    return redirect("accounts:api-keys")
