"""Subcommands that script a node's (and, on a master, the site's) HTTP API.

Each command is one function ``(client, args, out) -> exit status``; answers print as indented JSON
(``--compact`` for one line), so the output pipes into ``jq``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, TextIO

from routerd.cli.http import Client
from routerd.paths import NODE_DECISIONS

SITE = "/router/v1/site"
LINK_PATHS = {"image": f"{SITE}/routing-groups", "text": f"{SITE}/text-routing-groups"}

Command = Callable[[Client, argparse.Namespace, TextIO], int]


def emit(out: TextIO, value: Any, args: argparse.Namespace) -> None:
    if getattr(args, "compact", False):
        out.write(json.dumps(value, separators=(",", ":")) + "\n")
    else:
        out.write(json.dumps(value, indent=2) + "\n")
    out.flush()


def endpoint(text: str) -> dict[str, str]:
    """``NODE/MODEL`` → ``{"node_id", "model_id"}`` (a model ID may itself contain ``/``)."""
    node_id, sep, model_id = text.partition("/")
    if not sep or not node_id or not model_id:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE/MODEL")
    return {"node_id": node_id, "model_id": model_id}


def settings_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is read as JSON when it parses (``20``, ``true``), else as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def models(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.get("/router/v1/models"), args)
    return 0


def state(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.node:
        emit(out, client.get(f"{SITE}/nodes/state", node_id=args.node), args)
    else:
        emit(out, client.get("/router/v1/state"), args)
    return 0


def load(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.post("/router/v1/load", {"model": args.model}), args)
    return 0


def unload(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    body: dict[str, Any] = {}
    if args.model:
        body["model"] = args.model
    if args.target:
        body["target"] = args.target
    emit(out, client.post("/router/v1/unload", body), args)
    return 0


def reload(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.post("/router/v1/reload"), args)
    return 0


def links_list(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    anchor = args.anchor or {}
    emit(out, client.get(LINK_PATHS[args.lane], node_id=anchor.get("node_id"),
                         model_id=anchor.get("model_id")), args)
    return 0


def _peers(items: list[dict[str, str]], args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{**item, "load_if_unloaded": not args.no_load,
             "restore_after_borrow": args.restore_after_borrow} for item in items]


def links_set(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    body = {"anchor": args.anchor, "lends_to": _peers(args.lends_to, args),
            "borrows_from": _peers(args.borrows_from, args),
            "acknowledge_different_weights": args.acknowledge_different_weights}
    emit(out, client.post(LINK_PATHS[args.lane], body), args)
    return 0


def links_delete(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.delete(LINK_PATHS[args.lane], node_id=args.anchor["node_id"],
                            model_id=args.anchor["model_id"]), args)
    return 0


def _scope(args: argparse.Namespace) -> dict[str, str]:
    """``--node``/``--model`` → the scope key: model (both), node (node only), else cluster."""
    if args.model and not args.node:
        raise SystemExit("--model needs --node (a model is named by its local ID on a node)")
    if args.model:
        return {"scope": "model", "node_id": args.node, "model_id": args.model}
    if args.node:
        return {"scope": "node", "node_id": args.node}
    return {"scope": "cluster"}


def guardians_list(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.get(f"{SITE}/guardians"), args)
    return 0


def guardians_set(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.post(f"{SITE}/guardians", {**_scope(args), "guardian": args.guardian}), args)
    return 0


def guardians_delete(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.delete(f"{SITE}/guardians", **_scope(args)), args)
    return 0


def settings_get(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.get(f"{SITE}/offload/settings"), args)
    return 0


def settings_set(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.post(f"{SITE}/offload/settings", {"values": dict(args.values)}), args)
    return 0


def settings_clear(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    emit(out, client.delete(f"{SITE}/offload/settings", key=args.key), args)
    return 0


def decisions(client: Client, args: argparse.Namespace, out: TextIO,
              sleep: Callable[[float], None] = time.sleep) -> int:
    """Decision rows, newest first; with ``--follow``, then every new row as one JSON line, oldest
    first, polling every ``--interval`` seconds until interrupted (or ``--max-polls`` polls) with the
    answer's ``cursor`` (each row once: ``routerd.lending.follow``, as the WebUI's live tail)."""
    path = f"{SITE}/offload/decisions" if not args.node_local else NODE_DECISIONS
    query: dict[str, str | int | None] = {"lane": args.lane, "outcome": args.outcome, "kind": args.kind,
                                          "node_id": args.node, "limit": args.limit}
    answer = client.get(path, **query)
    if not args.follow:
        emit(out, answer, args)
        return 0
    polls = 0
    while True:
        for row in reversed(answer.get("records", [])):
            out.write(json.dumps(row) + "\n")
        out.flush()
        if args.max_polls is not None and polls >= args.max_polls:
            return 0
        if not answer.get("cursor"):
            raise SystemExit("this node answers no follow cursor: --follow needs a node of this version")
        sleep(args.interval)
        polls += 1
        answer = client.get(path, **{**query, "after": answer["cursor"]})


def add_api_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Registers the API subcommands on an argparse subparsers object; ``common`` holds the connection
    options every subcommand accepts."""
    parents = [common]
    p = sub.add_parser("models", parents=parents, help="models of the node (every node's, on a master)")
    p.set_defaults(command=models)
    p = sub.add_parser("state", parents=parents, help="runtimes, active and held requests")
    p.add_argument("--node", help="another node's state, through the master")
    p.set_defaults(command=state)
    p = sub.add_parser("load", parents=parents, help="load a model (on whichever node has it)")
    p.add_argument("model")
    p.set_defaults(command=load)
    p = sub.add_parser("unload", parents=parents, help="unload a model (all models without one)")
    p.add_argument("model", nargs="?")
    p.add_argument("--target", help="unload only this runtime (e.g. text, image)")
    p.set_defaults(command=unload)
    p = sub.add_parser("reload", parents=parents,
                       help="re-read the config and rescan the models folder (as SIGHUP does)")
    p.set_defaults(command=reload)

    links = sub.add_parser("links", parents=parents, help="lending links (master)").add_subparsers(
        dest="links_action", required=True)
    for name, func, help_text in (("list", links_list, "links, and an anchor's candidates"),
                                  ("set", links_set, "replace every link touching an anchor"),
                                  ("delete", links_delete, "remove every link touching an anchor")):
        p = links.add_parser(name, parents=parents, help=help_text)
        p.add_argument("--lane", choices=sorted(LINK_PATHS), default="text")
        p.add_argument("--anchor", type=endpoint, required=name != "list", metavar="NODE/MODEL")
        if name == "set":
            p.add_argument("--lends-to", type=endpoint, action="append", default=[], metavar="NODE/MODEL")
            p.add_argument("--borrows-from", type=endpoint, action="append", default=[],
                           metavar="NODE/MODEL")
            p.add_argument("--no-load", action="store_true", help="lend only while the helper is loaded")
            p.add_argument("--restore-after-borrow", action="store_true")
            p.add_argument("--acknowledge-different-weights", action="store_true")
        p.set_defaults(command=func)

    guardians = sub.add_parser("guardians", parents=parents,
                               help="guardian models (master)").add_subparsers(
        dest="guardians_action", required=True)
    p = guardians.add_parser("list", parents=parents,
                             help="settings, candidates, and every text-only model's guardian")
    p.set_defaults(command=guardians_list)
    for name, func, help_text in (
            ("set", guardians_set, "set the guardian of a model (--node, --model), a node (--node) or"
                                   " the cluster"),
            ("delete", guardians_delete, "remove the guardian of a model, a node or the cluster")):
        p = guardians.add_parser(name, parents=parents, help=help_text)
        if name == "set":
            p.add_argument("guardian", type=endpoint, metavar="NODE/MODEL",
                           help="a multimodal text model")
        p.add_argument("--node", help="the node of a node or model scope")
        p.add_argument("--model", help="the local model ID of a model scope (with --node)")
        p.set_defaults(command=func)

    settings = sub.add_parser("settings", parents=parents, help="lending settings (master)").add_subparsers(
        dest="settings_action", required=True)
    p = settings.add_parser("get", parents=parents,
                            help="every setting with its default, override and effective value")
    p.set_defaults(command=settings_get)
    p = settings.add_parser("set", parents=parents, help="override settings: KEY=VALUE ...")
    p.add_argument("values", nargs="+", type=settings_value, metavar="KEY=VALUE")
    p.set_defaults(command=settings_set)
    p = settings.add_parser("clear", parents=parents, help="drop an override (all overrides without a key)")
    p.add_argument("key", nargs="?")
    p.set_defaults(command=settings_clear)

    p = sub.add_parser("decisions", parents=parents,
                       help="lending decisions, newest first (site-wide on a master)")
    p.add_argument("--lane", choices=["image", "text"])
    p.add_argument("--outcome")
    p.add_argument("--kind")
    p.add_argument("--node")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--node-local", action="store_true",
                   help="this node's own log (/router/v1/node/offload/decisions; needs the cluster token)")
    p.add_argument("-f", "--follow", action="store_true", help="then print new rows as JSON lines")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls with --follow")
    p.add_argument("--max-polls", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(command=decisions)
