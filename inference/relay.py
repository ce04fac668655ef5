"""Direct relay: the edge that took a `/v1` request reads the worker's stream itself.

An answer nobody keeps (a `/v1` key that stores nothing) and that offers no tools does not
pass through the scheduler token by token. The scheduler admits and places it as any
other, then writes a `relay` order to its stream: the worker, the request as the worker is
to be asked it, the attempt, the replica. The edge that queued it (`inference.edge_relay`)
finds the order in the stream it tails anyway, streams the answer from the worker, checks
it with the output guard as it grows, and reports in the job's hash, with a word on the
replica's channel (`queue.relay_channel`):

- `relay_first`: `<attempt> <ms>` at the attempt's first token (the replica takes the
  prompt's prefill off the worker's count and learns its speed);
- `relay_beat`: `<ms> <tokens>` every `BEAT_SECONDS` while it lasts; a replica that hears
  nothing of a relay for `PATIENCE_SECONDS` takes its edge for dead and ends the answer;
- `relayed`: the attempt's `Outcome` once it ended: the text, usage and finish reason, a
  fault of the worker (the replica retries elsewhere, as for an attempt of its own), a
  withdrawal by output moderation, or the client gone (the edge cancels the answer next).

The replica finishes the generation from the outcome as from its own attempt: billing, the
prefix index, the stream's last events (the whole text, once, then `done`, which the edge
waits for). Everything else still comes by the stream: a `restart` (a retry elsewhere, or
another replica adopted the answer) voids the attempt under way, `done` ends it. A request
replayed with the same Idempotency-Key follows the stream without relaying, and gets the
text the replica writes at the end.

Per token this is one read of the worker's stream, in the edge; through the scheduler it was
read there, written to Redis and read again by the edge.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# How often an edge says a relay still runs, and how long a replica waits without a word.
BEAT_SECONDS = 5.0
PATIENCE_SECONDS = 4 * BEAT_SECONDS
# A report that Redis refused is tried again after these pauses.
REPORT_RETRY_DELAYS = (0.2, 1.0, 3.0)

# The job's fields a relay reports in.
FIRST_FIELD = "relay_first"
BEAT_FIELD = "relay_beat"
OUTCOME_FIELD = "relayed"


class End(enum.StrEnum):
    """How a relayed attempt ended."""

    COMPLETE = "complete"  # the worker finished the answer
    FAULT = "fault"  # the worker failed (`fault_code`, `fault_message`)
    BLOCKED = "blocked"  # output moderation withdrew it (`retract`)
    LEFT = "left"  # the client went away; its edge cancels the answer
    LOST = "lost"  # (the replica's own finding) the edge stopped reporting


@dataclass
class Outcome:
    """What the edge reports of one relayed attempt."""

    attempt: int
    end: str
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    fault_code: str = ""
    fault_message: str = ""
    # The `retract` event's payload of a withdrawn answer.
    retract: dict[str, Any] | None = None
    # Pieces of text read (about one a token): what a lost relay is charged.
    tokens: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: str | None) -> Outcome | None:
        """The outcome `raw` holds; None for nothing, or for something unreadable."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{name: value for name, value in data.items() if name in names})
        except (ValueError, TypeError):
            logger.warning("unreadable relay outcome %r", raw[:200])
            return None


@dataclass(frozen=True)
class Order:
    """A `relay` event: where and how to read one attempt of the answer."""

    attempt: int
    replica: str
    url: str
    body: dict[str, Any]
    request_id: str

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Order:
        return cls(
            attempt=int(data["attempt"]),
            replica=str(data["replica"]),
            url=str(data["url"]),
            body=dict(data["body"]),
            request_id=str(data.get("request_id") or ""),
        )


def parse_beat(raw: str | None) -> tuple[int, int]:
    """The two numbers of a relay's field: `relay_beat`'s time (ms) and tokens read,
    `relay_first`'s attempt and time (ms); (0, 0) when there is none."""
    try:
        at, tokens = (raw or "").split()
        return int(at), int(tokens)
    except ValueError:
        return 0, 0
