"""Error codes of billing: quota refusals, idempotency conflicts, invoices, statements."""

import enum


class ErrorCode(enum.StrEnum):
    MODEL_NOT_IN_PLAN = "model_not_in_plan"
    RATE_LIMITED_REQUESTS = "rate_limited_requests"
    RATE_LIMITED_TOKENS = "rate_limited_tokens"
    MESSAGE_CAP_REACHED = "message_cap_reached"
    TOO_MANY_CONCURRENT = "too_many_concurrent"
    REQUEST_TOO_LARGE = "request_too_large"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    IDEMPOTENCY_KEY_IN_USE = "idempotency_key_in_use"
    INVOICE_NOT_OPEN = "invoice_not_open"
    MANUAL_PAYMENT_UNSUPPORTED = "manual_payment_unsupported"
    NOTHING_TO_INVOICE = "nothing_to_invoice"
    ACCOUNT_DELETED = "account_deleted"
