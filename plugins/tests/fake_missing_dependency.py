"""A plugin module whose dependency is not installed."""

import chatsite_no_such_dependency  # noqa: F401

plugin = None
