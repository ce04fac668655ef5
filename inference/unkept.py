"""Generations without a row: the answers of `/v1` keys that keep nothing.

Such an answer is never written to Postgres to be deleted again. Its whole life is in Redis:
the job (`job:<id>`, which carries `kept=""`), the queue and the lease, and the stream whose
events (`meta`, `delta`, `done`) the edge relays. What must last of it is written by the
subscribers of `inference.hooks` from an `UnkeptGeneration`, which offers what they read of
a `Generation` row: billing settles the reservation in Redis at once and owes the usage
event to its outbox, which a writer empties in batches (`billing.ledger`); moderation
records a flag against the user alone.

The scheduler knows an unkept generation by its job (`queue.Job.kept`); where only an id is
at hand (housekeeping, adoption, the edge's cancel) `generation_finish` and
`generation_cancel_unkept` read the job.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from . import queue
from .models import Generation, ModelPool


@dataclass
class UnkeptGeneration:
    """What the hooks read of a generation, for one that has no row."""

    id: uuid.UUID
    user_id: int
    pool: ModelPool
    tier: str
    priority: int
    max_tokens: int
    status: str = Generation.Status.QUEUED
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    finished_at: datetime | None = None
    # Never routed elsewhere (a `/v1` client names its model) and never in a conversation.
    served_pool_id: None = None
    served_pool: None = None
    conversation_id: None = None
    message_id: None = None

    @property
    def pool_id(self) -> int:
        return int(self.pool.pk)

    @property
    def is_final(self) -> bool:
        return self.status in Generation.FINAL_STATUSES

    @property
    def answering_pool(self) -> ModelPool:
        return self.pool

    @classmethod
    def from_job(cls, job: queue.Job, pool: ModelPool) -> UnkeptGeneration:
        return cls(
            id=uuid.UUID(job.generation_id),
            user_id=job.user_id,
            pool=pool,
            tier=job.tier,
            priority=job.priority,
            max_tokens=job.max_tokens,
        )
