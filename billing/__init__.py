"""Billing: plans, quotas, token buckets, usage ledger and statements (ARCHITECTURE.md, steps 2 and 10)."""
