"""Links and lending settings across a real master and slave.

The master stores an edit made through its site API and installs it into its own lending; the push
to the slave is the coordinator's (``LendingService.push``).  The slave's push receipt is exercised
directly with the cluster token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from routerd.config.lending import LendingSettings
from routerd.paths import LINKS_PATH
from routerd.store.links import LinkRow
from routerd.wire.lending import Endpoint, Link
from tests.integration.nodes import (
    TOKEN,
    Pair,
    start_pair,
    wait_until,
)

TEXT_GROUPS = "/router/v1/site/text-routing-groups"
SETTINGS = "/router/v1/site/offload/settings"
LINK = Link(Endpoint("master", "chat"), Endpoint("slave-a", "chat"), True, True)
EDIT = {"anchor": {"node_id": "master", "model_id": "chat"},
        "lends_to": [{"node_id": "slave-a", "model_id": "chat", "restore_after_borrow": True}]}





@pytest_twisted.async_yield_fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    running = await start_pair(tmp_path)
    yield running
    await running.stop()

async def _call(method: str, url: str, body: Any = None, *, token: str | None = None) -> tuple[int, Any]:
    headers: dict[bytes | str, bytes | str] = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    response = await treq.request(method, url, data=None if body is None else json.dumps(body).encode(),
                                  headers=headers)
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_a_text_link_posted_to_the_master_is_stored_and_installed_on_the_master(pair: Pair) -> None:
    code, body = await _call("POST", pair.master.url + TEXT_GROUPS, EDIT)
    assert code == 200, body
    # same checkpoint on both nodes: no acknowledgement needed, and the candidate says so
    [candidate] = body["candidates"]
    assert candidate["node_id"] == "slave-a" and candidate["weights_match"] is True
    assert candidate["lends_to"]["selected"] is True
    master = pair.master.node
    assert master.store is not None
    assert await master.store.links("text") == [LinkRow("master", "chat", "slave-a", "chat", True, True)]
    assert list(master.lending.links["text"]) == [LINK]
    assert len(master.lending.links["image"]) == 0
    code, body = await _call("GET", pair.master.url + TEXT_GROUPS + "?node_id=master&model_id=chat")
    assert code == 200 and len(body["links"]) == 1


@pytest_twisted.ensureDeferred
async def test_a_settings_override_posted_to_the_master_applies_on_the_master(pair: Pair) -> None:
    code, body = await _call("POST", pair.master.url + SETTINGS,
                             {"values": {"scheduling_grant_ttl": "45s"}})
    assert code == 200, body
    assert pair.master.node.lending.settings.scheduling_grant_ttl == 45.0
    assert body["fingerprint"] == pair.master.node.lending.settings.fingerprint()


@pytest_twisted.ensureDeferred
async def test_the_slave_closes_the_site_api_and_accepts_a_push_only_with_the_cluster_token(
        pair: Pair) -> None:
    code, _ = await _call("GET", pair.slave.url + TEXT_GROUPS)
    assert code == 404
    push = {"image": [], "text": [{"owner": {"node_id": "master", "model_id": "chat"},
                                   "helper": {"node_id": "slave-a", "model_id": "chat"},
                                   "load_if_unloaded": True, "restore_after_borrow": True}]}
    code, _ = await _call("POST", pair.slave.url + LINKS_PATH, push)
    assert code == 401
    code, body = await _call("POST", pair.slave.url + LINKS_PATH, push, token=TOKEN)
    assert code == 200 and body == {"ok": True, "image": 0, "text": 1, "guardians": 0}
    assert list(pair.slave.node.lending.links["text"]) == [LINK]


@pytest_twisted.ensureDeferred
async def test_links_and_settings_posted_to_the_master_reach_the_slave(pair: Pair) -> None:
    code, _ = await _call("POST", pair.master.url + TEXT_GROUPS, EDIT)
    assert code == 200
    code, _ = await _call("POST", pair.master.url + SETTINGS, {"values": {"scheduling_grant_ttl": "45s"}})
    assert code == 200
    slave = pair.slave.node
    await wait_until(lambda: list(slave.lending.links["text"]) == [LINK], timeout=3.0)
    wanted = LendingSettings(scheduling_grant_ttl=45.0)
    await wait_until(lambda: slave.lending.settings == wanted, timeout=3.0)
