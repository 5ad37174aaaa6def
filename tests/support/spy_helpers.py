"""A spy on a module's function: the tests that check which scheme a dispatcher chose."""
from __future__ import annotations


def spy(monkeypatch, module, name) -> list:
    """Replace ``module.name`` by a wrapper that appends ``name`` to the returned list on each call, then calls
    the real function (monkeypatch restores it after the test)."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(name), real(*a, **k))[1])
    return calls
