"""Staff console for plugins and MCP servers: thin, every write goes through plugins.services.

A plugin's settings form is built from its config schema (`plugins.forms`); secrets are
password boxes that never show what is stored.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from chatsite.errors import ServiceError

from . import services
from .crypto import decrypt_json
from .forms import settings_fields, settings_values
from .models import McpServer, PluginConfig
from .registry import get_registry
from .selectors import plugin_states


class PluginConfigForm(forms.ModelForm[PluginConfig]):
    class Meta:
        model = PluginConfig
        fields = ["enabled", "all_plans", "plans"]


@admin.register(PluginConfig)
class PluginConfigAdmin(admin.ModelAdmin[PluginConfig]):
    list_display = ["slug", "plugin_name", "enabled", "all_plans", "configured", "origin"]
    list_filter = ["enabled"]
    filter_horizontal = ["plans"]
    form = PluginConfigForm

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Rows are made for the plugins the registry found, not by hand.
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        services.plugin_configs_sync()
        for skipped in get_registry().skipped:
            self.message_user(
                request, f"Not loaded: {skipped.source}: {skipped.reason}", messages.WARNING
            )
        return super().changelist_view(request, extra_context)

    @admin.display(description="name")
    def plugin_name(self, obj: PluginConfig) -> str:
        loaded = get_registry().plugins.get(obj.slug)
        return loaded.plugin.name if loaded else "(not installed)"

    @admin.display(description="origin")
    def origin(self, obj: PluginConfig) -> str:
        loaded = get_registry().plugins.get(obj.slug)
        return loaded.source if loaded else ""

    @admin.display(boolean=True, description="configured")
    def configured(self, obj: PluginConfig) -> bool | None:
        state = plugin_states().get(obj.slug)
        return state.configured if state else None

    def _settings_fields(self, obj: PluginConfig | None) -> dict[str, forms.Field]:
        loaded = get_registry().plugins.get(obj.slug) if obj else None
        if obj is None or loaded is None:
            return {}
        return settings_fields(
            loaded.plugin.config_schema,
            values=obj.values,
            secrets_set=set(decrypt_json(obj.secrets)),
        )

    def get_fieldsets(self, request: HttpRequest, obj: PluginConfig | None = None) -> Any:
        fieldsets: list[Any] = [(None, {"fields": ["enabled", "all_plans", "plans"]})]
        names = list(self._settings_fields(obj))
        if names:
            fieldsets.append(("Settings", {"fields": names}))
        return fieldsets

    def get_form(
        self,
        request: HttpRequest,
        obj: PluginConfig | None = None,
        change: bool = False,
        **kwargs: Any,
    ) -> Any:
        kwargs["form"] = type("PluginSettingsForm", (PluginConfigForm,), self._settings_fields(obj))
        return super().get_form(request, obj, change, **kwargs)

    def save_model(self, request: HttpRequest, obj: PluginConfig, form: Any, change: bool) -> None:
        try:
            services.plugin_config_update(
                slug=obj.slug,
                enabled=form.cleaned_data["enabled"],
                all_plans=form.cleaned_data["all_plans"],
                values=settings_values(form.cleaned_data),
            )
        except ServiceError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        form.instance.plans.set(form.cleaned_data["plans"])


class McpServerForm(forms.ModelForm[McpServer]):
    url = forms.URLField(
        max_length=500,
        assume_scheme="https",
        help_text="The streamable HTTP endpoint, e.g. https://tools.example.com/mcp",
    )
    token = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Sent as 'Authorization: Bearer …'. Stored encrypted; leave empty to keep it.",
    )
    extra_headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='More HTTP headers as a JSON object, e.g. {"X-Api-Key": "…"}. Stored '
        "encrypted and never shown again; leave empty to keep them.",
    )

    class Meta:
        model = McpServer
        fields = ["slug", "name", "url", "enabled", "all_plans", "plans"]

    def clean_extra_headers(self) -> dict[str, str] | None:
        raw = self.cleaned_data["extra_headers"].strip()
        if not raw:
            return None
        try:
            headers = json.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError("Not valid JSON.") from exc
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise forms.ValidationError("Give a JSON object of header names to text values.")
        return headers


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin[McpServer]):
    form = McpServerForm
    list_display = ["slug", "name", "url", "enabled", "tool_count", "tools_refreshed_at"]
    list_filter = ["enabled"]
    filter_horizontal = ["plans"]
    readonly_fields = ["secrets_set", "tool_list", "tools_refreshed_at", "last_error"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "url", "enabled", "all_plans", "plans"]}),
        ("Credentials", {"fields": ["secrets_set", "token", "extra_headers"]}),
        ("Tools", {"fields": ["tool_list", "tools_refreshed_at", "last_error"]}),
    ]
    actions = ["refresh_tools"]

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools)

    @admin.display(description="stored credentials")
    def secrets_set(self, obj: McpServer) -> str:
        secret = decrypt_json(obj.secret_headers)
        parts = ["token" if secret.get("token") else ""]
        parts += [f"header {name}" for name in secret.get("headers") or {}]
        return ", ".join(part for part in parts if part) or "none"

    @admin.display(description="tools as last listed")
    def tool_list(self, obj: McpServer) -> str:
        return ", ".join(tool["name"] for tool in obj.tools) or "none (refresh tools)"

    def save_model(self, request: HttpRequest, obj: McpServer, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        services.mcp_server_set_secrets(
            server=obj,
            token=form.cleaned_data.get("token"),
            headers=form.cleaned_data.get("extra_headers"),
        )

    # A refresh rewrites the server's tool list (what users are offered): the change permission.
    @admin.action(description="Refresh tools (list them from the server)", permissions=["change"])
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            try:
                count = services.mcp_server_refresh_tools(server=server)
            except ServiceError as exc:
                self.message_user(request, exc.message, messages.ERROR)
            else:
                self.message_user(request, f"{server}: {count} tools listed.", messages.SUCCESS)
