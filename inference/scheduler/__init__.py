"""The scheduler: admits queued generations to workers and streams their answers to Redis.

- `service`:      the `Scheduler` replica, its lifecycle and loops (health, dispatch, listen)
- `placement`:    pure placement policies over candidates and their load, chosen by setting
- `capacity`:     the workers' room, leases, and placement's facts read from Redis
- `run`:          one generation's run: attempt, tool rounds, retry elsewhere, finish
- `writer`:       typed stream events, coalescing, the retract step
- `tools`:        the tool loop over a `ToolRunner` (the plugin layer by default)
- `guard`:        the output guard protocol (output moderation by default)
- `housekeeping`: heartbeat, lease renewal, cancels, queue limits and positions, sweep
- `dotted`:       building what a dotted-path setting names
"""

from .service import Scheduler as Scheduler

__all__ = ["Scheduler"]
