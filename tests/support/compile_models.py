"""What the compile tests (test_compile.py, test_compile_models.py) share: the fresh-dynamo fixture,
the error measure and the float64 reference; and the models they run: a VAE-style decoder defined
here, and spandrel's upscale architectures imported without running spandrel's package ``__init__``
(which imports every architecture; LaMa needs torchvision, which does not match the project's
torch). The real architecture code is loaded: only the package modules above it are bare."""
from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from anydevice.backend import compile as adc


# ---- shared by the compile tests -------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Autouse in every test module that imports it: dynamo and the fallback report start empty."""
    torch._dynamo.reset()
    adc.reset_report()
    yield
    torch._dynamo.reset()


def rel(y, ref) -> float:
    """Normwise relative error of ``y`` against ``ref``, in float64."""
    y, ref = y.detach().double(), ref.detach().double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def ref64(model, *xs):
    """The model's output in float64 (a copy of the model; no autograd)."""
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        return m(*(x.double() for x in xs))


# ---- a VAE-style decoder ----------------------------------------------------------------------------
class ResBlock(nn.Module):
    def __init__(self, cin, cout, groups=8):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(groups, cin, eps=1e-6), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(groups, cout, eps=1e-6), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        h = self.c2(F.silu(self.n2(h)))
        return self.skip(x) + h


class AttnBlock(nn.Module):
    """As the SD VAE's: GroupNorm, 1x1 q/k/v, one-head attention over the pixels (SDPA)."""

    def __init__(self, c, groups=8):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=1e-6)
        self.q, self.k, self.v, self.proj = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        h = self.norm(x)
        b, c, hh, ww = h.shape
        q, k, v = (m(h).reshape(b, 1, c, hh * ww).transpose(2, 3).contiguous() for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj(y.transpose(2, 3).reshape(b, c, hh, ww))


class Decoder(nn.Module):
    def __init__(self, zc=4, ch=32, out=3):
        super().__init__()
        self.conv_in = nn.Conv2d(zc, ch, 3, padding=1)
        self.mid1, self.attn, self.mid2 = ResBlock(ch, ch), AttnBlock(ch), ResBlock(ch, ch)
        self.up = ResBlock(ch, ch // 2)
        self.up_conv = nn.Conv2d(ch // 2, ch // 2, 3, padding=1)
        self.norm_out = nn.GroupNorm(8, ch // 2, eps=1e-6)
        self.conv_out = nn.Conv2d(ch // 2, out, 3, padding=1)

    def forward(self, z):
        h = self.mid2(self.attn(self.mid1(self.conv_in(z))))
        h = self.up(h)
        h = self.up_conv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h)))


# ---- spandrel, without its package __init__ ------------------------------------------------------------
def _bare_package(name: str, path: str) -> None:
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [path]
    mod.__package__ = name
    sys.modules[name] = mod


def spandrel_arch(arch: str, module: str):
    """The module ``spandrel.architectures.<arch>.__arch.<module>``, the real code."""
    full = f"spandrel.architectures.{arch}.__arch.{module}"
    if full in sys.modules:
        return sys.modules[full]
    if "spandrel" not in sys.modules:
        spec = importlib.util.find_spec("spandrel")
        if spec is None:
            pytest.skip("spandrel is not installed")
        root = spec.submodule_search_locations[0]
        _bare_package("spandrel", root)
        _bare_package("spandrel.architectures", f"{root}/architectures")
    root = sys.modules["spandrel"].__path__[0]
    _bare_package(f"spandrel.architectures.{arch}", f"{root}/architectures/{arch}")
    return importlib.import_module(full)


def rrdbnet(seed=0):
    torch.manual_seed(seed)
    m = spandrel_arch("ESRGAN", "RRDB").RRDBNet(in_nc=3, out_nc=3, num_filters=16, num_blocks=2, scale=2)
    return m.eval()


def compact(seed=0):
    torch.manual_seed(seed)
    m = spandrel_arch("Compact", "SRVGG").SRVGGNetCompact(num_in_ch=3, num_out_ch=3, num_feat=16, num_conv=4,
                                                          upscale=2, act_type="prelu")
    return m.eval()


def swinir(seed=0):
    torch.manual_seed(seed)
    m = spandrel_arch("SwinIR", "SwinIR").SwinIR(img_size=16, in_chans=3, embed_dim=24, depths=[2], num_heads=[2],
                                                 window_size=4, mlp_ratio=2.0, upscale=2,
                                                 upsampler="pixelshuffledirect", drop_path_rate=0.0)
    return m.eval()


def decoder(seed=0):
    torch.manual_seed(seed)
    return Decoder().eval()


class SmallAttention(nn.Module):
    """Self-attention over an image's pixels (qkv linear, SDPA over heads, out linear, residual)."""

    def __init__(self, c, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x):
        n, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        q, k, v = self.qkv(t).reshape(n, -1, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, -1, c)
        return x + self.out(a).transpose(1, 2).reshape(n, c, h, w)


def conv_attention_model(seed=0):
    """A small model of what a diffusion model is made of: convs, GroupNorm, SiLU, attention, upsample."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(4, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),
        nn.Conv2d(32, 32, 3, padding=1), SmallAttention(32), nn.SiLU(),
        nn.Upsample(scale_factor=2), nn.Conv2d(32, 4, 1)).eval()
