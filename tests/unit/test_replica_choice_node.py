"""``routing.replica_choice`` on real nodes in memory (issue 33): a master with no model of its own and
two slaves ``sa`` and ``sb`` serving the same ``chat`` (one public ID, two replicas), simulator
backends on one Clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.node import Node
from tests.unit.node_fixture import TEXT, World, master_cluster, slave_cluster

SLAVES = ("sa", "sb")


def site(tmp_path: Path, mode: str, *, timed: bool = False) -> tuple[World, Node]:
    """``timed``: the simulators run at their speed on the clock (100 tokens/s), else instantly."""
    world = World(tmp_path)
    timing = {"llama": {"extra_args": []}} if timed else {}
    slaves = [world.node(name, {"chat": TEXT}, cluster=slave_cluster(f"http://{name}.test:8080"), **timing)
              for name in SLAVES]
    master = world.node("master", {}, cluster=master_cluster(
        slave_urls=[f"http://{name}.test:8080" for name in SLAVES]), routing={"replica_choice": mode})
    world.start(*slaves, master)
    return world, master


def body(turn: int, *, max_tokens: int = 2, persona: str = "helpful") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"you are {persona}"},
                                      {"role": "user", "content": "hello"}]
    for i in range(turn):
        messages += [{"role": "assistant", "content": f"reply {i}"}, {"role": "user", "content": f"next {i}"}]
    return {"model": "chat", "messages": messages, "max_tokens": max_tokens}


def served_by(world: World, master: Node, payload: dict[str, Any], **headers: str) -> str:
    response, _body = world.call("POST", master, "/v1/chat/completions", json=payload,
                                 headers={k.replace("_", "-"): [v] for k, v in headers.items()})
    assert response.code == 200
    return str(response.headers.getRawHeaders(b"x-routerd-node")[0].decode())


def metrics(world: World, master: Node) -> str:
    _response, text = world.call("GET", master, "/metrics")
    return text.decode()


def test_affinity_keeps_each_session_on_one_replica_and_spreads_sessions(tmp_path: Path) -> None:
    """Ten turns of each of seven sessions (by X-Session-Id), interleaved (an odd count: rotation
    would move every session at every turn): every turn of a session is served by the node that
    served its first; the sessions use both replicas."""
    world, master = site(tmp_path, "affinity")
    homes: dict[str, set[str]] = {}
    for turn in range(10):
        for session in ("s1", "s2", "s3", "s4", "s5", "s6", "s7"):
            homes.setdefault(session, set()).add(served_by(world, master, body(turn), X_Session_Id=session))
    assert all(len(nodes) == 1 for nodes in homes.values()), homes
    assert set().union(*homes.values()) == set(SLAVES)
    text = metrics(world, master)
    hits = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("routerd_replica_choices_total{") and 'reason="affinity_hit"' in line)
    assert hits == 63  # 7 sessions x 9 later turns


def test_affinity_by_prompt_keeps_a_chat_without_a_session_header_together(tmp_path: Path) -> None:
    """No header, no ``user``: the system prompt and first user turn key the chat."""
    world, master = site(tmp_path, "affinity")
    nodes = {served_by(world, master, body(turn, persona="a pirate")) for turn in range(8)}
    assert len(nodes) == 1


def test_affinity_rows_carry_the_key_hash_never_the_key(tmp_path: Path) -> None:
    world, master = site(tmp_path, "affinity")
    for turn in range(3):
        served_by(world, master, body(turn), X_Session_Id="very-private-session")
    world.clock.advance(2)  # the decision log's flush
    rows = world.run(world.stores["master"].query_decisions(kind="replica_choice"))
    assert [r["reason"] for r in sorted(rows, key=lambda r: r["id"])] == \
        ["affinity_new", "affinity_hit", "affinity_hit"]
    assert "very-private-session" not in json.dumps(rows)
    assert len({r["key_hash"] for r in rows}) == 1


def test_least_loaded_sends_work_past_a_replica_busy_with_a_long_request(tmp_path: Path) -> None:
    """One long request (900 tokens: 9 s) holds a replica; the short requests sent while it runs all
    go to the other replica, where rotation would send every second one behind the long one."""
    world, master = site(tmp_path, "least_loaded", timed=True)
    http = world.network.client(world.clock)
    long = http.request("POST", f"http://{world.netlocs[master]}/v1/chat/completions",
                        json=body(0, max_tokens=900))
    while world.network.flush():
        pass
    shorts = [served_by(world, master, body(0, max_tokens=1)) for _ in range(4)]
    response = world.run(long)
    busy = response.headers.getRawHeaders(b"x-routerd-node")[0].decode()
    assert shorts == [next(n for n in SLAVES if n != busy)] * 4
