"""Encryption at rest of plugin and MCP server secrets (Fernet: AES-CBC with an HMAC).

The key is `settings.PLUGINS_ENCRYPTION_KEY`, or SECRET_KEY when that is empty, hashed
into the 32 bytes Fernet wants. A token that no longer decrypts (the key changed) reads as
no secrets at all: the plugin then lacks its secrets until staff enter them again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

logger = logging.getLogger(__name__)


def _fernet() -> Fernet:
    material = settings.PLUGINS_ENCRYPTION_KEY or settings.SECRET_KEY
    digest = hashlib.sha256(b"chatsite.plugins.secrets:" + material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt_json(value: dict[str, Any]) -> str:
    """A Fernet token holding `value` as JSON; "" for an empty dict."""
    if not value:
        return ""
    return _fernet().encrypt(json.dumps(value).encode()).decode()


def decrypt_json(token: str) -> dict[str, Any]:
    """The dict inside `token`; {} when empty or when it does not decrypt with today's key."""
    if not token:
        return {}
    try:
        value = json.loads(_fernet().decrypt(token.encode()))
    except (InvalidToken, ValueError):
        logger.warning("Stored plugin secrets do not decrypt with the current key; ignored.")
        return {}
    return value if isinstance(value, dict) else {}
