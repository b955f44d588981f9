"""What the lending integration tests share: a master with no models, an owner slave and a helper
slave with simulator backends (``Trio``), requests, and the warm-up that fits costs and links the
owner's model to the helper's through the master's site API.

Time is scaled so a job takes about 100 ms (``JOB``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import treq
from twisted.internet import defer

from tests.integration.nodes import (
    FAST_TEXT,
    Cluster,
    RunningNode,
    knows,
    plan_cluster,
    slave,
    start_cluster,
    wait_until,
    write_models,
)

LENDING = {"scheduling_min_samples": 2, "offload_probe_idle": "100ms", "scheduling_refresh_interval": "10m"}
# 20 generated tokens at 200 tokens/s: a job takes ~100 ms on either node.
JOB = {**FAST_TEXT, "load_ms": 30, "gen_tokens_per_s": 200}

#: One node's models: local ID -> (its ``.kcpps``, its simulated weights).
Models = Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]


def text_models(context: int = 4096, **weights: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any],
                                                                                      Mapping[str, Any]]]:
    """Text models named by keyword, each on its own weights file, with ``context`` tokens."""
    return {name: ({"model": f"../weights/{name}.sim.json", "contextsize": context}, spec)
            for name, spec in weights.items()}


def image_models(**weights: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], Mapping[str, Any]]]:
    """Image models named by keyword (image ID ``<name>-<name>``), each on its own weights file."""
    return {name: ({"sdmodel": f"../weights/{name}.sim.json"}, spec) for name, spec in weights.items()}


class Trio(Cluster):
    """The master (no models), the ``owner`` slave and the ``helper`` slave."""

    owner = slave("owner")
    helper = slave("helper")


async def start_trio(root: Path, owner: Models, helper: Models, *, master_extra: Mapping[str, Any] = LENDING,
                     slave_extra: Mapping[str, Any] = LENDING,
                     owner_sections: Mapping[str, Mapping[str, Any]] | None = None,
                     helper_sections: Mapping[str, Mapping[str, Any]] | None = None,
                     master_sections: Mapping[str, Mapping[str, Any]] | None = None) -> Trio:
    """Start the three nodes and wait until the master knows every model of both slaves.
    ``owner_sections``/``helper_sections``: more config sections for a slave (another backend
    family)."""
    plan = plan_cluster(root, ["owner", "helper"])
    (plan.root / "master" / "models").mkdir(parents=True)
    for name, models in (("owner", owner), ("helper", helper)):
        write_models(plan.root / name, {m: kcpps for m, (kcpps, _w) in models.items()},
                     {m: weights for m, (_k, weights) in models.items()})
    slaves = {name: plan.slave_config(name, extra_cluster=dict(slave_extra), sections=sections)
              for name, sections in (("owner", owner_sections), ("helper", helper_sections))}
    started = await start_cluster(
        plan, plan.master_config(dict(master_extra), sections=master_sections), slaves,
        ready=lambda r: all(knows(r, **{node: m}) for node, models in (("owner", owner), ("helper", helper))
                            for m in models))
    return Trio(started.plan, started.master, started.slaves)


def chat(model: str, content: str = "tell me a short story please") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 20}


async def ask_chat(url: str, model: str, content: str = "tell me a short story please",
                   key: str = "") -> tuple[int, dict[str, Any], Any]:
    """POST a chat completion (with ``key`` as the bearer token when given); (status, JSON body,
    response)."""
    headers = {"Authorization": [f"Bearer {key}"]} if key else None
    response = await treq.post(url + "/v1/chat/completions", json=chat(model, content), headers=headers)
    return response.code, json.loads(await response.content()), response


async def warm_and_link(trio: Trio, owner: str = "alpha", helper: str = "beta", key: str = "") -> None:
    """Three requests to each text model, a cost refit on both slaves, then the text link
    ``owner/<owner> -> helper/<helper>`` (loads allowed), waited for until both slaves have it.
    ``key``: the inference key the warm-up requests carry.

    Each model's three go one after another (each request alone on its backend, as the samples the
    fit reads should be); the two models, on two nodes, warm at the same time (with ~1 s jobs and a
    slow load the warm-up was half of some lending tests' time)."""

    async def warm(model: str) -> None:
        for _ in range(3):
            code, payload, _ = await ask_chat(trio.master.url, model, key=key)
            assert code == 200, (model, code, payload)

    await defer.gatherResults([defer.Deferred.fromCoroutine(warm(model)) for model in (owner, helper)],
                              consumeErrors=True)
    for node in (trio.owner, trio.helper):
        await node.node._refit()
        assert node.node.lending.costs.models, "a cost fit from the warm-up samples"
    await link(trio, "text", owner, helper)


async def lend_to_the_master(master: RunningNode, owner: RunningNode) -> None:
    """After a warm-up of both models: a cost refit on both nodes, then the text link
    ``owner/alpha -> master/gamma`` (the master is the helper), waited for until the owner runs it."""
    await owner.node._refit()
    await master.node._refit()
    response = await treq.post(master.url + "/router/v1/site/text-routing-groups", json={
        "anchor": {"node_id": "owner", "model_id": "alpha"},
        "lends_to": [{"node_id": "master", "model_id": "gamma"}],
        "acknowledge_different_weights": True})
    assert response.code == 200, await response.content()
    await wait_until(lambda: owner.node.lending.queues["text"].is_owner("alpha"))


async def link(trio: Trio, lane: str, owner: str, helper: str) -> None:
    """Link the owner's model ``owner`` to the helper's ``helper`` in ``lane`` through the master's
    site API, and wait until both slaves run the link."""
    groups = "text-routing-groups" if lane == "text" else "routing-groups"
    response = await treq.post(trio.master.url + f"/router/v1/site/{groups}", json={
        "anchor": {"node_id": "owner", "model_id": owner},
        "lends_to": [{"node_id": "helper", "model_id": helper, "load_if_unloaded": True}],
        "acknowledge_different_weights": True})
    assert response.code == 200, await response.content()
    await wait_until(lambda: trio.owner.node.lending.queues[lane].is_owner(owner)
                     and trio.helper.node.lending.queues[lane].is_enrolled(helper))
