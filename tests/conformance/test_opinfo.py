"""PyTorch's own OpInfo samples, replayed on every backend.

For every pack op with an OpInfo counterpart (``torch.testing._internal.common_methods_invocations
.op_db``), the float32 CPU samples of that OpInfo are run through the backend (the sample's tensors
as NumPy arrays, the arguments mapped by the table ``OPS`` below) and compared with the OpInfo's own
function run on float64 copies of the same sample: the precision suite's bar (normwise relative
error <= 1e-6, NaN and Inf positions exact) and no input written.

Samples that use something outside the pack's contract (a rounding_mode, an out-of-place alpha, a
dtype= argument, a pad of more than two dims, ...) are skipped through ``EXCLUDED``: one reason per
(op, feature). Ops that other work adds (pools, interpolate, where, cat, ...) have their entry
already: it skips while the backend has no method of that name. ``MAX_SAMPLES`` caps the samples per
OpInfo (evenly spaced) so the file stays quick on every backend.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

from anydevice.backend.ops.contract import Backend

from precision_helpers import _assert_unchanged, _snapshot, check, tol_for

pytest.importorskip("expecttest", reason="expecttest not installed (PyTorch's OpInfo database imports it; "
                    ".ci/setup installs it)")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

MAX_SAMPLES = 24
#: elementwise ops whose OpInfo reference inputs (extremal values: NaN, +-Inf, huge, tiny, -0) are
#: replayed as well, at most MAX_REFERENCE of them per op
REFERENCE_OPS = {"nn.functional.relu", "nn.functional.gelu", "nn.functional.elu", "nn.functional.leaky_relu",
                 "nn.functional.softplus", "nn.functional.silu", "sigmoid", "tanh", "exp", "log", "sqrt",
                 "rsqrt", "erf", "sin", "cos", "abs", "neg", "add", "sub", "mul", "div", "pow", "minimum",
                 "maximum"}
MAX_REFERENCE = 6
MAX_REFERENCE_NUMEL = 2**14  # the big ones are large-tensor cases, slow and not about special values


class Excluded(Exception):
    """A sample uses a feature outside the contract; the argument is the key into EXCLUDED."""


#: (op, feature) -> why the pack does not take such samples
EXCLUDED = {
    ("nn.functional.pad", "pad of more than 2 dims"): "the pack pads the last two dims only",
    ("nn.functional.interpolate", "volume"): "interpolate takes 3-D and 4-D inputs (one or two spatial dims); "
                                             "5-D volumes and trilinear are outside the contract",
    ("nn.functional.batch_norm", "1-D input"): "batch_norm takes (N, C, *) inputs (torch also passes an "
                                                "empty 1-D one through)",
    ("nn.functional.pad", "constant value"): "constant padding is zeros; pad has no value argument",
    ("clamp", "tensor bounds"): "min/max are numbers in the pack (torch also takes tensors)",
    ("add", "alpha"): "add/sub take no alpha (other * alpha would round once more)",
    ("sub", "alpha"): "add/sub take no alpha (other * alpha would round once more)",
    ("div", "rounding_mode"): "div has no rounding_mode (true division only)",
    ("softmax", "dtype"): "compute is float32; no dtype= argument",
    ("log_softmax", "dtype"): "compute is float32; no dtype= argument",
    ("sum", "dtype"): "compute is float32; no dtype= argument",
    ("mean", "dtype"): "compute is float32; no dtype= argument",
    ("*", "inplace"): "no op writes into an input",
    ("*", "return_indices"): "pools return values only, not argmax indices",
    ("*", "negative eps"): "the normalisations refuse eps < 0 (AnyDeviceError; torch takes it)",
    ("nn.functional.dropout", "random"): "dropout with p > 0 in training is random: nothing to compare",
    ("nn.functional.scaled_dot_product_attention", "dropout"): "attention dropout is refused (training only)",
}

#: (op, sample index) -> reason: samples that fail through a known pack bug (xfail, not strict:
#: a backend where the bug does not show passes)
KNOWN_BUGS: dict[tuple[str, int], str] = {}


def _drop_inplace(kw):
    if kw.pop("inplace", False):
        raise Excluded("inplace")
    return kw


def _plain(x, args, kw):
    return (x, *args), _drop_inplace(kw)


def _pad(x, args, kw):
    pad = args[0]
    mode = args[1] if len(args) > 1 else kw.get("mode", "constant")
    value = args[2] if len(args) > 2 else kw.get("value")
    if len(pad) > 4:
        raise Excluded("pad of more than 2 dims")
    if mode == "constant" and value not in (None, 0, 0.0):
        raise Excluded("constant value")
    return (x, tuple(pad), mode), {}


def _clamp(x, args, kw):
    bounds = list(args) + [kw.get("min"), kw.get("max")][len(args):]
    if any(isinstance(b, np.ndarray) for b in bounds):
        raise Excluded("tensor bounds")
    return (x,), {"min": bounds[0], "max": bounds[1]}


def _no_alpha(x, args, kw):
    if "alpha" in kw:
        raise Excluded("alpha")
    return (x, *args), kw


def _div(x, args, kw):
    if kw.get("rounding_mode") is not None:
        raise Excluded("rounding_mode")
    return (x, *args), {}


def _no_dtype(x, args, kw):
    if "dtype" in kw:
        raise Excluded("dtype")
    return (x, *args), kw


def _var(x, args, kw):
    kw = dict(kw)
    args = list(args)
    if args and isinstance(args[0], bool):  # var(input, unbiased)
        kw["unbiased"] = args.pop(0)
    if args:
        kw["dim"] = args.pop(0)
    if "unbiased" in kw:
        kw["correction"] = int(kw.pop("unbiased"))
    return (x,), kw


def _pool(x, args, kw):
    """max_pool2d / adaptive_max_pool2d: return_indices (a keyword or the last positional)."""
    if kw.get("return_indices") or (args and isinstance(args[-1], bool) and args[-1] and len(args) in (2, 6)):
        raise Excluded("return_indices")
    kw = dict(kw)
    kw.pop("return_indices", None)
    return (x, *args), kw


def _dropout(x, args, kw):
    p = args[0] if args else kw.get("p", 0.5)
    training = args[1] if len(args) > 1 else kw.get("training", True)
    if p > 0 and training:
        raise Excluded("random")
    return _plain(x, args, kw)


def _sdpa(x, args, kw):
    if kw.get("dropout_p", 0.0):
        raise Excluded("dropout")
    return (x, *args), kw


def _norm(x, args, kw):
    if (kw.get("eps") or 0) < 0:
        raise Excluded("negative eps")
    return (x, *args), kw


def _interpolate(x, args, kw):
    if x.ndim > 4 or kw.get("mode") == "trilinear":
        raise Excluded("volume")
    return (x, *args), kw


def _batch_norm(x, args, kw):
    if x.ndim < 2:
        raise Excluded("1-D input")
    return (x, *args), kw


def _where(x, args, kw):  # OpInfo's where is lambda self, condition, other: torch.where(condition, self, other)
    return (args[0], x, *args[1:]), kw


@dataclass(frozen=True)
class Op:
    method: str                                  # the Backend method
    call: Callable = _plain                      # (input, args, kwargs) -> (args, kwargs) of the method


#: op_db name -> how the backend method is called
OPS: dict[str, Op] = {
    "matmul": Op("matmul"),
    "nn.functional.linear": Op("linear"),
    "nn.functional.conv2d": Op("conv2d"),
    "nn.functional.conv_transpose2d": Op("conv_transpose2d"),
    "nn.functional.pad": Op("pad", _pad),
    **{f"nn.functional.{n}": Op(n) for n in ("relu", "gelu", "elu", "leaky_relu", "softplus", "silu")},
    **{n: Op(n) for n in ("sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "abs", "neg")},
    "clamp": Op("clamp", _clamp),
    "add": Op("add", _no_alpha), "sub": Op("sub", _no_alpha), "mul": Op("mul"), "div": Op("div", _div),
    "pow": Op("pow"), "minimum": Op("minimum"), "maximum": Op("maximum"),
    "sum": Op("sum", _no_dtype), "mean": Op("mean", _no_dtype), "amax": Op("max"), "amin": Op("min"),
    "var": Op("var", _var), "std": Op("std", _var),
    "softmax": Op("softmax", _no_dtype), "log_softmax": Op("log_softmax", _no_dtype),
    **{f"nn.functional.{n}": Op(n) for n in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                                             "binary_cross_entropy")},
    **{f"nn.functional.{n}": Op(n, _norm) for n in ("layer_norm", "group_norm", "rms_norm")},
    "nn.functional.scaled_dot_product_attention": Op("scaled_dot_product_attention", _sdpa),
    # ops other work adds: active once the backend has the method
    "nn.functional.max_pool2d": Op("max_pool2d", _pool),
    "nn.functional.avg_pool2d": Op("avg_pool2d"),
    "nn.functional.adaptive_avg_pool2d": Op("adaptive_avg_pool2d"),
    "nn.functional.adaptive_max_pool2d": Op("adaptive_max_pool2d", _pool),
    "nn.functional.interpolate": Op("interpolate", _interpolate),
    "where": Op("where", _where),
    "cat": Op("cat"),
    "stack": Op("stack"),
    "nn.functional.cross_entropy": Op("cross_entropy"),
    "nn.functional.nll_loss": Op("nll_loss"),
    "nn.functional.batch_norm": Op("batch_norm", _batch_norm),
    "nn.functional.dropout": Op("dropout", _dropout),
}


# ---------------------------------------------------------------------------------------------
# samples
# ---------------------------------------------------------------------------------------------
def _np(v):
    """A sample value for the backend: tensors as NumPy arrays of their own dtype (copies)."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone().numpy()
    if isinstance(v, (list, tuple)) and any(isinstance(i, torch.Tensor) for i in v):
        return type(v)(_np(i) for i in v)
    return v


def _t64(v):
    """A sample value for the reference: float tensors in float64 (copies), the rest as is."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone().double() if v.is_floating_point() else v.detach().clone()
    if isinstance(v, (list, tuple)) and any(isinstance(i, torch.Tensor) for i in v):
        return type(v)(_t64(i) for i in v)
    return v


def _key(info) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


_SAMPLES: dict[str, tuple] = {}   # key -> (opinfo, [samples])


def _numel(sample) -> int:
    vals = [sample.input, *sample.args, *sample.kwargs.values()]
    return sum(v.numel() for v in vals if isinstance(v, torch.Tensor))


def _spaced(samples, most):
    """At most ``most`` samples, evenly spaced (first and last included)."""
    if len(samples) <= most:
        return samples
    return [samples[i] for i in sorted(set(np.linspace(0, len(samples) - 1, most).round().astype(int)))]


def _samples(info, reference=False):
    key = _key(info) + ("/ref" if reference else "")
    if key not in _SAMPLES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if reference:
                plain = len(list(info.sample_inputs("cpu", torch.float32, requires_grad=False)))
                # reference_inputs starts with the plain samples: only the ones after them
                found = [r for r in list(info.reference_inputs("cpu", torch.float32, requires_grad=False))[plain:]
                         if _numel(r) <= MAX_REFERENCE_NUMEL]
                found = _spaced(found, MAX_REFERENCE)
            else:
                found = _spaced(list(info.sample_inputs("cpu", torch.float32, requires_grad=False)), MAX_SAMPLES)
        _SAMPLES[key] = (info, found)
    return _SAMPLES[key][1]


def _prepare(name, sample):
    """(args, kwargs) for the backend method, or raise Excluded."""
    return OPS[name].call(_np(sample.input), [_np(a) for a in sample.args],
                          {k: _np(v) for k, v in sample.kwargs.items()})


def _reason(name, feature) -> str:
    reason = EXCLUDED.get((name, feature)) or EXCLUDED.get(("*", feature))
    assert reason, f"({name!r}, {feature!r}) is excluded without a reason in EXCLUDED"
    return f"{feature}: {reason}"


def _params():
    out = []
    for info in op_db:
        if info.name not in OPS:
            continue
        key = _key(info)
        if torch.float32 not in info.supported_dtypes("cpu"):
            continue  # a variant for other dtypes (silu.complex, batch_norm.without_cudnn)
        if not hasattr(Backend, OPS[info.name].method):
            out.append(pytest.param(key, -1, id=f"{key}-absent",
                                    marks=pytest.mark.skip(reason=f"no Backend.{OPS[info.name].method} here yet")))
            continue
        for skey in (key, key + "/ref") if info.name in REFERENCE_OPS else (key,):
            for i, s in enumerate(_samples(info, skey.endswith("/ref"))):
                marks = []
                try:
                    _prepare(info.name, s)
                except Excluded as exc:
                    marks.append(pytest.mark.skip(reason="excluded: " + _reason(info.name, exc.args[0])))
                if (skey, i) in KNOWN_BUGS:
                    marks.append(pytest.mark.xfail(reason=KNOWN_BUGS[(skey, i)], strict=False))
                out.append(pytest.param(skey, i, id=f"{skey}-{i}", marks=marks))
    return out


def _as_np64(y):
    if isinstance(y, torch.Tensor):
        y = y.detach().numpy()
    return np.asarray(y, dtype=np.float64)


@pytest.mark.parametrize("key,index", _params())
def test_opinfo_sample(backend_target, key, index):
    info, samples = _SAMPLES[key]
    s = samples[index]
    args, kwargs = _prepare(info.name, s)
    with warnings.catch_warnings():  # torch's own warnings on the reference (e.g. var's degrees of freedom)
        warnings.simplefilter("ignore")
        ref = info.op(_t64(s.input), *[_t64(a) for a in s.args], **{k: _t64(v) for k, v in s.kwargs.items()})
    arrays = [a for a in list(args) + list(kwargs.values()) if isinstance(a, np.ndarray)]
    arrays += [a for v in list(args) if isinstance(v, (list, tuple)) for a in v if isinstance(a, np.ndarray)]
    before = _snapshot(*arrays)
    be = backend_target
    y = getattr(be, OPS[info.name].method)(*args, **kwargs)
    _assert_unchanged(before, _snapshot(*arrays))
    what = f"{key} sample {index}: {s.summary() if hasattr(s, 'summary') else s}"
    check(_as_np64(y), _as_np64(ref), what[:400], tol_for(be))
