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
