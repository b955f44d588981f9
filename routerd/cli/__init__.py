"""The ``routerd`` console command.

``routerd run``/``check``/``version``/``demo`` work on this machine; every other subcommand scripts a running
node's HTTP API, at ``--url`` (or ``ROUTERD_URL``, default ``http://127.0.0.1:8080``) with the bearer
key ``--key`` (or ``ROUTERD_KEY``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from routerd.cli import commands, run
from routerd.cli.http import ApiError, Client

EXIT_ERROR = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # Accepted before or after the subcommand; SUPPRESS keeps a subcommand's absent option from
    # overwriting the value given before it.
    common.add_argument("--url", default=argparse.SUPPRESS,
                        help="node URL (env ROUTERD_URL; default http://127.0.0.1:8080)")
    common.add_argument("--key", default=argparse.SUPPRESS,
                        help="bearer key: an admin key for /router/v1 (env ROUTERD_KEY)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds per HTTP call")
    common.add_argument("--compact", action="store_true", default=argparse.SUPPRESS,
                        help="one-line JSON output")
    parser = argparse.ArgumentParser(
        prog="routerd", description="Run and script a routerd node.", parents=[common],
        epilog="API commands read --url/--key, else ROUTERD_URL/ROUTERD_KEY.")
    parser.set_defaults(url=None, key=None, timeout=30.0, compact=False)
    sub = parser.add_subparsers(dest="name", required=True, metavar="COMMAND")
    p = sub.add_parser("run", help="run a node in the foreground (twistd -n routerd …)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("demo", help="a three-node simulated cluster with lending and load; Ctrl-C stops it "
                                    "(routerd demo --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("check", help="validate a config and its model configs; print ok or every error")
    p.add_argument("--config", "-c", help="YAML config (default: the embedded default)")
    sub.add_parser("version", help="print the routerd, Twisted and Python versions")
    commands.add_api_commands(sub, common)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None,
         client: Client | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args_list = list(sys.argv[1:] if argv is None else argv)
    # ``routerd run`` hands everything after ``run`` to twistd and the routerd plugin untouched.
    if args_list and args_list[0] == "run":
        if run.wants_help(args_list[1:]):
            out.write(run.usage())
            return 0
        return run.run(args_list[1:])
    if args_list and args_list[0] == "demo":  # its own options (routerd.demo.demo.parse_args)
        from routerd.demo import demo
        return demo.main(args_list[1:])
    args = _parser().parse_args(args_list)
    if args.name == "check":
        ok, errors = run.check(args.config)
        if ok:
            out.write("ok\n")
            return 0
        for line in errors:
            out.write(line + "\n")
        return EXIT_ERROR
    if args.name == "version":
        out.write("\n".join(run.version_lines()) + "\n")
        return 0
    client = client or Client(args.url, args.key, timeout=args.timeout)
    try:
        return int(args.command(client, args, out))
    except ApiError as exc:
        err.write(f"routerd {args.name}: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def console() -> None:
    sys.exit(main())
