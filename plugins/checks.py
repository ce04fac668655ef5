"""System checks: every plugin the registry left out is a warning (`plugins.W001`...)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .registry import get_registry


@checks.register("plugins")
def check_plugins(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """One warning per skipped plugin, with the reason and the way to fix it."""
    return [
        checks.Warning(
            f"Plugin {skipped.source} was not loaded: {skipped.reason}.",
            hint="Fix or uninstall the plugin package, or remove it from PLUGINS_BUILTIN.",
            id=skipped.check_id,
        )
        for skipped in get_registry().skipped
    ]
