"""Model pools, their workers, and generations (one per assistant answer being produced)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from chatsite.netpolicy import AddressPolicy

from .client import WORKER_NETWORKS_SETTING, kv_events_endpoint_refusal
from .sampling import SAMPLING_FIELDS, sampling_defaults_refusal


def worker_url_refusal(url: str) -> str | None:
    """Why the address policy refuses a worker at `url` (a sentence), or None if it does not."""
    return AddressPolicy.from_setting(WORKER_NETWORKS_SETTING).url_refusal(url)


def validate_sampling_defaults(value: object) -> None:
    if refusal := sampling_defaults_refusal(value):
        raise ValidationError(refusal)


def default_tiers() -> list[str]:
    return ["free", "plus", "pro"]


class ModelPool(models.Model):
    """A public model name, the model its workers serve, and who may use it."""

    name = models.SlugField(max_length=100, unique=True, help_text="Public model name.")
    served_model = models.CharField(
        max_length=200, help_text="The model name the workers answer to (vLLM's served name)."
    )
    tokenizer_path = models.CharField(
        max_length=500,
        blank=True,
        help_text="Folder holding tokenizer.json; empty means the prepared model's folder.",
    )
    context_window = models.PositiveIntegerField(default=8192)
    max_output_tokens = models.PositiveIntegerField(default=512)
    sampling_defaults = models.JSONField(
        default=dict,
        blank=True,
        validators=[validate_sampling_defaults],
        help_text=(
            "Sent to the workers with every request that does not set its own, e.g. "
            '{"temperature": 0.7, "min_tokens": 1}. Fields: ' + ", ".join(SAMPLING_FIELDS) + "."
        ),
    )
    tiers = models.JSONField(
        default=default_tiers, help_text="Plan tiers that may use this pool, e.g. free, plus."
    )
    fallback = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="fallback_for",
        help_text="A smaller pool to send the free tier to under pressure.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Worker(models.Model):
    """One vLLM server of a pool, reached over its OpenAI-compatible HTTP API.

    `url` must lead to a public address, or to one of `INFERENCE_WORKER_ALLOWED_NETWORKS`
    (workers usually sit on a private network, which that setting then names): checked when
    staff save it (`clean`), when `INFERENCE_WORKERS` registers it, and on every connection
    (`inference.client`).
    """

    class State(models.TextChoices):
        HEALTHY = "healthy"
        DRAINING = "draining"
        DOWN = "down"

    class Origin(models.TextChoices):
        SETTINGS = "settings"
        ADMIN = "admin"

    pool = models.ForeignKey(ModelPool, on_delete=models.CASCADE, related_name="workers")
    name = models.SlugField(max_length=100, unique=True)
    url = models.URLField(max_length=300, unique=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.DOWN)
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.ADMIN)
    # vLLM's own default batch limit (max_num_seqs); the schedulers' KV budget
    # (SCHEDULER_KV_OVERCOMMIT) usually binds first.
    max_concurrency = models.PositiveIntegerField(
        default=256, help_text="Most generations the schedulers send to the worker at once."
    )
    # Where the worker publishes vLLM's KV cache events (`--kv-events-config`), if it does:
    # the schedulers then know what its cache holds instead of estimating it.
    kv_events_endpoint = models.CharField(
        max_length=200,
        blank=True,
        help_text="ZeroMQ address of its KV cache events, e.g. tcp://10.0.0.5:5557.",
    )
    kv_events_replay_endpoint = models.CharField(
        max_length=200,
        blank=True,
        help_text="ZeroMQ address of the events' replay socket, e.g. tcp://10.0.0.5:5558.",
    )
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pool__name", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.url})"

    def clean(self) -> None:
        super().clean()
        refusals = {"url": worker_url_refusal(self.url)}
        for field in ("kv_events_endpoint", "kv_events_replay_endpoint"):
            if endpoint := getattr(self, field):
                refusals[field] = kv_events_endpoint_refusal(endpoint)
        errors = {field: refusal for field, refusal in refusals.items() if refusal is not None}
        if errors:
            raise ValidationError(errors)


class Generation(models.Model):
    """The production of one assistant message, from queue to final status.

    Rows stay after the answer is done: their timestamps are the service's latency history.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETE = "complete"
        CANCELLED = "cancelled"
        FAILED = "failed"
        REJECTED = "rejected"

    FINAL_STATUSES = frozenset({Status.COMPLETE, Status.CANCELLED, Status.FAILED, Status.REJECTED})

    class RouteReason(models.TextChoices):
        REQUESTED = "", "as requested"
        HIGH_DEMAND = "high_demand", "fallback: high demand"
        # The `auto` model's choice (conversations/auto_model.py), by its reason.
        AUTO_CODE = "auto_code", "auto: code"
        AUTO_LONG_PROMPT = "auto_long_prompt", "auto: long prompt"
        AUTO_PLAN = "auto_plan", "auto: plan"
        AUTO_SIMPLE = "auto_simple", "auto: simple task"
        AUTO_PLAN_LIMIT = "auto_plan_limit", "auto: the plan's model"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    message = models.OneToOneField(
        "conversations.Message", on_delete=models.CASCADE, related_name="generation"
    )
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="generations"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="generations"
    )
    pool = models.ForeignKey(ModelPool, on_delete=models.PROTECT, related_name="generations")
    worker = models.ForeignKey(
        Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="generations"
    )
    # The pool that answered when it is not the one asked for, and why (the overload policy).
    served_pool = models.ForeignKey(
        ModelPool,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="served_generations",
        help_text="The pool that answered, when the overload policy sent the answer elsewhere.",
    )
    route_reason = models.CharField(
        max_length=32, choices=RouteReason.choices, blank=True, default=RouteReason.REQUESTED
    )
    tier = models.CharField(max_length=32)
    priority = models.IntegerField(help_text="vLLM priority: lower runs first.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    max_tokens = models.PositiveIntegerField()
    attempts = models.PositiveSmallIntegerField(default=0)
    enqueued_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    first_token_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)

    class Meta:
        ordering = ["-enqueued_at"]
        indexes = [
            models.Index(fields=["status", "enqueued_at"], name="gen_status_idx"),
            models.Index(fields=["pool", "-enqueued_at"], name="gen_pool_idx"),
        ]

    def __str__(self) -> str:
        return f"Generation {self.id} ({self.status})"

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL_STATUSES

    @property
    def answering_pool(self) -> ModelPool:
        """The pool whose workers answer (or answered) it."""
        return self.served_pool or self.pool
