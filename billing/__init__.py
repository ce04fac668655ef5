"""Billing: plans, quotas, token buckets, usage ledger and statements (steps 2 and 10)."""
