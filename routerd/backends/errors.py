"""Errors the backends raise to the rest of routerd."""

from __future__ import annotations


class BackendMissing(Exception):
    """The backend program named in the config cannot be found."""


class LoadFailed(Exception):
    """A backend could not be brought up for a config; ``reason`` says why
    (for a process that exited: its exit code and last output lines)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RuntimeClosed(LoadFailed):
    """The runtime was stopped (service shutdown) before the request could be served."""


#: What joins a load failure's reason to the backend's last output lines.
OUTPUT_MARK = "; last output:\n"


def with_output(reason: str, lines: list[str]) -> str:
    """A load failure's reason followed by the backend's last output lines (when it has any)."""
    if not lines:
        return reason
    return reason + OUTPUT_MARK + "\n".join(lines)


def split_output(reason: str) -> tuple[str, list[str]]:
    """:func:`with_output` undone: the reason and the output lines it carried."""
    message, mark, tail = reason.partition(OUTPUT_MARK)
    return message, tail.split("\n") if mark else []
