"""Command-line flags: a declarative table per family, parsed with argparse after unknown flags
(the real binaries' many other options, passed through ``extra_args``) have been set aside."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Sequence

import attrs

__all__ = [
    "ENV_TIME_SCALE",
    "Flag",
    "SIM_FLAGS",
    "build_parser",
    "below_floor",
    "parse_flags",
    "split_known",
]

ENV_TIME_SCALE = "ROUTERD_SIM_TIME_SCALE"


@attrs.frozen
class Flag:
    """One option: its spellings, where it lands, and its value type (``bool`` = a switch)."""

    names: tuple[str, ...]
    dest: str
    type: type[str] | type[int] | type[float] | type[bool]
    default: object = None
    help: str = ""
    metavar: str | None = None

    @property
    def takes_value(self) -> bool:
        return self.type is not bool


SIM_FLAGS: tuple[Flag, ...] = (
    Flag(("--sim-fail-load",), "sim_fail_load", bool, False,
         "the model load fails: print an error and exit 1 after load_ms"),
    Flag(("--sim-crash-after",), "sim_crash_after", int, None,
         "exit with code 3 after serving N inference requests", "N"),
    Flag(("--sim-slowdown",), "sim_slowdown", float, 1.0,
         "multiply every job duration by F", "F"),
    Flag(("--sim-hang",), "sim_hang", bool, False,
         "accept requests but never answer them"),
    Flag(("--sim-time-scale",), "sim_time_scale", float, None,
         f"multiply all durations, load_ms included (default: ${ENV_TIME_SCALE} or 1.0)", "F"),
)


def build_parser(prog: str, flags: Iterable[Flag]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    for flag in flags:
        if flag.takes_value:
            parser.add_argument(
                *flag.names, dest=flag.dest, type=flag.type, default=flag.default,
                help=flag.help, metavar=flag.metavar,
            )
        else:
            parser.add_argument(*flag.names, dest=flag.dest, action="store_true", help=flag.help)
    return parser


def _looks_like_value(token: str) -> bool:
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def split_known(argv: Sequence[str], flags: Iterable[Flag]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into tokens for our parser and the ones to ignore.

    Only exact spellings count as known, so unknown short options such as ``-mg`` or ``-ctk`` are
    never mistaken for ``-m``/``-c`` with an attached value. An unknown option swallows the
    following token when that token looks like a value; the ignored list holds one entry per
    unknown option (``"-ngl 99"``).
    """
    table = {name: flag for flag in flags for name in flag.names}
    table["-h"] = table["--help"] = Flag(("-h", "--help"), "help", bool)
    known: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, has_inline, _ = token.partition("=")
        flag = table.get(name) if token.startswith("--") and has_inline else table.get(token)
        if flag is not None:
            known.append(token)
            if flag.takes_value and not has_inline and i + 1 < len(argv):
                known.append(argv[i + 1])
                i += 1
        else:
            if (
                token.startswith("-")
                and "=" not in token
                and i + 1 < len(argv)
                and _looks_like_value(argv[i + 1])
            ):
                token = f"{token} {argv[i + 1]}"
                i += 1
            unknown.append(token)
        i += 1
    return known, unknown


def parse_flags(
    prog: str,
    argv: Sequence[str],
    flags: Sequence[Flag],
    validate: Callable[[argparse.Namespace], str | None] | None = None,
) -> tuple[argparse.Namespace, list[str]]:
    """Parse the known flags and return them with the ignored tokens.

    Bad values exit with status 2 and a usage message, as argparse does."""
    known, unknown = split_known(argv, flags)
    parser = build_parser(prog, flags)
    namespace = parser.parse_args(known)
    if getattr(namespace, "sim_time_scale", "absent") is None:
        raw = os.environ.get(ENV_TIME_SCALE, "").strip()
        try:
            namespace.sim_time_scale = float(raw) if raw else 1.0
        except ValueError:
            parser.error(f"{ENV_TIME_SCALE}={raw!r} is not a number")
    problem = _check_sim_flags(namespace) or (validate(namespace) if validate else None)
    if problem:
        parser.error(problem)
    return namespace, unknown


def _check_sim_flags(namespace: argparse.Namespace) -> str | None:
    if getattr(namespace, "sim_time_scale", 1.0) < 0:
        return "--sim-time-scale must not be negative"
    if getattr(namespace, "sim_slowdown", 1.0) <= 0:
        return "--sim-slowdown must be positive"
    crash_after = getattr(namespace, "sim_crash_after", None)
    if crash_after is not None and crash_after < 0:
        return "--sim-crash-after must not be negative"
    return None


def below_floor(ns: argparse.Namespace, floors: dict[str, int]) -> str | None:
    """The complaint about the first numeric flag (by ``dest``) below its floor, or None: ``--x must
    not be negative`` for a floor of 0, ``--x must be at least N`` otherwise."""
    for dest, floor in floors.items():
        if getattr(ns, dest) < floor:
            flag = "--" + dest.replace("_", "-")
            return f"{flag} must not be negative" if floor == 0 else f"{flag} must be at least {floor}"
    return None
