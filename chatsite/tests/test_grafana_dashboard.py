"""The Grafana dashboard (`deploy/grafana/chatsite-dashboard.json`) asks only for what the
service exports: every metric an expression or a variable names is one of ours, and every
series it reads exists with the labels it groups by."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from prometheus_client import REGISTRY

from chatsite.metrics import CeleryQueueCollector
from inference.metrics import FleetCollector
from moderation.metrics import MODERATION_TRIPS

DASHBOARD = Path(settings.BASE_DIR) / "deploy" / "grafana" / "chatsite-dashboard.json"

# PromQL's words that are not metrics: functions, aggregations and their modifiers.
PROMQL_WORDS = {
    "histogram_quantile",
    "rate",
    "irate",
    "increase",
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "by",
    "without",
    "label_values",
    "topk",
    "clamp_min",
}
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}


def exported() -> dict[str, set[str]]:
    """Every series name the service exports, with its labels (a pid for the per-process
    gauge, `le` for histograms' buckets)."""
    assert MODERATION_TRIPS  # its module registered with the rest
    families = [*REGISTRY.collect()]
    families += [*CeleryQueueCollector().describe(), *FleetCollector(dict).describe()]
    names: dict[str, set[str]] = {}
    for family in families:
        if not family.name.startswith("chatsite_"):
            continue
        labels = _label_names(family)
        for suffix in SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    names["chatsite_edge_active_streams"].add("pid")  # multiprocess mode adds it
    return names


def _label_names(family: Any) -> set[str]:
    if family.samples:
        return {name for sample in family.samples for name in sample.labels}
    collector = REGISTRY._names_to_collectors.get(family.name)
    if collector is not None:
        return set(getattr(collector, "_labelnames", ()))
    # A collector's family (described with its label names in `describe`).
    return set(getattr(family, "_labelnames", ()))


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL expression of the dashboard: targets' `expr`, variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in {"expr", "definition"} and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield value["query"]
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """The identifiers of `expr` that are not PromQL's words, and the labels it groups by."""
    grouped = {
        label.strip()
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in group.split(",")
    }
    bare = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # ranges
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"label_values\(([^,]+),[^)]*\)", r"\1", bare)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return words - PROMQL_WORDS, grouped


def test_the_dashboard_names_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exported()
    found = list(expressions(dashboard))

    assert len(found) > 10
    for expr in found:
        names, grouped = names_in(expr)
        assert names, expr
        assert names <= set(series), f"{expr}: {names - set(series)} is not exported"
        for name in names:
            # `instance` is Prometheus's own label of each scraped target.
            assert grouped - {"instance"} <= series[name], f"{expr}: {name} lacks {grouped}"


def test_the_dashboard_covers_every_slo_and_counter() -> None:
    used = set().union(*(names_in(e)[0] for e in expressions(json.loads(DASHBOARD.read_text()))))

    for name in (
        "chatsite_ttft_seconds_bucket",
        "chatsite_queue_seconds_bucket",
        "chatsite_stream_tokens_per_second_bucket",
        "chatsite_admissions_total",
        "chatsite_rejections_total",
        "chatsite_degradations_total",
        "chatsite_generations_total",
        "chatsite_moderation_trips_total",
        "chatsite_prefix_cache_hit_ratio",
        "chatsite_edge_active_streams",
        "chatsite_edge_events_delivered_total",
        "chatsite_celery_queue_length",
    ):
        assert name in used, name


def test_a_name_the_service_does_not_export_is_caught() -> None:
    names, _ = names_in('sum by (pool) (rate(vllm:num_requests_running{pool="a"}[5m]))')

    assert names == {"vllm:num_requests_running"}
    assert not names <= set(exported())
