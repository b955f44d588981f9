"""A keyless node against web pages (:mod:`routerd.api.browser`): a page on another origin cannot
change it, a page under a rebound name cannot use it, and curl, scripts and the node's own WebUI
are served as before.  Then the rules on their own, ``server.allowed_hosts``, and names that do not
parse (a JSON 400, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, capturedLogs

from routerd.api.browser import BrowserRules, split_authority
from routerd.api.channel import NodeServerFactory
from routerd.api.site import GuardResource
from routerd.config.load import ConfigError, parse_config
from routerd.edge import build_site
from routerd.node import Node
from tests.unit.edge_support import status_and_code
from tests.unit.node_fixture import TEXT, World

ORDER = {"id": "drive-by", "files": {"model": "ok.sim.json"}}


def keyless(tmp_path: Path) -> tuple[World, Node]:
    """A keyless standalone node (the embedded default's shape) with a file root to cook from."""
    root = tmp_path / "files"
    root.mkdir()
    (root / "ok.sim.json").write_text(json.dumps({"kind": "text", "weights": "ok"}))
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, models={"file_roots": [str(root)]})
    world.start(node)
    return world, node


def post(world: World, node: Node, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    response, content = world.call("POST", node, path, data=json.dumps(body).encode(),
                                   headers={name.replace("_", "-"): value for name, value in headers.items()})
    return int(response.code), json.loads(content) if content else None


def test_a_page_on_another_origin_cannot_cook_on_a_keyless_node(tmp_path: Path) -> None:
    world, node = keyless(tmp_path)
    code, body = post(world, node, "/router/v1/site/cook/apply", ORDER, Content_Type="text/plain",
                      Origin="https://evil.example", Sec_Fetch_Site="cross-site")
    assert code == 403 and body["error"]["code"] == "cross_origin"
    assert "server.cors_origins" in body["error"]["message"]
    code, body = post(world, node, "/router/v1/site/cook/apply", ORDER, Content_Type="text/plain",
                      Origin="https://evil.example")  # a browser without fetch metadata
    assert code == 403 and body["error"]["code"] == "cross_origin"
    assert not (tmp_path / "solo" / "models" / "drive-by.kcpps").exists()


def test_a_simple_body_type_is_refused_so_a_browser_must_preflight(tmp_path: Path) -> None:
    world, node = keyless(tmp_path)
    code, body = post(world, node, "/router/v1/site/cook/apply", ORDER, Content_Type="text/plain")
    assert code == 415 and body["error"]["code"] == "unsupported_media_type"
    assert "application/json" in body["error"]["message"]
    assert not (tmp_path / "solo" / "models" / "drive-by.kcpps").exists()


def test_a_rebound_host_name_is_refused_on_a_keyless_node(tmp_path: Path) -> None:
    world, node = keyless(tmp_path)
    code, body = post(world, node, "/v1/chat/completions", {"model": "chat", "messages": []},
                      Content_Type="application/json", Host="rebound.evil.example")
    assert code == 421 and body["error"]["code"] == "unknown_host"
    assert "server.allowed_hosts" in body["error"]["message"]


def test_curl_scripts_and_the_nodes_own_webui_are_served(tmp_path: Path) -> None:
    world, node = keyless(tmp_path)
    netloc = world.netlocs[node]
    code, body = post(world, node, "/router/v1/site/cook/apply", ORDER, Content_Type="application/json")
    assert code == 200 and body["applied"], body
    code, body = post(world, node, "/router/v1/site/cook/preview", ORDER, Content_Type="application/json",
                      Origin=f"http://{netloc}", Sec_Fetch_Site="same-origin")  # the WebUI, same origin
    assert code == 200 and body["exists"], body


def test_a_listed_cors_origin_may_call_a_keyless_node(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, server={"cors_origins": ["https://ui.example"]})
    world.start(node)
    code, _ = post(world, node, "/router/v1/reload", {}, Content_Type="application/json",
                   Origin="https://ui.example", Sec_Fetch_Site="cross-site")
    assert code == 200


def test_the_names_a_node_answers_to() -> None:
    rules = BrowserRules.build(("Router.Example.",), "https://public.example:8443/", "box.lan")
    for name in ("localhost", "ui.localhost", "127.0.0.1", "10.1.2.3", "::1", "router.example",
                 "public.example", "box.lan"):
        assert rules.knows(name), name
    for name in ("rebound.evil.example", "localhost.evil.example", "router.example.evil"):
        assert not rules.knows(name), name
    assert BrowserRules.build(("*",)).knows("anything.example")
    assert split_authority("[::1]:8080") == ("::1", 8080)
    assert split_authority("Node.Example.:80") == ("node.example", 80)


def test_allowed_hosts_is_a_list_of_host_names(tmp_path: Path) -> None:
    models = {"config_dir": str(tmp_path)}
    config = parse_config({"server": {"allowed_hosts": ["router.lan", "*"]}, "models": models}, ".", {})
    assert config.server.allowed_hosts == ("router.lan", "*")
    with pytest.raises(ConfigError) as err:
        parse_config({"server": {"allowed_hosts": ["http://router.lan:8080"]}, "models": models}, ".", {})
    assert "server.allowed_hosts" in str(err.value)


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\nHost: \xff\r\n\r\n",
    b"GET /api/tags HTTP/1.1\r\nHost: \xff\r\n\r\n",
    b"GET /ui/%ff HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET /sdcpp/v1/jobs/%ff HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"DELETE /router/v1/site/cook/%ff HTTP/1.1\r\nHost: localhost\r\n\r\n",
])
def test_a_name_that_does_not_parse_is_a_json_400_without_a_traceback(tmp_path: Path, head: bytes) -> None:
    world, node = keyless(tmp_path)
    factory = NodeServerFactory(build_site(node), lambda: node.phase)
    factory.site.reactor = world.clock
    address = IPv4Address("TCP", "127.0.0.1", 50000)
    transport = StringTransport(peerAddress=address)
    with capturedLogs() as events:
        channel = factory.buildProtocol(address)
        channel.makeConnection(transport)
        channel.dataReceived(head)
        world.network.flush()
    status, code = status_and_code(transport.value())
    assert status == 400 and code in ("bad_request", "error")  # OpenAI's envelope, or Ollama's
    assert b"application/json" in transport.value()
    assert not [e for e in events if e.get("log_failure") is not None
                or e["log_level"] in (LogLevel.error, LogLevel.critical)]


def test_a_reload_takes_new_allowed_hosts_and_keeps_the_rules_on(tmp_path: Path) -> None:
    world, node = keyless(tmp_path)
    site = build_site(node)
    guard = site.resource
    assert isinstance(guard, GuardResource)
    assert guard.rules.browser.enabled and guard.rules.browser.knows("solo.test")
    server = attrs.evolve(node.config.server, allowed_hosts=("router.lan",))
    changed = attrs.evolve(node.config, server=server)
    guard.update(node.policy, site, changed)
    assert guard.rules.browser.enabled and guard.rules.browser.knows("router.lan")
    assert not guard.rules.browser.knows("solo.test")
