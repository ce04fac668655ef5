"""The surge's fairness figure (`benchmarks/surge.py --heavy`): who sends what, and how the
tokens admitted while every free user waited are read against VTC's bound."""

from __future__ import annotations

import random

from benchmarks.surge import fairness, heavy_mix


def test_the_heavy_user_sends_times_as_many_as_each_other_in_a_random_order() -> None:
    senders = heavy_mix("heavy", ["a", "b", "c", "d"], 56, 10.0, random.Random(1))
    assert len(senders) == 56
    # 56 sends over 4 + 10 shares: 4 each for the others, the rest (40) for the heavy user.
    assert {name: senders.count(name) for name in set(senders)} == {
        "a": 4,
        "b": 4,
        "c": 4,
        "d": 4,
        "heavy": 40,
    }
    assert senders[:10].count("heavy") < 10  # shuffled, not the heavy user's block first


def test_the_window_runs_from_the_last_send_to_the_first_other_user_served_out() -> None:
    admitted = {
        # (seconds into the surge, cost): admitted before every send was queued (at 1.0)
        # counts for nobody; after the window (at 5.0, when "a" had its last) neither.
        "heavy": [(0.5, 100), (2.0, 100), (3.0, 100), (4.0, 100), (6.0, 100)],
        "a": [(2.5, 100), (5.0, 120)],
        "b": [(3.5, 100), (4.5, 100), (7.0, 100)],
    }
    found = fairness(admitted, heavy="heavy", heavy_sent=0.6, since=1.0)
    assert found.window_s == 4.0
    assert found.heavy_tokens == 300
    assert found.others_tokens == [220, 200]
    assert found.largest_cost == 120
    assert found.lead == 100 and found.bound == 240
    assert found.heavy_served == 300 / 720
    assert "within" in found.describe()


def test_a_heavy_user_served_first_is_reported_over_the_bound() -> None:
    admitted = {
        "heavy": [(1.0 + n / 10, 100) for n in range(10)],
        "a": [(2.5, 100)],
    }
    found = fairness(admitted, heavy="heavy", heavy_sent=0.9, since=0.9)
    assert found.heavy_tokens == 1000 and found.others_tokens == [100]
    assert found.lead == 900 > found.bound == 200
    assert found.describe().endswith("OVER")


def test_no_wait_once_every_send_was_queued_is_said_so() -> None:
    found = fairness(
        {"heavy": [(0.1, 50)], "a": [(0.2, 50)]}, heavy="heavy", heavy_sent=0.5, since=0.3
    )
    assert found.window_s == 0.0
    assert "nothing to share" in found.describe()
