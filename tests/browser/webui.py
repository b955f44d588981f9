"""Helpers of the browser tests: a headless Chromium from Debian's packages (``chromium`` and
``chromium-driver``) driven by Selenium, and a cluster of real nodes (a master and a slave with
simulator backends) on 127.0.0.1 for it to look at.

The nodes run in the test's reactor; every Selenium call blocks, so the tests run each browser
step in a thread (``Browser.do``) and the reactor keeps serving the pages meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import treq
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait
from twisted.internet import threads

from tests.integration.nodes import ClusterPlan, RunningNode, all_healthy, knows, start_cluster

T = TypeVar("T")

CHROMIUM = os.environ.get("ROUTERD_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ROUTERD_CHROMEDRIVER", "/usr/bin/chromedriver")
#: Where the tests write the README's screenshots when set (e.g. ``docs``); unset, none are taken.
SCREENSHOTS = os.environ.get("ROUTERD_WEBUI_SCREENSHOTS", "")
WIDTH, HEIGHT = 1280, 800
#: The admin key of the sites the browser tests sign in to.
ADMIN_KEY = "webui-admin-key-0123456789"


def browser_missing() -> str | None:
    """Why no browser can be started here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) or shutil.which(path)):
            return f"{path} is missing: apt-get install -y chromium chromium-driver"
    return None


def start_chromium() -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(WIDTH, HEIGHT)
    return driver


@attrs.define
class Browser:
    """One headless Chromium; ``do`` runs a blocking step in a thread."""

    driver: WebDriver
    base: str

    async def do(self, step: Callable[..., T], *args: Any) -> T:
        return await threads.deferToThread(step, *args)

    # -- blocking helpers, called inside ``do`` ---------------------------------------------------

    def wait(self, predicate: Callable[[WebDriver], Any], timeout: float = 15.0, what: str = "") -> Any:
        return WebDriverWait(self.driver, timeout, poll_frequency=0.05,
                             ignored_exceptions=(StaleElementReferenceException,)).until(predicate, what)

    def click(self, selector: str, timeout: float = 15.0) -> None:
        """Click the first element matching ``selector`` (found again if a refresh replaced it)."""
        def clicked(_d: WebDriver) -> bool:
            found = self.css(selector)
            if not found:
                return False
            found[0].click()
            return True
        self.wait(clicked, timeout, f"click {selector}")

    def css(self, selector: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def one(self, selector: str, timeout: float = 15.0) -> WebElement:
        return self.wait(lambda d: (self.css(selector) or [None])[0], timeout, f"no {selector}")

    def select(self, selector: str, value: str, timeout: float = 15.0) -> None:
        """Choose ``value`` in the ``<select>`` at ``selector`` once that option is there (a page
        fills its options from documents it fetches)."""
        self.one(f'{selector} option[value="{value}"]', timeout)
        Select(self.one(selector)).select_by_value(value)

    def text(self, selector: str) -> str:
        return " ".join(e.text for e in self.css(selector))

    def wait_text(self, selector: str, needle: str, timeout: float = 15.0) -> str:
        """Wait until an element matching ``selector`` shows ``needle``; its text."""
        def found(_d: WebDriver) -> str | None:
            for element in self.css(selector):
                try:
                    if needle in element.text:
                        return str(element.text)
                except Exception:  # re-rendered between find and read: look again
                    continue
            return None
        return str(self.wait(found, timeout, f"{needle!r} in {selector}"))

    def confirm(self, question: str, *, ok: bool = True) -> str:
        """Answer the confirmation a destructive action asks (the ``#confirm`` dialog, which must
        show ``question``): its OK button, or Cancel when ``ok`` is false.  The dialog's text."""
        text = str(self.wait_text("dialog#confirm[open]", question))
        self.one("#confirm-ok" if ok else "#confirm-cancel").click()
        self.wait(lambda d: not self.css("dialog#confirm[open]"), 5.0, "the dialog closes")
        return text

    def open(self, page: str) -> None:
        self.driver.get(f"{self.base}/ui/#{page}")

    def tab(self, page: str) -> None:
        self.click(f'#tabs a[data-page="{page}"]')
        self.one(f"#page-{page}")

    def screenshot(self, name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(Path(SCREENSHOTS) / f"webui-{name}.png"))

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)


@attrs.define
class Site:
    """A master and its ``slave-a``, and a browser on the master's WebUI."""

    plan: ClusterPlan
    master: RunningNode
    slave: RunningNode
    browser: Browser

    async def site_json(self, path: str) -> Any:
        return await site_json(self.master.url, path)


async def site_json(url: str, path: str) -> Any:
    """``GET url + path`` as the admin: the JSON answer (a 200 is asserted)."""
    response = await treq.get(url + path, headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.code == 200
    return json.loads(await response.content())


@asynccontextmanager
async def running_site(plan: ClusterPlan, ready: str, *, sections: Mapping[str, Mapping[str, Any]],
                       extra_cluster: Mapping[str, Any] | None = None,
                       slave_sections: Mapping[str, Mapping[str, Any]] | None = None) -> AsyncIterator[Site]:
    """Start the plan's master and ``slave-a`` (their models already written) with these config
    ``sections``, wait until the master knows the slave's model ``ready`` and every node is
    healthy, open a browser on the master; stop it all on the way out.  Fails (never skips) when
    the browser is missing: CI installs it (README test command)."""
    missing = browser_missing()
    if missing:
        pytest.fail(missing)
    slave = plan.slave_config("slave-a", extra_cluster=extra_cluster,
                              sections=sections if slave_sections is None else slave_sections)
    master = plan.master_config(extra_cluster, sections=sections)
    cluster = await start_cluster(plan, master, {"slave-a": slave},
                                  ready=lambda r: knows(r, **{"slave-a": ready}) and all_healthy(r))
    driver = await threads.deferToThread(start_chromium)
    running = Site(plan, cluster.master, cluster.slaves["slave-a"], Browser(driver, cluster.master.url))
    try:
        yield running
    finally:
        await running.browser.do(driver.quit)
        await cluster.stop()


@asynccontextmanager
async def browsing(node: RunningNode) -> AsyncIterator[Browser]:
    """A browser on a started ``node``'s WebUI; on the way out the browser quits and the node stops.
    Fails (never skips) when the browser is missing: CI installs it (README test command)."""
    try:
        missing = browser_missing()
        if missing:
            pytest.fail(missing)
        driver = await threads.deferToThread(start_chromium)
        browser = Browser(driver, node.url)
        try:
            yield browser
        finally:
            await browser.do(driver.quit)
    finally:
        await node.stop()


def sim_weights(spec: dict[str, Any], name: str) -> str:
    return json.dumps({"weights": name, **spec})


__all__ = ["ADMIN_KEY", "HEIGHT", "WIDTH", "Browser", "Site", "browser_missing", "browsing", "running_site",
           "start_chromium"]
