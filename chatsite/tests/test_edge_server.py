"""The edge's server (`chatsite.edge`): uvicorn's, ticking once a second instead of ten times."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn

from chatsite import edge


async def test_each_tick_refreshes_the_date_header_and_a_stop_ends_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(edge, "TICK_SECONDS", 0.001)
    server = edge.quiet_server_class()(config=uvicorn.Config(app=edge.APPLICATION))
    dated: list[int] = []
    real_tick = uvicorn.Server.on_tick

    async def on_tick(self: Any, counter: int) -> bool:
        before = self.server_state.default_headers
        stop = await real_tick(self, counter)
        if self.server_state.default_headers is not before:
            dated.append(counter)
        if len(dated) == 3:
            self.should_exit = True
        return stop

    monkeypatch.setattr(type(server), "on_tick", on_tick)
    await asyncio.wait_for(server.main_loop(), timeout=60)
    # uvicorn refreshes the Date header on every tenth of its ticks: here, on every tick; the
    # stop asked during the third is seen at the next, which ends the loop.
    assert dated == [0, 10, 20, 30]
