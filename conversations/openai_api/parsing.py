"""The body of `POST /v1/chat/completions`, read and checked into a `ChatCompletionRequest`.

As OpenAI does, fields it does not know are ignored and fields of the wrong type are refused
(400 `invalid_request_error` naming the field in `param`, e.g. `messages[1].content`). Each
honoured field has one reader below; a new field is a new reader and a new attribute.

Tools are the client's own (OpenAI's function calling): `tools` offers them, `tool_choice`
steers the model, and the model's calls go back to the client, which runs them and sends the
results as `tool` messages after the assistant message that made the calls. The tool loop of
the messages is checked here: every `tool` message answers a call of the assistant message
before it, and every call is answered before the conversation goes on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from chatsite import jsonbody

from .errors import OpenAIError

# Roles whose text becomes the conversation's system prompt, in order.
SYSTEM_ROLES = frozenset({"system", "developer"})
TURN_ROLES = frozenset({"user", "assistant", "tool"})
MAX_STOP_SEQUENCES = 4
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")

# A turn: (role, content, metadata), metadata holding an assistant's `tool_calls` or a tool
# message's `tool_call_id` and `name`, as `conversations.Message.metadata` keeps them.
InputTurn = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class ChatCompletionRequest:
    """What a client asked for, in the service's terms."""

    model: str
    system_prompt: str
    # The user, assistant and tool turns, oldest first, ending with a user or tool turn.
    messages: list[InputTurn]
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    # Sampling settings passed to the model as they came: temperature, top_p, stop, ...
    sampling: dict[str, Any] = field(default_factory=dict)
    # The client's tools in OpenAI's format (None: none offered), and its `tool_choice`.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


def _invalid(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _type_error(param: str, expected: str, value: Any) -> OpenAIError:
    return _invalid(
        param,
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        code="invalid_type",
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _type_error(param, "a string", value)
    return value


def _boolean(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise _type_error(param, "a boolean", value)
    return value


def _integer(value: Any, param: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise _type_error(param, "an integer", value)
    number = int(value)
    if minimum is not None and number < minimum:
        raise _invalid(param, f"'{param}' must be at least {minimum}; got {number}.")
    return number


def _number(value: Any, param: str, *, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _type_error(param, "a decimal", value)
    if not low <= value <= high:
        raise _invalid(param, f"'{param}' must be between {low:g} and {high:g}; got {value:g}.")
    return float(value)


def _stop(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise _type_error(param, "a string or an array of strings", value)
    if len(value) > MAX_STOP_SEQUENCES:
        raise _invalid(param, f"'{param}' holds at most {MAX_STOP_SEQUENCES} sequences.")
    return [_string(item, f"{param}[{index}]") for index, item in enumerate(value)]


# Sampling fields handed to the model as they are (vLLM's names are OpenAI's).
_SAMPLING: dict[str, Callable[[Any, str], Any]] = {
    "temperature": lambda value, param: _number(value, param, low=0, high=2),
    "top_p": lambda value, param: _number(value, param, low=0, high=1),
    "stop": _stop,
    "presence_penalty": lambda value, param: _number(value, param, low=-2, high=2),
    "frequency_penalty": lambda value, param: _number(value, param, low=-2, high=2),
    "seed": _integer,
}


def _content(value: Any, param: str, *, nullable: bool = False) -> str:
    """A message's text: a string, or an array of `text` parts joined."""
    if value is None and nullable:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _type_error(param, "a string or an array of content parts", value)
    texts = []
    for index, part in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(part, dict):
            raise _type_error(where, "an object", part)
        kind = _string(part.get("type"), f"{where}.type")
        if kind != "text":
            raise _invalid(
                f"{where}.type",
                f"Content parts of type {kind!r} are not supported; only 'text' is.",
                code="unsupported_value",
            )
        texts.append(_string(part.get("text"), f"{where}.text"))
    return "".join(texts)


def _required(container: dict[str, Any], name: str, where: str) -> Any:
    if container.get(name) is None:
        raise _invalid(
            f"{where}.{name}",
            f"Missing required parameter: '{where}.{name}'.",
            "missing_required_parameter",
        )
    return container[name]


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(param, "an object", value)
    return value


def _function_type(container: dict[str, Any], where: str) -> None:
    kind = _string(_required(container, "type", where), f"{where}.type")
    if kind != "function":
        raise _invalid(
            f"{where}.type",
            f"Invalid value for '{where}.type': {kind!r}. Only 'function' is supported.",
            code="unsupported_value",
        )


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls`, in the shape the worker takes them."""
    if not isinstance(value, list):
        raise _type_error(where, "an array", value)
    calls = []
    for index, call in enumerate(value):
        at = f"{where}[{index}]"
        call = _object(call, at)
        call_id = _string(_required(call, "id", at), f"{at}.id")
        if not call_id:
            raise _invalid(f"{at}.id", f"'{at}.id' is empty.")
        _function_type(call, at)
        function = _object(_required(call, "function", at), f"{at}.function")
        name = _string(_required(function, "name", f"{at}.function"), f"{at}.function.name")
        arguments = _string(
            _required(function, "arguments", f"{at}.function"), f"{at}.function.arguments"
        )
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return calls


def _messages(value: Any) -> tuple[str, list[InputTurn]]:
    """The system prompt and the turns of `messages`, the tool loop checked."""
    if value is None:
        raise _invalid(
            "messages", "Missing required parameter: 'messages'.", "missing_required_parameter"
        )
    if not isinstance(value, list):
        raise _type_error("messages", "an array", value)
    if not value:
        raise _invalid("messages", "'messages' must hold at least one message.")
    system: list[str] = []
    turns: list[InputTurn] = []
    # The calls of the last assistant message still waiting for their `tool` messages
    # (id -> function name), and where that message is.
    pending: dict[str, str] = {}
    calls_at = ""
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _type_error(where, "an object", message)
        if "role" not in message:
            raise _invalid(
                f"{where}.role",
                f"Missing required parameter: '{where}.role'.",
                "missing_required_parameter",
            )
        role = _string(message["role"], f"{where}.role")
        if role == "function" or message.get("function_call") is not None:
            raise _invalid(
                f"{where}.role" if role == "function" else f"{where}.function_call",
                "Legacy function calling is not supported; use 'tools', assistant "
                "'tool_calls' and 'tool' messages.",
                code="unsupported_value",
            )
        if role not in SYSTEM_ROLES | TURN_ROLES:
            raise _invalid(
                f"{where}.role",
                f"Invalid value for '{where}.role': {role!r}. Supported values are 'system', "
                "'developer', 'user', 'assistant' and 'tool'.",
            )
        if role != "tool" and pending:
            raise _invalid(
                calls_at,
                f"An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'; no response for: {', '.join(pending)}.",
            )
        if role in SYSTEM_ROLES:
            system.append(_content(message.get("content"), f"{where}.content"))
        elif role == "tool":
            call_id = _string(_required(message, "tool_call_id", where), f"{where}.tool_call_id")
            if call_id not in pending:
                raise _invalid(
                    f"{where}.tool_call_id",
                    f"Invalid value for '{where}.tool_call_id': {call_id!r} does not answer a "
                    "tool call of the assistant message before it (or answers it twice).",
                )
            content = _content(message.get("content"), f"{where}.content")
            turns.append(("tool", content, {"tool_call_id": call_id, "name": pending.pop(call_id)}))
        elif role == "assistant":
            content = _content(message.get("content"), f"{where}.content", nullable=True)
            metadata: dict[str, Any] = {}
            if message.get("tool_calls") is not None:
                calls = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
                if calls:
                    metadata["tool_calls"] = calls
                    pending = {call["id"]: call["function"]["name"] for call in calls}
                    calls_at = f"{where}.tool_calls"
                    if len(pending) < len(calls):
                        raise _invalid(calls_at, f"'{calls_at}' repeats a call id.")
            turns.append(("assistant", content, metadata))
        else:
            turns.append((role, _content(message.get("content"), f"{where}.content"), {}))
    if pending:
        raise _invalid(
            calls_at,
            "An assistant message with 'tool_calls' must be followed by tool messages "
            f"responding to each 'tool_call_id'; no response for: {', '.join(pending)}.",
        )
    if not turns or turns[-1][0] not in ("user", "tool"):
        raise _invalid(
            "messages",
            "The last message (after any system message) must be the user's, or the tool "
            "results of the assistant's calls.",
        )
    return "\n\n".join(system), turns


def _tools(value: Any) -> list[dict[str, Any]]:
    """The client's `tools`: functions with a name and a JSON Schema of their arguments."""
    if not isinstance(value, list):
        raise _type_error("tools", "an array", value)
    if not value:
        raise _invalid("tools", "'tools' must hold at least one tool; leave it out for none.")
    if len(value) > MAX_TOOLS:
        raise _invalid("tools", f"'tools' holds at most {MAX_TOOLS} tools.")
    tools: list[dict[str, Any]] = []
    names: set[str] = set()
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        tool = _object(tool, where)
        _function_type(tool, where)
        function = _object(_required(tool, "function", where), f"{where}.function")
        at = f"{where}.function"
        name = _string(_required(function, "name", at), f"{at}.name")
        if not TOOL_NAME.fullmatch(name):
            raise _invalid(
                f"{at}.name",
                f"Invalid '{at}.name': {name!r}. A name holds 1 to 64 letters, digits, "
                "underscores or dashes.",
            )
        if name in names:
            raise _invalid(f"{at}.name", f"Two tools are named {name!r}.")
        names.add(name)
        entry: dict[str, Any] = {"name": name}
        if function.get("description") is not None:
            entry["description"] = _string(function["description"], f"{at}.description")
        if function.get("strict") is not None:
            _boolean(function["strict"], f"{at}.strict")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        parameters = _object(parameters, f"{at}.parameters")
        if parameters.get("type", "object") != "object":
            raise _invalid(
                f"{at}.parameters",
                f"Invalid schema for function {name!r}: the arguments' schema must be of "
                f"type 'object', not {parameters.get('type')!r}.",
            )
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise _invalid(
                f"{at}.parameters",
                f"Invalid schema for function {name!r}: {exc.message}.",
            ) from exc
        entry["parameters"] = {"type": "object", **parameters}
        tools.append({"type": "function", "function": entry})
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any]:
    """`tool_choice`: "none", "auto", "required" or one named tool of `tools`."""
    if tools is None:
        raise _invalid("tool_choice", "'tool_choice' is only allowed when 'tools' are given.")
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise _invalid(
                "tool_choice",
                f"Invalid value for 'tool_choice': {value!r}. Supported values are 'none', "
                "'auto', 'required' or an object naming a tool.",
            )
        return value
    if not isinstance(value, dict):
        raise _type_error("tool_choice", "a string or an object", value)
    _function_type(value, "tool_choice")
    function = _object(_required(value, "function", "tool_choice"), "tool_choice.function")
    name = _string(_required(function, "name", "tool_choice.function"), "tool_choice.function.name")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise _invalid(
            "tool_choice.function.name",
            f"Invalid value for 'tool_choice': no tool named {name!r} is in 'tools'.",
        )
    return {"type": "function", "function": {"name": name}}


def parse_chat_completion(raw: bytes) -> ChatCompletionRequest:
    """Read a request body; raises `OpenAIError` (400) for what a client must fix."""
    try:
        body = jsonbody.loads(raw or b"null")
    except jsonbody.BadJSON as exc:
        raise OpenAIError(400, str(exc), code="invalid_json") from exc
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.", code="invalid_json")

    model = body.get("model")
    if model is None:
        raise _invalid(
            "model", "Missing required parameter: 'model'.", "missing_required_parameter"
        )
    model = _string(model, "model").strip()
    if not model:
        raise _invalid("model", "'model' is empty.")
    system_prompt, messages = _messages(body.get("messages"))

    n = body.get("n")
    if n is not None and _integer(n, "n", minimum=1) != 1:
        raise _invalid("n", "Only one choice per request is supported (n=1).", "unsupported_value")

    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):
        if body.get(name) is not None:
            # max_completion_tokens, OpenAI's newer name, wins when both are given.
            max_tokens = _integer(body[name], name, minimum=1)

    stream = body.get("stream")
    stream = False if stream is None else _boolean(stream, "stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _type_error("stream_options", "an object", options)
        if not stream:
            raise _invalid(
                "stream_options", "'stream_options' is only allowed when 'stream' is true."
            )
        if options.get("include_usage") is not None:
            include_usage = _boolean(options["include_usage"], "stream_options.include_usage")

    user = body.get("user")
    user = None if user is None else _string(user, "user")

    sampling = {
        name: read(body[name], name)
        for name, read in _SAMPLING.items()
        if body.get(name) is not None
    }

    tools = None if body.get("tools") is None else _tools(body["tools"])
    tool_choice = None
    if body.get("tool_choice") is not None:
        tool_choice = _tool_choice(body["tool_choice"], tools)
    return ChatCompletionRequest(
        model=model,
        system_prompt=system_prompt,
        messages=messages,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        user=user,
        sampling=sampling,
        tools=tools,
        tool_choice=tool_choice,
    )
