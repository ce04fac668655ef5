"""How the worker client splits a streamed body into its events' payloads (`_data_lines`):
one step per read from the socket, whatever the reads' boundaries."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from inference.client import MAX_LINE_BYTES, FaultCode, WorkerFault, _data_lines


class Reads:
    """A response body as aiohttp hands it over: in the pieces the socket gave."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces

    async def iter_any(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


async def steps(*pieces: bytes) -> list[list[bytes]]:
    return [payloads async for payloads in _data_lines(Reads(*pieces))]  # type: ignore[arg-type]


async def test_each_read_gives_the_payloads_it_completes() -> None:
    assert await steps(b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\ndata: [DONE]\n\n') == [
        [b'{"a": 1}'],
        [b'{"b": 2}', b"[DONE]"],
    ]


async def test_an_event_cut_between_reads_is_whole_once_its_end_comes() -> None:
    assert await steps(b'data: {"te', b'xt": "hi"}', b"\n\ndata: [DO", b"NE]\n\n") == [
        [b'{"text": "hi"}'],
        [b"[DONE]"],
    ]


async def test_comments_blank_lines_and_carriage_returns_are_not_payloads() -> None:
    assert await steps(b': ping\r\n\r\ndata: {"a": 1}\r\n\r\nevent: x\n\n') == [[b'{"a": 1}']]


async def test_a_last_line_without_its_end_still_counts() -> None:
    assert await steps(b"data: [DONE]") == [[b"[DONE]"]]


async def test_a_line_past_the_limit_is_a_bad_response() -> None:
    with pytest.raises(WorkerFault) as raised:
        await steps(b"data: " + b"x" * MAX_LINE_BYTES, b"x")
    assert raised.value.code == FaultCode.BAD_RESPONSE
