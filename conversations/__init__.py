"""Conversations: the message tree, branches, the sidebar and context assembly."""
