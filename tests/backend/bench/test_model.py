"""``anydevice bench --model`` and its model definitions (backend/bench/model_zoo.py).

The definitions must be the real architectures: the SD1.x decoder against ComfyUI's own
``comfy.ldm.modules.diffusionmodules.model.Decoder`` (run in ComfyUI's venv, found as the e2e tests
find it: COMFYUI_DIR), the compact upscaler against spandrel's SRVGGNetCompact (skipped without
spandrel). The bench itself runs in its ``--quick`` mode through the CLI on numpy; speed is never
asserted, the rows' contents are.
"""
from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch

from anydevice.backend.bench import ops as bench, model as bench_model, model_zoo

import compile_models as cm
import e2e_helpers as e2e


# ---- the decoder against ComfyUI's ------------------------------------------------------------------------
_COMFY_CHECK = r"""
import importlib.util, json, sys
sys.argv = [sys.argv[0], "--cpu"]
sys.path.insert(0, COMFY)
import comfy.options
comfy.options.enable_args_parsing()
import torch
import comfy.ldm.modules.diffusionmodules.model as cmodel
spec = importlib.util.spec_from_file_location("model_zoo_under_test", ZOO)
mz = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mz)
ddconfig = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
            "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}
theirs = cmodel.Decoder(**ddconfig).eval()
ours = mz.sd_vae_decoder(seed=3)
out = {"default_attention": theirs.mid.attn_1.optimized_attention.__name__}
r = theirs.load_state_dict(ours.state_dict(), strict=True)
out["into_comfy"] = [list(r.missing_keys), list(r.unexpected_keys)]
shapes_theirs = {k: list(v.shape) for k, v in theirs.state_dict().items()}
shapes_ours = {k: list(v.shape) for k, v in ours.state_dict().items()}
out["same_shapes"] = shapes_theirs == shapes_ours
out["n_tensors"] = len(shapes_ours)
z = torch.randn(1, 4, 6, 5, generator=torch.Generator().manual_seed(1))
def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())
with torch.no_grad():
    y_ours = ours(z)
    out["shape"] = list(y_ours.shape)
    out["rel_default"] = rel(theirs(z), y_ours)   # CPU ComfyUI: normal_attention (sliced bmm + softmax)
    theirs.mid.attn_1.optimized_attention = cmodel.pytorch_attention
    out["rel_pytorch_attention"] = rel(theirs(z), y_ours)
    # and the other way: ComfyUI's (re-randomized) weights into ours
    for p in theirs.parameters():
        p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() % 9973)) * 0.05)
    ours2 = mz.sd_vae_decoder(seed=4)
    r = ours2.load_state_dict(theirs.state_dict(), strict=True)
    out["into_ours"] = [list(r.missing_keys), list(r.unexpected_keys)]
    out["rel_back"] = rel(ours2(z), theirs(z))
print("RESULT " + json.dumps(out))
"""


def test_decoder_matches_comfyui_decoder():
    comfy, why = e2e.comfy_dir()
    if comfy is None:
        pytest.skip(f"ComfyUI's Decoder not available ({why}; set COMFYUI_DIR to a ComfyUI checkout with a venv)")
    py = e2e._venv_python(comfy)
    code = f"COMFY = {str(comfy)!r}\nZOO = {str(e2e.ROOT / 'backend' / 'bench' / 'model_zoo.py')!r}\n" + _COMFY_CHECK
    p = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=600, cwd=str(comfy))
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, (p.stdout[-2000:], p.stderr[-3000:])
    r = json.loads(line[len("RESULT "):])
    assert r["into_comfy"] == [[], []] and r["into_ours"] == [[], []]
    assert r["same_shapes"] and r["n_tensors"] == len(model_zoo.sd_vae_decoder().state_dict())
    assert r["shape"] == [1, 3, 48, 40]
    assert r["rel_pytorch_attention"] <= 1e-6, r      # the same computation (in practice 0)
    assert r["rel_back"] <= 1e-6, r
    assert r["rel_default"] <= 1e-4, r                # ComfyUI's CPU attention path: rounding only


def test_decoder_config_and_shapes():
    d = model_zoo.sd_vae_decoder(seed=0)
    n = sum(p.numel() for p in d.parameters())
    assert n == 49_490_179  # ComfyUI's SD1.x decoder (first_stage_model.decoder.*) parameter count
    assert [type(m).__name__ for m in d.up[1].children()] == ["ModuleList", "ModuleList", "Upsample"]
    assert len(d.up[0].block) == 3 and not hasattr(d.up[0], "upsample")
    gn = [m for m in d.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert gn and all(m.num_groups == 32 and m.eps == 1e-6 for m in gn)
    # seeded: the same weights twice, other weights for another seed
    a, b, c = (model_zoo.sd_vae_decoder(seed=s, ch=32).state_dict() for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["conv_in.weight"], c["conv_in.weight"])
    with torch.no_grad():
        y = model_zoo.sd_vae_decoder(seed=0, ch=32)(torch.randn(1, 4, 3, 5))
    assert y.shape == (1, 3, 24, 40) and torch.isfinite(y).all()


# ---- the upscaler against spandrel's ----------------------------------------------------------------------
@pytest.mark.parametrize("act", ["prelu", "leakyrelu", "relu"])
def test_compact_matches_spandrel(act):
    arch = cm.spandrel_arch("Compact", "SRVGG")  # skips when spandrel is not installed
    cfg = dict(model_zoo.COMPACT_CONFIG, act_type=act)
    ours = model_zoo.compact_upscaler(seed=1, **cfg)
    theirs = arch.SRVGGNetCompact(**cfg).eval()
    r = theirs.load_state_dict(ours.state_dict(), strict=True)
    assert not r.missing_keys and not r.unexpected_keys
    x = torch.rand(1, 3, 11, 9, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y, ref = ours(x), theirs(x)
    assert y.shape == ref.shape == (1, 3, 44, 36)
    assert torch.equal(y, ref)
    ours2 = model_zoo.compact_upscaler(seed=7, **cfg)
    r = ours2.load_state_dict(theirs.state_dict(), strict=True)
    assert not r.missing_keys and not r.unexpected_keys
    with torch.no_grad():
        assert torch.equal(ours2(x), ref)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_compact_refuses_unknown_activation():
    from anydevice.backend.system.errors import AnyDeviceError
    with pytest.raises(AnyDeviceError, match="act_type"):
        model_zoo.SRVGGNetCompact(act_type="gelu")


# ---- the bench --------------------------------------------------------------------------------------------
def test_bench_model_quick_cli_on_numpy(tmp_path, capsys):
    from anydevice import cli
    out = tmp_path / "model.json"
    rc = cli.main(["bench", "--model", "--quick", "--backend", "numpy", "--case", "vae", "--case", "upscaler",
                   "--dtype", "float32", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "ratio" in text and "VAE decoder" in text and "upscaler" in text and "host fallbacks/call 0" in text
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == ["SD1.x VAE decoder 1x4x8x8 (quick)", "compact upscaler x4 1x3x16x16 (quick)"]
    fields = set(bench.Row.__dataclass_fields__)
    shapes = {"SD1.x": ((1, 4, 8, 8), (1, 3, 64, 64)), "compact": ((1, 3, 16, 16), (1, 3, 64, 64))}
    for r in rows:
        assert fields <= set(r) and r["backend"] == "numpy" and r["reps"] == 2 and r["per_call_us"] is False
        for k in ("ms", "torch_ms", "ratio", "gflops", "torch_gflops", "first_ms", "torch_first_ms"):
            assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] > 0, (k, r)
        assert r["ratio"] == pytest.approx(r["torch_ms"] / r["ms"])
        assert r["gflops"] / r["torch_gflops"] == pytest.approx(r["ratio"])
        assert r["fallbacks"] == 0 and r["fallback_ops"] == {} and r["eager_fallbacks"] == 0
        assert r["graphs"] == 1
        xin, yout = shapes[r["case"].split()[0]]
        assert r["uploads"] == 1 and r["bytes_up"] == 4 * math.prod(xin)    # the input, once per call
        assert r["downloads"] == 1 and r["bytes_down"] == 4 * math.prod(yout)
        assert r["rel_err"] <= 1e-5
        # every op reads its input and writes its result: at least the input, the output and one of them
        # again per op; NumPy records no device graphs
        assert r["moved_mb"] * 2**20 > 4 * (math.prod(xin) + 2 * math.prod(yout)) and r["replayed"] == 0
    params = [sum(p.numel() for p in m.parameters()) for m in
              (model_zoo.sd_vae_decoder(ch=32), model_zoo.compact_upscaler(num_feat=16, num_conv=4))]
    for r, n in zip(rows, params):  # every weight uploaded once, as a constant
        assert r["weights_mb"] * 2 ** 20 >= 4 * n
        assert r["launches"] is None  # NumPy launches no kernels


def test_bench_model_counts_kernel_launches_on_opencl(tmp_path, capsys):
    """On OpenCL each model row carries the kernels launched per call (the device counts every launch):
    the quick VAE decoder's GroupNorm + SiLU pairs run as one kernel, so a call launches fewer kernels
    than with that fusion off."""
    from anydevice.backend import get_backend
    try:
        get_backend("opencl")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"opencl unavailable: {exc}")
    from anydevice import cli
    from anydevice.backend.compile import aten_ops
    out = tmp_path / "l.json"
    args = ["bench", "--model", "--quick", "--backend", "opencl", "--case", "vae", "--reps", "1", "--dtype", "float32",
            "--json", str(out)]
    assert cli.main(args) == 0
    fused = json.loads(out.read_text())[0]["launches"]
    assert "kernels/call" in capsys.readouterr().out
    saved = dict(aten_ops.FUSED_ACTS)
    aten_ops.FUSED_ACTS.clear()
    try:
        assert cli.main(args) == 0
    finally:
        aten_ops.FUSED_ACTS.update(saved)
    unfused = json.loads(out.read_text())[0]["launches"]
    assert fused == int(fused) and 0 < fused < unfused, (fused, unfused)


def test_bench_model_backends_and_case_filter(tmp_path):
    names = bench_model.default_backends()
    assert names and set(names) <= set(bench_model.DEFAULT_BACKENDS) and "cpu" not in names
    from anydevice import cli
    out = tmp_path / "one.json"
    assert cli.main(["bench", "--model", "--quick", "--backend", "numpy", "--case", "upscaler", "--reps", "1",
                     "--dtype", "float32", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and rows[0]["case"].startswith("compact upscaler") and rows[0]["reps"] == 1


def test_bench_model_unet_in_float32_and_float16(tmp_path, capsys):
    """The SD1.5-shaped UNet step (--quick: narrow) in both default dtypes: one row each, the dtype a field
    of its own (not in ``case``), float16's resident weights half of float32's, a device peak and no
    streaming (the budget is the device's free memory); the error of float16 against eager float32 is
    float16's, float32's is float32's."""
    from anydevice import cli
    out = tmp_path / "unet.json"
    assert cli.main(["bench", "--model", "--quick", "--backend", "numpy", "--case", "unet", "--reps", "1",
                     "--json", str(out)]) == 0
    rows = {r["dtype"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"float32", "float16"}
    assert rows["float32"]["case"] == rows["float16"]["case"] == "SD1.5 UNet step 1x4x8x8 (quick)"
    w32, w16 = rows["float32"]["weights_mb"], rows["float16"]["weights_mb"]
    assert w32 > 0 and abs(w16 / w32 - 0.5) <= 0.02, (w16, w32)
    for r in rows.values():
        assert r["streamed_mb"] == 0 and r["peak_mb"] >= r["weights_mb"] and r["fallbacks"] == 0
    assert rows["float32"]["rel_err"] <= 1e-5 and 1e-5 < rows["float16"]["rel_err"] <= 1e-2
    assert "float16: weights" in capsys.readouterr().out
