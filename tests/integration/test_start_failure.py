"""A node whose start fails part-way (its startup model does not load, after its store opened and its
listener answered 503 ``starting``) is stopped by the test helper that started it: its store's worker
thread and its listener do not live on into the tests that run after it in the same process (one that
did once made a later test count a store thread that was not its own)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import pytest_twisted

from routerd.errors import HTTPError
from tests.integration.nodes import FAST_TEXT, node_config, sim_model, start_node, write_models
from tests.ports import free_port


@pytest_twisted.ensureDeferred
async def test_a_node_whose_startup_model_fails_to_load_leaves_no_store_thread_and_no_listener(
        tmp_path: Path) -> None:
    write_models(tmp_path, {"broken": sim_model("broken", extra_args=["--sim-fail-load"])},
                 {"broken": FAST_TEXT})
    port = free_port()
    before = set(threading.enumerate())
    with pytest.raises(HTTPError, match="failed to load"):
        await start_node(node_config(tmp_path, {"server": {"bind": f"127.0.0.1:{port}"},
                                                "models": {"startup_model": "broken"}}))
    started = [t for t in threading.enumerate() if t not in before and "routerd-store" in t.name]
    for thread in started:
        thread.join(timeout=5)  # a closed store's thread ends (it may still be returning)
    assert [t.name for t in started if t.is_alive()] == []
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))
