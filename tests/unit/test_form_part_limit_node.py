"""``limits.max_form_parts`` on a real node in memory (one ``task.Clock``, no sockets): a
``multipart/form-data`` upload with more parts than the limit is refused 413 ``too_many_parts`` with a
JSON reason before routing reads its parts; one at the limit goes on to routing."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.node_fixture import World

CT = "multipart/form-data; boundary=XyZ"


def _form(parts: int) -> bytes:
    one = b'--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nnope\r\n'
    return one * parts + b"--XyZ--\r\n"


def test_a_form_past_max_form_parts_is_refused_413_with_a_json_reason(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("box", {}, limits={"max_form_parts": 8})
    world.start(node)
    response, body = world.call("POST", node, "/v1/audio/transcriptions", data=_form(9),
                                headers={"Content-Type": CT})
    assert response.code == 413, body
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_parts" and "more than 8 parts" in error["message"]
    response, body = world.call("POST", node, "/v1/audio/transcriptions", data=_form(8),
                                headers={"Content-Type": CT})
    assert response.code == 404, body  # at the limit: routed (to a model this node does not have)


def test_the_default_limit_is_64_parts(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("box", {})
    world.start(node)
    assert node.config.limits.max_form_parts == 64
    response, body = world.call("POST", node, "/v1/audio/transcriptions", data=_form(65),
                                headers={"Content-Type": CT})
    assert response.code == 413 and json.loads(body)["error"]["code"] == "too_many_parts"
