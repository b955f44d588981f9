"""The fault soak's short version (``benchmarks/soak.py``): master + two slaves with lending links
as ``twistd`` processes with simulator backends, mixed requests at concurrency, and every fault of
the full soak on the same schedule (shorter freeze and read-only windows).  Every request is
answered exactly once; the only errors are where a backend really failed mid-answer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import pytest_twisted

pytestmark = pytest.mark.slow

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("routerd_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Answers the crash faults explain: the backend died mid-answer or mid-load (502), or the
#: cluster had no replica for a moment (503 without Retry-After), or a stream broke off.
BACKEND_FAILED = ("http 502 ", "http 503 ", "broken stream")


@pytest_twisted.ensureDeferred
async def test_short_soak_loses_and_duplicates_nothing_under_faults(tmp_path: Path) -> None:
    soak = soak_module()
    plan = soak.SoakPlan(requests=240, concurrency=16, freeze_s=3.0, read_only_s=2.0, restart_after_s=1.0,
                         deadline_s=60.0)
    report = await soak.run_soak(plan, tmp_path)
    print(report.text())
    assert report.lost == 0, report.text()
    assert report.duplicated == [] and report.answered_twice == 0, report.text()
    assert report.answered == plan.requests
    assert report.unlogged == 0, report.text()
    unexplained = {error: n for error, n in report.errors.items() if not error.startswith(BACKEND_FAILED)}
    assert unexplained == {}, report.text()
    assert sum(report.errors.values()) <= plan.requests // 10, report.text()
    assert len(report.faults) >= 10, report.faults  # every fault ran
