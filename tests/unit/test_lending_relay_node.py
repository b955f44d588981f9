"""The master's relay on real in-memory nodes: the owner's lease and the helper's claim decide where
a lent request goes (spec "Who decides"), not the master's own record of the lease.

A master and its slave share one clock and simulator backends.  The slave's ``chat`` lends to the
master's ``chat``; the slave relays a request it lends under its lease (naming the master as helper)
while the master's book holds no lease for it (its plan never granted one, or the record ran out).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.unit.node_fixture import TEXT, TOKEN, World, master_cluster, slave_cluster

LINKABLE = {**TEXT, "kcpps": {"contextsize": 4096}}
RELAY = "/router/v1/node/offload/request"


def _relay_headers(helper: tuple[str, str] | None) -> dict[bytes, list[bytes]]:
    headers = {b"authorization": [b"Bearer " + TOKEN.encode()],
               b"content-type": [b"application/json"],
               b"x-routerd-offload-owner": [b"slave"],
               b"x-routerd-offload-owner-model": [b"chat"],
               b"x-routerd-offload-lane": [b"text"],
               b"x-routerd-offload-path": [b"/v1/chat/completions"]}
    if helper is not None:
        headers[b"x-routerd-offload-helper"] = [helper[0].encode()]
        headers[b"x-routerd-offload-helper-model"] = [helper[1].encode()]
    return headers


def _chat() -> bytes:
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()


def _linked_world(tmp_path: Path) -> tuple[World, Any]:
    world = World(tmp_path)
    slave = world.node("slave", {"chat": LINKABLE}, cluster=slave_cluster())
    master = world.node("master", {"chat": LINKABLE},
                        cluster=master_cluster(scheduling_refresh_interval="1h"))
    world.start(slave, master)
    edit = {"anchor": {"node_id": "slave", "model_id": "chat"},
            "lends_to": [{"node_id": "master", "model_id": "chat"}], "acknowledge_different_weights": True}
    response, body = world.call("POST", master, "/router/v1/site/text-routing-groups", json=edit)
    assert response.code == 200, body
    return world, master


def test_a_relay_under_the_owners_lease_is_served_though_the_master_holds_no_lease_for_it(
        tmp_path: Path) -> None:
    """The master's plan granted the slave nothing (it has no held work), yet the slave lends under
    the lease it times on its own clock, naming the master's ``chat``: the master serves it (today's
    ``no_live_lease`` refusal sent it back although the owner's lease was live)."""
    world, master = _linked_world(tmp_path)
    response, body = world.call("POST", master, RELAY, data=_chat(),
                                headers=_relay_headers(("master", "chat")))
    assert response.code == 200, body
    assert response.headers.getRawHeaders(b"x-routerd-lent-to") == [b"master/chat"]
    assert json.loads(body)["choices"]


def test_a_relay_naming_no_helper_still_needs_the_masters_live_lease(tmp_path: Path) -> None:
    """An owner of an older build names no helper: only the master's live lease can say where its
    request goes, and there is none, so it comes back with 409 ``offload_returned``."""
    world, master = _linked_world(tmp_path)
    response, body = world.call("POST", master, RELAY, data=_chat(), headers=_relay_headers(None))
    assert response.code == 409, body
    assert json.loads(body)["error"]["code"] == "offload_returned"
