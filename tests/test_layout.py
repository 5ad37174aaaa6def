"""tests/ mirrors the source: the test of a module is found beside its name.

Every test file under tests/backend/ and tests/nodes/ sits at the mirrored place of what it tests:
``tests/<dir>/test_<name>.py`` tests ``<dir>/X.py`` or the package ``<dir>/X/`` or the package
``<dir>`` itself (X its folder name), where ``<name>`` is X or X followed by ``_<aspect>`` (e.g.
tests/backend/ops/test_windows.py for backend/ops/windows.py, tests/nodes/compute/test_windows_nodes.py
for nodes/compute/windows.py, tests/backend/learn/autograd/test_autograd.py for the autograd
package). Test basenames are unique across tests/ (pytest's "prepend" import mode, folders without
``__init__.py``), and test files elsewhere sit in the folders the README names.
"""
from __future__ import annotations

from collections import Counter

from repo_paths import ROOT, TESTS

MIRRORED = ("backend", "nodes")
#: folders of tests/ that mirror no source: the whole-backend suites, real ComfyUI / browser /
#: whole-workflow tests, whole-model tests, shared helpers
OTHER = {"conformance", "e2e", "models", "support"}


def _is_package(d) -> bool:
    return d.is_dir() and (d / "__init__.py").is_file()


def _mirror_problem(test) -> str | None:
    """Why ``test`` (a tests/<dir>/test_*.py file) mirrors no source module, or None."""
    rel = test.parent.relative_to(TESTS)
    src = ROOT / rel
    if not _is_package(src):
        return f"{rel} is no package of the source"
    name = test.stem[len("test_"):]
    parts = name.split("_")
    for i in range(len(parts), 0, -1):
        x = "_".join(parts[:i])
        if (src / f"{x}.py").is_file() or _is_package(src / x) or x == src.name:
            return None
    return f"no {rel}/<X>.py, {rel}/<X>/ or package {src.name} for test_<X>[_<aspect>].py"


def test_backend_and_nodes_tests_mirror_a_source_module():
    bad = []
    for top in MIRRORED:
        for test in sorted((TESTS / top).rglob("test_*.py")):
            why = _mirror_problem(test)
            if why:
                bad.append(f"{test.relative_to(ROOT)}: {why}")
    assert not bad, "\n".join(bad)


def test_no_other_folders_and_unique_basenames():
    folders = {p.relative_to(TESTS).parts[0] for p in TESTS.rglob("*.py") if p.parent != TESTS}
    assert folders <= set(MIRRORED) | OTHER, folders - set(MIRRORED) - OTHER
    top = [p.stem[len("test_"):] for p in TESTS.glob("test_*.py")]
    assert not [n for n in top if _is_package(ROOT / n)]  # a package's test goes below it
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    assert not [n for n, c in names.items() if c > 1], [n for n, c in names.items() if c > 1]
    assert not list(TESTS.rglob("__init__.py"))


def test_the_rule_refuses_what_mirrors_nothing():
    assert _mirror_problem(TESTS / "backend" / "ops" / "test_windows_nodes.py") is None
    assert _mirror_problem(TESTS / "backend" / "learn" / "autograd" / "test_autograd.py") is None
    assert _mirror_problem(TESTS / "backend" / "ops" / "test_no_such_module.py")
    assert _mirror_problem(TESTS / "backend" / "no_such_package" / "test_x.py")
