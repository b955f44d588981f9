"""docs/contract.md lists every kind, trigger, outcome and reason the decision log accepts (it once
omitted ``model_ineligible``, outcome ``guardian`` with its reasons and ``helper_unreachable`` on
``stall_reclaimed``), and every value of the other enumerations the code has a table of, each in the
section where it is used: the values are read from the code's constants and ``Literal`` types."""

from __future__ import annotations

from typing import get_args

import pytest

from routerd.cluster.auth import RouteClass
from routerd.config.keys import PRIORITY_CLASSES
from routerd.config.lending import Kind
from routerd.config.schema import ROLES
from routerd.families import every_family
from routerd.inference.admin import UNLOAD_TARGETS
from routerd.lanes import LANES
from routerd.lending.decisions import KINDS, OUTCOMES_BY_KIND, REASONS_BY_KIND, TRIGGERS_BY_KIND
from routerd.lending.layering import Source
from routerd.registry.recipes import RECIPE_LANES
from routerd.routing.classify import RouteKind
from routerd.routing.guardians import SCOPES
from routerd.store.analytics import ANALYTICS_LANES, LEVELS, PERIODS
from routerd.store.samples import RUNTIMES as SAMPLE_RUNTIMES
from routerd.store.samples import SECTIONS as SAMPLE_SECTIONS
from routerd.wire.lending import HeldState, ServiceSource
from routerd.wire.telemetry import ATTENTION_CODES, GPU_STATES

from .contract_doc import CONTRACT, section


def test_every_value_the_decision_log_accepts_is_in_the_contract() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    enumeration = text[text.index("Enumerations:"):]
    values = set(KINDS)
    for table in (OUTCOMES_BY_KIND, REASONS_BY_KIND, TRIGGERS_BY_KIND):
        for kind_values in table.values():
            values |= {v for v in kind_values if v}
    missing = sorted(v for v in values if f"`{v}`" not in enumeration)
    assert missing == []
    assert "`service_unpriced`" in enumeration and "never written" in enumeration


def _listed(value: str, text: str) -> bool:
    """A value is listed when the contract writes it as a name (`value`) or a JSON string ("value")."""
    return f"`{value}`" in text or f'"{value}"' in text


#: (what, the code's values, the contract section that must list each).
ENUMERATIONS: list[tuple[str, tuple[str, ...], int]] = [
    ("analytics request row route", get_args(RouteKind), 9),
    ("analytics lane", ANALYTICS_LANES, 9),
    ("analytics rollup level", tuple(LEVELS), 9),
    ("analytics period", tuple(PERIODS), 9),
    ("request sample section", SAMPLE_SECTIONS, 8),
    ("load sample runtime", SAMPLE_RUNTIMES, 8),
    ("decision service_source", get_args(ServiceSource), 8),
    ("held request state", get_args(HeldState), 6),
    ("telemetry GPU state", GPU_STATES, 6),
    ("telemetry attention code", ATTENTION_CODES, 6),
    ("lane", LANES, 6),
    ("guardian scope", SCOPES, 7),
    ("lending setting source", get_args(Source), 7),
    ("lending setting kind", get_args(Kind), 7),
    ("split recipe lane", RECIPE_LANES, 7),
    ("unload target", UNLOAD_TARGETS, 7),
    ("priority class", PRIORITY_CLASSES, 5),
    ("cluster role", ROLES, 2),
    ("backend mode", tuple(family.name for family in every_family()), 2),
    ("route credential", get_args(RouteClass), 10),
]


@pytest.mark.parametrize(("what", "values", "number"), ENUMERATIONS, ids=[e[0] for e in ENUMERATIONS])
def test_every_value_of_an_enumeration_the_code_has_is_in_its_contract_section(
        what: str, values: tuple[str, ...], number: int) -> None:
    assert values, what
    text = section(number)
    assert [v for v in values if not _listed(v, text)] == []
