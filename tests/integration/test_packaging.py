"""Packaging (issue 13 item 9): the sdist and wheel build, pass ``twine check``, and the wheel installed
in a fresh virtual environment runs ``routerd check`` on the embedded default and ships the WebUI."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_sdist_and_wheel_build_pass_twine_check_and_the_installed_wheel_checks_its_default(
        tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", dist, ROOT)
    wheels = sorted(dist.glob("routerd-*.whl"))
    sdists = sorted(dist.glob("routerd-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    assert "PASSED" in run(sys.executable, "-m", "twine", "check", *wheels, *sdists)

    env_dir = tmp_path / "venv"
    # A fresh environment without pip of its own (ensurepip cost ~8 s): this pip installs into it.
    # No byte-compiling of the dependencies either (~1/3 of the install): Python compiles on import.
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", wheels[0])
    # outside the checkout, so the installed package (not the source tree) is what runs
    out = run(env_dir / "bin" / "routerd", "check", cwd=tmp_path)
    assert "ok" in out.splitlines()
    webui = list((env_dir / "share" / "routerd" / "webui").glob("*.html"))
    assert webui, "the WebUI is installed with the package"
    # the OpenAPI document /openapi.json renders is package data
    doc = run(python, "-c", "from routerd.api.openapi import openapi_document as d; print(d()['openapi'])",
              cwd=tmp_path)
    assert doc.strip().startswith("3.")
