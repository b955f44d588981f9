"""The family registry finds the families in the modules of their package: every module with a
``DECLARED`` named after it is a family, listed with the default first and then by name; a module
without one is a shared part; a declaration under another module's name, a package without the
default family and a module asking the registry while the families are being found are refused."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from routerd import families

_COUNTER = itertools.count()


def family_source(name: str, **facts: str) -> str:
    extra = "".join(f", {key}={value}" for key, value in facts.items())
    return (f"from routerd.families import Declared\n"
            f"DECLARED = Declared({name!r}, sections={{'text': {name!r}}},\n"
            f"                    simulators={{{name!r}: 'x'}}{extra})\n")


def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: dict[str, str]) -> str:
    """A package of ``modules`` (name -> source) that the registry scans instead of the real one."""
    package = f"toy_families_{next(_COUNTER)}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(families, "FAMILY_PACKAGE", package)
    monkeypatch.setattr(families, "_BY_NAME", {})
    return package


def test_every_module_declaring_a_family_is_found_default_first_then_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy_package(tmp_path, monkeypatch, {
        "zeta": family_source("zeta"),
        families.DEFAULT_MODE: family_source(families.DEFAULT_MODE),
        "alpha": family_source("alpha", single_process="True"),
        "shared": "HELPER = 1\n",
    })
    assert families.backend_modes() == (families.DEFAULT_MODE, "alpha", "zeta")
    assert families.binary_sections() == (families.DEFAULT_MODE, "alpha", "zeta")
    assert families.declared("alpha").single_process and families.single_process("alpha")
    assert not families.single_process("zeta") and not families.single_process("shared")
    assert families.is_declared("zeta") and not families.is_declared("shared")
    with pytest.raises(KeyError):
        families.declared("shared")


def test_a_declaration_under_another_modules_name_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy_package(tmp_path, monkeypatch, {families.DEFAULT_MODE: family_source(families.DEFAULT_MODE),
                                        "beta": family_source("gamma")})
    with pytest.raises(ImportError, match="beta"):
        families.backend_modes()


def test_a_package_without_the_default_family_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy_package(tmp_path, monkeypatch, {"beta": family_source("beta")})
    with pytest.raises(ImportError, match=families.DEFAULT_MODE):
        families.backend_modes()


def test_a_module_asking_the_registry_while_it_is_found_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy_package(tmp_path, monkeypatch, {
        families.DEFAULT_MODE: family_source(families.DEFAULT_MODE),
        "asks": "from routerd.families import backend_modes\nMODES = backend_modes()\n",
    })
    with pytest.raises(RuntimeError, match="being found"):
        families.backend_modes()
    assert not families._finding
