"""A revoked API key loses the streams it holds open: the response ends within a heartbeat
period and the reconnect is refused, while another key's stream goes on. Against the suite's
live edge (heartbeats every second)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User

from accounts.authentication import stream_credential_check
from accounts.models import ApiKey
from accounts.services import api_key_create, api_key_revoke, api_keys_revoke
from chatsite.testing import budget
from inference.tests.fixtures import LiveEdge, register_pool, send

pytestmark = pytest.mark.django_db(transaction=True)

# Failure points only (scaled budgets): a line comes every second, and a revoked key's stream
# ends within a heartbeat period or two; these only bound a stream that never does.
READ_TIMEOUT = budget(60)


async def new_key(user: User) -> tuple[ApiKey, dict[str, str]]:
    key, raw = await sync_to_async(api_key_create)(user=user, name="stream")
    return key, {"Authorization": f"Bearer {raw}"}


async def read_to_the_end(lines: AsyncIterator[str]) -> list[str]:
    """The lines left until the server ends the response."""
    return [line async for line in lines]


@pytest.mark.parametrize("door", ["generation", "user events"])
async def test_a_revoked_keys_open_stream_ends_and_cannot_come_back(
    user: User, live_edge: LiveEdge, door: str
) -> None:
    await sync_to_async(register_pool)()  # no worker: the answer waits, its stream stays open
    turn = await send(user)
    path = (
        f"/api/v1/generations/{turn.generation.id}/stream"
        if door == "generation"
        else "/api/v1/events/stream"
    )
    url = f"{live_edge.url}{path}"
    revoked, revoked_headers = await new_key(user)
    _, kept_headers = await new_key(user)
    async with (
        httpx.AsyncClient(timeout=READ_TIMEOUT) as client,
        client.stream("GET", url, headers=revoked_headers) as doomed,
        client.stream("GET", url, headers=kept_headers) as kept,
    ):
        assert doomed.status_code == kept.status_code == 200
        doomed_lines, kept_lines = doomed.aiter_lines(), kept.aiter_lines()
        await anext(doomed_lines)
        await sync_to_async(api_key_revoke)(user=user, key_id=revoked.pk)

        # Ends by itself (heartbeats every second here, each asking after the key).
        rest = await asyncio.wait_for(read_to_the_end(doomed_lines), timeout=READ_TIMEOUT)
        assert not any(line.startswith("event: done") for line in rest)
        # The other key's stream is still open: it still sends.
        assert await asyncio.wait_for(anext(kept_lines), timeout=READ_TIMEOUT) is not None
        again = await client.get(url, headers=revoked_headers)
    assert again.status_code == 401


async def test_staffs_bulk_revocation_ends_the_keys_streams(
    user: User, live_edge: LiveEdge
) -> None:
    url = f"{live_edge.url}/api/v1/events/stream"
    _, headers = await new_key(user)
    async with (
        httpx.AsyncClient(timeout=READ_TIMEOUT) as client,
        client.stream("GET", url, headers=headers) as doomed,
    ):
        assert doomed.status_code == 200
        lines = doomed.aiter_lines()
        await anext(lines)
        revoked = await sync_to_async(api_keys_revoke)(keys=ApiKey.objects.filter(user=user))
        assert revoked == 1
        await asyncio.wait_for(read_to_the_end(lines), timeout=READ_TIMEOUT)


def test_a_session_stream_has_no_key_to_check(rf: Any) -> None:
    assert stream_credential_check(rf.get("/api/v1/events/stream"), redis=None) is None
