"""Error codes of the conversations app."""

import enum


class ErrorCode(enum.StrEnum):
    CONVERSATION_DELETED = "conversation_deleted"
    MESSAGE_TOO_LONG = "message_too_long"
    EMPTY_MESSAGE = "empty_message"
    UNKNOWN_PARENT = "unknown_parent"
    INVALID_PARENT = "invalid_parent"
    NOT_A_USER_MESSAGE = "not_a_user_message"
    NOT_AN_ASSISTANT_MESSAGE = "not_an_assistant_message"
    CANNOT_SWITCH_TO_ROOT = "cannot_switch_to_root"
    GENERATION_IN_PROGRESS = "generation_in_progress"
    UNKNOWN_MODEL = "unknown_model"
    SYSTEM_PROMPT_TOO_LONG = "system_prompt_too_long"
    EMPTY_TITLE = "empty_title"
    TITLE_TOO_LONG = "title_too_long"
    INVALID_CURSOR = "invalid_cursor"
    CONTEXT_TOO_LONG = "context_too_long"
