"""Encryption at rest of plugin and MCP server secrets (Fernet: AES-CBC with an HMAC).

The keys are `settings.PLUGINS_ENCRYPTION_KEY`, comma-separated strings, each hashed into
the 32 bytes Fernet wants. The first encrypts; a token made with any of them decrypts, so a
key is rotated by putting the new one first and keeping the old one behind it until every
secret has been saved again. A token that decrypts with none of them (the key changed) reads
as no secrets at all: the plugin then lacks its secrets until staff enter them again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

logger = logging.getLogger(__name__)


def _fernet() -> MultiFernet:
    materials = [part.strip() for part in settings.PLUGINS_ENCRYPTION_KEY.split(",")]
    keys = []
    for material in filter(None, materials):
        digest = hashlib.sha256(b"chatsite.plugins.secrets:" + material.encode()).digest()
        keys.append(Fernet(base64.urlsafe_b64encode(digest)))
    return MultiFernet(keys)


def encrypt_json(value: dict[str, Any]) -> str:
    """A Fernet token holding `value` as JSON, under the first key; "" for an empty dict."""
    if not value:
        return ""
    return _fernet().encrypt(json.dumps(value).encode()).decode()


def decrypt_json(token: str) -> dict[str, Any]:
    """The dict inside `token`; {} when empty or when it decrypts with none of today's keys."""
    if not token:
        return {}
    try:
        value = json.loads(_fernet().decrypt(token.encode()))
    except (InvalidToken, ValueError):
        logger.warning("Stored plugin secrets do not decrypt with the current keys; ignored.")
        return {}
    return value if isinstance(value, dict) else {}
