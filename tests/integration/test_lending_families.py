"""Lending between backend families (issue 11): a kobold owner (one KoboldCpp) lends its text
backlog to a llama_sdcpp helper through the master, and the other way round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer

from tests.integration.lending_support import JOB, ask_chat, start_trio, text_models, warm_and_link
from tests.integration.nodes import SIM

KOBOLD = {"backend": {"mode": "kobold"}, "kobold": {"binary_path": [*SIM, "koboldcpp"]}}


@pytest.mark.parametrize(("owner_mode", "helper_mode"),
                         [("kobold", "llama_sdcpp"), ("llama_sdcpp", "kobold")])
@pytest_twisted.ensureDeferred
async def test_text_backlog_is_lent_between_a_kobold_node_and_a_llama_sdcpp_node(
    tmp_path: Path, owner_mode: str, helper_mode: str,
) -> None:
    def sections(mode: str) -> dict[str, Any] | None:
        return KOBOLD if mode == "kobold" else None

    trio = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB),
                            owner_sections=sections(owner_mode), helper_sections=sections(helper_mode))
    try:
        registry = trio.master.node.master.registry  # type: ignore[union-attr]
        assert registry.find("owner", local_id="alpha").backend_mode == owner_mode  # type: ignore[union-attr]
        assert registry.find("helper", local_id="beta").backend_mode == helper_mode  # type: ignore[union-attr]
        await warm_and_link(trio)
        for node, config in ((trio.owner, "alpha.kcpps"), (trio.helper, "beta.kcpps")):
            assert node.node.runtimes.loaded_config("text") == config
            assert node.node.lending.lane_statuses()["text"].active_config == config
        results = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)])
        assert all(code == 200 for code, _, _ in results), results
        assert all(payload["model"] == "alpha" for _, payload, _ in results)
        lent = [r for _, _, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to")]
        assert lent, f"some of the {owner_mode} owner's backlog went to the {helper_mode} helper"
        assert all(r.headers.getRawHeaders(b"x-routerd-lent-to") == [b"helper/beta"] for r in lent)
        assert all(r.headers.getRawHeaders(b"x-routerd-node") == [b"helper"] for r in lent)
        kept = [r for _, _, r in results if not r.headers.getRawHeaders(b"x-routerd-lent-to")]
        assert kept and all(r.headers.getRawHeaders(b"x-routerd-node") == [b"owner"] for r in kept)
    finally:
        await trio.stop()
