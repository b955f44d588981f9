"""The README's "With your own llama-server" block works as written, on a real llama-server and a GGUF.

The block is taken from between its markers in README.md and run line by line in a fresh folder, with only
three things changed: its two path variables (the tier's llama-server and the tiny model) and the port (8080
becomes a free one, so the test can run beside anything).  The ``routerd run … &`` line is started as its own
process (stopped by the test); every other line runs in bash as written, and the last line's answer must be
the tiny model's known sentence.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.nodes import free_port
from tests.integration.processes import stop
from tests.integration.real_backends import LLAMA_ANSWER, RealServers, TinyModels

pytestmark = [pytest.mark.slow, pytest.mark.real]

ROOT = Path(__file__).resolve().parents[2]


def readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- own-llama-server -->\n```sh\n(.*?)```\n<!-- /own-llama-server -->", text, re.S)
    assert found, "README.md has the own-llama-server block between its markers"
    return found.group(1).strip().splitlines()


def test_the_readme_block_for_your_own_llama_server_answers_a_chat_as_written(
        tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> None:
    lines = readme_block()
    assert lines[0] == "LLAMA_SERVER=/path/to/llama-server; GGUF=/path/to/model.gguf"
    port = str(free_port())
    venv = Path(sys.executable).parent
    lines = [line.replace("8080", port).replace(".venv/bin/", f"{venv}/") for line in lines]
    lines[0] = f"LLAMA_SERVER={real_servers.llama}; GGUF={tiny_models.tiny}"
    (run_at,) = [i for i, line in enumerate(lines) if " run --config " in line]
    assert lines[run_at].endswith(" &")

    setup = subprocess.run(["bash", "-euc", "\n".join(lines[:run_at])], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, check=False)
    assert setup.returncode == 0, setup.stderr
    assert setup.stdout.strip().splitlines()[0] == "ok"  # routerd check

    node = subprocess.Popen(["bash", "-c", "exec " + lines[run_at].removesuffix(" &")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        body: dict[str, object] = {}
        while "choices" not in body and time.monotonic() < deadline:  # a starting node answers 503 "starting"
            asked = subprocess.run(["bash", "-c", "\n".join(lines[run_at + 1:])], cwd=tmp_path,
                                   capture_output=True, text=True, timeout=60, check=False)
            body = json.loads(asked.stdout) if asked.stdout.startswith("{") else {}
        assert "choices" in body, body
        assert body["choices"][0]["message"]["content"] == LLAMA_ANSWER
        assert body["model"] == "my-model"
    finally:
        output = stop(node, signal.SIGTERM, collect=True)
    assert b"routerd node local is ready" in output
