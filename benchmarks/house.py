"""Print the figures of the house: what the tree's shape is, counted from the code itself.

Counts, each the way anyone can check it by reading the code:

- modules in ``routerd/`` over 500 lines (physical lines, as ``wc -l`` counts them);
- ``routerd/node.py``: its lines, the lambdas in it and the lines of ``Node.__init__``;
- import circles: strongly connected groups of the import graph of ``routerd/`` and ``benchmarks/``
  (every ``import`` statement, at any depth, ``TYPE_CHECKING`` blocks included) and of ``webui/js``
  (ES module ``import ... from "./x.js"``);
- "issue N" references in ``routerd/`` (the history belongs in commits and the CHANGELOG);
- string comparisons on a backend mode outside the family modules and the simulator (a literal
  family name, as :mod:`routerd.families` finds them, compared with ``==``, ``!=`` or ``in``, or a
  ``mode`` compared with anything; ``for mode in`` is a loop, not a comparison, and a backend
  answer's ``answer_format`` is not a mode even where its value is ``"kobold"``, KoboldCpp's API).

    .venv/bin/python benchmarks/house.py [--strict]

With ``--strict`` the exit status is 1 when a target of the house is missed (a module over 500 lines,
``node.py`` over 200 lines or with a lambda, an import circle, an "issue N" reference).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from routerd.families import backend_modes

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 500
NODE_MAX_LINES = 200
ISSUE_REF = re.compile(r"\bissues? \d+", re.IGNORECASE)
JS_IMPORT = re.compile(r"""^\s*import\b[^'"]*['"](\./[^'"]+)['"]""", re.MULTILINE)
_NAMES = "|".join(backend_modes())
#: a family's name compared as a string, or a ``mode`` compared with anything (not ``for mode in``)
MODE_COMPARISON = re.compile(
    rf"""(==|!=|\bin)\s*\(?\s*['"]({_NAMES})['"]|['"]({_NAMES})['"]\s*(==|!=)"""
    r"""|(?<!for )\bmode\b\s*(==|!=|not in|in)\s""")
#: a backend answer's format compared (``"kobold"`` there names KoboldCpp's API, not the family)
ANSWER_FORMAT_COMPARISON = re.compile(r"""\banswer_format\s*(==|!=|not in|in)\s""")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports (a ``from package import name`` that names a
    submodule counts as importing that submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            for alias in node.names:
                found.add(base + "." + alias.name)
    if path.parent.name == "benchmarks":  # the scripts import each other by bare name (sys.path)
        found |= {"benchmarks." + name for name in found}
    resolved = set()
    for name in found:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != here:
            resolved.add(name)
    return resolved


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def python_circles() -> list[list[str]]:
    files = python_files("routerd", "benchmarks")
    known = {module_name(p) for p in files}
    # a package's __init__ is imported with any of its submodules: that edge makes no circle of its own
    graph = {module_name(p): imports_of(p, known) for p in files}
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    return circles(graph)


def js_circles() -> list[list[str]]:
    folder = ROOT / "webui" / "js"
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.js")):
        text = path.read_text(encoding="utf-8")
        graph[path.name] = {Path(target).name for target in JS_IMPORT.findall(text)}
    return circles(graph)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    missed = []

    sources = python_files("routerd")
    long = sorted(((len(p.read_text(encoding="utf-8").splitlines()), p) for p in sources), reverse=True)
    over = [(n, p) for n, p in long if n > MAX_LINES]
    print(f"modules in routerd/: {len(sources)}; over {MAX_LINES} lines: {len(over)}")
    for n, p in over:
        print(f"  {n:5d} {p.relative_to(ROOT)}")
    if over:
        missed.append("modules over 500 lines")

    node = ROOT / "routerd" / "node.py"
    tree = ast.parse(node.read_text(encoding="utf-8"))
    lambdas = sum(isinstance(n, ast.Lambda) for n in ast.walk(tree))
    init_lines = 0
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef) and n.name == "__init__" and n.end_lineno is not None:
            init_lines = max(init_lines, n.end_lineno - n.lineno + 1)
    node_lines = len(node.read_text(encoding="utf-8").splitlines())
    print(f"routerd/node.py: {node_lines} lines, {lambdas} lambdas, longest __init__ {init_lines} lines")
    if node_lines > NODE_MAX_LINES or lambdas:
        missed.append("node.py")

    found = python_circles() + [[f"webui/js/{m}" for m in group] for group in js_circles()]
    print(f"import circles: {len(found)}")
    for group in found:
        print("  " + " <-> ".join(group))
    if found:
        missed.append("import circles")

    refs = [(p, i + 1) for p in sources
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()) if ISSUE_REF.search(line)]
    print(f'"issue N" references in routerd/: {len(refs)} in {len({p for p, _ in refs})} modules')
    for p, line in refs[:20]:
        print(f"  {p.relative_to(ROOT)}:{line}")
    if refs:
        missed.append('"issue N" references')

    comparisons = [(p, i + 1) for p in sources if not {"families", "sim"} & set(p.relative_to(ROOT).parts)
                   for i, line in enumerate(p.read_text(encoding="utf-8").splitlines())
                   if MODE_COMPARISON.search(line) and not ANSWER_FORMAT_COMPARISON.search(line)]
    print(f"string comparisons on a backend mode outside the family modules and the simulator: "
          f"{len(comparisons)}")
    for p, line in comparisons[:30]:
        print(f"  {p.relative_to(ROOT)}:{line}")

    if args.strict and missed:
        print("missed: " + ", ".join(missed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
