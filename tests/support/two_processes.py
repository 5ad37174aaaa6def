"""One script run twice, each time in a fresh interpreter (2 threads): what the determinism tests
across processes compare (tests/backend/learn/test_train.py, tests/nodes/learn/test_network_nodes.py).
"""
from __future__ import annotations

import os
import subprocess
import sys


def run_twice(tmp_path, name: str, text: str, *args: str, drop_env=()) -> list[subprocess.CompletedProcess]:
    """Writes ``text`` to ``tmp_path/name`` and runs it twice with ``args`` (ANYDEVICE_NUM_THREADS=2,
    the variables ``drop_env`` unset); returns both runs, output captured as text."""
    script = tmp_path / name
    script.write_text(text)
    env = dict(os.environ, ANYDEVICE_NUM_THREADS="2")
    for var in drop_env:
        env.pop(var, None)
    return [subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
