"""Errors the backends raise to the rest of routerd."""

from __future__ import annotations

import re
from collections.abc import Sequence


class BackendMissing(Exception):
    """The backend program named in the config cannot be found."""


class LoadFailed(Exception):
    """A backend could not be brought up for a config; ``reason`` says why (for a process that
    exited: its own reason or exit code, then its last output lines).  As text it is the reason
    without the output lines: what a client's answer says (the load-errors list keeps the lines)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return split_output(self.reason)[0]


class RuntimeClosed(LoadFailed):
    """The runtime was stopped (service shutdown) before the request could be served."""


#: What joins a load failure's reason to the backend's last output lines.
OUTPUT_MARK = "; last output:\n"


def with_output(reason: str, lines: list[str]) -> str:
    """A load failure's reason followed by the backend's last output lines (when it has any)."""
    if not lines:
        return reason
    return reason + OUTPUT_MARK + "\n".join(lines)


#: llama.cpp's log line: the elapsed time (unless ``--log-timestamps`` is off), a level letter, the text
#: (``0.00.017.729 E llama_model_load: ...``).
_LEVELLED = re.compile(r"^(?:\d+(?:\.\d+)+ )?([DIWE]) (.*)$")
#: Words a backend's own line uses when something went wrong (whisper.cpp, the simulator and KoboldCpp
#: print no level letter).
_TROUBLE = re.compile(r"\b(?:error|failed|invalid|cannot|unable)\b", re.IGNORECASE)


def own_reason(lines: Sequence[str]) -> str | None:
    """The backend's own words for what went wrong: its first error line among ``lines`` (llama.cpp's
    level-E lines, without their time and level; else the first line saying error, failed, invalid,
    cannot or unable), or ``None``."""
    for line in lines:
        levelled = _LEVELLED.match(line)
        if levelled is not None:
            if levelled.group(1) == "E":
                return levelled.group(2).strip()
        elif _TROUBLE.search(line):
            return line.strip()
    return None


def exit_reason(subject: str, exited: str, lines: Sequence[str]) -> str:
    """Why a backend process ended: ``subject`` (``llama for 'chat'``), the backend's own reason when its
    output has one, else only how it ``exited`` (``exited with exit code 1 during the load``), followed by
    its last output lines."""
    cause = own_reason(lines)
    head = f"{subject} {exited}" if cause is None else f"{subject}: {cause} ({exited})"
    return with_output(head, list(lines))


def split_output(reason: str) -> tuple[str, list[str]]:
    """:func:`with_output` undone: the reason and the output lines it carried."""
    message, mark, tail = reason.partition(OUTPUT_MARK)
    return message, tail.split("\n") if mark else []
