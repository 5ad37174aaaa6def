"""Where the nodes look up input names: ComfyUI's input folder (and the pack's bundled inputs)
inside ComfyUI; the headless runner's input folders for the workflow it runs
(``using_input_folders``), else its defaults: next to the workflow, ./, ./input and the pack's
example_workflows/input."""
from __future__ import annotations

import contextlib
import sys
from contextvars import ContextVar
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_INPUTS = PACK_ROOT / "example_workflows" / "input"


def input_folders(workflow_path=None) -> list[Path]:
    """Where LoadImage names are looked up, each folder once: next to the workflow, its input/
    and ../input, ./ and ./input, and the pack's example_workflows/input."""
    folders = []
    if workflow_path is not None:
        wd = Path(workflow_path).resolve().parent
        folders += [wd, wd / "input", wd.parent / "input"]
    folders += [Path.cwd(), Path.cwd() / "input", EXAMPLE_INPUTS]
    return list(dict.fromkeys(d.resolve() for d in folders))


_RUNNER_FOLDERS: ContextVar = ContextVar("anydevice_input_folders", default=None)


@contextlib.contextmanager
def using_input_folders(folders):
    """Inside the block the node lists, validates and reads folders of ``folders`` only (the
    headless runner's input folders for the workflow it runs)."""
    token = _RUNNER_FOLDERS.set(tuple(Path(f) for f in folders))
    try:
        yield
    finally:
        _RUNNER_FOLDERS.reset(token)


def input_roots() -> list[Path]:
    """Where a folder is looked up: the runner's folders inside ``using_input_folders``; ComfyUI's
    input directory inside ComfyUI; otherwise the headless runner's default input folders (./,
    ./input, the pack's example_workflows/input)."""
    chosen = _RUNNER_FOLDERS.get()
    if chosen is not None:
        return list(chosen)
    fp = sys.modules.get("folder_paths")
    if fp is None and "comfy" in sys.modules:
        try:
            import folder_paths as fp  # noqa: PLC0415 - only inside ComfyUI
        except ImportError:
            fp = None
    if fp is not None and hasattr(fp, "get_input_directory"):
        # ComfyUI's input folder first; then the pack's own bundled inputs, so the bundled
        # templates (the digits) run without copying anything
        return [Path(fp.get_input_directory()).resolve(), EXAMPLE_INPUTS]
    return input_folders(None)
