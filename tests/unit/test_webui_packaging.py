"""Every WebUI file (pages, modules, the vendored chart library and its licence) is shipped by
setup.cfg ``data_files``, and the vendored library is the pinned one README names."""

from __future__ import annotations

import configparser
import glob
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def shipped_webui_files() -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    shipped: set[str] = set()
    for target, sources in parser["options.data_files"].items():
        if not target.startswith("share/routerd/webui"):
            continue
        for pattern in (s.strip() for s in sources.replace("\n", ",").split(",")):
            if pattern:
                shipped.update(os.path.relpath(p, ROOT) for p in glob.glob(str(ROOT / pattern)))
    return shipped


def test_every_file_under_webui_is_in_the_data_files_of_setup_cfg() -> None:
    """Fails when a page, module or vendored file would be left out of an installed wheel."""
    present = {os.path.relpath(p, ROOT) for p in glob.glob(str(ROOT / "webui" / "**" / "*"), recursive=True)
               if os.path.isfile(p)}
    assert present - shipped_webui_files() == set()


def assert_vendored(name: str, module: str, export: str) -> None:
    """``webui/vendor/<name>``: the MIT licence, the npm package.json of the version README names,
    and its ES module ``module`` (which ``export``s what the pages import) unchanged."""
    folder = ROOT / "webui" / "vendor" / name
    assert (folder / "LICENSE").read_text().startswith("The MIT License")
    pinned = json.loads((folder / "package.json").read_text())
    assert pinned["name"] == name and pinned["license"] == "MIT"
    assert f"{name}@{pinned['version']}" in (ROOT / "README.md").read_text()
    assert export in (folder / module).read_text()


def test_the_vendored_chart_library_ships_with_its_licence_and_the_version_readme_names() -> None:
    assert_vendored("uplot", "uPlot.esm.js", "export { uPlot as default }")


def test_the_vendored_dom_patcher_ships_with_its_licence_and_the_version_readme_names() -> None:
    """The pages' in-place refresh (dom.js) imports morphdom's ES module: pinned, licensed, named."""
    assert_vendored("morphdom", "morphdom-esm.js", "export default morphdom;")
    assert 'from "../vendor/morphdom/morphdom-esm.js"' in (ROOT / "webui" / "js" / "dom.js").read_text()
