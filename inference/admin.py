"""Staff console for the inference plane: pools, workers with their live load, generations."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

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
