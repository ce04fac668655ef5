"""The answers that show a raw API key tell every cache not to keep them (Cache-Control:
no-store): the web page that creates a key and the API's create."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.cache import get_max_age
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def assert_no_store(response: Any) -> None:
    directives = {part.strip() for part in response["Cache-Control"].split(",")}
    assert {"no-store", "no-cache", "private"} <= directives, response["Cache-Control"]
    assert get_max_age(response) == 0


def test_the_page_showing_a_new_key_is_not_stored(user: Any) -> None:
    client = Client()
    client.force_login(user)
    created = client.post(reverse("accounts:api-keys"), {"name": "laptop"})
    assert created.status_code == 200
    assert created.context["new_key"] in created.content.decode()
    assert_no_store(created)
    # The page is the same one before a key is made (the back button must not bring one back).
    assert_no_store(client.get(reverse("accounts:api-keys")))


def test_the_api_answer_with_a_new_key_is_not_stored(api_client: APIClient) -> None:
    created = api_client.post("/api/v1/api-keys", {"name": "laptop"}, format="json")
    assert created.status_code == 201
    assert created.json()["key"].startswith("csk_")
    assert_no_store(created)
