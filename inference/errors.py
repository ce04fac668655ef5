"""Error codes of the inference plane, in API answers and in stream `error` events."""

import enum


class ErrorCode(enum.StrEnum):
    UNKNOWN_MODEL = "unknown_model"
    MODEL_NOT_IN_PLAN = "model_not_in_plan"
    UNKNOWN_TIER = "unknown_tier"
    BAD_WORKER_SETTING = "bad_worker_setting"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_WORKER = "no_worker"
    SCHEDULER_LOST = "scheduler_lost"
    GENERATION_FAILED = "generation_failed"
