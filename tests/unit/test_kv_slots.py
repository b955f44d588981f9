"""KV slots kept across swaps: the keeper's bookkeeping (what is saved, bounded, keyed and restored), the
runtime slot's ``before_stop`` hook, llama-server's ``--slot-save-path`` and the metrics.

No sockets: llama-server's slot routes are a ``twisted.web`` resource behind ``treq.testing.StubTreq``
answering as llama.cpp b11434 does; time is a ``task.Clock``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import Request

from routerd.backends.families.base import FamilyWorld
from routerd.backends.families.llama_sdcpp import LlamaSdcppFamily
from routerd.backends.kv_slots import SlotKeeper, keeps_slots, kv_slot_keeper, session_hash, slot_file_name
from routerd.backends.readiness import probe_text
from routerd.backends.slot import RuntimeSlot, SlotState
from routerd.backends.testing import FakeBackendHTTP, FakeLauncher, PortCounter
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.load import parse_config
from routerd.metrics import NodeMetrics
from routerd.routing.call import Call
from routerd.routing.classify import classify

FOLDER = "/data/kv-slots"
H1, H2 = "1" * 64, "2" * 64


def model(local_id: str = "chat", model_hash: str = H1, **more: Any) -> ModelConfig:
    fields: dict[str, Any] = dict(local_id=local_id, filename=f"{local_id}.kcpps",
                                  path=f"/m/{local_id}.kcpps", backend_mode="llama_sdcpp",
                                  capabilities=Capabilities(llm=True), config_hash="c",
                                  text_model=f"/w/{local_id}.gguf", model_hash=model_hash)
    fields.update(more)
    return ModelConfig(**fields)


class SlotRoutes(Resource):
    """llama-server's ``POST /slots/{id}?action=save|restore``: files in a dict, sizes as given."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, int] = {}
        self.calls: list[tuple[int, str, str]] = []  # (port, action, filename)
        self.size = 1000
        self.status: dict[str, int] = {}  # action -> a forced status

    def render_POST(self, request: Request) -> bytes:
        port = request.getHost().port
        action = request.args[b"action"][0].decode()
        filename = json.loads(request.content.read())["filename"]
        self.calls.append((port, action, filename))
        forced = self.status.get(action)
        if forced is not None:
            request.setResponseCode(forced)
            return json.dumps({"error": {"code": forced, "message": "refused"}}).encode()
        if action == "save":
            self.files[filename] = self.size
            return json.dumps({"id_slot": 0, "filename": filename, "n_saved": 500,
                               "n_written": self.size}).encode()
        if filename not in self.files:
            request.setResponseCode(400)
            return b'{"error": {"code": 400, "message": "Unable to restore slot"}}'
        return json.dumps({"id_slot": 0, "filename": filename, "n_restored": 500,
                           "n_read": self.files[filename]}).encode()


@attrs.define
class World:
    routes: SlotRoutes
    stub: StubTreq
    keeper: SlotKeeper
    removed: list[str]

    def run(self, d: Deferred[Any] | Any) -> Any:
        """Fire ``d`` (a Deferred or a coroutine) with the stub's answers delivered."""
        if not isinstance(d, Deferred):
            d = Deferred.fromCoroutine(d)
        self.stub.flush()
        out: list[Any] = []
        d.addBoth(out.append)
        assert out, "not done"
        return out[0]

    def calls(self) -> list[tuple[str, str]]:
        return [(action, name) for _port, action, name in self.routes.calls]


def world(keep_count: int = 4, keep_bytes: int = 10**9) -> World:
    routes = SlotRoutes()
    stub = StubTreq(routes)
    removed: list[str] = []
    clock = Clock()
    keeper = SlotKeeper(stub, FOLDER, keep_count=keep_count, keep_bytes=keep_bytes, clock=clock.seconds,
                        remove=removed.append)
    return World(routes, stub, keeper, removed)


def served_then_stopped(w: World, config: ModelConfig, session: str, port: int = 41001) -> None:
    """A request of ``session`` on the process at ``port``, then that process stopped."""
    assert w.run(w.keeper.before_request(port, config, session)) is None
    assert w.run(w.keeper.before_stop(config, port)) is None


def test_the_last_session_a_process_served_is_saved_before_its_stop_and_restored_before_its_next_request(
) -> None:
    w, chat = world(), model()
    served_then_stopped(w, chat, "header:s1")
    [(action, name)] = w.calls()
    assert action == "save" and name.startswith(H1[:16] + "-") and name.endswith(".bin")
    assert "s1" not in name  # the session is hashed, never written as is
    assert w.keeper.kept_bytes == 1000

    w.run(w.keeper.before_request(41002, chat, "header:s1"))  # the model back, in a new process
    assert w.calls()[1] == ("restore", name)
    assert w.removed == [f"{FOLDER}/{name}"]  # restored: the slot holds it now
    assert not w.keeper.kept
    assert w.keeper.rows() == [("text", "chat", 1, 1, 1000, 1000, 0)]
    w.run(w.keeper.before_request(41002, chat, "header:s1"))  # the next turn: nothing to restore
    assert len(w.calls()) == 2


def test_only_the_last_session_of_a_process_is_saved_and_a_prompt_without_session_saves_none() -> None:
    w, chat = world(), model()
    w.run(w.keeper.before_request(41001, chat, "header:s1"))
    w.run(w.keeper.before_request(41001, chat, "header:s2"))
    w.run(w.keeper.before_stop(chat, 41001))
    assert [name for _a, name in w.calls()] == [slot_file_name(H1, _hash("header:s2"))]
    w.run(w.keeper.before_request(41003, chat, "header:s3"))
    w.run(w.keeper.before_request(41003, chat, None))  # slot 0 now holds a prompt nobody asks for again
    w.run(w.keeper.before_stop(chat, 41003))
    assert len(w.calls()) == 1


def _hash(session: str) -> str:
    return session_hash(session)


def test_the_kept_slots_stay_within_their_count_the_oldest_dropped_with_its_file() -> None:
    w, chat = world(keep_count=2), model()
    for n, session in enumerate(("header:s1", "header:s2", "header:s3")):
        served_then_stopped(w, chat, session, port=41001 + n)
    assert [slot.session for slot in w.keeper.kept.values()] == [_hash("header:s2"), _hash("header:s3")]
    assert w.removed == [f"{FOLDER}/{slot_file_name(H1, _hash('header:s1'))}"]
    w.run(w.keeper.before_request(41009, chat, "header:s1"))  # dropped: never restored
    assert [action for action, _ in w.calls()] == ["save", "save", "save"]


def test_the_kept_slots_stay_within_their_bytes_the_oldest_dropped() -> None:
    w, chat = world(keep_count=10, keep_bytes=2500), model()
    for n, session in enumerate(("header:s1", "header:s2", "header:s3", "header:s4")):
        served_then_stopped(w, chat, session, port=41001 + n)
    assert w.keeper.kept_bytes == 2000
    assert [slot.session for slot in w.keeper.kept.values()] == [_hash("header:s3"), _hash("header:s4")]
    w.routes.size = 3000  # one slot over the whole bound: not kept either
    served_then_stopped(w, chat, "header:s5", port=41010)
    assert not w.keeper.kept and w.keeper.kept_bytes == 0


def test_a_slot_saved_by_one_weight_file_is_never_restored_into_another() -> None:
    w = world()
    first, other = model("chat", H1), model("chat16", H2)
    served_then_stopped(w, first, "header:s1")
    w.run(w.keeper.before_request(41002, other, "header:s1"))  # same session, another file
    assert [action for action, _ in w.calls()] == ["save"]
    w.run(w.keeper.before_stop(model("chat", H2), 41002))  # the same config name, re-hashed weights
    w.run(w.keeper.before_request(41003, model("chat", H2), "header:s1"))
    assert ("restore", slot_file_name(H1, _hash("header:s1"))) not in w.calls()
    w.run(w.keeper.before_request(41004, first, "header:s1"))  # its own file: restored
    assert w.calls()[-1] == ("restore", slot_file_name(H1, _hash("header:s1")))


def test_a_process_stopped_for_another_weight_file_than_its_last_request_saves_nothing() -> None:
    w = world()
    w.run(w.keeper.before_request(41001, model("chat", H1), "header:s1"))
    w.run(w.keeper.before_stop(model("chat", H2), 41001))
    assert w.calls() == []


def test_a_process_started_before_the_catalog_was_hashed_saves_under_its_weight_files_hash() -> None:
    """A startup model's process holds the config loaded before hashing (no ``model_hash``): the hash of
    the same weight file its last request named keys the slot; another weight file saves nothing."""
    w = world()
    w.run(w.keeper.before_request(41001, model("chat", H1), "header:s1"))
    w.run(w.keeper.before_stop(model("chat", ""), 41001))
    assert w.calls() == [("save", slot_file_name(H1, _hash("header:s1")))]
    w.run(w.keeper.before_request(41002, model("chat", H1), "header:s2"))
    w.run(w.keeper.before_stop(model("chat", "", text_model="/w/elsewhere.gguf"), 41002))
    assert len(w.calls()) == 1  # s2 was not saved


def test_a_failed_save_never_fails_the_stop_and_keeps_nothing() -> None:
    w, chat = world(), model()
    w.routes.status["save"] = 500
    served_then_stopped(w, chat, "header:s1")
    assert not w.keeper.kept
    assert w.keeper.rows() == [("text", "chat", 0, 0, 0, 0, 1)]


def test_a_refused_restore_never_fails_the_request_and_drops_the_file() -> None:
    w, chat = world(), model()
    served_then_stopped(w, chat, "header:s1")
    w.routes.status["restore"] = 400  # e.g. a cache too small for the file
    assert w.run(w.keeper.before_request(41002, chat, "header:s1")) is None
    assert len(w.removed) == 1 and not w.keeper.kept
    assert w.keeper.rows() == [("text", "chat", 1, 0, 1000, 0, 1)]


class Refusing:
    """A client whose every POST fails (the backend gone, a timeout)."""

    def __init__(self) -> None:
        self.posts = 0

    def post(self, url: str, *, json: Any = None, timeout: float | None = None) -> Deferred[Any]:
        self.posts += 1
        return fail(ConnectionRefusedError(url))


def test_a_backend_that_cannot_be_reached_fails_neither_the_stop_nor_the_request() -> None:
    w, chat = world(), model()
    served_then_stopped(w, chat, "header:s1")
    refusing = Refusing()
    w.keeper.http = refusing
    assert w.run(w.keeper.before_request(41002, chat, "header:s1")) is None  # the restore fails
    served_then_stopped(w, chat, "header:s2", port=41003)  # and so does the save
    assert refusing.posts == 2
    assert w.keeper.rows()[0][-1] == 2 and not w.keeper.kept


def test_a_backend_without_slot_routes_is_skipped_without_counting_a_failure() -> None:
    w, chat = world(), model()
    w.routes.status["save"] = 501  # llama-server without --slot-save-path (404: the simulator)
    served_then_stopped(w, chat, "header:s1")
    assert not w.keeper.kept
    assert w.keeper.rows() == [("text", "chat", 0, 0, 0, 0, 0)]


def test_other_families_multi_slot_and_unhashed_models_are_left_alone() -> None:
    w = world()
    for config in (model(backend_mode="kobold"), model(parallel=2), model(model_hash=""),
                   model(model_hash="missing:x")):
        assert not keeps_slots(config)
        served_then_stopped(w, config, "header:s1")
    assert w.calls() == []
    assert keeps_slots(model(parallel=1)) and keeps_slots(model())


def test_a_keeper_with_no_count_does_nothing() -> None:
    w = world(keep_count=0)
    served_then_stopped(w, model(), "header:s1")
    assert w.calls() == []


# -- the runtime slot's hook ----------------------------------------------------------------------

class Hooked:
    def __init__(self, fails: bool = False) -> None:
        self.clock = Clock()
        self.launcher = FakeLauncher()
        self.http = FakeBackendHTTP(self.clock.seconds)
        self.calls: list[tuple[str, int]] = []
        self.pending: Deferred[None] = Deferred()
        self.fails = fails
        self.slot = RuntimeSlot("text", clock=self.clock, launcher=self.launcher,
                                argv_for=lambda m, port: ["llama-server", "--port", str(port)],
                                probe=lambda base_url: probe_text(self.http, base_url),
                                port_allocator=PortCounter(), name="llama-server",
                                before_stop=self.before_stop)

    def before_stop(self, config: ModelConfig, port: int) -> Deferred[None]:
        self.calls.append((config.local_id, port))
        if self.fails:
            return fail(RuntimeError("disk full"))
        return self.pending

    def ready(self, config: ModelConfig) -> None:
        d = self.slot.acquire(config)
        self.http.ready.add(self.launcher.spawned[-1].port)
        self.clock.advance(0.5)
        out: list[Any] = []
        d.addCallback(out.append)
        out[0].release()


def test_a_switch_stops_the_old_process_only_after_its_before_stop_hook() -> None:
    h = Hooked()
    h.ready(model("a"))
    old = h.launcher.spawned[0]
    h.slot.acquire(model("b"))
    assert h.calls == [("a", old.port)]
    assert old.running and h.slot.state is SlotState.SWITCHING and len(h.launcher.spawned) == 1
    h.pending.callback(None)
    assert not old.running and len(h.launcher.spawned) == 2


def test_an_unload_runs_the_hook_first_and_a_failing_hook_still_stops_the_process() -> None:
    h = Hooked(fails=True)
    h.ready(model("a"))
    old = h.launcher.spawned[0]
    done = h.slot.unload()
    assert h.calls == [("a", old.port)]
    assert not old.running and done.called and h.slot.state is SlotState.EMPTY


# -- the family, the config, the metrics -----------------------------------------------------------

def _family_argv(keeper: SlotKeeper | None) -> tuple[list[str], dict[str, Any]]:
    made: dict[str, tuple[Any, dict[str, Any]]] = {}

    def make(kind: str, name: str, argv_for: Any, probe: Any, **more: Any) -> Any:
        made[kind] = (argv_for, more)
        return None

    config = parse_config({"llama": {"binary_path": sys.executable}, "models": {"config_dir": "/"}},
                          base_dir="/", env={})
    world_ = FamilyWorld(Clock(), None, 1.0, keeper)
    LlamaSdcppFamily(config, make, world_.kv_slots)
    argv_for, more = made["text"]
    return argv_for(model(), 41001), more


def test_llama_server_gets_the_slot_folder_and_the_hook_only_when_slots_are_kept() -> None:
    argv, more = _family_argv(world().keeper)
    assert argv[argv.index("--slot-save-path") + 1] == FOLDER
    assert "before_stop" in more
    argv, more = _family_argv(None)
    assert "--slot-save-path" not in argv and "before_stop" not in more


def test_the_config_reads_slot_keep_count_and_slot_keep_mb_and_refuses_bad_values() -> None:
    config = parse_config({"models": {"config_dir": "/", "slot_keep_count": 3, "slot_keep_mb": 1.5}},
                          base_dir="/", env={})
    assert (config.models.slot_keep_count, config.models.slot_keep_bytes) == (3, 1572864)
    assert parse_config({"models": {"config_dir": "/"}}, base_dir="/", env={}).models.slot_keep_count == 0
    for bad in ({"slot_keep_count": -1}, {"slot_keep_count": "4"}, {"slot_keep_mb": 0}):
        try:
            parse_config({"models": {"config_dir": "/", **bad}}, base_dir="/", env={})
        except Exception as exc:
            assert "models.slot_keep" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


def test_metrics_count_slots_saved_restored_their_bytes_and_failures_per_runtime_and_model() -> None:
    w, chat = world(), model()
    served_then_stopped(w, chat, "header:s1")
    w.run(w.keeper.before_request(41002, chat, "header:s1"))
    metrics = NodeMetrics()
    metrics.watch_kv_slots(w.keeper.rows)
    text = metrics.render().decode()
    for line in ('routerd_kv_slots_saved_total{model="chat",runtime="text"} 1.0',
                 'routerd_kv_slots_restored_total{model="chat",runtime="text"} 1.0',
                 'routerd_kv_slot_bytes_total{direction="saved",model="chat",runtime="text"} 1000.0',
                 'routerd_kv_slot_bytes_total{direction="restored",model="chat",runtime="text"} 1000.0',
                 'routerd_kv_slot_failures_total{model="chat",runtime="text"} 0.0'):
        assert line in text.splitlines(), line


def test_the_node_keeper_has_its_folder_under_the_store_dir_emptied_of_a_previous_runs_files(
        tmp_path: Path) -> None:
    folder = tmp_path / "store" / "kv-slots"
    folder.mkdir(parents=True)
    (folder / "old-slot.bin").write_bytes(b"kv")
    (folder / "notes.txt").write_text("not ours")
    data = {"models": {"config_dir": str(tmp_path), "slot_keep_count": 2},
            "cluster": {"store_dir": str(tmp_path / "store")}}
    keeper = kv_slot_keeper(parse_config(data, base_dir=str(tmp_path), env={}), Refusing(), Clock())
    assert keeper is not None and keeper.folder == str(folder) and keeper.keep_count == 2
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    off = parse_config({"models": {"config_dir": str(tmp_path)}}, base_dir=str(tmp_path), env={})
    assert kv_slot_keeper(off, Refusing(), Clock()) is None


def _chat_call(*, session: str = "", user: str | None = None, system: str = "be brief") -> Call:
    route = classify("POST", "/v1/chat/completions")
    assert route is not None
    parsed: dict[str, Any] = {"model": "chat", "messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": "hi"}]}
    if user is not None:
        parsed["user"] = user
    return Call(reply=None, route=route, path="/v1/chat/completions",  # type: ignore[arg-type]
                body=json.dumps(parsed).encode(), content_type="application/json", parsed=parsed,
                stream=False, request_id="r1", started=0.0, selector="chat", session=session)


@pytest.mark.parametrize("source", ["header", "user", "prompt", "auto"])
def test_the_node_keeper_keys_a_slot_by_the_session_replica_choice_steers_by(
        tmp_path: Path, source: str) -> None:
    """``routing.affinity_key`` names one session for both: a keeper on ``user`` keys two chats of
    one user (other headers, other prompts) alike, and a keeper on ``header`` ignores the user."""
    data = {"models": {"config_dir": str(tmp_path), "slot_keep_count": 2},
            "cluster": {"store_dir": str(tmp_path / "store")}, "routing": {"affinity_key": source}}
    keeper = kv_slot_keeper(parse_config(data, base_dir=str(tmp_path), env={}), Refusing(), Clock())
    assert keeper is not None and keeper.key_source == source
    first = _chat_call(session="s1", user="ann", system="be brief")
    other_header = _chat_call(session="s2", user="ann", system="be brief")
    other_user = _chat_call(session="s1", user="bob", system="be brief")
    other_prompt = _chat_call(session="s1", user="ann", system="be long")
    same = {name: keeper.session_of(first) == keeper.session_of(made)
            for name, made in (("header", other_header), ("user", other_user), ("prompt", other_prompt))}
    expected = {"header": {"header": False, "user": True, "prompt": True},
                "user": {"header": True, "user": False, "prompt": True},
                "prompt": {"header": True, "user": True, "prompt": False},
                "auto": {"header": False, "user": True, "prompt": True}}[source]
    assert same == expected
