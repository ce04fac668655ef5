"""A staff warning reaches the user: shown on the chat page until they acknowledge it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from moderation import services
from moderation.models import Sanction

from .test_review import make_flag

pytestmark = pytest.mark.django_db

REASON = "Insults are not allowed <b>here</b>"


def warn(user: User, staff: User) -> Sanction:
    return services.user_warn(flag=make_flag(user), by=staff, reason=REASON)


def page_for(user: User, **client_options: Any) -> tuple[Client, str]:
    client = Client(**client_options)
    client.force_login(user)
    return client, client.get("/").content.decode()


def test_a_warning_shows_on_the_chat_page_until_acknowledged(user: User, staff: User) -> None:
    warning = warn(user, staff)
    client, page = page_for(user)
    assert "A moderator warned your account" in page
    assert "Insults are not allowed &lt;b&gt;here&lt;/b&gt;" in page  # escaped, never markup
    assert 'name="next" value="/"' in page

    response = client.post(f"/moderation/warnings/{warning.pk}/seen/", {"next": "/"})

    assert response.status_code == 302 and response["Location"] == "/"
    warning.refresh_from_db()
    assert warning.seen_at is not None
    assert "A moderator warned your account" not in client.get("/").content.decode()


def test_another_users_warning_cannot_be_acknowledged(
    user: User, other_user: User, staff: User
) -> None:
    warning = warn(user, staff)
    client, page = page_for(other_user)
    assert "A moderator warned your account" not in page

    assert client.post(f"/moderation/warnings/{warning.pk}/seen/").status_code == 404
    warning.refresh_from_db()
    assert warning.seen_at is None


def test_acknowledging_needs_a_post_with_the_csrf_token(user: User, staff: User) -> None:
    warning = warn(user, staff)
    client, _ = page_for(user, enforce_csrf_checks=True)

    assert client.get(f"/moderation/warnings/{warning.pk}/seen/").status_code == 405
    assert client.post(f"/moderation/warnings/{warning.pk}/seen/").status_code == 403
    warning.refresh_from_db()
    assert warning.seen_at is None


def test_an_offsite_next_is_not_followed(user: User, staff: User) -> None:
    warning = warn(user, staff)
    client, _ = page_for(user)

    response = client.post(
        f"/moderation/warnings/{warning.pk}/seen/", {"next": "https://evil.example/"}
    )

    assert response.status_code == 302 and response["Location"] == "/"
