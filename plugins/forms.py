"""Django form fields built from a plugin's config schema, for the staff console.

string, integer, number and boolean properties and enums become the matching fields. A
property marked `"secret": true` becomes a password box that never shows the stored value:
left empty, the stored secret is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms

FIELD_PREFIX = "setting_"


def _enum_field(prop: Mapping[str, Any], required: bool, **common: Any) -> forms.Field:
    options = list(prop["enum"])
    by_text = {str(option): option for option in options}
    choices = [(str(option), str(option)) for option in options]
    if not required:
        choices.insert(0, ("", "---------"))
    return forms.TypedChoiceField(
        choices=choices,
        coerce=lambda text: by_text[text],
        empty_value=None,
        required=required,
        **common,
    )


def setting_field(
    key: str, prop: Mapping[str, Any], *, required: bool, secret_is_set: bool = False
) -> forms.Field:
    """The form field of one config property."""
    label = prop.get("title") or key.replace("_", " ").capitalize()
    help_text = prop.get("description", "")
    common: dict[str, Any] = {"label": label}
    if prop.get("secret"):
        state = "A value is set (hidden)." if secret_is_set else "No value set."
        return forms.CharField(
            required=required and not secret_is_set,
            widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
            help_text=f"{help_text} Stored encrypted. {state} Leave empty to keep it.".strip(),
            strip=False,
            **common,
        )
    common["help_text"] = help_text
    if "enum" in prop:
        return _enum_field(prop, required, **common)
    kind = prop.get("type")
    bounds = {
        name: prop[key_name]
        for name, key_name in (("min_value", "minimum"), ("max_value", "maximum"))
        if key_name in prop
    }
    if kind == "boolean":
        return forms.BooleanField(required=False, **common)
    if kind == "integer":
        return forms.IntegerField(required=required, **bounds, **common)
    if kind == "number":
        return forms.FloatField(required=required, **bounds, **common)
    length = {"max_length": prop["maxLength"]} if "maxLength" in prop else {}
    return forms.CharField(required=required, **length, **common)


def settings_fields(
    schema: Mapping[str, Any], *, values: Mapping[str, Any], secrets_set: set[str]
) -> dict[str, forms.Field]:
    """Every field of `schema`, named `setting_<key>`, with initial values (never secrets)."""
    required = set(schema.get("required") or [])
    fields: dict[str, forms.Field] = {}
    for key, prop in (schema.get("properties") or {}).items():
        field = setting_field(key, prop, required=key in required, secret_is_set=key in secrets_set)
        if not prop.get("secret"):
            field.initial = values.get(key, prop.get("default"))
        fields[FIELD_PREFIX + key] = field
    return fields


def settings_values(cleaned_data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings in a cleaned form, by key; empty optional fields become None."""
    return {
        name.removeprefix(FIELD_PREFIX): (None if value == "" else value)
        for name, value in cleaned_data.items()
        if name.startswith(FIELD_PREFIX)
    }
