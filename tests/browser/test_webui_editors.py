"""The WebUI's guardians editor (Lending tab, issue 10) and recipes section (Models page, issue 15)
in a real headless Chromium against a real master and slave with simulator backends.

The master holds a text-only ``alpha``, a multimodal ``eye`` (an ``mmproj`` in its ``.kcpps``) and
an image model ``paint``; the slave holds a text-only ``beta`` and a multimodal ``vision``.  Every
assertion reads what the page shows; a few also check the master agrees.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
import treq
from selenium.webdriver.support.ui import Select

from tests.browser.test_webui import ADMIN_KEY, sign_in
from tests.browser.webui import Browser, Site, running_site
from tests.integration.nodes import FAST_TEXT, plan_cluster, sim_model, write_models

pytestmark = pytest.mark.slow

JOB = {**FAST_TEXT, "load_ms": 30}
PAINTER = {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 5}
PNG = "data:image/png;base64,iVBORw0KGgo="
GUARDIANS = "/router/v1/site/guardians"
RECIPES = "/router/v1/site/recipes"


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {
        "alpha": sim_model("alpha"),
        "eye": sim_model("eye", mmproj="../weights/eye.sim.json"),
        "paint": {"sdmodel": "../weights/paint.sim.json"},
    }, {"alpha": JOB, "eye": JOB, "paint": PAINTER})
    write_models(plan.root / "slave-a", {
        "beta": sim_model("beta"),
        "vision": sim_model("vision", mmproj="../weights/vision.sim.json"),
    }, {"beta": JOB, "vision": JOB})
    async with running_site(plan, "vision", sections={"auth": {"admin_keys": [ADMIN_KEY]}}) as running:
        yield running


# -- guardians (blocking steps) ------------------------------------------------------------------------


def _read(b: Browser, selector: str) -> str:
    """The text of every element matching ``selector``, read again if a refresh replaced one."""
    return str(b.wait(lambda d: [b.text(selector)], what=selector)[0])


def _applied(b: Browser, model: str) -> str:
    return _read(b, f'#guardians tr.text-model[data-model="{model}"]')


def guardians_start_unset(b: Browser) -> None:
    b.tab("lending")
    b.wait_text('#guardians tr.text-model[data-model="master/alpha"]', "none")
    assert "none" in _applied(b, "slave-a/beta")
    # only text-only models are listed as needing a guardian; only multimodal ones are offered
    assert not b.css('#guardians tr.text-model[data-model="slave-a/vision"]')
    assert not b.css('#guardians tr.text-model[data-model="master/paint"]')
    assert "no guardian set" in _read(b, "#guardians div.guardian-settings")
    offered = [o.get_attribute("value") for o in b.css('select[name="guardian-model"] option')]
    assert offered == ["", "master/eye", "slave-a/vision"]


def set_guardian(b: Browser, scope: str, target: str, guardian: str) -> None:
    Select(b.one('select[name="guardian-scope"]')).select_by_value(scope)
    if target:
        b.wait(lambda d: any(o.get_attribute("value") == target
                             for o in b.css('select[name="guardian-target"] option')), what=target)
        Select(b.one('select[name="guardian-target"]')).select_by_value(target)
    else:
        assert not b.one('select[name="guardian-target"]').is_displayed()  # the cluster has no target
    Select(b.one('select[name="guardian-model"]')).select_by_value(guardian)
    b.one("button.set-guardian").click()
    b.wait_text(".guardian-message", f"set to {guardian}")


def guardians_resolve_most_specific_first(b: Browser) -> None:
    set_guardian(b, "cluster", "", "slave-a/vision")
    b.wait_text('#guardians tr.text-model[data-model="master/alpha"]', "slave-a/vision")
    assert "cluster" in _applied(b, "master/alpha")
    assert "slave-a/vision" in _applied(b, "slave-a/beta") and "cluster" in _applied(b, "slave-a/beta")
    set_guardian(b, "node", "master", "master/eye")
    alpha = b.wait_text('#guardians tr.text-model[data-model="master/alpha"]', "master/eye")
    assert "node" in alpha
    assert "slave-a/vision" in _applied(b, "slave-a/beta")  # another node: still the cluster's
    set_guardian(b, "model", "slave-a/beta", "master/eye")
    beta = b.wait_text('#guardians tr.text-model[data-model="slave-a/beta"]', "master/eye")
    assert "model" in beta
    rows = b.css("#guardians tr.guardian-setting")
    assert sorted((r.get_attribute("data-scope"), r.get_attribute("data-target")) for r in rows) == [
        ("cluster", ""), ("model", "slave-a/beta"), ("node", "master")]


def guardian_refused_changes_nothing(b: Browser) -> None:
    """A choice the master refuses (as a page that went stale would send: ``beta`` is not
    multimodal) shows the master's message, and the settings stay as they were."""
    before = _read(b, "#guardians div.guardian-settings")
    b.js("""
      const scope = document.querySelector('select[name="guardian-scope"]');
      scope.value = 'cluster';
      scope.dispatchEvent(new Event('change'));
      const select = document.querySelector('select[name="guardian-model"]');
      select.appendChild(new Option('slave-a / beta', 'slave-a/beta'));
      select.value = 'slave-a/beta';
      document.querySelector('button.set-guardian').click();
    """)
    message = b.wait_text(".guardian-message", "not set")
    assert "slave-a/beta is not a multimodal text model" in message
    assert _read(b, "#guardians div.guardian-settings") == before
    assert "slave-a/vision" in _read(b, '#guardians tr.guardian-setting[data-scope="cluster"]')


def guardian_removed_falls_back(b: Browser) -> None:
    b.click('#guardians tr.guardian-setting[data-scope="node"] button.remove-guardian')
    b.confirm("Remove the node guardian of master?")
    b.wait_text(".guardian-message", "removed the node guardian of master")
    alpha = b.wait_text('#guardians tr.text-model[data-model="master/alpha"]', "slave-a/vision")
    assert "cluster" in alpha
    assert len(b.css("#guardians tr.guardian-setting")) == 2
    # pushed with the links: both nodes report the master's fingerprint
    b.wait(lambda d: len(b.css("#lending-nodes tr[data-node-id]")) == 2 and all(
        "in sync" in tr.text for tr in b.css("#lending-nodes tr[data-node-id]")), what="both in sync")


def show_section(b: Browser, selector: str, name: str) -> None:
    b.js("arguments[0].scrollIntoView({block: 'start'})", b.one(selector))
    b.screenshot(name)


@pytest_twisted.ensureDeferred
async def test_an_operator_sets_lists_and_removes_guardians_on_the_lending_tab(site: Site) -> None:
    b = site.browser
    await b.do(sign_in, b)
    await b.do(guardians_start_unset, b)
    await b.do(guardians_resolve_most_specific_first, b)
    # what the page set is what routes: an image for beta goes to its model-scope guardian
    response = await treq.post(site.master.url + "/v1/chat/completions", json={
        "model": "beta", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": PNG}}]}]})
    assert response.code == 200, await response.content()
    assert response.headers.getRawHeaders("x-routerd-guardian") == ["master/eye"]
    await response.content()
    await b.do(show_section, b, "#guardians", "guardians")
    await b.do(guardian_refused_changes_nothing, b)
    assert len((await site.site_json(GUARDIANS))["guardians"]) == 3
    await b.do(guardian_removed_falls_back, b)
    stored = (await site.site_json(GUARDIANS))["guardians"]
    assert sorted(s["scope"] for s in stored) == ["cluster", "model"]


# -- recipes (blocking steps) ----------------------------------------------------------------------


def _options(b: Browser, lane: str) -> list[str]:
    return [str(o.get_attribute("value")) for o in b.css(f'select[name="recipe-{lane}"] option')][1:]


def recipes_offer_the_models_of_each_lane(b: Browser) -> None:
    b.tab("models")
    b.wait_text("#recipes .recipe-list", "no recipes")
    b.wait(lambda d: _options(b, "image"), what="image models offered")
    assert _options(b, "text") == ["master/alpha", "master/eye", "slave-a/beta", "slave-a/vision"]
    assert _options(b, "image") == ["master/paint"]
    assert _options(b, "embeddings") == [] and _options(b, "voice") == []


def create_recipe(b: Browser, recipe_id: str, text: str, image: str) -> None:
    field = b.one('input[name="recipe-id"]')
    field.clear()
    field.send_keys(recipe_id)
    Select(b.one('select[name="recipe-text"]')).select_by_value(text)
    Select(b.one('select[name="recipe-image"]')).select_by_value(image)
    b.one("button.create-recipe").click()


def recipe_is_listed(b: Browser) -> None:
    create_recipe(b, "duo", "slave-a/beta", "master/paint")
    b.wait_text(".recipe-message", "recipe duo saved")
    row = '#recipes tr.recipe[data-recipe-id="duo"]'
    assert _read(b, f"{row} td.public-ids").split() == ["duo", "duo-image"]
    assert _read(b, f'{row} .component[data-lane="text"]') == "text slave-a / beta"
    assert _read(b, f'{row} .component[data-lane="image"]') == "image master / paint"
    assert not b.css(f'{row} .component[data-lane="embeddings"]')


def recipe_refused_changes_nothing(b: Browser) -> None:
    create_recipe(b, "duo", "master/alpha", "master/paint")
    message = b.wait_text(".recipe-message", "not saved")
    assert "recipe 'duo' already exists" in message
    rows = b.css("#recipes tr.recipe")
    assert len(rows) == 1 and "slave-a / beta" in rows[0].text


def recipe_deleted(b: Browser) -> None:
    b.click('#recipes tr.recipe[data-recipe-id="duo"] button.delete-recipe')
    b.confirm("Delete the recipe duo?")
    b.wait_text(".recipe-message", "recipe duo deleted")
    b.wait_text("#recipes .recipe-list", "no recipes")


@pytest_twisted.ensureDeferred
async def test_an_operator_creates_lists_and_deletes_recipes_on_the_models_page(site: Site) -> None:
    b = site.browser
    await b.do(sign_in, b)
    await b.do(recipes_offer_the_models_of_each_lane, b)
    await b.do(recipe_is_listed, b)
    [saved] = (await site.site_json(RECIPES))["recipes"]
    assert saved["text"] == {"node_id": "slave-a", "model_id": "beta"}
    assert saved["image"] == {"node_id": "master", "model_id": "paint"}
    models = json.loads(await (await treq.get(site.master.url + "/v1/models")).content())
    assert "duo" in [m["id"] for m in models["data"]]
    await b.do(show_section, b, "#recipes", "recipes")
    await b.do(recipe_refused_changes_nothing, b)
    assert len((await site.site_json(RECIPES))["recipes"]) == 1
    await b.do(recipe_deleted, b)
    assert (await site.site_json(RECIPES))["recipes"] == []
