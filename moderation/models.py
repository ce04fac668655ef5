"""Moderation's records: thresholds and rules staff edit, flags to review, sanctions on
accounts, and the audit log of every staff (and automatic) action."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from .categories import Category


class CategoryThreshold(models.Model):
    """The scores at which a category blocks and at which it is queued for review.

    A category without a row uses `settings.MODERATION_THRESHOLDS`; an empty score never acts.
    """

    category = models.CharField(max_length=16, choices=Category.choices, unique=True)
    block_at = models.FloatField(
        null=True, blank=True, help_text="Block at this score or above (0..1); empty: never."
    )
    review_at = models.FloatField(
        null=True,
        blank=True,
        help_text="Queue for review at this score or above (0..1); empty: never.",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["category"]

    def __str__(self) -> str:
        return f"{self.get_category_display()}: block {self.block_at}, review {self.review_at}"

    def clean(self) -> None:
        for name in ("block_at", "review_at"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValidationError({name: "A score lies between 0 and 1."})


class Rule(models.Model):
    """A term or regular expression that scores a category when it occurs in a text."""

    class Kind(models.TextChoices):
        TERM = "term", "Term (whole words, any case)"
        REGEX = "regex", "Regular expression (any case)"

    category = models.CharField(max_length=16, choices=Category.choices)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TERM)
    pattern = models.CharField(max_length=500)
    score = models.FloatField(default=1.0, help_text="The category's score on a match (0..1).")
    is_active = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["category", "pattern"]
        constraints = [
            models.UniqueConstraint(
                fields=["category", "kind", "pattern"], name="moderation_rule_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.category} {self.kind}: {self.pattern}"

    def clean(self) -> None:
        if self.kind == self.Kind.REGEX:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValidationError({"pattern": f"Not a regular expression: {exc}"}) from exc
        if not 0.0 <= self.score <= 1.0:
            raise ValidationError({"score": "A score lies between 0 and 1."})


class Flag(models.Model):
    """A text a classifier scored past a review or block threshold, with its context."""

    class Direction(models.TextChoices):
        INPUT = "input", "User input"
        OUTPUT = "output", "Model output"

    class Action(models.TextChoices):
        BLOCKED = "blocked", "Input refused"
        RETRACTED = "retracted", "Answer retracted"
        REVIEW = "review", "Allowed, queued for review"

    class Status(models.TextChoices):
        OPEN = "open"
        DISMISSED = "dismissed"
        CONFIRMED = "confirmed"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="moderation_flags"
    )
    conversation = models.ForeignKey(
        "conversations.Conversation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    message = models.ForeignKey(
        "conversations.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    direction = models.CharField(max_length=8, choices=Direction.choices)
    excerpt = models.TextField(help_text="The text that was checked (the window, for output).")
    categories = models.JSONField(default=list, help_text="Categories past their threshold.")
    scores = models.JSONField(default=dict, help_text="Every category's score.")
    backend = models.CharField(max_length=200, help_text="The classifier(s) that scored it.")
    action = models.CharField(max_length=16, choices=Action.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="flag_queue_idx"),
            models.Index(fields=["user", "status", "reviewed_at"], name="flag_strikes_idx"),
        ]

    def __str__(self) -> str:
        return f"Flag {self.pk} ({self.direction}, {', '.join(self.categories) or 'none'})"


class Sanction(models.Model):
    """A warning, a suspension until a time, or a ban, on an account.

    Suspensions and bans refuse every send while active; staff lift them (`lifted_at`).
    """

    class Kind(models.TextChoices):
        WARNING = "warning"
        SUSPENSION = "suspension"
        BAN = "ban"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="moderation_sanctions"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    reason = models.CharField(max_length=500, blank=True)
    flag = models.ForeignKey(
        Flag, null=True, blank=True, on_delete=models.SET_NULL, related_name="sanctions"
    )
    # Null: imposed by the system (the strikes policy).
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    ends_at = models.DateTimeField(null=True, blank=True, help_text="Empty for a ban.")
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A warning is shown on the user's chat page until they acknowledge it.
    seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "kind", "lifted_at"], name="sanction_active_idx")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.user}"


class AuditEntry(models.Model):
    """One staff or system action in moderation: who, what, when, on what. Never edited."""

    class Action(models.TextChoices):
        FLAG_DISMISSED = "flag_dismissed"
        FLAG_CONFIRMED = "flag_confirmed"
        USER_WARNED = "user_warned"
        USER_SUSPENDED = "user_suspended"
        USER_BANNED = "user_banned"
        SANCTION_LIFTED = "sanction_lifted"
        THRESHOLD_CHANGED = "threshold_changed"
        RULE_CHANGED = "rule_changed"
        RULE_DELETED = "rule_deleted"

    # Null: the system (the strikes policy).
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=32, choices=Action.choices)
    target_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    flag = models.ForeignKey(
        Flag, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sanction = models.ForeignKey(
        Sanction, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        who = self.actor or "system"
        return f"{who}: {self.get_action_display()}"
