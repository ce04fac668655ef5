"""Plugins: third-party tools called inside a generation (ARCHITECTURE.md, "Tools inside a generation")."""
