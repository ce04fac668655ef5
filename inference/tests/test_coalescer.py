"""The coalescer sends an answer's text in order and whole: one flush at a time, and a
flush under way is never cancelled, whichever of the timer and the stream loop asked for it.

A flush the test makes slow waits on an event the test sets, and the test waits for a flush
to have begun rather than for a time, so the order of things does not hang on the machine's
speed. The quiet interval is the one time that matters: the pieces a test sends "within" it
are sent one after the other with nothing slow between them, and `INTERVAL` is far longer
than that takes on any machine the suite runs on (and scales with the test budgets).
"""

from __future__ import annotations

import asyncio

from chatsite.testing import budget
from inference.scheduler.writer import Coalescer

from .fixtures import wait_for

INTERVAL = budget(0.5)


class Answer:
    """A run's pending text and what its flushes sent; the flushes numbered in `held` wait
    for `go_on` once begun (`begun` says which have), as an XADD on a busy Redis does."""

    def __init__(self, held: frozenset[int] = frozenset()) -> None:
        self.pending = ""
        self.sent: list[str] = []
        self.held = held
        self.begun: set[int] = set()
        self.go_on = asyncio.Event()
        self.flushes = 0

    async def flush(self) -> None:
        self.flushes += 1
        number = self.flushes
        text, self.pending = self.pending, ""
        self.begun.add(number)
        if number in self.held:
            await self.go_on.wait()
        if text:
            self.sent.append(text)

    async def has_begun(self, number: int) -> None:
        async def begun() -> bool:
            return number in self.begun

        await wait_for(begun, what=f"flush {number} begun")


async def test_a_timer_flush_under_way_is_neither_cancelled_nor_overtaken() -> None:
    # The second flush (the timer's, of "b") is slow; "c" arrives while it is under way and
    # after the quiet interval, so the loop flushes at once.
    answer = Answer(held=frozenset({2}))
    coalescer = Coalescer(answer.flush, interval=INTERVAL)
    answer.pending += "a"
    await coalescer.pending()  # the first piece goes out at once
    answer.pending += "b"
    await coalescer.pending()  # within the interval: the timer's
    await answer.has_begun(2)  # the timer's flush of "b" has begun and is still under way
    assert answer.flushes == 2 and answer.sent == ["a"]
    answer.pending += "c"
    loop_flush = asyncio.create_task(coalescer.pending())  # past the interval: at once
    await asyncio.sleep(0)  # it runs up to the flush lock the timer's flush holds
    assert answer.flushes == 2  # it waits for the one under way
    answer.go_on.set()
    await loop_flush
    await coalescer.aclose()
    await answer.flush()  # the stream loop's last flush
    assert answer.sent == ["a", "b", "c"]


async def test_closing_waits_for_a_timer_flush_under_way_and_forgets_a_waiting_one() -> None:
    answer = Answer(held=frozenset({2}))
    coalescer = Coalescer(answer.flush, interval=INTERVAL)
    answer.pending += "a"
    await coalescer.pending()
    answer.pending += "b"
    await coalescer.pending()  # the timer's, due once the interval is up
    await answer.has_begun(2)  # under way
    closing = asyncio.create_task(coalescer.aclose())
    await asyncio.sleep(0)  # closing has begun (a cancel of the flush would be delivered now)
    answer.go_on.set()
    await closing
    assert answer.sent == ["a", "b"]  # closing waited for it

    waiting = Answer()
    coalescer = Coalescer(waiting.flush, interval=10)
    waiting.pending += "x"
    await coalescer.pending()
    waiting.pending += "y"
    await coalescer.pending()  # a timer 10 s away (closed long before, at any speed)
    await coalescer.aclose()
    assert waiting.flushes == 1  # forgotten: the caller's own last flush sends "y"
    await waiting.flush()
    assert waiting.sent == ["x", "y"]


async def test_a_burst_goes_out_together_once_the_interval_is_up() -> None:
    answer = Answer()
    coalescer = Coalescer(answer.flush, interval=INTERVAL)
    for piece in "abcd":
        answer.pending += piece
        await coalescer.pending()
        await asyncio.sleep(0)  # the loop turns between pieces, as it does between tokens
    assert answer.sent == ["a"]  # the rest waits for the interval
    await answer.has_begun(2)  # the timer's, once the interval is up
    await coalescer.aclose()
    assert answer.sent == ["a", "bcd"]
