"""The ``anydevice`` command: ``devices``, ``bench`` and ``run``.

Every error reaches the user as one line per problem on stderr, ``anydevice[ run]: error: ...``,
and an exit code (``report_error``); ``-v`` adds the traceback. Only ``bench`` and ``run`` need
PyTorch, and they are the only commands that import it.
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import sys
import traceback
from pathlib import Path

DESCRIPTION = ("Neural-network and tensor ops of the AnyDevice ComfyUI nodes on any device "
               "(CUDA, ROCm, XPU, MPS, OpenCL, NumPy), without ComfyUI.")
EPILOG = """\
settings: the ANYDEVICE_* environment variables (README.md, "Backends"). Every command checks them
first and refuses a bad value with a message naming the variable; `anydevice devices` still prints
its table first.
exit codes: 0 done; 1 a workflow or benchmark failed; 2 a bad command line, setting or workflow file.
-v/--verbose (before or after the command) adds debug logging and the traceback of an error."""


def report_error(prog: str, exc: BaseException, verbose: bool = False) -> int:
    """Print ``exc`` as one line per problem on stderr (and its traceback when verbose); return
    the exit code: the exception's ``exit_code`` (2 for settings), else 1."""
    if verbose:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    if isinstance(exc, ModuleNotFoundError) and exc.name == "torch" and "PyTorch" not in str(exc):
        from .backend.system.registry import INSTALL_TORCH
        text = f"needs PyTorch: {INSTALL_TORCH}"
    elif isinstance(exc, MemoryError):
        text = "out of memory"
    elif isinstance(exc, (ValueError, OSError, ImportError)) or hasattr(exc, "exit_code"):
        text = str(exc)  # our own errors (AnyDeviceError is a ValueError); the OS's and imports' name what failed
    else:
        text = f"{type(exc).__name__}: {exc}" + ("" if verbose else " (-v shows the traceback)")
    for line in text.splitlines() or [type(exc).__name__]:
        print(f"{prog}: error: {line}", file=sys.stderr)
    return int(getattr(exc, "exit_code", 1))


def _settings_problems() -> list:
    """ConfigError for every ANYDEVICE_* variable with a bad value; warns about unknown names."""
    from .backend.system import config
    for name in config.unknown():
        near = difflib.get_close_matches(name.upper(), list(config.SETTINGS), n=1)
        hint = f"; did you mean {near[0]}?" if near else " (README.md lists the settings)"
        print(f"anydevice: warning: {name} is not an AnyDevice setting, ignored{hint}", file=sys.stderr)
    return config.check()


def _cmd_devices(args) -> int:
    from .backend.system import config, registry
    from .backend import list_backends
    problems = list(args.settings_problems)
    infos = list_backends(refresh=True, include_aliases=args.all)
    chosen = None
    if not problems:
        try:
            chosen = registry.parse_name(registry.auto_name())[0]
        except config.ConfigError as exc:  # ANYDEVICE_BACKEND names a backend that cannot run here
            problems.append(exc)
    checks = {i.name: registry.selfcheck_status(i) for i in infos}  # passed / failed / not yet run / skipped
    if args.json:
        print(json.dumps([dict(i.as_dict(), chosen=i.name == chosen, selfcheck=checks[i.name]) for i in infos],
                         indent=2))
    else:
        print(f"{'':2}{'backend':<11}{'available':<11}{'priority':<9}device / reason")
        for i in infos:
            mark = "* " if i.name == chosen else "  "
            detail = i.device if i.available else i.reason
            print(f"{mark}{i.name:<11}{('yes' if i.available else 'no'):<11}{i.priority:<9}{detail}")
            if i.available and i.notes:
                print(f"{'':33}(note: {i.notes})")
            if i.available and checks[i.name]:
                print(f"{'':33}(self-check: {checks[i.name]})")
        if chosen:
            print("\n* = chosen automatically (override with ANYDEVICE_BACKEND=name[:index])")
        else:
            print("\nnothing is chosen: a setting is wrong (below)")
    for exc in problems:
        report_error("anydevice devices", exc)
    return 2 if problems else 0


def _cmd_bench(args) -> int:
    from .backend import bench
    return bench.main(args)


def _cmd_run(args) -> int:
    from .backend.system import registry
    registry.auto_name()  # a backend ANYDEVICE_BACKEND names but that cannot run: say so before the nodes load
    return run_main(args)


def _cmd_warm(args) -> int:
    """``anydevice warm``: run each workflow once headless into a throwaway folder, so every kernel it
    uses is built and cached (the pack's binary cache, and PoCL's own code generation cache) before a
    user's first run. Workflows with nodes only ComfyUI has are skipped, saying so."""
    import tempfile
    import time
    from .backend.system import registry
    from .nodes.headless.runner import _node_class, load_workflow, run_prompt
    registry.auto_name()
    paths = args.workflows or sorted(str(p) for p in (Path(__file__).resolve().parent / "example_workflows" / "api").glob("*.json"))
    failed = 0
    t_all = time.perf_counter()
    for path in paths:
        name = Path(path).name
        try:
            prompt = load_workflow(path)
            other = sorted({n.get("class_type") for n in prompt.values() if isinstance(n, dict)
                            and isinstance(n.get("class_type"), str) and _node_class(n["class_type"]) is None})
            if other:
                print(f"  {name:<34} skipped (needs ComfyUI: {', '.join(other)})")
                continue
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="anydevice-warm-") as tmp:
                run_prompt(prompt, output_dir=tmp, workflow_path=path)
            print(f"  {name:<34} {time.perf_counter() - t0:7.2f} s")
        except Exception as exc:  # noqa: BLE001 - one line a workflow; the others still warm
            failed += 1
            report_error(f"anydevice warm: {name}", exc, getattr(args, "verbose", False))
    print(f"warm: {len(paths)} workflows in {time.perf_counter() - t_all:.1f} s" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0


def add_run_arguments(parser) -> None:
    parser.add_argument("workflow", help="API-format workflow JSON (ComfyUI: Workflow > Export (API))")
    parser.add_argument("--input", metavar="IMAGE", default=None,
                        help="image file every LoadImage node loads (default: the file each names, looked up next "
                             "to the workflow, in ./input and in the pack's example_workflows/input)")
    parser.add_argument("--output-dir", metavar="DIR", default="output",
                        help="where SaveImage writes (PreviewImage writes to DIR/temp); default ./output")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON summary (backend, times, ui, files) on stdout; everything else goes "
                             "to stderr")


def build_parser() -> argparse.ArgumentParser:
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="debug logging, and the traceback of an error")
    parser = argparse.ArgumentParser(prog="anydevice", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and the traceback of an error")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{devices,bench,run,warm}")
    p = sub.add_parser("devices", parents=[verbose], help="every backend: available, its device, or why not",
                       description="Every backend: available, its device, or the reason it is not; * marks the "
                                   "automatic choice.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="also list the torch-* vendor aliases")
    p.set_defaults(func=_cmd_devices)
    p = sub.add_parser("bench", parents=[verbose], help="speed of each backend against PyTorch (needs PyTorch)",
                       description="GFLOPS per case and the ratio to PyTorch on the same device, same run.")
    from .backend import bench
    bench.add_arguments(p)
    p.set_defaults(func=_cmd_bench)
    p = sub.add_parser("run", parents=[verbose], help="run an API-format workflow headless (needs PyTorch)",
                       description="Run an API-format ComfyUI workflow of this pack's nodes (plus LoadImage, "
                                   "SaveImage, PreviewImage, EmptyImage, EmptyLatentImage) without ComfyUI.")
    add_run_arguments(p)
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("warm", parents=[verbose], help="build the kernels the bundled workflows use (needs PyTorch)",
                       description="Run each workflow once headless into a throwaway folder, so that the kernels "
                                   "it uses are built and cached before the first real run (PoCL's code "
                                   "generation included). Default: the pack's example_workflows/api/*.json.")
    p.add_argument("workflows", nargs="*", metavar="WORKFLOW", help="API-format workflow JSON files")
    p.set_defaults(func=_cmd_warm)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # warnings only: the pack's INFO line at load repeats what `run` prints; -v shows everything
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    prog = f"anydevice {args.cmd}"
    try:
        args.settings_problems = _settings_problems()
        if args.settings_problems and args.cmd != "devices":  # devices reports them after its table
            return max(report_error(prog, exc) for exc in args.settings_problems)
        code = args.func(args)
        sys.stdout.flush()  # inside the try: a reader that went away is a BrokenPipeError here
        return code
    except BrokenPipeError:
        # `anydevice devices --json | head`: the reader has what it wanted. Point stdout at the
        # null device so the flush at exit raises nothing, and stop quietly.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes one line
        return report_error(prog, exc, args.verbose)



# ---- anydevice run ------------------------------------------------------------------------------
def run_main(args) -> int:
    """``anydevice run``; ``args`` from the cli's parser, or a list of its arguments. Human lines go
    to stdout, or to stderr with --json (stdout then holds the JSON alone); errors to stderr."""
    from .nodes.headless.runner import load_workflow, run_prompt
    if isinstance(args, (list, tuple)):
        args = build_parser().parse_args(["run", *args])
    stream = sys.stderr if args.json else sys.stdout

    def echo(text):
        print(text, file=stream)

    try:
        prompt = load_workflow(args.workflow)
        echo(f"anydevice run {args.workflow}")
        res = run_prompt(prompt, output_dir=args.output_dir, input_image=args.input, workflow_path=args.workflow,
                         echo=echo)
    except Exception as exc:  # noqa: BLE001 - one line a problem, the exit code it carries
        return report_error("anydevice run", exc, getattr(args, "verbose", False))
    echo(f"total: {sum(res.times_ms.values()):.1f} ms in {len(res.times_ms)} nodes")
    for s in res.saved:
        echo(f"saved: {s['path']}")
    if args.json:
        print(json.dumps(_jsonable({"backend": res.backend, "times_ms": res.times_ms, "ui": res.ui,
                                    "saved": res.saved}), allow_nan=False))
    return 0


def _jsonable(x):
    """Plain JSON: NumPy scalars as numbers, non-finite numbers (a PSNR of identical images) as null."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, (np.floating, np.integer)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


if __name__ == "__main__":
    sys.exit(main())
