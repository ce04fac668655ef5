"""ChatGPT `conversations.json` exports, as ChatGPT writes them ("Export data" in its
settings): a list of conversations, each a `mapping` of nodes {id, message, parent, children}
and the `current_node` on screen. Each message has `author.role`, `content` {content_type,
parts | text}, `create_time` (epoch seconds, or null), `status` and `metadata` (model_slug,
is_visually_hidden_from_conversation, attachments...).

`sourdough()` has what an import must get right: the empty root and a hidden system message
(skipped, their children re-parented), hidden custom instructions, an edited question (two
user children under one node: two branches), a regenerated answer (two assistant children),
a tool round (assistant code, a `tool` result, the answer), an image part, and a
`current_node` on the edited branch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

T0 = 1_717_000_000.0


def node(
    node_id: str,
    parent: str | None,
    children: list[str],
    *,
    role: str | None = None,
    parts: list[Any] | None = None,
    content: dict[str, Any] | None = None,
    at: float | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A node of a mapping; without `role`, the message-less root."""
    message: dict[str, Any] | None = None
    if role is not None:
        message = {
            "id": node_id,
            "author": {"role": role, "name": None, "metadata": {}},
            "create_time": at,
            "update_time": None,
            "content": content or {"content_type": "text", "parts": parts or [""]},
            "status": "finished_successfully",
            "end_turn": role == "assistant" or None,
            "weight": 1.0,
            "metadata": metadata or {},
            "recipient": "all",
            "channel": None,
        }
    return {"id": node_id, "message": message, "parent": parent, "children": children}


def conversation(
    title: str, nodes: list[dict[str, Any]], current: str | None, *, at: float = T0
) -> dict[str, Any]:
    return {
        "title": title,
        "create_time": at,
        "update_time": at + 600,
        "mapping": {n["id"]: n for n in nodes},
        "moderation_results": [],
        "current_node": current,
        "plugin_ids": None,
        "conversation_id": f"6650{int(at)}-conv",
        "conversation_template_id": None,
        "gizmo_id": None,
        "is_archived": False,
        "safe_urls": [],
        "default_model_slug": "gpt-4o",
        "id": f"6650{int(at)}-conv",
    }


GPT = {"model_slug": "gpt-4o", "default_model_slug": "gpt-4o"}


def sourdough(at: float = T0) -> dict[str, Any]:
    hidden = {"is_visually_hidden_from_conversation": True}
    nodes = [
        node("root", None, ["sys"]),
        node("sys", "root", ["ctx"], role="system", at=None, metadata=hidden),
        node(
            "ctx",
            "sys",
            ["q1", "q1-edit"],
            role="user",
            content={"content_type": "user_editable_context", "user_profile": "I bake."},
            metadata={**hidden, "user_context_message_data": {"about_user_message": "I bake."}},
        ),
        # The first question, and its edit: two branches.
        node(
            "q1",
            "ctx",
            ["a1", "a1-regen"],
            role="user",
            parts=["How often should I feed a sourdough starter?"],
            at=at + 10,
        ),
        node(
            "a1",
            "q1",
            [],
            role="assistant",
            parts=["Feed it **once a day** at room temperature."],
            at=at + 20,
            metadata=GPT,
        ),
        node(
            "a1-regen",
            "q1",
            [],
            role="assistant",
            parts=["Daily, or weekly if it lives in the fridge."],
            at=at + 30,
            metadata=GPT,
        ),
        node(
            "q1-edit",
            "ctx",
            ["a2"],
            role="user",
            parts=["How much rye flour goes into a sourdough starter?"],
            at=at + 40,
        ),
        node(
            "a2",
            "q1-edit",
            ["q3"],
            role="assistant",
            parts=["Equal weights of rye flour and water."],
            at=at + 50,
            metadata=GPT,
        ),
        node(
            "q3",
            "a2",
            ["call"],
            role="user",
            content={
                "content_type": "multimodal_text",
                "parts": [
                    {
                        "content_type": "image_asset_pointer",
                        "asset_pointer": "file-service://x",
                        "size_bytes": 1024,
                        "width": 64,
                        "height": 64,
                    },
                    "Here is my starter. And what is 25% of 480 grams?",
                ],
            },
            at=at + 60,
        ),
        node(
            "call",
            "q3",
            ["tool"],
            role="assistant",
            content={"content_type": "code", "language": "python", "text": "480 * 0.25"},
            at=at + 70,
            metadata=GPT,
        ),
        node(
            "tool",
            "call",
            ["a3"],
            role="tool",
            content={"content_type": "execution_output", "text": "120.0"},
            at=at + 75,
        ),
        node(
            "a3",
            "tool",
            [],
            role="assistant",
            parts=["25% of 480 g is **120 g** of rye flour."],
            at=at + 80,
            metadata=GPT,
        ),
    ]
    return conversation("Sourdough starter", nodes, "a3", at=at)


def small(title: str, question: str, answer: str, *, at: float = T0) -> dict[str, Any]:
    """A one-turn conversation."""
    nodes = [
        node("r", None, ["u"]),
        node("u", "r", ["a"], role="user", parts=[question], at=at + 1),
        node("a", "u", [], role="assistant", parts=[answer], at=at + 2, metadata=GPT),
    ]
    return conversation(title, nodes, "a", at=at)


def export_list() -> list[dict[str, Any]]:
    """A realistic export: newest first, as ChatGPT lists them."""
    return [
        sourdough(T0 + 1000),
        small(
            "Capybara facts",
            "Do capybaras swim well?",
            "Yes, capybaras are excellent swimmers.",
            at=T0,
        ),
    ]


def write_export(path: Path, conversations: list[dict[str, Any]] | None = None) -> Path:
    path.write_text(json.dumps(conversations if conversations is not None else export_list()))
    return path


def many(count: int) -> Iterator[bytes]:
    """A large export as a stream of bytes, made as it is read: `count` conversations."""
    yield b"["
    for index in range(count):
        if index:
            yield b","
        yield json.dumps(small(f"Chat {index}", f"Question {index}", f"Answer {index}")).encode()
    yield b"]"
