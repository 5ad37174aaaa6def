"""Shared test set-up.

The repository root is loaded as the package ``anydevice`` (whatever the checkout folder is
called), so tests import ``anydevice.backend`` and ``anydevice.nodes`` exactly as ComfyUI sees the
pack: a package with relative imports.

``backend_target`` is the fixture every precision test takes: one parameter per backend available
on this machine, plus the extra variants listed in ``VARIANTS`` here (e.g.
the OpenCL GPU kernel family forced on a CPU device). ``ANYDEVICE_TEST_BACKENDS=numpy,cpu`` limits
the list.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

#: the shared helpers (tests/support: repo_paths, precision_helpers, grad_check, e2e_helpers, ...)
#: import by their bare names from any folder of tests/
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from repo_paths import ROOT, TESTS  # noqa: E402


def _load_pack():
    if "anydevice" in sys.modules and Path(sys.modules["anydevice"].__file__).resolve().parent == ROOT:
        return sys.modules["anydevice"]
    spec = importlib.util.spec_from_file_location("anydevice", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["anydevice"] = mod
    spec.loader.exec_module(mod)
    return mod


_load_pack()
from anydevice import backend as _backend  # noqa: E402


def _opencl_gpu_family():
    from anydevice.backend.devices import opencl as opencl_backend
    return opencl_backend.create("opencl", 0, family="gpu")


def _mini_device():
    """tests/backend/devices/test_interface.py's MiniDevice: a device written from the interface alone (plain NumPy)."""
    spec = importlib.util.spec_from_file_location("_anydevice_mini_device",
                                                  TESTS / "backend" / "devices" / "test_interface.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.create_mini()


#: extra test targets per backend: the OpenCL GPU kernel family forced on whatever device is there
#: (on PoCL that is how the portable GPU kernels are tested without a GPU); "mini", the minimal
#: device of tests/backend/devices/test_interface.py, runs with the numpy backend
VARIANTS = {"opencl": [("opencl-gpu-family", _opencl_gpu_family)], "numpy": [("mini", _mini_device)]}


def _targets():
    """[(id, factory)] for every backend (and variant) that can run here."""
    only = {s.strip() for s in os.environ.get("ANYDEVICE_TEST_BACKENDS", "").split(",") if s.strip()}
    out = []
    for info in _backend.list_backends(include_aliases=True):
        if not info.available:
            continue
        out.append((info.name, lambda n=info.name: _backend.get_backend(n)))
        for vid, factory in VARIANTS.get(info.name, []):
            out.append((vid, factory))
    if only:
        out = [t for t in out if t[0] in only or t[0].split("-")[0] in only]
    return out


TARGETS = _targets()

#: tests that reach the target through the registry by its name (nodes' ``device`` input): the
#: "mini" device is no registry backend, so they skip it
REGISTRY_ONLY = {"test_robust.py::test_converter_of_a_computed_value_never_aliases_it"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is not None and spec.params.get("backend_target") == "mini" and \
                f"{item.path.name}::{item.originalname}" in REGISTRY_ONLY:
            item.add_marker(pytest.mark.skip(reason="the mini device is not in the registry"))
_cache: dict[str, object] = {}


def pytest_report_header(config):
    lines = ["anydevice backends under test: " + ", ".join(t[0] for t in TARGETS)]
    for info in _backend.list_backends():
        if not info.available:
            lines.append(f"  skipped backend {info.name}: {info.reason}")
    return lines


@pytest.fixture(params=[t[0] for t in TARGETS], scope="session")
def backend_target(request):
    """A backend instance; one parameter per backend/variant available on this machine."""
    tid = request.param
    if tid not in _cache:
        _cache[tid] = dict(TARGETS)[tid]()
    return _cache[tid]


@pytest.fixture(scope="session")
def opencl_backend():
    """The OpenCL backend on the first usable device (its CPU family on PoCL here); skips without one."""
    try:
        from anydevice.backend import get_backend
        return get_backend("opencl")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no OpenCL device: {exc}")
