"""Every WebUI file (pages, modules, the vendored chart library and its licence) is shipped by
setup.cfg ``data_files``, and the vendored library is the pinned one README names."""

from __future__ import annotations

import configparser
import glob
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UPLOT = ROOT / "webui" / "vendor" / "uplot"


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


def test_the_vendored_chart_library_ships_with_its_licence_and_the_version_readme_names() -> None:
    assert (UPLOT / "LICENSE").read_text().startswith("The MIT License")
    pinned = json.loads((UPLOT / "package.json").read_text())
    assert pinned["name"] == "uplot" and pinned["license"] == "MIT"
    assert f"uplot@{pinned['version']}" in (ROOT / "README.md").read_text()
    assert "export { uPlot as default }" in (UPLOT / "uPlot.esm.js").read_text()


MORPHDOM = ROOT / "webui" / "vendor" / "morphdom"


def test_the_vendored_dom_patcher_ships_with_its_licence_and_the_version_readme_names() -> None:
    """The pages' in-place refresh (dom.js) imports morphdom's ES module: pinned, licensed, named."""
    assert (MORPHDOM / "LICENSE").read_text().startswith("The MIT License")
    pinned = json.loads((MORPHDOM / "package.json").read_text())
    assert pinned["name"] == "morphdom" and pinned["license"] == "MIT"
    assert f"morphdom@{pinned['version']}" in (ROOT / "README.md").read_text()
    assert "export default morphdom;" in (MORPHDOM / "morphdom-esm.js").read_text()
    assert 'from "../vendor/morphdom/morphdom-esm.js"' in (ROOT / "webui" / "js" / "dom.js").read_text()
