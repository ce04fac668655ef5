"""The staff console for conversations: read-mostly.

Staff look at conversations; they do not rewrite history. Every field is read-only, nothing
is added here, and the only write is deleting a whole conversation, through the service, so
that the tombstone stays and no tree is left half-cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any, TypeVar

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .models import BranchSummary, Conversation, Feedback, ImportJob, Message, Share
from .removal import conversation_remove
from .selectors import feedback_report

_M = TypeVar("_M", bound=Model)


class ReadOnlyAdmin(admin.ModelAdmin[_M]):
    """Shows every field read-only and allows neither adding nor changing."""

    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin[Conversation]):
    list_display = ["__str__", "owner", "model", "source", "last_activity_at", "deleted_at"]
    list_filter = ["source", "model", ("deleted_at", admin.EmptyFieldListFilter)]
    search_fields = ["owner__username", "owner__email", "title"]
    list_select_related = ["owner"]
    date_hierarchy = "last_activity_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*super().get_readonly_fields(request, obj), "messages_link"]

    @admin.display(description="Messages")
    def messages_link(self, conversation: Conversation) -> SafeString:
        url = reverse("admin:conversations_message_changelist")
        return format_html(
            '<a href="{}?conversation__id__exact={}">{} messages</a>',
            url,
            conversation.pk,
            conversation.messages.count(),
        )

    def get_deleted_objects(
        self, objs: Sequence[Conversation] | QuerySet[Conversation], request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Messages cannot be deleted one by one, but they go with their conversation.
        perms_needed.discard(str(Message._meta.verbose_name))
        return deleted, counts, perms_needed, protected

    def delete_model(self, request: HttpRequest, obj: Conversation) -> None:
        conversation_remove(conversation=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        for conversation in queryset:
            conversation_remove(conversation=conversation)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin[Message]):
    list_display = ["__str__", "role", "status", "model", "conversation_link", "created_at"]
    list_filter = ["role", "status", "conversation__source"]
    search_fields = [
        "content",
        "conversation__title",
        "conversation__owner__username",
        "conversation__owner__email",
    ]
    list_select_related = ["conversation", "conversation__owner"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A message cut out of its tree would orphan its branch; conversations go whole.
        return False

    @admin.display(description="Conversation")
    def conversation_link(self, message: Message) -> SafeString:
        url = reverse("admin:conversations_conversation_change", args=[message.conversation_id])
        return format_html('<a href="{}">{}</a>', url, message.conversation)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        # The conversation page links here filtered by conversation.
        return lookup == "conversation__id__exact" or super().lookup_allowed(lookup, value, request)


@admin.register(BranchSummary)
class BranchSummaryAdmin(ReadOnlyAdmin[BranchSummary]):
    """Rolling summaries, read-only: written by the Celery task, gone with their branch."""

    list_display = ["__str__", "conversation_link", "covered_messages", "tokens", "created_at"]
    list_filter = ["model"]
    search_fields = ["conversation__title", "conversation__owner__username"]
    list_select_related = ["conversation", "conversation__owner"]

    @admin.display(description="Conversation")
    def conversation_link(self, summary: BranchSummary) -> SafeString:
        url = reverse("admin:conversations_conversation_change", args=[summary.conversation_id])
        return format_html('<a href="{}">{}</a>', url, summary.conversation)


@admin.register(Share)
class ShareAdmin(ReadOnlyAdmin[Share]):
    """Share links, read-only. The link itself is not shown: only its owner has it."""

    list_display = ["__str__", "conversation_link", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["title", "conversation__owner__username"]
    list_select_related = ["conversation", "conversation__owner"]
    date_hierarchy = "created_at"

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked by the owner, or gone with the conversation

    @admin.display(description="Conversation")
    def conversation_link(self, share: Share) -> SafeString:
        url = reverse("admin:conversations_conversation_change", args=[share.conversation_id])
        return format_html('<a href="{}">{}</a>', url, share.conversation)


class FeedbackPeriodForm(forms.Form):
    """The report's period, whole UTC days from `since` to `until` inclusive."""

    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            raise forms.ValidationError("The period ends before it starts.")
        return cleaned


FEEDBACK_REPORT_DEFAULT_DAYS = 30


@admin.register(Feedback)
class FeedbackAdmin(ReadOnlyAdmin[Feedback]):
    """Thumbs on answers, read-only, and the report per model and pool (`report/`): thumbs up
    and down and the regenerate rate over a chosen period. Both need the view permission on
    feedback (`conversations.view_feedback`); a staff member without it gets 403."""

    list_display = ["__str__", "rating", "reason", "answer_model", "updated_at"]
    list_filter = ["rating", "reason", "message__model"]
    search_fields = ["comment", "user__username"]
    list_select_related = ["message"]
    date_hierarchy = "updated_at"
    change_list_template = "admin/conversations/feedback/change_list.html"

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the user's own to take back

    @admin.display(description="Model", ordering="message__model")
    def answer_model(self, feedback: Feedback) -> str:
        return feedback.message.model

    def get_urls(self) -> list[URLPattern]:
        report = path(
            "report/",
            self.admin_site.admin_view(self.report_view),
            name="conversations_feedback_report",
        )
        return [report, *super().get_urls()]

    def report_view(self, request: HttpRequest) -> HttpResponse:
        """Per model and answering pool: answers, regenerated share, thumbs up and down."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = FeedbackPeriodForm(request.GET or None)
        today = timezone.now().date()
        since = today - timedelta(days=FEEDBACK_REPORT_DEFAULT_DAYS - 1)
        until = today
        if form.is_valid():
            since = form.cleaned_data["since"] or since
            until = form.cleaned_data["until"] or until
        start = datetime.combine(since, time.min, tzinfo=UTC)
        end = datetime.combine(until + timedelta(days=1), time.min, tzinfo=UTC)
        context = {
            **self.admin_site.each_context(request),
            "title": "Feedback and regenerate rate per model and pool",
            "opts": self.model._meta,
            "form": form,
            "since": since,
            "until": until,
            "rows": feedback_report(since=start, until=end),
        }
        return TemplateResponse(request, "admin/conversations/feedback/report.html", context)


@admin.register(ImportJob)
class ImportJobAdmin(ReadOnlyAdmin[ImportJob]):
    """Users' imports (#18), read-only: what they uploaded, how far it came, why it failed."""

    list_display = ["__str__", "owner", "format", "status", "total", "imported", "created_at"]
    list_filter = ["status", "format"]
    search_fields = ["owner__username", "owner__email", "filename"]
    list_select_related = ["owner"]
