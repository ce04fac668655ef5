"""The token of a share link: the share's id and an HMAC of it under SECRET_KEY.

Why a signature rather than a random token kept hashed: the owner can list their links and
copy one again at any time (the token is recomputed from the id), yet the database holds
nothing that opens a link: someone who reads the `Share` table still lacks SECRET_KEY, and a
guessed or altered id fails the HMAC, compared in constant time. Revocation is a flag on the
row (a revoked share is 404 whatever its token). Rotating SECRET_KEY would break the links, so
keys listed in SECRET_KEY_FALLBACKS are still accepted, as Django's own signing does.

A token is 64 hexadecimal characters: the id's 32, then 32 of HMAC-SHA256 (128 bits).
"""

from __future__ import annotations

import re
import uuid

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

SALT = "conversations.share"
_TOKEN = re.compile(r"[0-9a-f]{64}")


def _mac(share_id: uuid.UUID, secret: str) -> str:
    return salted_hmac(SALT, share_id.hex, secret=secret, algorithm="sha256").hexdigest()[:32]


def share_token(*, share_id: uuid.UUID) -> str:
    """The token of the share's link."""
    return share_id.hex + _mac(share_id, settings.SECRET_KEY)


def share_id_from_token(*, token: str) -> uuid.UUID | None:
    """The share id a token names if its HMAC holds; None for anything malformed or forged."""
    if not _TOKEN.fullmatch(token):
        return None
    share_id = uuid.UUID(hex=token[:32])
    mac = token[32:]
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    valid = False
    for secret in secrets:
        # Every key is tried, so the time taken does not tell which one matched.
        valid |= constant_time_compare(mac, _mac(share_id, secret))
    return share_id if valid else None
