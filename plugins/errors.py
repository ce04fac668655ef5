"""Error codes of the plugins app (API refusals; a tool run's own codes are on ToolResult)."""

import enum


class ErrorCode(enum.StrEnum):
    UNKNOWN_TOOL = "unknown_tool"
    UNKNOWN_PLUGIN = "unknown_plugin"
    INVALID_CONFIG = "invalid_config"
    INVALID_SWITCHES = "invalid_switches"
    MCP_UNREACHABLE = "mcp_unreachable"
