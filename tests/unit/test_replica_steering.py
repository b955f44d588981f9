"""The master's replica choice beyond rotation (``routerd.cluster.steering``, issue 33) on a real
registry, the nodes' statuses as a master's latest poll holds them, a real decision log and metrics.

Three replicas of ``chat``: on the master ``m`` and the slaves ``a`` and ``b``.  Costs: each node's
fit of ``chat`` (ms = base + slope × prompt tokens + slope × output tokens) and token profile, as
the runtime status carries them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.cluster.steering import ReplicaSteering, model_mode
from routerd.config.routing import RoutingConfig
from routerd.lending.decisions import DecisionLog
from routerd.metrics import NodeMetrics
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.registry import Registry
from routerd.registry.replica_choice import key_hash
from routerd.routing.call import Call
from routerd.routing.choice import Forward, Local, RoutingView, choose
from routerd.routing.classify import classify
from routerd.store.decisions import COLUMNS
from routerd.wire.lending import Costs, LaneStatus, ModelCost, QueueStat, TokenProfile
from routerd.wire.records import ModelRecord, Snapshot, record_from_config
from routerd.wire.status import RuntimeStatus

TEXT = Capabilities(llm=True, context=8192)


def config(local_id: str = "chat", mode: str | None = None) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/m/{local_id}.kcpps",
                       backend_mode="llama", capabilities=TEXT, config_hash="c" * 64,
                       replica_choice=mode)  # type: ignore[arg-type]


def registry(nodes: tuple[str, ...] = ("a", "b"), *, master_has: bool = True,
             mode: str | None = None) -> Registry:
    reg = Registry("m", "http://m:8080", MemoryPublicIdStore())
    reg.update_local([record_from_config(config(mode=mode), node_id="m", node_url="")] if master_has else [])
    for node in nodes:
        url = f"http://{node}:8080"
        reg.update_node(Snapshot(node_id=node, node_url=url, build_version="x", protocol_version=2,
                                 models=(record_from_config(config(mode=mode), node_id=node, node_url=url),)),
                        url)
    return reg


def costs(base_ms: float, per_output_ms: float = 0.0) -> Costs:
    return Costs(models=(ModelCost("chat", "llm", base_ms, (0.0, per_output_ms), 50),),
                 tokens=(TokenProfile("chat", 4.0, 1000, 50),))


def status(node: str, fit: Costs, backlog: int = 0, backlog_work: tuple[float, ...] = ()) -> RuntimeStatus:
    queue = (QueueStat("chat", backlog_count=backlog, backlog_work=backlog_work),) if backlog else ()
    return RuntimeStatus(node_id=node, lanes={"text": LaneStatus(queue=queue)}, costs=fit)


class FakeMaster:
    """What the steering reads of a master: its registry and its latest statuses."""

    def __init__(self, reg: Registry, statuses: Mapping[str, RuntimeStatus], clock: Clock) -> None:
        self.registry = reg
        self.latest = dict(statuses)
        self.clock = clock
        self.polls = 0
        self.reserved_then: dict[str, float] = {}  # what the master held reserved at the poll

    def latest_statuses(self) -> tuple[dict[str, RuntimeStatus], float | None, dict[str, float]]:
        return self.latest, self.clock.seconds(), self.reserved_then

    def statuses(self) -> Deferred[dict[str, RuntimeStatus]]:
        self.polls += 1
        return succeed(self.latest)


class Log:
    """A decision log without a store: the rows it would write."""

    def __init__(self, clock: Clock) -> None:
        self.log = DecisionLog(None, clock, "m")
        self.rows: list[dict[str, Any]] = []
        self.log.observe(lambda row, _count: self.rows.append(dict(row)))


def steering(reg: Registry, statuses: Mapping[str, RuntimeStatus], **settings: Any
             ) -> tuple[ReplicaSteering, Log, NodeMetrics]:
    clock = Clock()
    log, metrics = Log(clock), NodeMetrics()
    routing = RoutingConfig(**settings)
    steer = ReplicaSteering(master=FakeMaster(reg, statuses, clock), settings=lambda: routing,  # type: ignore[arg-type]
                            context_reserve=lambda: 256, decisions=log.log, metrics=metrics, clock=clock)
    return steer, log, metrics


def call(*, session: str = "", user: str | None = None, system: str = "be brief", turn: int = 0,
         max_tokens: int = 10, request_id: str = "r1") -> Call:
    route = classify("POST", "/v1/chat/completions")
    assert route is not None
    messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                      {"role": "user", "content": "hi"}]
    for i in range(turn):
        messages += [{"role": "assistant", "content": f"answer {i}"},
                     {"role": "user", "content": f"more {i}"}]
    parsed: dict[str, Any] = {"model": "chat", "messages": messages, "max_tokens": max_tokens}
    if user is not None:
        parsed["user"] = user
    return Call(reply=None, route=route, path="/v1/chat/completions",  # type: ignore[arg-type]
                body=json.dumps(parsed).encode(), content_type="application/json", parsed=parsed,
                stream=False, request_id=request_id, started=0.0, selector="chat", session=session)


def chosen(steer: ReplicaSteering, made: Call) -> str:
    steered = steer.steer(made, "chat", "text")
    assert steered is not None
    return steered.record.node_id


def hold(reg: Registry, steer: ReplicaSteering, made: Call) -> str:
    """Choose and reserve (what the front does), the reservation kept: the work stays in flight."""
    steered = steer.steer(made, "chat", "text")
    assert steered is not None
    reg.reserve(steered.record, "text", seconds=steered.seconds)
    return steered.record.node_id


EVEN = {node: status(node, costs(1000.0, 10.0)) for node in ("m", "a", "b")}


# -- least_loaded --------------------------------------------------------------------------------

def test_least_loaded_weighs_predicted_seconds_not_request_counts() -> None:
    """Node a reports one queued job of 500 output tokens (6 s); b three of 10 (3.3 s) and the master
    two of 10 (2.2 s): by count a is the lightest, by predicted seconds the master is."""
    statuses = {"m": status("m", costs(1000.0, 10.0), 2, (20.0, 20.0)),
                "a": status("a", costs(1000.0, 10.0), 1, (10.0, 500.0)),
                "b": status("b", costs(1000.0, 10.0), 3, (30.0, 30.0))}
    steer, log, _metrics = steering(registry(), statuses, replica_choice="least_loaded")
    assert chosen(steer, call()) == "m"
    [row] = log.rows
    assert (row["kind"], row["outcome"], row["reason"], row["helper_node_id"]) == \
        ("replica_choice", "least_loaded", "least_loaded", "m")
    assert row["load_ms"] == pytest.approx(2200.0)
    assert row["service_ms"] == pytest.approx(1100.0)  # 1000 + 10 × the 10 tokens asked for


def test_least_loaded_prices_each_replica_with_its_own_fit() -> None:
    """The same queued job on a slow node weighs more: a (fit 3 s a job) holds one, b (0.5 s) two."""
    statuses = {"a": status("a", costs(3000.0), 1, (10.0, 10.0)),
                "b": status("b", costs(500.0), 2, (20.0, 20.0))}
    steer, _log, _metrics = steering(registry(master_has=False), statuses, replica_choice="least_loaded")
    assert chosen(steer, call()) == "b"


def test_least_loaded_counts_the_work_the_master_holds_in_flight() -> None:
    """Nothing reported: each request held goes to the replica with the least reserved seconds; a
    long one (200 tokens: 3 s) outweighs two short ones (2 × 1.1 s)."""
    steer, _log, _metrics = steering(registry(("a",), master_has=True), EVEN, replica_choice="least_loaded")
    reg = steer.registry
    first = hold(reg, steer, call(max_tokens=200))
    second = hold(reg, steer, call(max_tokens=10))
    assert first != second
    assert hold(reg, steer, call(max_tokens=10)) == second, "1.1 s is under 3 s"
    assert hold(reg, steer, call(max_tokens=10)) == second, "2.2 s is still under 3 s"
    assert hold(reg, steer, call(max_tokens=10)) == first, "3.3 s is over 3 s"


def test_a_reported_queue_of_the_masters_own_requests_is_not_counted_again_once_they_end() -> None:
    """a reported three jobs (3.3 s) when the master held exactly those reserved there; they have
    ended since.  b reported one job of its own clients (1.1 s).  a is the lighter now: its report
    was the master's own work, which ended; b's is work the master never saw."""
    statuses = {"a": status("a", costs(1000.0, 10.0), 3, (30.0, 30.0)),
                "b": status("b", costs(1000.0, 10.0), 1, (10.0, 10.0))}
    steer, log, _metrics = steering(registry(master_has=False), statuses, replica_choice="least_loaded")
    steer.master.reserved_then = {"a:chat:text": 3.3}  # type: ignore[attr-defined]
    assert chosen(steer, call()) == "a"
    assert log.rows[0]["load_ms"] == pytest.approx(0.0)


def test_least_loaded_breaks_ties_by_rotation_never_by_list_order() -> None:
    steer, log, _metrics = steering(registry(), EVEN, replica_choice="least_loaded")
    picks = [chosen(steer, call()) for _ in range(6)]
    assert picks == ["a", "b", "m", "a", "b", "m"]
    assert {row["reason"] for row in log.rows} == {"tie_rotation"}


def test_unpriced_replicas_count_each_request_as_one_second() -> None:
    """No node has a fit: the loads compare request counts (one queued on a, none on b)."""
    statuses = {"a": status("a", Costs(), 1, (10.0, 10.0)), "b": status("b", Costs())}
    steer, log, _metrics = steering(registry(master_has=False), statuses, replica_choice="least_loaded")
    assert chosen(steer, call()) == "b"
    assert log.rows[0]["service_ms"] == pytest.approx(1000.0)


def test_a_replica_without_a_fit_is_priced_with_another_replicas_fit() -> None:
    """b has no fit: its one long queued job is priced with a's fit (10 s), so a's two short ones
    (4 s) weigh less, where counting requests would pick b."""
    statuses = {"a": status("a", costs(1000.0, 10.0), 2, (20.0, 200.0)),
                "b": status("b", Costs(), 1, (10.0, 900.0))}
    steer, _log, _metrics = steering(registry(master_has=False), statuses, replica_choice="least_loaded")
    assert chosen(steer, call()) == "a"


# -- affinity ------------------------------------------------------------------------------------

def test_affinity_keeps_a_session_on_one_replica_turn_after_turn() -> None:
    steer, log, metrics = steering(registry(), EVEN, replica_choice="affinity")
    homes = {chosen(steer, call(session="chat-7", turn=turn)) for turn in range(10)}
    assert len(homes) == 1
    assert [row["reason"] for row in log.rows] == ["affinity_new"] + ["affinity_hit"] * 9
    assert {row["key_hash"] for row in log.rows} == {key_hash("header:chat-7")}
    [home] = homes
    assert metrics.replica_choices.child("chat", home, "affinity", "affinity_hit").value == 9


def test_affinity_never_writes_the_raw_key_or_the_prompt() -> None:
    steer, log, _metrics = steering(registry(), EVEN, replica_choice="affinity")
    chosen(steer, call(session="secret-session", system="secret system prompt"))
    chosen(steer, call(system="secret system prompt"))
    written = json.dumps(log.rows)
    assert "secret" not in written
    assert all(len(row["key_hash"]) == 16 for row in log.rows)
    assert set(COLUMNS) >= set(log.rows[0]) - {"id"}


@pytest.mark.parametrize(("source", "made", "key"), [
    ("auto", call(session="s-1", user="u-1"), "header:s-1"),
    ("auto", call(user="u-1"), "user:u-1"),
    ("user", call(session="s-1", user="u-1"), "user:u-1"),
    ("header", call(user="u-1"), None),
])
def test_the_key_source_is_chosen_by_config(source: str, made: Call, key: str | None) -> None:
    steer, log, _metrics = steering(registry(), EVEN, replica_choice="affinity", affinity_key=source)
    chosen(steer, made)
    assert log.rows[0]["key_hash"] == (key_hash(key) if key else "")
    assert log.rows[0]["reason"] == ("affinity_new" if key else "tie_rotation")


def test_the_prompt_key_is_the_same_for_every_turn_of_one_chat_and_differs_between_chats() -> None:
    steer, log, _metrics = steering(registry(), EVEN, replica_choice="affinity", affinity_key="prompt")
    for turn in range(4):
        chosen(steer, call(system="persona A", turn=turn))
    chosen(steer, call(system="persona B"))
    hashes = [row["key_hash"] for row in log.rows]
    assert len(set(hashes[:4])) == 1 and hashes[4] != hashes[0]


def test_a_session_whose_replica_is_over_the_bound_moves_and_stays_moved() -> None:
    steer, log, metrics = steering(registry(master_has=False), EVEN, replica_choice="affinity")
    home = chosen(steer, call(session="s"))
    # the home replica's node now reports a deep queue: over 1.25 × the mean
    steer.master.latest[home] = status(home, costs(1000.0, 10.0), 10, (100.0, 100.0))  # type: ignore[attr-defined]
    moved = chosen(steer, call(session="s"))
    assert moved != home
    assert log.rows[-1]["reason"] == "affinity_moved"
    assert log.rows[-1]["moved_from"] == f"{home}:chat"
    assert metrics.replica_bound_moves.child("chat", home).value == 1
    # the queue drains: the session stays where it moved
    steer.master.latest[home] = status(home, costs(1000.0, 10.0))  # type: ignore[attr-defined]
    assert chosen(steer, call(session="s")) == moved
    assert log.rows[-1]["reason"] == "affinity_hit"


def test_a_session_whose_replica_went_away_is_placed_again() -> None:
    reg = registry()
    steer, log, _metrics = steering(reg, EVEN, replica_choice="affinity")
    home = chosen(steer, call(session="s"))
    if home == "m":
        reg.update_local([])
    else:
        reg.mark_unhealthy(f"http://{home}:8080")
    again = chosen(steer, call(session="s"))
    assert again != home and log.rows[-1]["reason"] == "affinity_gone"


def test_many_sessions_keep_every_replica_within_the_bound() -> None:
    """60 requests of 20 sessions, equal jobs, none ending: no replica ever holds more than 1.25 ×
    the mean rounded up to a whole job."""
    steer, _log, _metrics = steering(registry(), EVEN, replica_choice="affinity")
    reg = steer.registry
    for i in range(60):
        hold(reg, steer, call(session=f"s{i % 20}", request_id=f"r{i}"))
        loads = [reg.busy_seconds(r, "text") for r in reg.usable("chat", "text")]
        mean = sum(loads) / len(loads)
        assert max(loads) <= max(1.25 * mean + 1.1, min(loads) + 1.1) + 1e-6


# -- the mode -------------------------------------------------------------------------------------

def test_rotation_leaves_the_choice_to_the_registry() -> None:
    steer, log, _metrics = steering(registry(), EVEN)
    assert steer.steer(call(session="s"), "chat", "text") is None
    assert log.rows == []


def test_a_models_own_mode_overrides_the_site_mode() -> None:
    steer, log, _metrics = steering(registry(mode="affinity"), EVEN, replica_choice="rotation")
    assert steer.steer(call(session="s"), "chat", "text") is not None
    assert log.rows[0]["outcome"] == "affinity"
    records = [ModelRecord(local_id="x", node_id="a", replica_choice="no-such-mode"),
               ModelRecord(local_id="x", node_id="b", replica_choice="least_loaded")]
    assert model_mode(records, "rotation") == "least_loaded"
    assert model_mode(records[:1], "affinity") == "affinity"


def test_the_routing_choice_forwards_to_the_steered_replica_with_its_seconds() -> None:
    """``choose`` on a master's site view uses the steering: the target names the replica it chose
    and carries the request's predicted seconds there (reserved with it)."""
    reg = registry(master_has=False)
    steer, _log, _metrics = steering(reg, EVEN, replica_choice="affinity")
    view = RoutingView(node_id="m", catalog=lambda: None, loaded_config=lambda _k: None,  # type: ignore[arg-type,return-value]
                       guardians=lambda: None, registry=reg, routes=True, steer=steer.steer)
    targets = [choose(call(session="s", turn=t), view) for t in range(3)]
    assert all(isinstance(t, Forward) for t in targets)
    assert len({t.record.node_id for t in targets if isinstance(t, Forward)}) == 1
    assert all(t.seconds == pytest.approx(1.1) for t in targets if isinstance(t, Forward | Local))
