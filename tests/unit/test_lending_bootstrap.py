"""routerd.lending.bootstrap: the master's lending state read back from the router database."""

from __future__ import annotations

import pytest_twisted

from routerd.config.lending import LendingSettings
from routerd.lending.bootstrap import load_lending_state
from routerd.store.links import LinkRow
from routerd.store.store import Store
from routerd.wire.lending import Endpoint, Link


@pytest_twisted.ensureDeferred
async def test_stored_links_of_both_lanes_and_layered_settings_are_loaded() -> None:
    store = Store.open_sync()
    await store.replace_links("image", [LinkRow("m", "sd-x", "s", "sd-x", False, False)])
    await store.replace_links("text", [LinkRow("s", "llm", "m", "llm", True, True),
                                       LinkRow("m", "llm", "s", "llm")])
    await store.set_setting_overrides({"scheduling_grant_ttl": "1m", "offload_probe_idle": "never"})
    config = LendingSettings(scheduling_grant_ttl=45.0, offload_probe_idle=8.0)
    image, text, settings = await load_lending_state(store, config)
    assert image.lane == "image"
    assert list(image) == [Link(Endpoint("m", "sd-x"), Endpoint("s", "sd-x"), False, False)]
    assert text.lane == "text"
    assert list(text) == [Link(Endpoint("m", "llm"), Endpoint("s", "llm")),
                          Link(Endpoint("s", "llm"), Endpoint("m", "llm"), True, True)]
    # the valid override wins over the config; the invalid one is skipped for the config value
    assert settings == LendingSettings(scheduling_grant_ttl=60.0, offload_probe_idle=8.0)


@pytest_twisted.ensureDeferred
async def test_an_empty_database_gives_no_links_and_the_config_settings() -> None:
    config = LendingSettings(scheduling_min_samples=30)
    image, text, settings = await load_lending_state(Store.open_sync(), config)
    assert len(image) == 0 and len(text) == 0
    assert settings == config
