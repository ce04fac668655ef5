"""Error codes of the inference plane, in API answers and in stream `error` events."""

import enum


class ErrorCode(enum.StrEnum):
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_TIER = "unknown_tier"
    BAD_WORKER_SETTING = "bad_worker_setting"
    QUEUE_TIMEOUT = "queue_timeout"
    HIGH_DEMAND = "high_demand"
    SCHEDULER_LOST = "scheduler_lost"
    GENERATION_FAILED = "generation_failed"
    TOKENIZER_MISSING = "tokenizer_missing"
