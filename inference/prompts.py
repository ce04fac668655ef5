"""A prompt as a worker sees it: the chat template rendered and tokenized the way vLLM does.

The scheduler places a request by how much of its prompt a worker still holds in its KV cache
(`scheduler/prefix.py`), so it needs the prompt's token ids, not its messages. vLLM renders
OpenAI messages with the model's chat template (transformers' Jinja environment: sandboxed,
`trim_blocks`, `lstrip_blocks`, a `tojson` that does not escape) and tokenizes the text without
adding special tokens; this module does the same with the pool's `tokenizer.json`, so the
token ids match the worker's (a test compares them with transformers' `apply_chat_template`).

The prepared SmolLM2 is served with the project's own template (`worker/chatml_tools.jinja`,
see `run_worker`); a pool with a tokenizer folder of its own uses that folder's template.
"""

from __future__ import annotations

import contextlib
import json
import re
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from django.conf import settings
from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from chatsite.memo import DigestMemo

from .tokens import load_tokenizer

CHATML_TOOLS_TEMPLATE = Path(__file__).resolve().parent / "worker" / "chatml_tools.jinja"


class PromptUnavailable(Exception):
    """The pool's chat template is missing or failed to render these messages."""


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now(UTC).strftime(fmt)


def template_source(folder: str) -> str:
    """The chat template the worker for `folder`'s model renders with."""
    path = Path(folder)
    if path.resolve() == Path(settings.MODEL_DIR).resolve():
        return CHATML_TOOLS_TEMPLATE.read_text(encoding="utf-8")
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    config_path = path / "tokenizer_config.json"
    if config_path.is_file():
        template = json.loads(config_path.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if isinstance(template, str):
            return template
    raise PromptUnavailable(f"no chat template in {folder}")


@lru_cache(maxsize=8)
def chat_template(folder: str) -> Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(template_source(folder))


def _as_worker_sees(message: dict[str, Any]) -> dict[str, Any]:
    """A message as vLLM hands it to the template: text parts joined into one string, and
    tool-call arguments parsed from their JSON text."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        message = {**message, "content": "\n".join(texts)}
    calls = message.get("tool_calls")
    if calls:
        parsed = []
        for call in calls:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                with contextlib.suppress(ValueError):
                    function = {**function, "arguments": json.loads(arguments)}
            parsed.append({**call, "function": function})
        message = {**message, "tool_calls": parsed}
    return message


def render(
    folder: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    try:
        return chat_template(folder).render(
            messages=[_as_worker_sees(m) for m in messages],
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
        )
    except TemplateError as exc:
        raise PromptUnavailable(str(exc)) from exc


def token_ids(
    folder: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The token ids the worker serving `folder`'s model computes for this prompt."""
    text = render(folder, messages, tools=tools, add_generation_prompt=add_generation_prompt)
    return encode(folder, text)


def encode(folder: str, text: str) -> list[int]:
    """`text`'s token ids, as `folder`'s tokenizer gives them for the whole text, from the
    pieces between its special tokens: the tokenizer splits those out before anything else
    and encodes each piece on its own, so a piece seen before (a system prompt, an earlier
    message, sent again with every turn) is not encoded again (`PIECES`). A tokenizer whose
    special tokens are not split out that plainly is asked for the whole text."""
    tokenizer = load_tokenizer(folder)
    splitter = _special_tokens(folder)
    if splitter is None:
        whole: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return whole
    ids: list[int] = []
    for piece in splitter.split(text):
        if len(piece) < PIECE_MIN_CHARS:
            if piece:
                ids.extend(tokenizer.encode(piece, add_special_tokens=False).ids)
            continue
        key = (folder, DigestMemo.digest(piece))
        ids.extend(PIECES.of(key, partial(_kept_ids, tokenizer, piece)))
    return ids


def _kept_ids(tokenizer: Tokenizer, piece: str) -> array[int]:
    return array("I", tokenizer.encode(piece, add_special_tokens=False).ids)


# Pieces shorter than this are encoded each time (a role name, a short question).
PIECE_MIN_CHARS = 200
# The token ids of the longer pieces encoded lately, by tokenizer folder (4 bytes a token).
PIECES: DigestMemo[array[int]] = DigestMemo(settings.TOKEN_PIECE_MEMO_ENTRIES)


@lru_cache(maxsize=8)
def _special_tokens(folder: str) -> re.Pattern[str] | None:
    """A pattern that splits a text at `folder`'s added tokens, each kept as a piece of its
    own, if the tokenizer matches them on the raw text and nothing else (not normalized, no
    whitespace stripped around them, not whole words only); else None."""
    added = list(load_tokenizer(folder).get_added_tokens_decoder().values())
    if not added or any(
        token.normalized or token.lstrip or token.rstrip or token.single_word for token in added
    ):
        return None
    contents = sorted({token.content for token in added}, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(content) for content in contents) + ")")
