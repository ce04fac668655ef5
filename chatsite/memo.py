"""`DigestMemo`: what was computed from a text, kept by a digest of the text (never the text
itself), the least recently used dropped past a size. For work a `/v1` request repeats with
every turn on the parts it sends again: moderation scores, token counts."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")
Key = tuple[Hashable, bytes]


class DigestMemo(Generic[Value]):
    """Values by (what else they depend on, `digest(text)`); shared by a process's threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[Key, Value] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def digest(text: str) -> bytes:
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def get(self, key: Key) -> Value | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: Key, value: Value) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)

    def of(self, key: Key, compute: Callable[[], Value]) -> Value:
        """The value kept under `key`, or `compute()`'s, kept now."""
        value = self.get(key)
        if value is None:
            value = compute()
            self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)
