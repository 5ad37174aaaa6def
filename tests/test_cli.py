"""The ``anydevice`` command and the package's import surface: one clear line for every misuse,
no PyTorch needed where it is not used, settings errors that name the variable.

The commands run in a fresh interpreter (``run_cli``) that loads this checkout as the package
``anydevice``, optionally with PyTorch made unimportable: the check works on any machine. Where a
virtual environment without PyTorch exists (``NOTORCH_PYTHON``, or /tmp/notorch as the README's
recipe makes it) the same check runs there too.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anydevice.backend import AnyDeviceError, get_backend, list_backends
from anydevice.backend.system import config

from repo_paths import ROOT  # noqa: E402
WF = ROOT / "example_workflows" / "api" / "color_grading.json"

#: loads the checkout as `anydevice` (whatever its folder is called) and runs the cli, or the code
#: in the variable CLI_TEST_CODE; argv[1] = "1" blocks every import of torch first
LOADER = r"""
import importlib.abc, importlib.util, os, sys
root, block, argv = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
if block:
    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoTorch())
spec = importlib.util.spec_from_file_location("anydevice", os.path.join(root, "__init__.py"),
                                              submodule_search_locations=[root])
mod = importlib.util.module_from_spec(spec)
sys.modules["anydevice"] = mod
spec.loader.exec_module(mod)
code = os.environ.get("CLI_TEST_CODE")
if code:
    exec(code)
else:
    from anydevice.cli import main
    sys.exit(main(argv))
"""


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYDEVICE_")}
    env.update(extra)
    return env


def run_cli(*args, block_torch=False, python=sys.executable, env=None, code=None, cwd=None):
    env = clean_env(**(env or {}))
    if code:
        env["CLI_TEST_CODE"] = code
    return subprocess.run([python, "-c", LOADER, str(ROOT), "1" if block_torch else "0", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def error_lines(p) -> list[str]:
    assert "Traceback" not in p.stderr, p.stderr
    return [ln for ln in p.stderr.splitlines() if ": error: " in ln]


def one_error(p, prog="anydevice") -> str:
    lines = error_lines(p)
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"{prog}"), lines
    return lines[0]


# ---------------------------------------------------------------------------------------------
# without PyTorch
# ---------------------------------------------------------------------------------------------
USE_BACKEND = ("from anydevice import backend; import numpy as np; "
               "print(backend.get_backend('numpy').matmul(np.eye(2, dtype=np.float32), np.ones((2, 1))).sum()); "
               "import anydevice; print(sorted(anydevice.__dict__).count('NODE_CLASS_MAPPINGS'))")


def _notorch_pythons():
    out = [pytest.param((sys.executable, True), id="torch-blocked")]
    venv = os.environ.get("NOTORCH_PYTHON") or "/tmp/notorch/bin/python"
    if Path(venv).exists():
        out.append(pytest.param((venv, False), id="venv-without-torch"))
    return out


@pytest.fixture(params=_notorch_pythons())
def notorch(request):
    python, block = request.param
    if not block:
        probe = subprocess.run([python, "-c", "import numpy, PIL; import importlib.util as u; "
                                              "raise SystemExit(u.find_spec('torch') is not None)"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"{python} has PyTorch, or lacks NumPy/Pillow")
    return dict(python=python, block_torch=block)


def test_devices_and_backend_work_without_torch(notorch):
    p = run_cli("devices", **notorch)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    rows = {ln[2:].split()[0]: ln for ln in p.stdout.splitlines()[1:] if ln[2:].strip() and ln[2:3] != " "}
    assert rows["numpy"].split()[-3:-2] == ["yes"] or " yes " in rows["numpy"]
    assert "PyTorch is not installed (pip install torch)" in rows["cpu"]
    p = run_cli(code=USE_BACKEND, **notorch)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["2.0", "0"]  # the ops work; the node mappings were not loaded


@pytest.mark.parametrize("cmd", [["run", str(WF)], ["bench", "--quick"]])
def test_torch_commands_say_install_torch(notorch, cmd):
    p = run_cli(*cmd, **notorch)
    assert p.returncode == 1
    line = one_error(p)
    assert "need" in line and "PyTorch" in line and "pip install torch" in line


def test_nodes_import_without_torch_names_it(notorch):
    p = run_cli(code="import anydevice.nodes", **notorch)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1].startswith(
        "ModuleNotFoundError: the AnyDevice nodes need PyTorch: install PyTorch: pip install torch")


# ---------------------------------------------------------------------------------------------
# help, broken pipes, output folder
# ---------------------------------------------------------------------------------------------
def test_help_is_formatted_text():
    p = run_cli("--help")
    assert p.returncode == 0
    assert "``" not in p.stdout and "devices" in p.stdout and "run" in p.stdout and "exit codes" in p.stdout


def test_broken_pipe_ends_quietly():
    """`anydevice devices --json | head`: the reader goes away; no traceback."""
    proc = subprocess.Popen([sys.executable, "-c", LOADER, str(ROOT), "0", "devices", "--json", "--all"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    proc.stdout.close()  # nobody reads: every write is EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) != 0
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_output_dir_naming_a_file(tmp_path):
    afile = tmp_path / "some_file"
    afile.write_text("x")
    p = run_cli("run", str(WF), "--output-dir", str(afile))
    assert p.returncode == 2
    assert one_error(p, "anydevice run").endswith(f"output folder {afile}: is a file, not a folder")


def test_warm_builds_into_the_cache_and_skips_comfyui_only_workflows(tmp_path):
    """`anydevice warm` runs each workflow once (its outputs into a throwaway folder), so its kernels are
    in the cache afterwards; a workflow with ComfyUI's own nodes is skipped, naming them."""
    cache = tmp_path / "cache"
    vae = ROOT / "example_workflows" / "api" / "vae_decode_anydevice.json"
    p = run_cli("warm", str(WF), str(vae), cwd=tmp_path,
                env={"ANYDEVICE_CACHE_DIR": str(cache), "ANYDEVICE_SELFCHECK": "0"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert any(ln.split()[0] == "color_grading.json" and ln.rstrip().endswith(" s") for ln in lines), p.stdout
    assert any("vae_decode_anydevice.json" in ln and "skipped (needs ComfyUI: VAEDecode, VAEEncode, VAELoader)" in ln
               for ln in lines), p.stdout
    assert lines[-1].startswith("warm: 2 workflows in ")
    assert list(tmp_path.iterdir()) == [cache]  # nothing written next to the caller
    from anydevice.backend import list_backends
    if any(i.name == "opencl" and i.available for i in list_backends()):
        assert any((cache / "opencl").rglob("*")), "no kernel was cached"


def test_run_json_is_alone_on_stdout(tmp_path):
    p = run_cli("run", str(WF), "--output-dir", str(tmp_path), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["saved"]) == 3
    assert "backend: " in p.stderr


# ---------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------
def test_unknown_backend_setting():
    """`devices` prints its table (nothing chosen), then the error naming the variable; exit 2."""
    p = run_cli("devices", env={"ANYDEVICE_BACKEND": "nonsense"})
    assert p.returncode == 2
    assert "numpy" in p.stdout and "\n* " not in p.stdout and "nothing is chosen" in p.stdout
    line = one_error(p, "anydevice devices")
    assert "ANYDEVICE_BACKEND='nonsense': unknown backend; known: auto, cuda, rocm" in line
    p = run_cli("run", str(WF), env={"ANYDEVICE_BACKEND": "nonsense"})
    assert p.returncode == 2
    assert "ANYDEVICE_BACKEND='nonsense': unknown backend" in one_error(p, "anydevice run")


def _unusable_names():
    names = ["numpy:5", "opencl:x"]
    names += [i.name for i in list_backends() if not i.available][:1]  # e.g. cuda on a CPU machine
    return names


@pytest.mark.parametrize("name", _unusable_names())
def test_backend_setting_that_cannot_run_here(name, tmp_path):
    for cmd in (["devices"], ["run", str(WF), "--output-dir", str(tmp_path)]):
        p = run_cli(*cmd, env={"ANYDEVICE_BACKEND": name})
        assert p.returncode == 2, p.stderr
        assert f"ANYDEVICE_BACKEND={name!r}: " in one_error(p)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("var, reader", [("ANYDEVICE_WORKSPACE_MB", "workspace_budget_bytes"),
                                         ("ANYDEVICE_MAX_TENSOR_MB", "max_tensor_bytes")])
def test_bad_number_setting_names_the_variable(var, reader, monkeypatch):
    p = run_cli("run", str(WF), env={var: "abc"})
    assert p.returncode == 2
    assert f"{var}='abc': must be a number of megabytes > 0" in one_error(p, "anydevice run")
    monkeypatch.setenv(var, "abc")
    from anydevice.backend.ops import contract
    with pytest.raises(AnyDeviceError, match=f"{var}='abc'"):
        getattr(contract, reader)()
    if var == "ANYDEVICE_MAX_TENSOR_MB":  # read by every op: the op's error names the variable
        with pytest.raises(AnyDeviceError, match=f"{var}='abc'"):
            get_backend("numpy").matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))


def test_unknown_setting_names_are_warned_about():
    p = run_cli("devices", env={"ANYDEVICE_BACKNED": "cpu"})
    assert p.returncode == 0
    assert "ANYDEVICE_BACKNED is not an AnyDevice setting, ignored; did you mean ANYDEVICE_BACKEND?" in p.stderr


#: the pack's ComfyUI socket types, which look like setting names
_TYPE_NAMES = {"ANYDEVICE_LABELS", "ANYDEVICE_NETWORK"}


def test_every_setting_is_in_the_one_table():
    """Every ANYDEVICE_* name the code or the README mentions is a setting of backend/system/config.py."""
    import re
    named = set()
    for path in [ROOT / "README.md", *ROOT.glob("backend/**/*.py"), *ROOT.glob("nodes/*.py"), ROOT / "cli.py",
                 *ROOT.glob("tests/**/*.py")]:
        named |= set(re.findall(r"ANYDEVICE_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    # kernel macros (API flags, the preludes' include guard) and a deliberate typo
    named -= {"ANYDEVICE_CUDA", "ANYDEVICE_HIP", "ANYDEVICE_OPENCL", "ANYDEVICE_PRELUDE_H", "ANYDEVICE_BACKNED"}
    named -= {n for n in named if n in _TYPE_NAMES}  # ComfyUI socket types, not settings
    assert named <= set(config.SETTINGS), named - set(config.SETTINGS)


#: a bad value per setting and what its error says: {variable: (value, fragment)}
BAD_SETTINGS = {
    "ANYDEVICE_ALLOW_TF32": ("maybe", "must be 1 or 0"),
    "ANYDEVICE_NUM_THREADS": ("0", "must be a whole number >= 1"),
    "ANYDEVICE_OPENCL_DEVICE": ("junk", "must be platform:device numbers"),
    "ANYDEVICE_OPENCL_FAMILY": ("fpga", "must be one of cpu, gpu"),
    "ANYDEVICE_WORKSPACE_MB": ("-1", "must be a number of megabytes > 0 (default 256)"),
    "ANYDEVICE_MAX_TENSOR_MB": ("inf", "must be a number of megabytes > 0"),
}


@pytest.mark.parametrize("var, value, fragment", [(var, *bad) for var, bad in BAD_SETTINGS.items()])
def test_config_check_names_variable_and_value(var, value, fragment):
    errors = config.check({var: value})
    assert [str(e) for e in errors] == [f"{var}={value!r}: {fragment}"] or fragment in str(errors[0])
    assert errors[0].var == var and errors[0].exit_code == 2
    assert config.check({var: ""}) == []  # empty is unset


def test_config_values():
    assert config.get("ANYDEVICE_WORKSPACE_MB", {}) == 256 * 2**20
    assert config.get("ANYDEVICE_WORKSPACE_MB", {"ANYDEVICE_WORKSPACE_MB": "0.5"}) == 2**19
    assert config.get("ANYDEVICE_ALLOW_TF32", {"ANYDEVICE_ALLOW_TF32": "On"}) is True
    assert config.get("ANYDEVICE_BACKEND", {"ANYDEVICE_BACKEND": "auto"}) is None
    assert config.get("ANYDEVICE_BACKEND", {"ANYDEVICE_BACKEND": "opencl:1"}) == "opencl:1"
    assert config.get("ANYDEVICE_OPENCL_DEVICE", {"ANYDEVICE_OPENCL_DEVICE": "1:2"}) == (1, 2)
    from anydevice.backend.ops import contract
    assert contract.workspace_budget_bytes is config.workspace_budget_bytes


# ---------------------------------------------------------------------------------------------
# a checkout in a folder whose name is no Python identifier
# ---------------------------------------------------------------------------------------------
def test_root_init_imports_as_plain_file(tmp_path):
    """pytest imports the root __init__.py of a checkout called e.g. `anyd-e2e` as a module named
    `__init__` with no package: it must import (and register nothing)."""
    copy = tmp_path / "anyd-e2e"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", "tests",
                                                              "output", "out", "test-artifacts", ".hypothesis"))
    (copy / "tests").mkdir()
    (copy / "tests" / "test_tiny.py").write_text("def test_tiny():\n    assert True\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_tiny.py"],
                       cwd=copy, capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 passed" in p.stdout
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('__init__', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(m.NODE_CLASS_MAPPINGS, m.WEB_DIRECTORY)")
    p = subprocess.run([sys.executable, "-c", code, str(copy / "__init__.py")], capture_output=True, text=True,
                       timeout=300, env=clean_env())
    assert p.returncode == 0 and p.stdout.split() == ["{}", "./web"], p.stderr
