"""Staff settings: a form from the plugin's schema, secrets encrypted, masked and never shown."""

from __future__ import annotations

import logging

import pytest
from django.urls import reverse

from chatsite.errors import ServiceError
from plugins.crypto import decrypt_json
from plugins.models import PluginConfig
from plugins.selectors import plugin_states
from plugins.services import plugin_config_update, tool_run

pytestmark = pytest.mark.django_db

SECRET = "sk-live-7f3a9c1e5b2d"


@pytest.fixture
def staff_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("staff", "staff@example.com", "pw")
    client.force_login(admin)
    return client


def test_secrets_are_encrypted_at_rest(fake_registry):
    plugin_config_update(slug="secretive", values={"api_key": SECRET, "region": "us"})
    row = PluginConfig.objects.get(slug="secretive")
    assert SECRET not in row.secrets
    assert SECRET not in str(row.values)
    assert row.values == {"region": "us"}
    assert decrypt_json(row.secrets) == {"api_key": SECRET}
    assert plugin_states()["secretive"].settings["api_key"] == SECRET


def test_an_empty_secret_keeps_the_stored_one(fake_registry):
    plugin_config_update(slug="secretive", values={"api_key": SECRET})
    plugin_config_update(slug="secretive", values={"api_key": "", "region": "us"})
    assert plugin_states()["secretive"].settings == {"api_key": SECRET, "region": "us"}


def test_a_changed_key_reads_as_no_secret(fake_registry, settings):
    plugin_config_update(slug="secretive", values={"api_key": SECRET})
    settings.PLUGINS_ENCRYPTION_KEY = "another key"
    assert "api_key" not in plugin_states()["secretive"].settings


def test_settings_are_checked_against_the_schema_without_echoing_secrets(fake_registry):
    with pytest.raises(ServiceError) as excinfo:
        plugin_config_update(slug="secretive", values={"retries": 9})
    assert excinfo.value.code == "invalid_config"
    with pytest.raises(ServiceError) as excinfo:
        plugin_config_update(slug="secretive", values={"api_key": 12345678})
    assert "12345678" not in excinfo.value.message
    with pytest.raises(ServiceError):
        plugin_config_update(slug="secretive", values={"nope": 1})


def test_the_admin_form_is_built_from_the_schema_and_masks_the_secret(fake_registry, staff_client):
    plugin_config_update(slug="secretive", values={"api_key": SECRET, "retries": 2})
    row = PluginConfig.objects.get(slug="secretive")
    page = staff_client.get(reverse("admin:plugins_pluginconfig_change", args=[row.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert 'name="setting_api_key"' in html
    assert 'type="password"' in html
    assert "A value is set (hidden)." in html
    assert 'name="setting_region"' in html and "<select" in html
    assert 'name="setting_retries"' in html and 'value="2"' in html
    assert 'name="setting_verbose"' in html and 'type="checkbox"' in html
    assert SECRET not in html
    assert row.secrets not in html


def test_saving_in_admin_keeps_an_empty_secret_and_changes_a_new_one(
    fake_registry, staff_client, caplog
):
    plugin_config_update(slug="secretive", values={"api_key": SECRET})
    row = PluginConfig.objects.get(slug="secretive")
    url = reverse("admin:plugins_pluginconfig_change", args=[row.pk])
    form = {
        "enabled": "on",
        "all_plans": "on",
        "setting_api_key": "",
        "setting_region": "us",
        "setting_retries": "3",
    }
    with caplog.at_level(logging.DEBUG):
        response = staff_client.post(url, form)
        assert response.status_code == 302, response.content.decode()[:2000]
        row.refresh_from_db()
        assert row.enabled is True
        assert plugin_states()["secretive"].settings["api_key"] == SECRET
        assert row.values == {"region": "us", "retries": 3, "verbose": False}

        response = staff_client.post(url, {**form, "setting_api_key": "sk-new-0000"})
        assert response.status_code == 302
        assert plugin_states()["secretive"].settings["api_key"] == "sk-new-0000"
        page = staff_client.get(url).content.decode()
        assert "sk-new-0000" not in page
    assert SECRET not in caplog.text
    assert "sk-new-0000" not in caplog.text


def test_the_admin_list_shows_every_discovered_plugin(fake_registry, staff_client):
    page = staff_client.get(reverse("admin:plugins_pluginconfig_changelist"))
    assert page.status_code == 200
    assert set(PluginConfig.objects.values_list("slug", flat=True)) == {
        "echo",
        "misbehaving",
        "secretive",
    }
    assert PluginConfig.objects.get(slug="echo").enabled is True, "built-ins start on"
    assert PluginConfig.objects.get(slug="secretive").enabled is False, "installed start off"


def test_the_secret_reaches_the_handler_but_not_the_logs(fake_registry, user, caplog):
    plugin_config_update(slug="secretive", enabled=True, values={"api_key": SECRET})
    with caplog.at_level(logging.DEBUG):
        result = tool_run(user_id=user.pk, conversation_id=None, name="whoami", arguments="{}")
    assert result.ok
    assert result.content == f"key length {len(SECRET)}, region eu"
    assert SECRET not in caplog.text
