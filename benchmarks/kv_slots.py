"""KV slots kept across swaps (``models.slot_keep_count``): the prompt a long conversation pays again after a
swap, with slots kept against without, on the real ``llama-server``.

Two routerd nodes (``twistd`` processes), each on the real ``llama-server`` (``python -m
tests.real_servers install`` builds it once per machine; ``-t 1``), serve the same two generated GGUFs
(``tests.support_models``):
``chat`` (the tiny model, or with ``--large`` the 55 MB variant, whose prefill takes measurable time) and
``other`` (another weight file) on the one text runtime, ``parallel`` 1, a 2048-token context (the tiny
model's training context).  One node keeps slots (``slot_keep_count`` 4), the other does not (0).

Each run, on each node in turn (the order alternates by run, so a drift of the machine's load favours
neither): a new session (``X-Session-Id``) sends ``--turns`` turns of a chat with a long system prompt
(``--system-words``), each turn resending the whole conversation; then one request of another session to
``other`` (the swap: ``chat``'s llama-server is stopped); then the conversation's next turn on ``chat``.  The
figures of that turn, from llama-server's own answer: *re-evaluated* = ``prompt_tokens`` − ``cached_tokens``
(the prompt it evaluated again), as a share of the *prefix* (the last turn's ``prompt_tokens`` before the
swap: what the conversation had already paid), and the turn's prompt time (``timings.prompt_ms``) and wall
time.  Printed per run, then median [min, max] over the runs, and the kept ÷ without ratios.

Run: .venv/bin/python benchmarks/kv_slots.py [--runs 5] [--turns 3] [--system-words 560] [--large]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import attrs
from _harness import NodeProcess, free_port, tempdir, write_node

ROOT = Path(__file__).resolve().parent.parent
MODES = {"kept": 4, "without": 0}  # mode -> models.slot_keep_count
WORDS = ("hello", "tiny", "test", "model")


@attrs.frozen
class Turn:
    prompt: int  # prompt_tokens
    cached: int  # prompt_tokens_details.cached_tokens
    prompt_ms: float  # timings.prompt_ms
    wall: float  # seconds, the whole request through routerd
    reply: str


@attrs.frozen
class Run:
    prefix: int  # the last turn's prompt before the swap
    after: Turn  # the turn after the swap

    @property
    def evaluated(self) -> int:
        return self.after.prompt - self.after.cached

    @property
    def share(self) -> float:
        return self.evaluated / self.prefix


def post(url: str, body: dict[str, Any], session: str) -> tuple[dict[str, Any], float]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", "x-session-id": session})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer, time.perf_counter() - start


def turn(node: NodeProcess, model: str, messages: list[dict[str, str]], session: str) -> Turn:
    answer, wall = post(node.url + "/v1/chat/completions",
                        {"model": model, "messages": messages, "max_tokens": 16}, session)
    usage = answer["usage"]
    return Turn(usage["prompt_tokens"], usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                float(answer.get("timings", {}).get("prompt_ms", 0.0)), wall,
                answer["choices"][0]["message"]["content"])


def conversation(node: NodeProcess, session: str, system: str, turns: int) -> Run:
    messages = [{"role": "system", "content": system}]
    last: Turn | None = None
    for n in range(turns):
        messages.append({"role": "user", "content": f"Say hello {n}"})
        last = turn(node, "chat", messages, session)
        messages.append({"role": "assistant", "content": last.reply})
    assert last is not None
    turn(node, "other", [{"role": "user", "content": "Say hello"}], session + "-other")  # the swap
    messages.append({"role": "user", "content": "Say hello again"})
    return Run(last.prompt, turn(node, "chat", messages, session))


def start(root: Path, llama_server: str, keep: int, models: dict[str, Path]) -> NodeProcess:
    port = free_port()
    kcpps = {name: {"model": str(path), "contextsize": 2048, "parallel": 1} for name, path in models.items()}
    cfg = write_node(root, port, kcpps, {},
                     extra={"llama": {"binary_path": [llama_server, "-t", "1"]}, "models": {
                         "config_dir": "models", "slot_keep_count": keep}})
    node = NodeProcess(cfg, port)
    node.wait_ready()
    return node


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return (f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, "
            f"{fmt.format(max(values))}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3, help="turns before the swap")
    parser.add_argument("--system-words", type=int, default=560)
    parser.add_argument("--large", action="store_true", help="the 55 MB model (a prefill that takes time)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.integration.real_backends import real_servers_or_skip
    from tests.support_models import write_tiny_llama

    llama_server = real_servers_or_skip().llama
    root = tempdir()
    weights = root / "weights-gguf"
    weights.mkdir()
    models = {"chat": write_tiny_llama(weights / "chat.gguf", slow=args.large, f16=args.large),
              "other": write_tiny_llama(weights / "other.gguf", f16=True)}
    system = " ".join(WORDS[n % len(WORDS)] for n in range(args.system_words))
    nodes = {mode: start(root / mode, llama_server, keep, models) for mode, keep in MODES.items()}
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    try:
        print(f"real llama-server ({llama_server}), -t 1, parallel 1, ctx 2048, model "
              f"{'55 MB f16' if args.large else 'tiny 0.5 MB'}; {args.turns} turns, a swap, one more turn; "
              f"system prompt {args.system_words} words")
        for n in range(args.runs):
            order = list(MODES) if n % 2 == 0 else list(reversed(MODES))
            for mode in order:
                run = conversation(nodes[mode], f"bench-{mode}-{n}", system, args.turns)
                runs[mode].append(run)
                print(f"run {n} {mode:8}: prefix {run.prefix} tokens, after the swap {run.after.prompt} "
                      f"prompt tokens, {run.after.cached} cached, {run.evaluated} evaluated "
                      f"({100 * run.share:.1f} % of the prefix), prompt {run.after.prompt_ms:.1f} ms, "
                      f"wall {1000 * run.after.wall:.1f} ms")
    finally:
        for node in nodes.values():
            node.stop()
    print("\nmedian [min, max] over the runs:")
    for mode in MODES:
        rs = runs[mode]
        evaluated = spread([float(r.evaluated) for r in rs], "{:.0f}")
        prefix = spread([float(r.prefix) for r in rs], "{:.0f}")
        print(f"  {mode:8}: re-evaluated {spread([100 * r.share for r in rs], '{:.1f}')} % of the prefix "
              f"({evaluated} of {prefix} tokens); prompt {spread([r.after.prompt_ms for r in rs], '{:.1f}')} "
              f"ms; wall {spread([1000 * r.after.wall for r in rs], '{:.1f}')} ms")
    pairs = list(zip(runs["kept"], runs["without"], strict=True))
    ratios = [k.after.prompt_ms / max(w.after.prompt_ms, 1e-9) for k, w in pairs]
    walls = [k.after.wall / w.after.wall for k, w in pairs]
    print(f"  kept ÷ without, same run: prompt time {spread(ratios)}, wall {spread(walls)}")
    share = statistics.median(100 * r.share for r in runs["kept"])
    verdict = "met" if share <= 10 else "NOT met"
    print(f"  target ≤ 10 % of the prefix re-evaluated with slots kept: {verdict} ({share:.1f} %)")


if __name__ == "__main__":
    main()
