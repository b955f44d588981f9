"""The WebUI of a standalone node, a site of one (issue 21 §1), in a real headless Chromium against
one real node with simulator backends: a text-only ``alpha``, a multimodal ``eye`` and an image
model ``paint``.  Every page that applies shows (Nodes, Models with Recipes, the guardians editor
and the decision log on the Lending tab); the link picker says links need a cluster.  Before, every
page showed the site API's 404 instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
from selenium.webdriver.support.ui import Select

from tests.browser.test_webui import ADMIN_KEY, sign_in
from tests.browser.test_webui_editors import JOB, PAINTER, PNG, create_recipe, set_guardian
from tests.browser.webui import Browser, browsing, site_json
from tests.integration.nodes import RunningNode, free_port, node_config, sim_model, start_node, write_models

pytestmark = pytest.mark.slow


@attrs.define
class Solo:
    node: RunningNode
    browser: Browser

    async def site_json(self, path: str) -> Any:
        return await site_json(self.node.url, path)


@pytest_twisted.async_yield_fixture
async def solo(tmp_path: Path) -> AsyncIterator[Solo]:
    write_models(tmp_path, {"alpha": sim_model("alpha"),
                            "eye": sim_model("eye", mmproj="../weights/eye.sim.json"),
                            "paint": {"sdmodel": "../weights/paint.sim.json"}},
                 {"alpha": JOB, "eye": JOB, "paint": PAINTER})
    node = await start_node(node_config(tmp_path, {
        "server": {"bind": f"127.0.0.1:{free_port()}"}, "auth": {"admin_keys": [ADMIN_KEY]},
        "cluster": {"node_id": "solo"}}))
    assert node.node.role == "standalone"
    async with browsing(node) as browser:
        yield Solo(node, browser)


# -- blocking steps ----------------------------------------------------------------------------------


def nodes_page_shows_the_node(b: Browser) -> None:
    card = b.wait_text('.node-card[data-node-id="solo"]', "standalone")
    assert "healthy" in card and "settings in sync" in card
    assert b.one("#banner").get_attribute("hidden") is not None  # no site API error shown


def models_page_makes_a_recipe_of_own_models(b: Browser) -> None:
    b.tab("models")
    b.wait_text("#recipes .recipe-list", "no recipes")
    b.wait(lambda d: len(b.css('select[name="recipe-image"] option')) > 1, what="image models offered")
    create_recipe(b, "duo", "solo/alpha", "solo/paint")
    b.wait_text(".recipe-message", "recipe duo saved")
    row = '#recipes tr.recipe[data-recipe-id="duo"]'
    assert b.wait_text(f'{row} .component[data-lane="text"]', "solo") == "text solo / alpha"
    assert b.text(f'{row} .component[data-lane="image"]') == "image solo / paint"


def lending_tab_sets_a_guardian(b: Browser) -> None:
    b.tab("lending")
    b.wait_text('#guardians tr.text-model[data-model="solo/alpha"]', "none")
    offered = [o.get_attribute("value") for o in b.css('select[name="guardian-model"] option')]
    assert offered == ["", "solo/eye"]
    set_guardian(b, "model", "solo/alpha", "solo/eye")
    b.wait_text('#guardians tr.text-model[data-model="solo/alpha"]', "solo/eye")
    b.one("#decision-log")


def decision_log_shows_the_guardian(b: Browser) -> None:
    b.wait_text("#decision-log", "guardian", timeout=20)


def link_picker_says_links_need_a_cluster(b: Browser) -> None:
    b.tab("links")
    notice = b.wait_text("#page-links .cluster-needed", "Links need a cluster")
    assert "standalone" in notice
    assert not b.one('select[name="anchor"]').is_enabled()
    assert not b.css("tr.candidate") and not b.css("button.save")
    b.click('.lanes button[data-lane="image"]')
    b.wait_text("#page-links .cluster-needed", "Links need a cluster")
    # the lane's page is drawn again after the click: read the select once it has settled
    def no_anchor(_d: object) -> bool:
        return Select(b.one('select[name="anchor"]')).first_selected_option.get_attribute("value") == ""
    b.wait(no_anchor, what="the image lane's anchor select offers no anchor")


@pytest_twisted.ensureDeferred
async def test_a_standalone_node_shows_its_pages_and_says_links_need_a_cluster(solo: Solo) -> None:
    b = solo.browser
    await b.do(sign_in, b)
    await b.do(nodes_page_shows_the_node, b)
    await b.do(models_page_makes_a_recipe_of_own_models, b)
    [saved] = (await solo.site_json("/router/v1/site/recipes"))["recipes"]
    assert saved["text"] == {"node_id": "solo", "model_id": "alpha"}
    await b.do(lending_tab_sets_a_guardian, b)
    # what the page set is what routes: an image for alpha goes to eye, and the log shows it
    response = await treq.post(solo.node.url + "/v1/chat/completions", json={
        "model": "alpha", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": PNG}}]}]})
    assert response.code == 200, await response.content()
    assert response.headers.getRawHeaders("x-routerd-guardian") == ["solo/eye"]
    await response.content()
    await b.do(decision_log_shows_the_guardian, b)
    await b.do(link_picker_says_links_need_a_cluster, b)
