"""Plugins: third-party tools that the model calls inside a generation."""
