from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import ApiKey
from .services import api_keys_revoke


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = [
        "name",
        "prefix",
        "user",
        "scope",
        "store_conversations",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "scope", "store_conversations"]
    search_fields = ["name", "prefix", "user__username", "user__email"]
    # The scope is its owner's choice at creation: staff see it and can revoke, not widen it.
    readonly_fields = ["user", "prefix", "scope", "created_at", "last_used_at", "revoked_at"]
    fields = ["name", "store_conversations", *readonly_fields]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A key made here could never be shown to its owner; users create their own.
        return False

    # Revoking changes the key: staff who may only view keys may not revoke them.
    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = api_keys_revoke(keys=queryset)
        self.message_user(request, f"Revoked {count} key(s).")
