"""Error codes of moderation: refused content, sanctioned accounts, unavailable checks."""

import enum


class ErrorCode(enum.StrEnum):
    CONTENT_BLOCKED = "content_blocked"
    ACCOUNT_SUSPENDED = "account_suspended"
    ACCOUNT_BANNED = "account_banned"
    MODERATION_UNAVAILABLE = "moderation_unavailable"
    NOT_SUSPENDED = "not_suspended"
    FLAG_ALREADY_REVIEWED = "flag_already_reviewed"
