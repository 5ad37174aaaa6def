"""The ``anydevice`` command: devices, bench (run comes with the nodes)."""
from __future__ import annotations

import argparse
import json
import logging
import sys


def _cmd_devices(args) -> int:
    from .backend import auto_name, list_backends
    infos = list_backends(refresh=True, include_aliases=args.all)
    chosen = auto_name().split(":")[0]
    if args.json:
        print(json.dumps([i.as_dict() for i in infos], indent=2))
        return 0
    print(f"{'':2}{'backend':<11}{'available':<11}{'priority':<9}device / reason")
    for i in infos:
        mark = "* " if i.name == chosen else "  "
        detail = i.device if i.available else i.reason
        print(f"{mark}{i.name:<11}{('yes' if i.available else 'no'):<11}{i.priority:<9}{detail}")
        if i.available and i.notes:
            print(f"{'':33}(note: {i.notes})")
    print("\n* = chosen automatically (override with ANYDEVICE_BACKEND=name[:index])")
    return 0


def _cmd_bench(args) -> int:
    from .backend import bench
    return bench.main(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="anydevice", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("devices", help="list every backend with availability or the reason it is unavailable")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="also list the torch-* vendor aliases")
    p.set_defaults(func=_cmd_devices)
    p = sub.add_parser("bench", help="GFLOPS and same-run ratio to PyTorch for each backend")
    from .backend import bench
    bench.add_arguments(p)
    p.set_defaults(func=_cmd_bench)
    try:
        from .nodes import runner  # the headless workflow runner, when present
    except ImportError:
        runner = None
    if runner is not None and hasattr(runner, "add_arguments"):
        p = sub.add_parser("run", help="run an API-format workflow headless, without ComfyUI")
        runner.add_arguments(p)
        p.set_defaults(func=runner.main)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
