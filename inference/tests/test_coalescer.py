"""The coalescer sends an answer's text in order and whole: one flush at a time, and a
flush under way is never cancelled, whichever of the timer and the stream loop asked for it."""

from __future__ import annotations

import asyncio

from inference.scheduler.writer import Coalescer


class Answer:
    """A run's pending text and what its flushes sent; `slow` makes chosen flushes (by their
    number) take a while, as an XADD on a busy Redis does."""

    def __init__(self, slow: dict[int, float]) -> None:
        self.pending = ""
        self.sent: list[str] = []
        self.slow = slow
        self.flushes = 0

    async def flush(self) -> None:
        self.flushes += 1
        number = self.flushes
        text, self.pending = self.pending, ""
        await asyncio.sleep(self.slow.get(number, 0))
        if text:
            self.sent.append(text)


async def test_a_timer_flush_under_way_is_neither_cancelled_nor_overtaken() -> None:
    # The second flush (the timer's, of "b") is slow; "c" arrives while it is under way and
    # after the quiet interval, so the loop flushes at once.
    answer = Answer(slow={2: 0.2})
    coalescer = Coalescer(answer.flush, interval=0.05)
    answer.pending += "a"
    await coalescer.pending()  # the first piece goes out at once
    await asyncio.sleep(0.01)
    answer.pending += "b"
    await coalescer.pending()  # within the interval: the timer's
    await asyncio.sleep(0.08)  # the timer's flush of "b" has begun and is still under way
    assert answer.flushes == 2 and answer.sent == ["a"]
    answer.pending += "c"
    await coalescer.pending()
    await coalescer.aclose()
    await answer.flush()  # the stream loop's last flush
    assert answer.sent == ["a", "b", "c"]


async def test_closing_waits_for_a_timer_flush_under_way_and_forgets_a_waiting_one() -> None:
    answer = Answer(slow={2: 0.1})
    coalescer = Coalescer(answer.flush, interval=0.05)
    answer.pending += "a"
    await coalescer.pending()
    answer.pending += "b"
    await coalescer.pending()  # the timer's, due in 0.05 s
    await asyncio.sleep(0.07)  # under way
    await coalescer.aclose()
    assert answer.sent == ["a", "b"]  # closing waited for it

    waiting = Answer(slow={})
    coalescer = Coalescer(waiting.flush, interval=10)
    waiting.pending += "x"
    await coalescer.pending()
    waiting.pending += "y"
    await coalescer.pending()  # a timer 10 s away
    await coalescer.aclose()
    assert waiting.flushes == 1  # forgotten: the caller's own last flush sends "y"
    await waiting.flush()
    assert waiting.sent == ["x", "y"]


async def test_a_burst_goes_out_together_once_the_interval_is_up() -> None:
    answer = Answer(slow={})
    coalescer = Coalescer(answer.flush, interval=0.05)
    for piece in "abcd":
        answer.pending += piece
        await coalescer.pending()
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)
    await coalescer.aclose()
    assert answer.sent == ["a", "bcd"]
