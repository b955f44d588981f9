"""Readiness judgements (reference §4.2, llama_sdcpp column) and the probes over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
from treq.testing import StubTreq
from twisted.web.resource import Resource
from twisted.web.server import Request

from routerd.backends.readiness import models_ready, probe_image, probe_stt, probe_text, sd_models_ready
from routerd.backends.testing import FakeBackendHTTP


@pytest.mark.parametrize(
    ("body", "ready"),
    [
        ({"object": "list", "data": [{"id": "qwen.gguf"}]}, True),
        ({"models": [{"name": "qwen", "model": "qwen"}], "data": [{"id": "qwen"}]}, True),
        ({"data": [{"id": "inactive"}]}, False),
        ({"data": [{"id": "inactive"}, {"id": "inactive"}]}, False),
        ({"data": [{"id": "inactive"}, {"id": "emb"}]}, True),
        ({"data": [{"id": "x"}], "model": "inactive"}, False),
        ({"data": [], "id": "inactive"}, False),
        ({"data": []}, True),
        ([{"id": "x"}], False),
        ("loading", False),
    ],
)
def test_text_is_ready_unless_every_listed_id_is_inactive(body: Any, ready: bool) -> None:
    assert models_ready(body) is ready


@pytest.mark.parametrize(
    ("body", "ready"),
    [
        ([{"title": "sdxl", "model_name": "sdxl"}], True),
        ([{"model_name": "", "title": "", "model": "", "id": "sd15"}], True),
        ([{"model_name": "inactive"}], False),
        ([{"title": "inactive", "model_name": ""}], False),
        ([{"filename": "x.safetensors"}], False),
        ([], False),
        ({"data": [{"model": "flux"}]}, True),
        ({"error": "loading"}, False),
    ],
)
def test_image_is_ready_when_some_entry_names_an_active_model(body: Any, ready: bool) -> None:
    assert sd_models_ready(body) is ready


def result(d: Any) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out
    return out[0]


def test_probes_ask_each_backend_its_own_endpoint() -> None:
    http = FakeBackendHTTP()
    http.ready.add(9000)
    assert result(probe_text(http, "http://127.0.0.1:9000")) is True
    assert result(probe_image(http, "http://127.0.0.1:9000")) is True
    assert result(probe_stt(http, "http://127.0.0.1:9000")) is True
    assert [u for _, u in http.requests] == [
        "http://127.0.0.1:9000/v1/models",
        "http://127.0.0.1:9000/sdapi/v1/sd-models",
        "http://127.0.0.1:9000/health",
    ]


def test_503_while_loading_and_connection_refused_mean_not_yet() -> None:
    http = FakeBackendHTTP()
    http.listening.add(9001)
    for probe in (probe_text, probe_image, probe_stt):
        assert result(probe(http, "http://127.0.0.1:9001")) is False
        assert result(probe(http, "http://127.0.0.1:9002")) is False  # nothing listening


class Backend(Resource):
    isLeaf = True

    def __init__(self, code: int, body: bytes) -> None:
        super().__init__()
        self.code, self.body = code, body
        self.paths: list[bytes] = []

    def render_GET(self, request: Request) -> bytes:  # noqa: N802
        self.paths.append(request.path)
        request.setResponseCode(self.code)
        return self.body


def test_text_probe_through_stubtreq_reads_the_models_list() -> None:
    inactive = Backend(200, json.dumps({"data": [{"id": "inactive"}]}).encode())
    assert result(probe_text(StubTreq(inactive), "http://127.0.0.1:9003")) is False
    active = Backend(200, json.dumps({"data": [{"id": "qwen"}]}).encode())
    assert result(probe_text(StubTreq(active), "http://127.0.0.1:9003")) is True
    assert active.paths == [b"/v1/models"]


def test_health_probe_through_stubtreq_needs_2xx_only() -> None:
    assert result(probe_stt(StubTreq(Backend(200, b"")), "http://127.0.0.1:9004")) is True
    assert result(probe_stt(StubTreq(Backend(503, b"{}")), "http://127.0.0.1:9004")) is False


def test_a_body_that_is_not_json_is_not_ready() -> None:
    assert result(probe_image(StubTreq(Backend(200, b"<html>")), "http://127.0.0.1:9005")) is False
