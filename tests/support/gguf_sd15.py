"""A GGUF diffusion model written as ComfyUI-GGUF's tools make one (tools/convert.py, then its patched
llama-quantize for the quantized tensors), with the ``gguf`` package's own writer and quantizer:

* keys: the UNet's, the ``model.diffusion_model.`` prefix stripped (convert.py's ``load_state_dict``);
  ``general.architecture`` = ``arch`` ("sd1"), the quantization version and file type;
* 1-D tensors and tensors of at most QUANTIZATION_THRESHOLD (1024) values: F32; the other 2-D+ tensors
  ``qtype`` (Q8_0), where a tensor's last dimension is not a multiple of 256 but its size is (and it has
  at least REARRANGE_THRESHOLD = 512 values), it is stored as rows of 256 with
  ``comfy.gguf.orig_shape.<key>`` its original shape (convert.py's ``shape_fix`` for SD1/SDXL);
  a tensor that still has rows that are not whole blocks stays F16 (as llama-quantize leaves it).

``write_from_checkpoint(ckpt, out)`` takes the UNet of a ComfyUI checkpoint (safetensors);
``write(tensors, out)`` any dict of float arrays (tests' small files).
"""
from __future__ import annotations

import numpy as np

QUANTIZATION_THRESHOLD = 1024
REARRANGE_THRESHOLD = 512
PREFIX = "model.diffusion_model."


def write(tensors: dict, out, arch: str = "sd1", qtype: str = "Q8_0") -> dict:
    """Write ``tensors`` (name -> float32 array) to the GGUF file ``out``; returns {name: (ggml type name,
    stored shape, orig_shape or None)}."""
    import gguf
    q = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[q][0]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0) if qtype == "Q8_0" else 1)
    info = {}
    for key, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        n = a.size
        orig = None
        if a.ndim == 1 or n <= QUANTIZATION_THRESHOLD:
            t = gguf.GGMLQuantizationType.F32
        else:
            t = q
            if n >= REARRANGE_THRESHOLD and n % 256 == 0 and a.shape[-1] % 256:
                orig = tuple(int(d) for d in a.shape)
                a = a.reshape(n // 256, 256)
                w.add_array(f"comfy.gguf.orig_shape.{key}", list(orig))
            if a.shape[-1] % block:
                t = gguf.GGMLQuantizationType.F16
        data = gguf.quants.quantize(a, t) if t != gguf.GGMLQuantizationType.F32 else a
        w.add_tensor(key, data, raw_dtype=t)
        info[key] = (t.name, tuple(a.shape), orig)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return info


def write_from_checkpoint(ckpt, out, qtype: str = "Q8_0") -> dict:
    """The UNet of the ComfyUI checkpoint ``ckpt`` (safetensors) as a GGUF file (see the module)."""
    from safetensors import safe_open
    tensors = {}
    with safe_open(str(ckpt), framework="np") as f:
        for k in f.keys():
            if k.startswith(PREFIX):
                tensors[k[len(PREFIX):]] = f.get_tensor(k).astype(np.float32)
    if not tensors:
        raise RuntimeError(f"{ckpt} has no {PREFIX}* tensors")
    return write(tensors, out, "sd1", qtype)


def tiny_comfy_case(comfy, why: str, tmp_dir, backend: str, run, argv) -> dict:
    """The tests that run tests/support/gguf_comfy.py on the tiny SD1.5-config UNet: skipped (pytest.skip,
    saying why) without ComfyUI (``comfy`` None: ``why``), the gguf / safetensors packages or ``backend``;
    else the tiny UNet written by ComfyUI's python (``run("--write-sd", path)``), made a Q8_0 GGUF file here,
    and ``run(*argv(gguf_path))``'s result with the file's tensor table ("info") and the backend's
    quant_formats added."""
    import pytest
    if comfy is None:
        pytest.skip(why)
    pytest.importorskip("gguf", reason="the gguf package writes the test's GGUF file")
    pytest.importorskip("safetensors", reason="safetensors reads the tiny UNet")
    try:
        from anydevice.backend import get_backend
        be = get_backend(backend)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {backend} unavailable: {exc}")
    run("--write-sd", tmp_dir / "tiny.safetensors")
    info = write_from_checkpoint(tmp_dir / "tiny.safetensors", tmp_dir / "tiny_q8_0.gguf")
    r = run(*argv(tmp_dir / "tiny_q8_0.gguf"))
    r["info"], r["quant_formats"] = info, sorted(be.caps.quant_formats)
    return r
