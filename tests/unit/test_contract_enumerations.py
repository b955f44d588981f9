"""docs/contract.md lists every kind, trigger, outcome and reason the decision log accepts (issue 21
§3: it omitted ``model_ineligible``, outcome ``guardian`` with its reasons and ``helper_unreachable``
on ``stall_reclaimed``)."""

from __future__ import annotations

from pathlib import Path

from routerd.lending.decisions import KINDS, OUTCOMES_BY_KIND, REASONS_BY_KIND, TRIGGERS_BY_KIND

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"


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
