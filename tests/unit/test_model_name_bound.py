"""Model names are bounded (256 bytes) before anything stores, logs or echoes them: a longer one
is a 400 that does not repeat it, and its access line keeps only the start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.logger import capturedLogs

from routerd.logs import request_model
from routerd.routing.classify import classify
from routerd.routing.selector import MAX_MODEL_BYTES, SelectorError, select_model
from tests.unit.node_fixture import TEXT, World

CHAT = classify("POST", "/v1/chat/completions")
LONG = "m" * (MAX_MODEL_BYTES + 1)


@pytest.mark.parametrize("where", ["json", "query", "header"])
def test_a_selector_past_the_bound_is_refused_wherever_it_is_given(where: str) -> None:
    assert CHAT is not None
    body = json.dumps({"model": LONG}).encode() if where == "json" else b"{}"
    query = {"model": [LONG]} if where == "query" else {}
    headers = {"X-Routerd-Model": LONG} if where == "header" else {}
    with pytest.raises(SelectorError, match=f"longer than {MAX_MODEL_BYTES} bytes"):
        select_model(CHAT, body, "application/json", query, headers)


def test_the_bound_counts_bytes_and_a_name_at_the_bound_passes() -> None:
    assert CHAT is not None
    at = "é" * (MAX_MODEL_BYTES // 2)  # 256 bytes
    assert select_model(CHAT, json.dumps({"model": at}).encode(), "application/json", {}, {}).model == at
    with pytest.raises(SelectorError):
        select_model(CHAT, json.dumps({"model": at + "x"}).encode(), "application/json", {}, {})


def test_a_megabyte_model_name_is_a_400_that_neither_echoes_nor_logs_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    huge = "x" * (1 << 20)
    with capturedLogs() as events:
        for path, body in (("/v1/chat/completions", {"model": huge, "messages": []}),
                           ("/api/chat", {"model": huge, "messages": []}), ("/api/show", {"model": huge})):
            response, content = world.call("POST", node, path, data=json.dumps(body).encode(),
                                           headers={"Content-Type": "application/json"})
            assert response.code == 400, path
            assert len(content) < 500 and b"256 bytes" in content, path
        response, _ = world.call("POST", node, "/v1/chat/completions?model=" + "y" * 6000,
                                 data=b"{}", headers={"Content-Type": "application/json"})
        assert response.code == 400
    assert max(len(repr(_values(event))) for event in events) < 20_000


def _values(event: dict[str, Any]) -> list[Any]:
    return [value for key, value in event.items() if key != "log_logger"]


def test_an_access_line_keeps_the_start_of_a_long_name() -> None:
    shown = request_model(None, "z" * 5000, "", None)
    assert shown.startswith("z" * 64) and len(shown) < 100 and "5000" in shown
    assert request_model(None, "chat", "", None) == "chat"
