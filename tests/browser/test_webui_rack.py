"""The Nodes page shows the rack at a glance, in a real headless Chromium on a real master and slave
(simulator backends): each node's CPU and RAM, "no GPU" on this machine (no NVIDIA driver), and the
slave flagged for swap thrash after its text runtime swapped two models again and again; then, with a fake
NVML given to the master's telemetry (this machine has no GPU), each GPU's utilisation, VRAM, temperature
and power."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
import treq

from routerd.telemetry.attention import THRASH_LOADS
from routerd.telemetry.host import NvmlGpus
from tests.browser.webui import ADMIN_KEY, Browser, Site, running_site
from tests.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.integration.nodes import FAST_TEXT, plan_cluster, sim_model, write_models

pytestmark = pytest.mark.slow


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"chat": sim_model("chat")}, {"chat": FAST_TEXT})
    write_models(plan.root / "slave-a", {"alpha": sim_model("alpha"), "beta": sim_model("beta")},
                 {"alpha": {**FAST_TEXT, "load_ms": 10}, "beta": {**FAST_TEXT, "load_ms": 10}})
    async with running_site(plan, "beta", sections={"auth": {"admin_keys": [ADMIN_KEY]}}) as running:
        yield running


async def swap_on_the_slave(site: Site, times: int) -> None:
    for n in range(times):
        response = await treq.post(site.master.url + "/router/v1/site/nodes/load",
                                   json={"node_id": "slave-a", "model": ("alpha", "beta")[n % 2]},
                                   headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert response.code == 200, await response.text()


def sign_in_on_nodes(b: Browser) -> None:
    b.open("nodes")
    b.one("dialog#login[open]")
    b.one("#login-key").send_keys(ADMIN_KEY)
    b.one("#login-submit").click()
    b.wait(lambda d: not b.css("dialog#login[open]"), what="the sign-in dialog closes")


def cards_show_the_host_and_no_gpu(b: Browser) -> None:
    for node_id in ("master", "slave-a"):
        card = f'.node-card[data-node-id="{node_id}"]'
        b.wait_text(f"{card} .host .cpu", "CPU")
        ram = b.wait_text(f"{card} .host .ram", "RAM")
        assert "GiB" in ram
        assert b.wait_text(f"{card} .gpu-state", "no GPU") == "no GPU"


def slave_is_flagged_for_swap_thrash(b: Browser) -> None:
    slave = '.node-card[data-node-id="slave-a"]'
    flag = b.wait_text(f'{slave} .attention li[data-code="swap_thrash"]', "swap thrash", timeout=20)
    assert "text runtime loaded" in flag and "alpha" in flag and "beta" in flag
    assert "needs attention" in b.text(f"{slave} header")
    assert "needs-attention" in (b.one(slave).get_attribute("class") or "")
    row = b.wait_text(f'{slave} table.runtimes tr[data-kind="text"]', "beta")
    assert f"{THRASH_LOADS}" in row  # the loads in the window
    master = '.node-card[data-node-id="master"]'
    assert not b.css(f"{master} .attention li")
    assert "needs attention" not in b.text(f"{master} header")


def master_card_shows_each_gpu(b: Browser) -> None:
    master = '.node-card[data-node-id="master"]'
    first = b.wait_text(f'{master} table.gpus tr[data-gpu="0"]', "RTX 4090")
    assert "87 %" in first and "20.0 GiB / 24.0 GiB" in first
    assert "71 °C" in first and "313 W / 450 W" in first
    second = b.wait_text(f'{master} table.gpus tr[data-gpu="1"]', "RTX 3060")
    assert "1.0 GiB / 12.0 GiB" in second and "– / 170 W" in second  # a card that reports no power draw
    assert not b.css(f"{master} .gpu-state")


@pytest_twisted.ensureDeferred
async def test_the_nodes_page_shows_cpu_ram_no_gpu_and_flags_swap_thrash(site: Site) -> None:
    b = site.browser
    await b.do(sign_in_on_nodes, b)
    await b.do(cards_show_the_host_and_no_gpu, b)
    await swap_on_the_slave(site, THRASH_LOADS)
    await b.do(slave_is_flagged_for_swap_thrash, b)
    site.master.node.telemetry.gpus = NvmlGpus(FakeNvml([
        FakeGpu("NVIDIA RTX 4090", 87, 20 * GIB, 24 * GIB, 71, 312_500, 450_000),
        FakeGpu("NVIDIA RTX 3060", 3, 1 * GIB, 12 * GIB, 40, None, 170_000)]))
    await b.do(master_card_shows_each_gpu, b)
    await b.do(b.screenshot, "rack")
