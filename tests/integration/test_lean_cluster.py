"""Calls between nodes go over the lean path both ways.

A master, an owner slave and a helper slave (real nodes on 127.0.0.1, simulator backends as
processes).  The client side of every forward, relay, queue event and grant is the lean keep-alive
client (:mod:`routerd.clients.peer_http`: a ``BackendAgent`` pool per peer), and the receiving side
serves them on the lean channel: the connection each arrived on was never handed to twisted.web.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer

from routerd.api.channel import LeanChannel
from routerd.clients.backend_http import BackendAgent
from tests.integration.lending_support import JOB, Trio, ask_chat, start_trio, text_models, warm_and_link
from tests.integration.nodes import RunningNode, kill, wait_until


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    running = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB))
    yield running
    await running.stop()


def _peer_connections(caller: RunningNode, callee: RunningNode) -> list[Any]:
    """The open connections ``caller``'s lean peer client holds to ``callee``."""
    agent = caller.node.clients.peer_agent
    assert isinstance(agent, BackendAgent), "the node's peer client is the lean client"
    port = callee.service.port.getHost().port
    return [connection for authority, pool in agent._pools.items()
            if authority.endswith(b":%d" % port) for connection in pool.idle if not connection.lost]


def _served_lean(callee: RunningNode, connections: list[Any]) -> list[bool]:
    """For each client connection, whether ``callee`` serves it on its lean channel (never handed
    over to twisted.web)."""
    assert callee.service.connections is not None
    by_port = {channel.transport.getPeer().port: channel
               for channel in callee.service.connections.protocols if channel.transport is not None}
    served = []
    for connection in connections:
        channel = by_port.get(connection.transport.getHost().port)
        assert isinstance(channel, LeanChannel)
        served.append(channel._inner is None)
    return served


async def _lend_a_burst(trio: Trio, count: int = 10) -> list[tuple[int, Any, Any]]:
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(count)])
    return list(results)


@pytest_twisted.ensureDeferred
async def test_forwards_relays_and_events_go_over_the_lean_client_to_the_lean_channel(trio: Trio) -> None:
    """Fails on the treq/twisted.web path: the node's peer client was twisted's Agent, and the
    offload routes were twisted.web (Klein) routes, so their connections were handed over."""
    await warm_and_link(trio)  # forwards master -> owner and master -> helper
    results = await _lend_a_burst(trio)
    assert [code for code, _, _ in results] == [200] * 10
    lent = [r for _, _, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to")]
    assert lent, "some of the backlog went to the helper through the master's relay"
    # forwards (master -> owner), relays (owner -> master -> helper) and events (owner -> master):
    # kept-alive connections of the lean client, each served by the peer's lean channel
    for caller, callee in ((trio.master, trio.owner), (trio.owner, trio.master), (trio.master, trio.helper)):
        connections = _peer_connections(caller, callee)
        assert connections, f"{caller.node.node_id} keeps lean connections to {callee.node.node_id}"
        assert all(_served_lean(callee, connections))


@pytest_twisted.ensureDeferred
async def test_a_grant_reaches_the_helper_over_the_lean_path(trio: Trio) -> None:
    """The master's grant to the helper (a control call) rides the lean pool, not the control one."""
    await warm_and_link(trio)
    await _lend_a_burst(trio)
    await wait_until(lambda: trio.helper.node.lending.queues["text"].is_enrolled("beta"))
    connections = _peer_connections(trio.master, trio.helper)
    assert connections and all(_served_lean(trio.helper, connections))
    control = trio.master.node.clients.control_agent
    assert isinstance(control, BackendAgent) and control is not trio.master.node.clients.peer_agent


@pytest_twisted.ensureDeferred
async def test_a_helper_killed_mid_relay_leaves_every_request_to_the_owner_and_loses_none(trio: Trio) -> None:
    """The helper dies while lent requests are in its hands (relayed, not yet answered): the
    master's lean relay sees the connection drop, the request comes back to the owner, who serves
    it; every client gets its 200 from the owner's model and nothing is answered twice."""
    await warm_and_link(trio)
    burst = [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)]
    await wait_until(lambda: trio.helper.node.lending.borrowed_requests() != [], timeout=3)
    await kill(trio.helper)
    results = await defer.gatherResults(burst)
    assert [code for code, _, _ in results] == [200] * 10
    assert all(payload["model"] == "alpha" for _, payload, _ in results)
    owner_queue = trio.owner.node.lending.queues["text"]
    assert owner_queue.lent("alpha") == [] and owner_queue.pending() == []
