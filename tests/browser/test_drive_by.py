"""A drive-by page in a real headless Chromium against a keyless node on loopback (the embedded
default's shape): a page served from another origin sends the Cook apply as a "simple" request
(``text/plain``, ``no-cors``: no preflight) and a chat; the node refuses both and writes nothing.
The node's own page (same origin) cooks with the same browser, so the browser does reach it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import globalLogPublisher
from twisted.web import server, static

from tests.browser.webui import Browser, browsing
from tests.integration.nodes import FAST_TEXT, RunningNode, free_port, node_config, start_node, write_models

pytestmark = pytest.mark.slow

DRIVE_BY = {"id": "drive-by", "files": {"model": "ok.sim.json"}, "extra_args": ["--threads", "2"]}
#: The page another origin serves: two requests a page may send without a preflight.
EVIL_PAGE = """<!doctype html><title>loading</title><script>
const node = "%(node)s";
Promise.allSettled([
  fetch(node + "/router/v1/site/cook/apply", {method: "POST", mode: "no-cors",
        headers: {"Content-Type": "text/plain"}, body: %(order)s}),
  fetch(node + "/v1/chat/completions", {method: "POST", mode: "no-cors",
        headers: {"Content-Type": "text/plain"}, body: '{"model": "chat", "messages": []}'}),
]).then(() => { document.title = "sent"; });
</script>"""
#: The node's own page cooking, as the WebUI does (JSON, same origin).
OWN_COOK = """const done = arguments[arguments.length - 1];
fetch("/router/v1/site/cook/apply", {method: "POST", headers: {"content-type": "application/json"},
      body: JSON.stringify(arguments[0])}).then((r) => done(r.status), (e) => done(String(e)));"""


@attrs.define
class Scene:
    node: RunningNode
    browser: Browser
    evil_url: str
    models: Path
    seen: list[tuple[str, int]]


@pytest_twisted.async_yield_fixture
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json"}},
                 {"chat": FAST_TEXT, "ok": FAST_TEXT})
    node = await start_node(node_config(tmp_path, {
        "server": {"bind": f"127.0.0.1:{free_port()}"},
        "models": {"file_roots": [str(tmp_path / "weights")]}}))
    page = tmp_path / "evil"
    page.mkdir()
    order = json.dumps(json.dumps(DRIVE_BY))  # a JavaScript string holding the JSON
    (page / "index.html").write_text(EVIL_PAGE % {"node": node.url, "order": order})
    evil = reactor.listenTCP(0, server.Site(static.File(str(page))),  # type: ignore[attr-defined]
                             interface="127.0.0.1")
    seen: list[tuple[str, int]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "routerd.access":
            seen.append((str(event.get("path")), int(event.get("status", 0))))

    globalLogPublisher.addObserver(observe)
    try:
        async with browsing(node) as browser:  # the browser quits and the node stops on the way out
            # localhost, not 127.0.0.1: another site, as a page on the web would be
            yield Scene(node, browser, f"http://localhost:{evil.getHost().port}/index.html",
                        tmp_path / "models", seen)
    finally:
        globalLogPublisher.removeObserver(observe)
        await evil.stopListening()


def visit_the_evil_page(b: Browser, url: str) -> None:
    b.driver.get(url)
    b.wait(lambda d: d.title == "sent", what="the page sent its requests")


def cook_from_the_nodes_own_page(b: Browser) -> Any:
    b.driver.get(b.base + "/ui/")
    return b.driver.execute_async_script(OWN_COOK, {"id": "own", "files": {"model": "ok.sim.json"}})


@pytest_twisted.ensureDeferred
async def test_a_page_from_another_origin_cannot_cook_or_chat_and_the_nodes_own_page_can(
        scene: Scene) -> None:
    await scene.browser.do(visit_the_evil_page, scene.browser, scene.evil_url)
    assert not (scene.models / "drive-by.kcpps").exists()
    assert ("/router/v1/site/cook/apply", 403) in scene.seen, scene.seen  # it reached the node: refused
    assert ("/v1/chat/completions", 403) in scene.seen, scene.seen
    assert await scene.browser.do(cook_from_the_nodes_own_page, scene.browser) == 200
    assert (scene.models / "own.kcpps").exists()
