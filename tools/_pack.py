"""Loads a checkout of this pack as a package (``anydevice`` by default) from its folder, for the tools
and the scripts that tests/ runs under ComfyUI's python (they put tools/ on sys.path)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_pack(root: str | Path = ROOT, name: str = "anydevice"):
    """The checkout at root imported as the package ``name`` (in sys.modules under that name)."""
    root = Path(root).resolve()
    spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
    sys.modules[name] = mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
