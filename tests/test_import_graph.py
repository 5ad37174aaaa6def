"""The pack's import graph, built from the source (no import is run): no cycle among backend/,
nodes/ and the command line, and no module over 600 lines in backend/ or nodes/ except pure tables
that say so in their first line."""
from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import ROOT  # noqa: E402
SCANNED = ["backend", "nodes"]
TOP = ["cli.py", "__init__.py", "__main__.py"]
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for d in SCANNED:
        for p in (ROOT / d).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    for f in TOP:
        name = Path(f).stem
        out["" if name == "__init__" else name] = ROOT / f
    return out


def _resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = mod.split(".") if mod else []
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + (target.split(".") if target else []))


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    target = _resolve(mod, is_pkg, node.level, node.module)
                elif (node.module or "").split(".")[0] == "anydevice":
                    target = node.module[len("anydevice"):].lstrip(".")
                else:
                    continue
                # a name taken from a package is its submodule where one has that name, else the package's
                names = [f"{target}.{a.name}".lstrip(".") if f"{target}.{a.name}".lstrip(".") in mods else target
                         for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name[len("anydevice"):].lstrip(".") for a in node.names
                         if a.name.split(".")[0] == "anydevice"]
            else:
                continue
            for n in names:
                while n and n not in mods:  # the deepest module the name is in
                    n = n.rpartition(".")[0]
                if n in mods and n != mod:
                    graph[mod].add(n)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_graph_is_read():
    g = import_graph()
    assert "backend" in g and "nodes" in g and len(g) > 40
    assert any(g.values())


def test_no_import_cycle():
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_over_600_lines():
    big = []
    for d in SCANNED:
        for p in (ROOT / d).rglob("*.py"):
            text = p.read_text(encoding="utf-8")
            n = text.count("\n")
            first = text.lstrip().splitlines()[0] if text.strip() else ""
            if n > MAX_LINES and not first.lower().lstrip("\"' ").startswith("a pure table"):
                big.append(f"{p.relative_to(ROOT)}: {n}")
    assert big == [], "modules over 600 lines:\n" + "\n".join(big)


def test_pyproject_ships_every_package():
    """Every package folder of backend/ and nodes/ is in pyproject.toml's package list (a wheel
    built without one would miss its modules)."""
    import re
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    listed = set(re.findall(r'"(anydevice(?:\.[\w]+)*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    folders = {"anydevice." + ".".join(p.parent.relative_to(ROOT).parts)
               for d in SCANNED for p in (ROOT / d).rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)
