"""Moderation: classifiers, flags, review queue and strikes (see ARCHITECTURE.md, steps 3 and 8)."""
