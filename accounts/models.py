"""Per-user API keys. Users themselves are Django's auth users."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    """A bearer credential for the JSON API.

    The raw key is shown once at creation; only its SHA-256 digest is stored. Keys carry
    enough entropy (240 bits) that a fast digest is safe: there is nothing to brute-force.

    Its `scope` is what it may do (`accounts.authentication.ApiKeyScopePermission` holds the
    rule): `chat` keys chat, `full` keys manage the account too (API keys, billing). A new key
    is `chat` unless its owner asks for more: the key an integration needs, and the less a
    leaked one gives away. Keys made before scopes existed were all-powerful and stay `full`.
    """

    class Scope(models.TextChoices):
        CHAT = "chat", "Chat only"
        FULL = "full", "Full account"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="Visible start of the key.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scope = models.CharField(
        max_length=8,
        choices=Scope.choices,
        default=Scope.CHAT,
        help_text=(
            "Chat only: the OpenAI-compatible API, conversations, messages and generations. "
            "Full account: also API keys and billing."
        ),
    )
    store_conversations = models.BooleanField(
        default=True,
        help_text=(
            "Keep what the OpenAI-compatible API is sent with this key as conversations "
            "(marked API); when off, each request's conversation is removed once answered."
        ),
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def has_scope(self, required: str) -> bool:
        """Whether this key may do what needs `required`: a full key may do anything."""
        return self.scope == ApiKey.Scope.FULL or required == ApiKey.Scope.CHAT
