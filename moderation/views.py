"""The user's side of moderation on the site's pages: acknowledging a staff warning."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from chatsite.auth import request_user
from chatsite.errors import NotFound

from . import services


@login_required
@require_POST
def warning_seen(request: HttpRequest, sanction_id: int) -> HttpResponse:
    """Hide a warning the user has read, then go back to the page they were on."""
    try:
        services.warning_acknowledge(user=request_user(request), sanction_id=sanction_id)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    back = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return redirect(back if safe and back else "conversations:home")
