"""The README's test command is what CI runs, and it brings the real-backend tier with it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_test_command() -> str:
    lines = [line for line in (ROOT / "README.md").read_text().splitlines()
             if line.startswith("(command -v chromedriver")]
    assert len(lines) == 1, "the README has exactly one test command"
    return lines[0]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    script = (ROOT / ".ci" / "run").read_text().rstrip("\n").splitlines()
    assert script[-1] == readme_test_command()


def test_the_test_command_installs_the_real_servers_before_the_tests_and_requires_them() -> None:
    command = readme_test_command()
    install = command.index("python -m tests.real_servers install")
    tests = command.index("python -m pytest")
    assert install < tests
    assert "ROUTERD_REAL_SERVERS_REQUIRED=1 .venv/bin/python -m pytest" in command
