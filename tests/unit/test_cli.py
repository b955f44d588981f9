"""The ``routerd`` console command: argument parsing and the HTTP calls each subcommand makes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from routerd.cli import main
from routerd.cli.commands import decisions
from routerd.cli.http import ApiError, Client
from routerd.cli.run import _twistd_argv


class FakeClient(Client):
    """Records calls; answers from a queue (or ``{}``)."""

    def __init__(self, answers: list[Any] | None = None) -> None:
        super().__init__("http://node:1", None, environ={})
        self.calls: list[tuple[str, str, Any, dict[str, Any]]] = []
        self.answers = list(answers or [])

    def call(self, method: str, path: str, body: Any = None, query: Any = None) -> Any:
        self.calls.append((method, path, body, {k: v for k, v in (query or {}).items() if v is not None}))
        answer = self.answers.pop(0) if self.answers else {}
        if isinstance(answer, Exception):
            raise answer
        return answer


def _run(argv: list[str], client: FakeClient) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err, client=client)
    return code, out.getvalue(), err.getvalue()


def test_url_and_key_come_from_flags_else_the_environment() -> None:
    env = {"ROUTERD_URL": "http://env:9/", "ROUTERD_KEY": "k-env"}
    from_env = Client(None, None, environ=env)
    from_flags = Client("http://flag:1", "k", environ=env)
    assert (from_env.url, from_env.key) == ("http://env:9", "k-env")
    assert (from_flags.url, from_flags.key) == ("http://flag:1", "k")
    assert Client(None, None, environ={}).url == "http://127.0.0.1:8080"


def test_models_prints_the_answer_as_json_and_options_work_after_the_subcommand() -> None:
    client = FakeClient([{"models": [{"public_id": "m"}]}])
    code, out, _ = _run(["models", "--compact"], client)
    assert code == 0 and out == '{"models":[{"public_id":"m"}]}\n'
    assert client.calls == [("GET", "/router/v1/models", None, {})]


def test_load_unload_and_state_call_the_admin_routes() -> None:
    client = FakeClient()
    _run(["load", "chat-small"], client)
    _run(["unload"], client)
    _run(["unload", "chat-small", "--target", "text"], client)
    _run(["state"], client)
    _run(["state", "--node", "b"], client)
    assert client.calls == [
        ("POST", "/router/v1/load", {"model": "chat-small"}, {}),
        ("POST", "/router/v1/unload", {}, {}),
        ("POST", "/router/v1/unload", {"model": "chat-small", "target": "text"}, {}),
        ("GET", "/router/v1/state", None, {}),
        ("GET", "/router/v1/site/nodes/state", None, {"node_id": "b"}),
    ]


def test_links_set_list_and_delete_name_the_lane_and_the_anchor() -> None:
    client = FakeClient()
    _run(["links", "set", "--lane", "image", "--anchor", "a/sd", "--lends-to", "b/sd-fast",
          "--restore-after-borrow"], client)
    _run(["links", "list", "--anchor", "a/m"], client)
    _run(["links", "delete", "--anchor", "a/m"], client)
    post, listing, delete = client.calls
    assert post[:2] == ("POST", "/router/v1/site/routing-groups")
    assert post[2] == {"anchor": {"node_id": "a", "model_id": "sd"},
                       "lends_to": [{"node_id": "b", "model_id": "sd-fast", "load_if_unloaded": True,
                                     "restore_after_borrow": True}],
                       "borrows_from": [], "acknowledge_different_weights": False}
    anchor = {"node_id": "a", "model_id": "m"}
    assert listing == ("GET", "/router/v1/site/text-routing-groups", None, anchor)
    assert delete == ("DELETE", "/router/v1/site/text-routing-groups", None, anchor)


def test_guardians_set_list_and_delete_derive_the_scope_from_node_and_model() -> None:
    client = FakeClient()
    _run(["guardians", "set", "right/big"], client)
    _run(["guardians", "set", "left/vision", "--node", "left"], client)
    _run(["guardians", "set", "right/big", "--node", "left", "--model", "text"], client)
    _run(["guardians", "list"], client)
    _run(["guardians", "delete", "--node", "left"], client)
    path = "/router/v1/site/guardians"
    assert client.calls == [
        ("POST", path, {"scope": "cluster", "guardian": {"node_id": "right", "model_id": "big"}}, {}),
        ("POST", path, {"scope": "node", "node_id": "left",
                        "guardian": {"node_id": "left", "model_id": "vision"}}, {}),
        ("POST", path, {"scope": "model", "node_id": "left", "model_id": "text",
                        "guardian": {"node_id": "right", "model_id": "big"}}, {}),
        ("GET", path, None, {}),
        ("DELETE", path, None, {"scope": "node", "node_id": "left"}),
    ]
    with pytest.raises(SystemExit):
        _run(["guardians", "delete", "--model", "text"], FakeClient())


def test_a_malformed_anchor_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_:
        _run(["links", "delete", "--anchor", "no-slash"], FakeClient())
    assert exit_.value.code == 2


def test_settings_set_reads_values_as_json_when_they_parse_and_clear_names_the_key() -> None:
    client = FakeClient()
    _run(["settings", "set", "scheduling_min_samples=30", "offload_hold_for_faster_helper=false",
          "scheduling_grant_ttl=45s"], client)
    _run(["settings", "clear", "scheduling_grant_ttl"], client)
    _run(["settings", "get"], client)
    assert client.calls[0][2] == {"values": {"scheduling_min_samples": 30,
                                             "offload_hold_for_faster_helper": False,
                                             "scheduling_grant_ttl": "45s"}}
    assert client.calls[1] == ("DELETE", "/router/v1/site/offload/settings", None,
                               {"key": "scheduling_grant_ttl"})
    assert client.calls[2][:2] == ("GET", "/router/v1/site/offload/settings")


def test_an_error_answer_exits_1_with_the_servers_message() -> None:
    client = FakeClient([ApiError(404, "site routes are served by the master only")])
    code, out, err = _run(["settings", "get"], client)
    assert code == 1 and out == ""
    assert "HTTP 404: site routes are served by the master only" in err


def test_decisions_follow_prints_each_answer_oldest_first_and_polls_with_its_cursor() -> None:
    """``--follow`` prints the last rows, then what each poll brings, handing back the answer's
    ``cursor`` as ``after`` (the route answers each row once: ``routerd.lending.follow``)."""
    row = lambda i, t: {"id": i, "node_id": "a", "recorded_at": t, "outcome": "lent"}  # noqa: E731
    client = FakeClient([{"records": [row(2, 20), row(1, 10)], "cursor": "c1"},
                         {"records": [row(4, 30), row(3, 30)], "cursor": "c2"},
                         {"records": [], "cursor": "c2"}])
    sleeps: list[float] = []
    out = io.StringIO()
    args = _parse(["decisions", "--follow", "--interval", "0.5", "--lane", "text", "--max-polls", "2"])
    assert decisions(client, args, out, sleep=sleeps.append) == 0
    assert [json.loads(x)["id"] for x in out.getvalue().splitlines()] == [1, 2, 3, 4]
    assert sleeps == [0.5, 0.5]
    assert client.calls[0][3] == {"lane": "text", "limit": 50}
    assert client.calls[1][3] == {"lane": "text", "limit": 50, "after": "c1"}
    assert client.calls[2][3]["after"] == "c2"


def test_decisions_follow_against_a_node_without_cursors_says_so() -> None:
    client = FakeClient([{"records": []}])
    args = _parse(["decisions", "--follow", "--max-polls", "2"])
    with pytest.raises(SystemExit, match="no follow cursor"):
        decisions(client, args, io.StringIO(), sleep=lambda _s: None)


def _parse(argv: list[str]) -> Any:
    from routerd.cli import _parser

    return _parser().parse_args(argv)


def test_check_prints_ok_for_the_embedded_default_and_every_error_for_a_bad_config(tmp_path: Path) -> None:
    out = io.StringIO()
    assert main(["check"], out=out) == 0 and out.getvalue() == "ok\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  bind: nowhere\nmodels:\n  config_dir: nope\n")
    out = io.StringIO()
    assert main(["check", "--config", str(bad)], out=out) == 1
    assert "server.bind" in out.getvalue() and "models.config_dir" in out.getvalue()


def test_version_names_routerd_and_whether_twistd_finds_the_plugin() -> None:
    out = io.StringIO()
    assert main(["version"], out=out) == 0
    assert out.getvalue().startswith("routerd ") and "twistd plugin:" in out.getvalue()


def test_run_passes_twistd_options_before_the_plugin_and_routerd_options_after() -> None:
    assert _twistd_argv(["--config", "c.yaml", "--logfile", "x.log", "--json-log=-", "-r", "poll"]) == [
        "--nodaemon", "--pidfile=", "--logfile", "x.log", "-r", "poll", "routerd", "--config", "c.yaml",
        "--json-log=-"]


def test_reload_posts_to_the_reload_endpoint_and_prints_the_report() -> None:
    client = FakeClient([{"ok": True, "restart_required": ["server.bind"]}])
    code, out, _err = _run(["reload"], client)
    assert code == 0 and client.calls[0][:2] == ("POST", "/router/v1/reload")
    assert json.loads(out)["restart_required"] == ["server.bind"]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_help_prints_routerds_own_usage_not_twistds(flag: str) -> None:
    """``routerd run --help`` printed ``Usage: twistd [options] routerd …`` (twistd's parser answered)."""
    out = io.StringIO()
    assert main(["run", "--config", "node.yaml", flag], out=out) == 0
    text = out.getvalue()
    assert text.startswith("Usage: routerd run [--config PATH]"), text
    assert "twistd [options]" not in text
    assert "--log-level=" in text and "--logfile=" in text


def test_the_webui_address_a_ready_node_prints_is_one_a_browser_here_opens() -> None:
    """A wildcard bind is reached on loopback; an IPv6 host is bracketed."""
    from routerd.tap import webui_address  # new in issue 32

    assert webui_address("127.0.0.1", 8080) == "http://127.0.0.1:8080/ui/"
    assert webui_address("0.0.0.0", 9000) == "http://127.0.0.1:9000/ui/"
    assert webui_address("::", 9000) == "http://[::1]:9000/ui/"
    assert webui_address("fd00::5", 80) == "http://[fd00::5]:80/ui/"
    assert webui_address("10.1.2.3", 81) == "http://10.1.2.3:81/ui/"
