"""Shapes of billing on the JSON API: money in integer micro-units, times in UTC."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from billing.models import Plan, Statement, StatementLine


class PlanSerializer(serializers.ModelSerializer[Plan]):
    class Meta:
        model = Plan
        fields = [
            "slug",
            "name",
            "tier",
            "monthly_price_micros",
            "requests_per_minute",
            "tokens_per_minute",
            "max_concurrent",
            "max_output_tokens",
            "message_cap",
            "message_cap_window_seconds",
        ]
        read_only_fields = fields


class PoolUsageSerializer(serializers.Serializer[Any]):
    pool = serializers.CharField(source="pool_name")
    generations = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost_micros = serializers.IntegerField()


class CapSerializer(serializers.Serializer[Any]):
    pool = serializers.CharField(source="pool_name")
    limit = serializers.IntegerField(allow_null=True, help_text="Null: no cap.")
    window_seconds = serializers.IntegerField()
    used = serializers.IntegerField()
    remaining = serializers.IntegerField(allow_null=True)
    resets_at = serializers.DateTimeField(
        allow_null=True, help_text="When the cap has room again; null if it has room now."
    )


class BucketSerializer(serializers.Serializer[Any]):
    limit = serializers.IntegerField()
    remaining = serializers.IntegerField()
    reset_ms = serializers.IntegerField(help_text="Milliseconds until the bucket is full.")


class UsageSerializer(serializers.Serializer[Any]):
    plan = PlanSerializer()
    currency = serializers.CharField()
    period_start = serializers.DateField()
    period_end = serializers.DateField()
    prompt_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    usage_cost_micros = serializers.IntegerField()
    pools = PoolUsageSerializer(many=True)
    caps = CapSerializer(many=True)
    requests = BucketSerializer()
    tokens = BucketSerializer()
    concurrent_in_use = serializers.IntegerField()


class StatementLineSerializer(serializers.ModelSerializer[StatementLine]):
    pool = serializers.CharField(source="pool.name")

    class Meta:
        model = StatementLine
        fields = ["pool", "generations", "prompt_tokens", "output_tokens", "cost_micros"]
        read_only_fields = fields


class StatementSerializer(serializers.ModelSerializer[Statement]):
    lines = StatementLineSerializer(many=True)
    invoice = serializers.SerializerMethodField()

    class Meta:
        model = Statement
        fields = [
            "id",
            "period_start",
            "period_end",
            "plan_name",
            "plan_fee_micros",
            "usage_cost_micros",
            "total_micros",
            "generations",
            "prompt_tokens",
            "output_tokens",
            "lines",
            "invoice",
        ]
        read_only_fields = fields

    def get_invoice(self, statement: Statement) -> dict[str, Any] | None:
        invoice = getattr(statement, "invoice", None)
        if invoice is None:
            return None
        return {
            "amount_minor": invoice.amount_minor,
            "currency": invoice.currency,
            "status": invoice.status,
            "issued_at": invoice.issued_at.isoformat(),
            "paid_at": invoice.paid_at.isoformat() if invoice.paid_at else None,
        }
