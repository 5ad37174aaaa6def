"""The benchmark command runs on every backend (a smoke test: speed is never asserted)."""
from __future__ import annotations

import json

from anydevice.backend.bench import ops as bench


def test_bench_case_runs_on_every_backend(backend_target):
    case = next(c for c in bench.CASES if c.per_call_us)
    row = bench.bench_case(backend_target, case, budget_s=0.01, max_reps=3)
    assert row.ms > 0 and row.torch_ms > 0 and row.ratio > 0 and row.first_ms > 0
    small = bench.Case("conv small", "conv2d", (1, 3, 16, 16), (4, 3, 3, 3), {"padding": 1},
                       bench._conv_flops((1, 3, 16, 16), (4, 3, 3, 3), 1, 1))
    row = bench.bench_case(backend_target, small, budget_s=0.01, max_reps=3)
    assert row.gflops > 0


def test_bench_cli_prints_table_and_json(tmp_path, capsys):
    from anydevice import cli
    out = tmp_path / "bench.json"
    rc = cli.main(["bench", "--backend", "numpy", "--case", "4x4", "--quick", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "ratio" in text and "matmul 4x4" in text
    rows = json.loads(out.read_text())
    assert rows and rows[0]["backend"] == "numpy" and rows[0]["torch_ms"] > 0
