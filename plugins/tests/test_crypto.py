"""Plugin secrets under comma-separated keys (plugins/crypto.py): the first encrypts, each
decrypts, so a key is rotated without losing the secrets saved under the old one."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from cryptography.fernet import Fernet

from plugins.crypto import decrypt_json, encrypt_json

SECRETS = {"api_key": "sk-live-7f3a9c1e5b2d"}


def test_secrets_round_trip_and_are_not_readable_in_the_token(settings: Any) -> None:
    settings.PLUGINS_ENCRYPTION_KEY = "key one"
    token = encrypt_json(SECRETS)
    assert "sk-live" not in token
    assert decrypt_json(token) == SECRETS
    assert encrypt_json({}) == "" and decrypt_json("") == {}


def test_a_rotated_key_reads_old_secrets_and_writes_under_the_new_one(settings: Any) -> None:
    settings.PLUGINS_ENCRYPTION_KEY = "old key"
    old_token = encrypt_json(SECRETS)

    settings.PLUGINS_ENCRYPTION_KEY = "new key, old key"
    assert decrypt_json(old_token) == SECRETS
    new_token = encrypt_json(SECRETS)

    settings.PLUGINS_ENCRYPTION_KEY = "new key"
    assert decrypt_json(new_token) == SECRETS
    assert decrypt_json(old_token) == {}  # dropped too early: read as no secrets


def test_secrets_saved_under_the_secret_key_fallback_stay_readable_behind_a_new_key(
    settings: Any,
) -> None:
    """A deployment that relied on the old fallback to SECRET_KEY names it after its new key."""
    digest = hashlib.sha256(b"chatsite.plugins.secrets:" + settings.SECRET_KEY.encode()).digest()
    fallback = Fernet(base64.urlsafe_b64encode(digest))  # as the fallback made its key
    token = fallback.encrypt(json.dumps(SECRETS).encode()).decode()

    settings.PLUGINS_ENCRYPTION_KEY = "a new key"
    assert decrypt_json(token) == {}
    settings.PLUGINS_ENCRYPTION_KEY = f"a new key,{settings.SECRET_KEY}"
    assert decrypt_json(token) == SECRETS
