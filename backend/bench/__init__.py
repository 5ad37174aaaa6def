"""``anydevice bench``: same-run ratios to PyTorch.

* ops.py   -- single ops (GEMM, convolutions, attention, ...): GFLOPS and the ratio per case
* train.py -- ``--train``: one training step (forward, backward, Adam) of bundled networks
* model.py -- ``--model``: ComfyUI's models compiled for a backend (model_zoo.py defines them)
* rows.py  -- the row, the table and the loop every mode shares
"""
from __future__ import annotations


def add_arguments(p) -> None:
    """The bench's command-line options (every mode's)."""
    p.add_argument("--backend", action="append", default=None,
                   help="backend to measure (repeatable); default: every available backend")
    p.add_argument("--case", action="append", default=None,
                   help="only cases whose name contains this text (repeatable)")
    p.add_argument("--quick", action="store_true", help="short timing budget per case")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 tensor cores on both sides (PyTorch's allow_tf32 switches and "
                        "ANYDEVICE_ALLOW_TF32=1); by default both compute in full FP32")
    from .train import add_arguments as train_arguments  # --train
    train_arguments(p)
    from .model import add_arguments as model_arguments  # --model, --reps
    model_arguments(p)


def main(args) -> int:
    """Run the mode ``args`` asks for (--train, --model, else the op cases)."""
    from .rows import set_tf32
    set_tf32(bool(getattr(args, "tf32", False)))
    if getattr(args, "train", False):
        from .train import main as train_main
        return train_main(args)
    if getattr(args, "model", False):
        from .model import main as model_main
        return model_main(args)
    from .ops import main as ops_main
    return ops_main(args)
