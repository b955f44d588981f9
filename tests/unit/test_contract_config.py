"""docs/contract.md §2 names every config section and key the loader accepts, each in its section's
bullet.  The keys are the loader's own lists: every ``Reader.unknown(section, name, known)`` call a
config parse makes (the families' sections and settings, the lending settings' table included), and
the fields of an ``auth.inference_keys`` entry and its ``limits``."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from routerd.config.keys import KEY_FIELDS, LIMIT_FIELDS
from routerd.config.load import parse_config
from routerd.config.reader import Reader

from . import contract_doc


def accepted_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Section → the keys the loader accepts in it, as one parse of a minimal config asks
    ``Reader.unknown`` to check them."""
    seen: dict[str, set[str]] = defaultdict(set)
    check = Reader.unknown

    def spy(self: Reader, section: Mapping[str, Any], name: str, known: tuple[str, ...]) -> None:
        seen[name].update(known)
        check(self, section, name, known)

    monkeypatch.setattr(Reader, "unknown", spy)
    parse_config({"models": {"config_dir": str(tmp_path)}}, base_dir=str(tmp_path), env={})
    return dict(seen)


def section_bullets() -> dict[str, str]:
    """Section name → the text of the §2 bullet(s) naming it before their first colon."""
    out: dict[str, str] = defaultdict(str)
    for bullet in contract_doc.bullets(contract_doc.section(2)):
        head = bullet[2:].split(":", 1)[0]
        for name in contract_doc.ticked(head):
            out[name] += bullet + "\n"
    return dict(out)


def test_the_spy_sees_every_section_the_loader_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sections found are the loader's: its fixed ones and a binary section per family."""
    sections = set(accepted_keys(tmp_path, monkeypatch))
    assert {"server", "auth", "models", "backend", "cluster", "limits", "queue", "analytics",
            "llama", "kobold", "vllm"} <= sections
    assert "no_model" in accepted_keys(tmp_path, monkeypatch)["kobold"]


def test_every_section_and_key_the_loader_accepts_is_in_its_contract_bullet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    documented = section_bullets()
    missing: list[str] = []
    for section, keys in sorted(accepted_keys(tmp_path, monkeypatch).items()):
        bullet = documented.get(section)
        if bullet is None:
            missing.append(f"section {section}")
            continue
        names = contract_doc.ticked(bullet)
        missing += [f"{section}.{key}" for key in sorted(keys) if key not in names]
    assert missing == []


def test_every_field_of_an_inference_key_entry_is_in_the_auth_bullet() -> None:
    """The entry is written as an object in the bullet (``{name, key | key_file | key_env, …}``),
    so each field is looked for as a word of it."""
    bullet = section_bullets()["auth"]
    assert "limits" in KEY_FIELDS and "weight" in LIMIT_FIELDS
    missing = [f for f in (*KEY_FIELDS, *LIMIT_FIELDS) if re.search(rf"(?<![\w.]){f}(?!\w)", bullet) is None]
    assert missing == []


def test_no_section_bullet_names_a_key_the_loader_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way round: a section the contract lists is one the loader reads (a section it
    dropped or renamed would leave the contract promising a key that is refused)."""
    accepted = accepted_keys(tmp_path, monkeypatch)
    assert sorted(set(section_bullets()) - set(accepted)) == []
