"""The staff console for moderation: the review queue of flags with its actions, sanctions
(lift), thresholds and rules (edited through the services), and the read-only audit log.
Every action goes through `moderation.services`, which audits it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from chatsite.auth import request_user
from chatsite.errors import ServiceError

from . import services
from .models import AuditEntry, CategoryThreshold, Flag, Rule, Sanction


def _not_dismissed(queryset: QuerySet[Flag]) -> QuerySet[Flag]:
    """Flags a sanction may still rest on: open ones, and ones already confirmed."""
    return queryset.exclude(status=Flag.Status.DISMISSED)


def _each_open(queryset: QuerySet[Flag], review: Callable[[Flag], Any]) -> int:
    """Apply `review` to every still-open flag of the selection; how many it was."""
    count = 0
    for flag in queryset.filter(status=Flag.Status.OPEN):
        review(flag)
        count += 1
    return count


def _suspend_action(hours: int) -> Callable[..., None]:
    def action(modeladmin: FlagAdmin, request: HttpRequest, queryset: QuerySet[Flag]) -> None:
        staff = request_user(request)
        users = set()
        for flag in _not_dismissed(queryset).select_related("user"):
            if flag.user_id in users:
                services.flag_confirm(flag=flag, reviewer=staff)
                continue
            users.add(flag.user_id)
            services.user_suspend(
                user=flag.user, by=staff, hours=hours, flag=flag, reason=f"Flag {flag.pk}"
            )
        modeladmin.message_user(request, f"Suspended {len(users)} account(s) for {hours} h.")

    action.__name__ = f"suspend_{hours}h"
    days = hours // 24
    period = f"{days} day{'s' if days != 1 else ''}" if hours % 24 == 0 else f"{hours} hours"
    return admin.action(
        description=f"Confirm and suspend the author for {period}", permissions=["review"]
    )(action)


@admin.register(Flag)
class FlagAdmin(admin.ModelAdmin[Flag]):
    """The review queue: open flags first, newest first."""

    list_display = [
        "id",
        "created_at",
        "user",
        "direction",
        "action",
        "categories_shown",
        "top_score",
        "backend",
        "status",
        "excerpt_short",
    ]
    list_filter = ["status", "direction", "action", "backend", "created_at"]
    search_fields = ["user__username", "user__email", "excerpt"]
    list_select_related = ["user"]
    date_hierarchy = "created_at"
    readonly_fields = (
        "user",
        "conversation_link",
        "message_link",
        "direction",
        "excerpt",
        "categories",
        "scores",
        "backend",
        "action",
        "status",
        "reviewer",
        "reviewed_at",
        "created_at",
    )
    fields = readonly_fields
    actions = [
        "dismiss",
        "confirm",
        "warn",
        *(_suspend_action(hours) for hours in settings.MODERATION_SUSPEND_HOURS_CHOICES),
        "ban",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Flag]:
        return super().get_queryset(request).order_by("-status", "-created_at", "-id")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The page is read-only; actions (their own permission below) change flags.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_review_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("moderation.change_flag"))

    @admin.display(description="Categories")
    def categories_shown(self, flag: Flag) -> str:
        return ", ".join(flag.categories)

    @admin.display(description="Top score")
    def top_score(self, flag: Flag) -> str:
        return f"{max(flag.scores.values(), default=0.0):.2f}"

    @admin.display(description="Text")
    def excerpt_short(self, flag: Flag) -> str:
        return flag.excerpt[:80]

    @admin.display(description="Conversation")
    def conversation_link(self, flag: Flag) -> SafeString | str:
        if flag.conversation_id is None:
            return "-"
        url = reverse("admin:conversations_conversation_change", args=[flag.conversation_id])
        return format_html('<a href="{}">{}</a>', url, flag.conversation_id)

    @admin.display(description="Message (the full text, for staff)")
    def message_link(self, flag: Flag) -> SafeString | str:
        if flag.message_id is None:
            return "-"
        url = reverse("admin:conversations_message_change", args=[flag.message_id])
        return format_html('<a href="{}">{}</a>', url, flag.message_id)

    @admin.action(description="Dismiss (no violation)", permissions=["review"])
    def dismiss(self, request: HttpRequest, queryset: QuerySet[Flag]) -> None:
        staff = request_user(request)
        count = _each_open(queryset, lambda flag: services.flag_dismiss(flag=flag, reviewer=staff))
        self.message_user(request, f"Dismissed {count} flag(s).")

    @admin.action(description="Confirm (a strike)", permissions=["review"])
    def confirm(self, request: HttpRequest, queryset: QuerySet[Flag]) -> None:
        staff = request_user(request)
        count = _each_open(queryset, lambda flag: services.flag_confirm(flag=flag, reviewer=staff))
        self.message_user(request, f"Confirmed {count} flag(s).")

    @admin.action(description="Confirm and warn the author", permissions=["review"])
    def warn(self, request: HttpRequest, queryset: QuerySet[Flag]) -> None:
        staff = request_user(request)
        count = _each_open(
            queryset, lambda flag: services.user_warn(flag=flag, by=staff, reason=f"Flag {flag.pk}")
        )
        self.message_user(request, f"Warned the authors of {count} flag(s).")

    @admin.action(description="Confirm and ban the author", permissions=["review"])
    def ban(self, request: HttpRequest, queryset: QuerySet[Flag]) -> None:
        staff = request_user(request)
        banned = set()
        for flag in _not_dismissed(queryset).select_related("user"):
            if flag.user_id in banned:
                continue
            banned.add(flag.user_id)
            services.user_ban(user=flag.user, by=staff, flag=flag, reason=f"Flag {flag.pk}")
        self.message_user(request, f"Banned {len(banned)} account(s).")


@admin.register(Sanction)
class SanctionAdmin(admin.ModelAdmin[Sanction]):
    list_display = ["user", "kind", "created_at", "ends_at", "lifted_at", "created_by", "reason"]
    list_filter = ["kind", ("lifted_at", admin.EmptyFieldListFilter)]
    search_fields = ["user__username", "user__email", "reason"]
    list_select_related = ["user", "created_by"]
    readonly_fields = [
        "user",
        "kind",
        "reason",
        "flag",
        "created_by",
        "created_at",
        "ends_at",
        "lifted_at",
        "lifted_by",
    ]
    actions = ["lift"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_lift_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("moderation.change_sanction"))

    @admin.action(description="Lift (the user may send again)", permissions=["lift"])
    def lift(self, request: HttpRequest, queryset: QuerySet[Sanction]) -> None:
        staff = request_user(request)
        lifted = 0
        for sanction in queryset:
            try:
                services.sanction_lift(sanction=sanction, by=staff)
            except ServiceError as exc:
                self.message_user(request, f"{sanction}: {exc.message}", messages.WARNING)
            else:
                lifted += 1
        self.message_user(request, f"Lifted {lifted} sanction(s).")


@admin.register(CategoryThreshold)
class CategoryThresholdAdmin(admin.ModelAdmin[CategoryThreshold]):
    list_display = ["category", "block_at", "review_at", "updated_at", "updated_by"]
    fields = ["category", "block_at", "review_at"]

    def save_model(
        self, request: HttpRequest, obj: CategoryThreshold, form: Any, change: bool
    ) -> None:
        saved = services.threshold_set(
            category=obj.category,
            block_at=obj.block_at,
            review_at=obj.review_at,
            by=request_user(request),
        )
        obj.pk = saved.pk

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Clearing both scores disables a category; deleting would silently restore defaults.
        return False


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin[Rule]):
    list_display = ["pattern", "category", "kind", "score", "is_active", "updated_at"]
    list_filter = ["category", "kind", "is_active"]
    search_fields = ["pattern", "note"]
    fields = ["category", "kind", "pattern", "score", "is_active", "note"]

    def save_model(self, request: HttpRequest, obj: Rule, form: Any, change: bool) -> None:
        services.rule_save(rule=obj, by=request_user(request))

    def delete_model(self, request: HttpRequest, obj: Rule) -> None:
        services.rule_delete(rule=obj, by=request_user(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Rule]) -> None:
        for rule in queryset:
            services.rule_delete(rule=rule, by=request_user(request))


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin[AuditEntry]):
    """Who did what, when, on what: never added, changed or deleted here."""

    list_display = ["created_at", "actor_shown", "action", "target_user", "flag", "sanction"]
    list_filter = ["action", ("actor", admin.EmptyFieldListFilter), "created_at"]
    search_fields = ["actor__username", "target_user__username"]
    list_select_related = ["actor", "target_user"]
    readonly_fields = ["created_at", "actor", "action", "target_user", "flag", "sanction", "detail"]

    @admin.display(description="Actor")
    def actor_shown(self, entry: AuditEntry) -> str:
        return str(entry.actor) if entry.actor_id else "system"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
