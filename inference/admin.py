"""Staff console for the inference plane: pools, workers with their live load, generations,
and the capacity page (the per-tier SLO figures the metrics export, live)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from . import selectors, services
from .models import Generation, ModelPool, Worker


class WorkerInline(admin.TabularInline[Worker, ModelPool]):
    model = Worker
    extra = 0
    fields = ["name", "url", "state", "max_concurrency", "last_seen_at"]
    readonly_fields = ["last_seen_at"]


@admin.register(ModelPool)
class ModelPoolAdmin(admin.ModelAdmin[ModelPool]):
    list_display = ["name", "served_model", "tiers", "context_window", "fallback", "is_active"]
    list_filter = ["is_active"]
    search_fields = ["name", "served_model"]
    inlines = [WorkerInline]


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin[Worker]):
    list_display = [
        "name",
        "pool",
        "url",
        "state",
        "live_load",
        "max_concurrency",
        "last_seen_at",
        "origin",
    ]
    list_filter = ["state", "pool", "origin"]
    search_fields = ["name", "url"]
    readonly_fields = ["origin", "last_seen_at", "last_error", "state_changed_at", "live_load"]
    list_select_related = ["pool"]
    actions = ["drain", "undrain"]

    @admin.display(description="Live load")
    def live_load(self, worker: Worker) -> str:
        load = selectors.worker_live_load(worker_id=worker.pk)
        if "running" not in load:
            return f"in flight {load['in_flight']:.0f} · no reading"
        return (
            f"in flight {load['in_flight']:.0f} · running {load['running']:.0f} · "
            f"waiting {load['waiting']:.0f} · KV {load['kv_cache_percent']:.0f}%"
        )

    # Draining and undraining change a worker's state: the change permission, as editing it.
    @admin.action(description="Drain: take no new generations", permissions=["change"])
    def drain(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        count = services.workers_drain(workers=queryset)
        self.message_user(request, f"Draining {count} worker(s).")

    @admin.action(description="Undrain: back into service", permissions=["change"])
    def undrain(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        count = services.workers_undrain(workers=queryset)
        self.message_user(request, f"{count} worker(s) back in service.")

    # The capacity page: staff who may view workers (inference.view_worker) see it.

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "capacity/",
                self.admin_site.admin_view(self.capacity_view),
                name="inference_capacity",
            ),
            path(
                "capacity/data/",
                self.admin_site.admin_view(self.capacity_data),
                name="inference_capacity_data",
            ),
            *super().get_urls(),
        ]

    def capacity_view(self, request: HttpRequest) -> HttpResponse:
        minutes = self._capacity_minutes(request)
        context = {
            **self.admin_site.each_context(request),
            "title": "Capacity",
            "opts": self.model._meta,
            "minutes": minutes,
            "choices": CAPACITY_MINUTES,
            "refresh_seconds": CAPACITY_REFRESH_SECONDS,
            **capacity_tables(selectors.capacity_report(minutes=minutes)),
        }
        return TemplateResponse(request, "inference/admin_capacity.html", context)

    def capacity_data(self, request: HttpRequest) -> JsonResponse:
        """The page's tables again, for its script to refresh them."""
        minutes = self._capacity_minutes(request)
        return JsonResponse(capacity_tables(selectors.capacity_report(minutes=minutes)))

    def _capacity_minutes(self, request: HttpRequest) -> int:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            minutes = int(request.GET.get("minutes", ""))
        except ValueError:
            minutes = CAPACITY_MINUTES[0]
        return minutes if minutes in CAPACITY_MINUTES else CAPACITY_MINUTES[0]


# The capacity page's periods (the first is the default) and how often it refreshes itself.
CAPACITY_MINUTES = (5, 15, 60)
CAPACITY_REFRESH_SECONDS = 5


def capacity_tables(report: selectors.Capacity) -> dict[str, Any]:
    """The capacity page's two tables as rows of display cells (the page and its refresh
    show the same text)."""
    return {
        "tiers": [
            [
                row.pool,
                row.tier,
                str(row.queued),
                str(row.running),
                str(row.answered),
                _ms(row.ttft_p50_ms),
                _ms(row.ttft_p95_ms),
                _ms(row.queue_p50_ms),
                _ms(row.queue_p95_ms),
                _number(row.tokens_per_second),
                str(row.rejected),
            ]
            for row in report.tiers
        ],
        "workers": [
            [
                worker.name,
                worker.pool,
                worker.state,
                f"{worker.in_flight} / {worker.max_concurrency}",
                _number(worker.running, digits=0),
                _number(worker.waiting, digits=0),
                _number(worker.kv_cache_percent, digits=0, suffix=" %"),
                _number(
                    None if worker.prefix_hit_ratio is None else worker.prefix_hit_ratio * 100,
                    digits=0,
                    suffix=" %",
                ),
            ]
            for worker in report.workers
        ],
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _number(value: float | None, *, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin[Generation]):
    list_display = [
        "id",
        "user",
        "pool",
        "served_pool",
        "route_reason",
        "worker",
        "tier",
        "status",
        "enqueued_at",
        "first_token_at",
        "finished_at",
        "prompt_tokens",
        "output_tokens",
        "finish_reason",
    ]
    list_filter = ["status", "pool", "route_reason", "served_pool", "tier", "finish_reason"]
    # Each filter counts its rows: how many answers the overload policy sent to a fallback.
    show_facets = admin.ShowFacets.ALWAYS
    search_fields = ["id", "user__username", "user__email", "conversation__id"]
    list_select_related = ["user", "pool", "served_pool", "worker"]
    date_hierarchy = "enqueued_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Generation | None = None) -> list[str]:
        return [field.name for field in Generation._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
