"""The cache's serializer: JSON, refusing what JSON cannot hold.

django-redis pickles by default, and unpickling runs code: anyone who can write a key in Redis
could then run code in every process that reads the cache. django-redis's own JSON serializer
encodes datetimes, decimals and UUIDs as strings, so such a value would come back with another
type; this one refuses it when it is set (TypeError), as it refuses NaN and the infinities
(ValueError), so a caller storing one fails in its tests instead of misreading it later.
"""

from __future__ import annotations

import json
from typing import Any

from django_redis.serializers.base import BaseSerializer


class JSONSerializer(BaseSerializer):
    """Plain JSON in UTF-8 (django-redis stores integers as they are, for INCR)."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()

    def loads(self, value: bytes) -> Any:
        return json.loads(value.decode())
