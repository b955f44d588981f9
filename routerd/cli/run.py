"""``routerd run``, ``routerd check`` and ``routerd version``.

``routerd run`` is ``twistd --nodaemon --pidfile= routerd …`` without twistd's plugin discovery: the
service maker is handed to twistd's own option parser directly, so the command works in an editable
install (where ``twisted/plugins`` is not on ``sys.path``) and keeps every twistd behaviour (signal
handling, ``--logfile``, reactor selection, exit on ``SIGTERM``).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from twisted.application.service import IServiceMaker, ServiceMaker

import routerd

SERVICE_MAKER = ServiceMaker("routerd", "routerd.tap", "Cluster router for local AI inference backends",
                             "routerd")

# twistd options ``routerd run`` passes to twistd itself rather than to the routerd plugin.
_TWISTD_VALUE_OPTIONS = ("--logfile", "-l", "--logger", "--reactor", "-r", "--umask", "--rundir", "-d")


def _twistd_argv(args: Sequence[str]) -> list[str]:
    """``["--nodaemon", "--pidfile=", <twistd options>, "routerd", <routerd options>]``."""
    head: list[str] = ["--nodaemon", "--pidfile="]
    tail: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        name = arg.split("=", 1)[0]
        if name in _TWISTD_VALUE_OPTIONS:
            if "=" in arg:
                head.append(arg)
            elif i + 1 < len(items):
                head.extend([arg, items[i + 1]])
                i += 1
            else:
                head.append(arg)
        else:
            tail.append(arg)
        i += 1
    return [*head, "routerd", *tail]


def wants_help(args: Sequence[str]) -> bool:
    """Whether ``routerd run``'s arguments ask for its usage."""
    return any(arg in ("--help", "-h") for arg in args)


def usage() -> str:
    """``routerd run``'s own usage: the routerd options and the twistd ones it passes to twistd
    (twistd's help would say ``Usage: twistd [options] routerd …``, a command nobody typed)."""
    from routerd.tap import Options

    options = Options()  # type: ignore[no-untyped-call]
    twistd = ("  -l, --logfile=    log to this file instead of stdout\n"
              "      --logger=     a twistd log observer factory (module.name)\n"
              "  -r, --reactor=    the Twisted reactor to use\n"
              "      --umask=      the process's umask\n"
              "  -d, --rundir=     change to this folder first\n")
    own = options.getUsage().split("\n", 1)[-1].rstrip("\n")  # without its "Options:" line
    return (f"Usage: routerd run {options.synopsis} [--logfile PATH] [--reactor NAME] "
            "[--umask UMASK] [--rundir DIR]\n"
            "Run a routerd node in the foreground (twistd --nodaemon routerd …); SIGTERM or Ctrl-C drains "
            "it and stops.\nOnce ready it logs the WebUI's address (http://host:port/ui/).\n"
            f"Options:\n{own}\ntwistd options:\n{twistd}")


def run(args: Sequence[str]) -> int:
    """Run a node in the foreground (never returns normally: twistd exits the process)."""
    from twisted.application import app
    from twisted.scripts import twistd
    from twisted.scripts._twistd_unix import ServerOptions as TwistdOptions

    class ServerOptions(TwistdOptions):
        @staticmethod
        def _getPlugins(interface: Any, package: Any = None) -> Iterable[Any]:
            return [SERVICE_MAKER] if interface is IServiceMaker else []

    argv = _twistd_argv(args)
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        app.run(twistd.runApp, ServerOptions)
    finally:
        sys.argv = saved
    return 0


def plugin_discoverable() -> bool:
    """Whether ``twistd routerd`` finds the plugin (it does not in a default editable install)."""
    from twisted.plugin import getPlugins

    try:
        return any(p.tapname == "routerd" for p in getPlugins(IServiceMaker))
    except Exception:
        return False


def version_lines() -> list[str]:
    import twisted

    lines = [f"routerd {routerd.__version__}",
             f"twisted {twisted.__version__}, python {platform.python_version()}"]
    if plugin_discoverable():
        lines.append("twistd plugin: found (twistd routerd works)")
    else:
        lines.append("twistd plugin: not found (use `routerd run`, or see README: Install)")
    return lines


def check(config: str | None) -> tuple[bool, list[str]]:
    from routerd.checking import check_config

    return check_config(config)
