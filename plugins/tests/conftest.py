"""Fixtures of the plugin framework's tests: a registry made of the fake plugins."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from chatsite.testing import wait_until
from plugins import services
from plugins.registry import ENTRY_POINT_GROUP, Registry, registry_build, registry_reset

from . import fakes

FAKES = "plugins.tests.fakes"


def entry_point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


@pytest.fixture(autouse=True)
def _tools_on_by_default(settings: Any) -> None:
    """These tests are about plans, staff switches and limits: conversations start with the
    plan's tools on. The site's default is off; test_api.py checks that default."""
    settings.PLUGINS_TOOLS_ON_BY_DEFAULT = True


@pytest.fixture
def install_registry() -> Iterator[Callable[..., Registry]]:
    """Make the process's registry from the given built-ins and entry points."""

    def install(builtin: list[str], entry_points: list[EntryPoint] | None = None) -> Registry:
        registry = registry_build(builtin=builtin, entry_points=entry_points or [])
        registry_reset(registry)
        return registry

    yield install
    registry_reset()


@pytest.fixture
def fake_registry(install_registry: Callable[..., Registry]) -> Iterator[Registry]:
    """Built-ins echo and misbehaving; secretive from an entry point (so off by default)."""
    fakes.release_hang.clear()
    yield install_registry(
        [f"{FAKES}:echo", f"{FAKES}:misbehaving"],
        [entry_point("secretive", f"{FAKES}:secretive")],
    )
    fakes.release_hang.set()
    # The next test starts with every slot free (one counts the slots in use): the handlers
    # this one left hanging have returned, however long their threads take to see it.
    wait_until(lambda: services._running == 0, what="the tools' threads ended")
