"""A plugin module that fails while importing."""

raise RuntimeError("broken at import")
