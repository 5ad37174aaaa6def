"""The public API as declared: README's "Public API" list is ``backend.__all__`` plus the submodules
it names, every name in ``__all__`` (and in the facades' ``__all__``) imports, and the section points
to "Thread safety"."""
from __future__ import annotations

import importlib
import re

import pytest

from anydevice import backend

from repo_paths import ROOT  # noqa: E402

README = ROOT / "README.md"
#: the public submodules README names (each "(submodule ...", "(subpackage)" or "(module)")
SUBMODULES = {"autograd", "optim", "compile", "network", "train"}


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _listed() -> dict[str, str]:
    """README's public list: name -> its line."""
    out = {}
    for line in _section("Public API (for people who embed the backend)").splitlines():
        m = re.match(r"- `([A-Za-z_][A-Za-z0-9_]*)`(.*)", line)
        if m:
            assert m.group(1) not in out, f"listed twice: {m.group(1)}"
            out[m.group(1)] = m.group(2)
    return out


def test_readme_public_list_is_all_plus_the_submodules():
    listed = _listed()
    subs = {n for n, rest in listed.items() if re.match(r"\s*\((submodule|subpackage|module)\b", rest)}
    assert subs == SUBMODULES
    assert set(listed) - subs == set(backend.__all__)
    assert len(backend.__all__) == len(set(backend.__all__))


def test_readme_says_the_rest_is_private_and_points_to_thread_safety():
    text = _section("Public API (for people who embed the backend)")
    assert "private" in text and "without notice" in text
    assert "(#thread-safety)" in text
    _section("Thread safety")  # the section it points to exists


@pytest.mark.parametrize("name", sorted(backend.__all__))
def test_every_name_in_all_imports(name):
    ns = {}
    exec(f"from anydevice.backend import {name}", ns)  # noqa: S102 (the import statement itself)
    assert ns[name] is getattr(backend, name)


@pytest.mark.parametrize("name", sorted(SUBMODULES))
def test_every_public_submodule_imports_with_its_all(name):
    if name == "compile":
        pytest.importorskip("torch")
    mod = getattr(backend, name)  # autograd and optim: imported on first use from backend/learn/
    if name not in ("autograd", "optim"):
        assert importlib.import_module(f"anydevice.backend.{name}") is mod
    assert isinstance(getattr(mod, "__all__", None), list) and mod.__all__, name
    for attr in mod.__all__:
        assert hasattr(mod, attr), f"backend.{name}.__all__ names {attr}, which it lacks"


def test_the_facades_name_what_readme_says():
    from anydevice.backend import network, train
    assert set(network.__all__) == {"Network"}
    assert set(train.__all__) == {"train", "predict", "TrainResult"}
