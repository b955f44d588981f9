"""Stateless fuzzing (schemathesis) of every operation in ``openapi.yaml`` against a live node: a
master on 127.0.0.1 with simulator backends.  Every answer: no 500, every error the contract's
envelope for its path, status, content type and body as the document describes them."""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import threads

from routerd.api.openapi import openapi_document
from routerd.errors import style_for_path
from tests.integration.nodes import FAST_TEXT, TOKEN, RunningNode, plan_cluster, start_node, write_models

pytestmark = pytest.mark.slow

#: Examples per operation: ~96 operations × 10 stays within the suite's one-minute budget; set
#: ROUTERD_FUZZ_EXAMPLES for a longer hunt by hand.
EXAMPLES = int(os.environ.get("ROUTERD_FUZZ_EXAMPLES", "10"))
#: Inference bodies get a real model half the time, so the fuzzer reaches the backends and not
#: only "model not found" ("chat", or "embed" on the embedding paths).
_REAL_MODEL = {"/v1/embeddings": "embed", "/api/embed": "embed"}


@pytest_twisted.async_yield_fixture
async def master(tmp_path: Path) -> AsyncIterator[RunningNode]:
    plan = plan_cluster(tmp_path, [])
    write_models(plan.root / "master",
                 {"chat": {"model": "../weights/chat.sim.json", "contextsize": 4096},
                  "embed": {"embeddingsmodel": "../weights/embed.sim.json"}},
                 {"chat": FAST_TEXT, "embed": {**FAST_TEXT, "embedding_dim": 4}})
    running = await start_node(plan.master_config(limits={"first_byte_timeout": "20s"}))
    yield running
    await running.stop()


def envelope_problem(path: str, response: requests.Response) -> str | None:
    """Why an error answer is not the contract's envelope for ``path`` (None when it is)."""
    try:
        body = json.loads(response.content)
    except ValueError:
        return f"error body is not JSON: {response.content[:200]!r}"
    if not isinstance(body, dict) or "error" not in body:
        return f"error body has no 'error': {body!r}"
    if style_for_path(path) == "ollama":
        return None if isinstance(body["error"], str) else f"ollama error is not a string: {body!r}"
    error = body["error"]
    if not isinstance(error, dict) or not all(isinstance(error.get(k), str) for k in ("message", "type")) \
            or not isinstance(error.get("code"), str | int):
        return f"error is not {{message, type, code}}: {body!r}"
    return None


_ROUTED = {p for p, item in openapi_document()["paths"].items()
           if "post" in item and p.startswith(("/v1/", "/api/", "/sdapi/", "/completion"))}


def _valid_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
        and isinstance(m.get("content"), str) for m in value)


def _with_model(case: Any, pick: bool) -> Any:
    """Half the inference bodies name a real model, with the fields that model needs to answer
    (the rest stay as generated) and a short generation, so the fuzzer reaches the backends."""
    body = case.body
    if not (pick and isinstance(body, dict) and case.operation.path in _ROUTED):
        return case
    body["model"] = _REAL_MODEL.get(case.operation.path, "chat")
    if "messages" in body or case.operation.path in ("/v1/chat/completions", "/api/chat"):
        if not _valid_messages(body.get("messages")):
            body["messages"] = [{"role": "user", "content": "hello"}]
    if case.operation.path in _REAL_MODEL and not isinstance(body.get("input"), str):
        body["input"] = "hello"
    for key in ("max_tokens", "n_predict", "max_length"):
        body[key] = 4
    return case


@attrs.define
class Findings:
    failures: list[str] = attrs.Factory(list)
    statuses: dict[str, Counter[int]] = attrs.Factory(lambda: defaultdict(Counter))


def fuzz_operation(operation: Any, base_url: str, session: requests.Session, findings: Findings) -> None:
    """``EXAMPLES`` valid and invalid requests to one operation; what is wrong goes to ``findings``."""
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    # schemathesis' not_a_server_error counts every 5xx; 501/502/503/504 are routerd's honest
    # answers (unsupported family, node unreachable, no capable model, timeout): only 500 is a bug.
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    headers = {"Authorization": f"Bearer {TOKEN}"} if operation.path.startswith("/router/v1/node/") else {}
    name = f"{operation.method.upper()} {operation.path}"
    # valid requests as the document describes them, and requests that break it
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                      operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=EXAMPLES == 10,
              suppress_health_check=list(HealthCheck))
    @given(case=cases, pick=st.booleans())
    def run(case: Any, pick: bool) -> None:
        case = _with_model(case, pick)
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=30)
        label = f"{case.method} {case.formatted_path} -> {response.status_code}"
        findings.statuses[name][response.status_code] += 1
        if response.status_code == 500:
            findings.failures.append(f"{label}: server error {response.content[:300]!r}")
        if response.status_code >= 400:
            problem = envelope_problem(case.formatted_path, response)
            if problem:
                findings.failures.append(f"{label}: {problem}")
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except BaseException as exc:  # schemathesis' FailureGroup: keep going, report them all
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            findings.failures.append(f"{label}: {str(exc)[:600]}")

    run()


def fuzz(base_url: str) -> Findings:
    """Every operation of the document (in a thread: the reactor keeps serving the node)."""
    import schemathesis

    schema = schemathesis.openapi.from_dict(json.loads(json.dumps(openapi_document())))
    findings = Findings()
    session = requests.Session()
    for result in schema.get_all_operations():
        fuzz_operation(result.ok(), base_url, session, findings)
    return findings


@pytest_twisted.ensureDeferred
async def test_fuzzing_every_operation_finds_no_500_and_no_malformed_answer(master: RunningNode) -> None:
    random.seed(0)
    findings = await threads.deferToThread(fuzz, master.url)
    failures, statuses = findings.failures, findings.statuses
    assert failures == [], "\n".join(failures[:40])
    documented = {f"{m.upper()} {p}" for p, item in openapi_document()["paths"].items() for m in item}
    assert set(statuses) == documented  # every operation was called
    # the fuzzer reached real answers, not only refusals
    for operation in ("POST /v1/chat/completions", "POST /v1/embeddings", "GET /v1/models"):
        assert statuses[operation][200] > 0, (operation, statuses[operation])
