"""Self-contained definitions of two ComfyUI models, for ``anydevice bench --model`` and the model nodes.

Both need only PyTorch (no ComfyUI, no spandrel) and keep the originals' module names, so a state dict
loads into either side unchanged (tests/backend/bench/test_model.py checks that, and equal outputs, against
the real classes where they are installed):

* :class:`Decoder` -- the SD1.x VAE decoder as ComfyUI's
  ``comfy.ldm.modules.diffusionmodules.model.Decoder`` with the SD1.x config (ch 128, ch_mult
  (1, 2, 4, 4), num_res_blocks 2, z_channels 4, out_ch 3, no attention in the up levels): GroupNorm(32,
  eps 1e-6), swish, a mid block res-attn-res whose attention is single-head over the channels through
  ``scaled_dot_product_attention`` (ComfyUI's ``pytorch_attention``), nearest 2x upsampling + conv.
  The VAE's ``post_quant_conv`` (1x1, 4->4) and latent scaling sit outside the Decoder in ComfyUI too.
* :class:`SRVGGNetCompact` -- the RealESRGAN compact upscaler as spandrel's
  ``spandrel/architectures/Compact/__arch/SRVGG.py`` (body of conv+activation pairs, a last conv to
  out_ch * upscale^2, pixel shuffle, plus the nearest-upsampled input).

Builders (random weights, deterministic per seed, float32, eval mode)::

    from anydevice.backend.bench.model_zoo import sd_vae_decoder, compact_upscaler
    dec = sd_vae_decoder(seed=0)          # latent (N, 4, h, w) -> image (N, 3, 8h, 8w), ~49 M parameters
    up = compact_upscaler(seed=0)         # image (N, 3, H, W) -> (N, 3, 4H, 4W), ~0.6 M parameters

Keyword arguments of the builders change the config (the bench's ``--quick`` uses narrow ones).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Decoder", "SRVGGNetCompact", "sd_vae_decoder", "compact_upscaler", "SD1_DECODER_CONFIG",
           "COMPACT_CONFIG", "UNetModel", "sd15_unet", "SD15_UNET_CONFIG"]

#: ComfyUI's SD1.x VAE ddconfig, the keys its Decoder uses
SD1_DECODER_CONFIG = {"ch": 128, "out_ch": 3, "ch_mult": (1, 2, 4, 4), "num_res_blocks": 2, "z_channels": 4}
#: RealESRGAN's realesr-general-x4v3 / AnimeVideo-style compact model (spandrel's defaults)
COMPACT_CONFIG = {"num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_conv": 16, "upscale": 4,
                  "act_type": "prelu"}


# ---- SD1.x VAE decoder (ComfyUI comfy/ldm/modules/diffusionmodules/model.py) ------------------------------
def Normalize(in_channels: int, num_groups: int = 32) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=num_groups, num_channels=in_channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm1-swish-conv1-norm2-swish-conv2 plus the input (through a 1x1 ``nin_shortcut`` when the
    channel count changes). No time embedding (the decoder's temb_channels is 0); dropout 0."""

    def __init__(self, in_channels: int, out_channels: int | None = None):
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = Normalize(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.norm2 = Normalize(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.in_channels != self.out_channels:
            x = self.nin_shortcut(x)
        return x + h


def pytorch_attention(q, k, v):
    """ComfyUI's VAE attention: one head, the pixels are the sequence, the channels the features."""
    orig_shape = q.shape
    b, c = orig_shape[0], orig_shape[1]
    q, k, v = (t.view(b, 1, c, -1).transpose(2, 3).contiguous() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
    return out.transpose(2, 3).reshape(orig_shape)


class AttnBlock(nn.Module):
    def __init__(self, in_channels: int):
        super().__init__()
        self.in_channels = in_channels
        self.norm = Normalize(in_channels)
        self.q = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.k = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.v = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.proj_out = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        h = self.norm(x)
        h = pytorch_attention(self.q(h), self.k(h), self.v(h))
        return x + self.proj_out(h)


class Upsample(nn.Module):
    """Nearest 2x, then a 3x3 conv."""

    def __init__(self, in_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=(2.0, 2.0), mode="nearest"))


class Decoder(nn.Module):
    """ComfyUI's ``Decoder`` (2-D, no attention in the up levels, ``give_pre_end``/``tanh_out`` off).

    Module names as ComfyUI's: conv_in, mid.block_1, mid.attn_1, mid.block_2, up[i].block[j],
    up[i].upsample.conv (i > 0), norm_out, conv_out; ``up[i].attn`` is an empty ModuleList as there."""

    def __init__(self, *, ch: int = 128, out_ch: int = 3, ch_mult=(1, 2, 4, 4), num_res_blocks: int = 2,
                 z_channels: int = 4):
        super().__init__()
        self.ch, self.num_resolutions, self.num_res_blocks = ch, len(ch_mult), num_res_blocks
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in)
        self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(block_in, block_in)
        self.up = nn.ModuleList()
        for i_level in reversed(range(self.num_resolutions)):
            block = nn.ModuleList()
            block_out = ch * ch_mult[i_level]
            for _ in range(num_res_blocks + 1):
                block.append(ResnetBlock(block_in, block_out))
                block_in = block_out
            up = nn.Module()
            up.block = block
            up.attn = nn.ModuleList()
            if i_level != 0:
                up.upsample = Upsample(block_in)
            self.up.insert(0, up)
        self.norm_out = Normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, out_ch, kernel_size=3, stride=1, padding=1)

    def forward(self, z):
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for i_level in reversed(range(self.num_resolutions)):
            for i_block in range(self.num_res_blocks + 1):
                h = self.up[i_level].block[i_block](h)
            if i_level != 0:
                h = self.up[i_level].upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


# ---- SRVGGNetCompact (spandrel spandrel/architectures/Compact/__arch/SRVGG.py) -----------------------------
class SRVGGNetCompact(nn.Module):
    """RealESRGAN's compact VGG-style super-resolution network: all convolutions at the input size,
    upsampling by pixel shuffle in the last layer, plus the nearest-upsampled input (the net learns
    the residual). ``act_type``: "prelu" (per-channel), "relu" or "leakyrelu" (slope 0.1)."""

    def __init__(self, *, num_in_ch: int = 3, num_out_ch: int = 3, num_feat: int = 64, num_conv: int = 16,
                 upscale: int = 4, act_type: str = "prelu"):
        super().__init__()
        if act_type not in ("prelu", "relu", "leakyrelu"):
            from ..system.errors import AnyDeviceError
            raise AnyDeviceError("SRVGGNetCompact", "act_type", act_type, "must be 'prelu', 'relu' or 'leakyrelu'")
        self.num_in_ch, self.num_out_ch, self.num_feat = num_in_ch, num_out_ch, num_feat
        self.num_conv, self.upscale, self.act_type = num_conv, upscale, act_type

        def act():
            if act_type == "relu":
                return nn.ReLU(inplace=True)
            if act_type == "prelu":
                return nn.PReLU(num_parameters=num_feat)
            return nn.LeakyReLU(negative_slope=0.1, inplace=True)

        self.body = nn.ModuleList([nn.Conv2d(num_in_ch, num_feat, 3, 1, 1), act()])
        for _ in range(num_conv):
            self.body.append(nn.Conv2d(num_feat, num_feat, 3, 1, 1))
            self.body.append(act())
        self.body.append(nn.Conv2d(num_feat, num_out_ch * upscale * upscale, 3, 1, 1))
        self.upsampler = nn.PixelShuffle(upscale)

    def forward(self, x):
        out = x
        for layer in self.body:
            out = layer(out)
        out = self.upsampler(out)
        base = F.interpolate(x, scale_factor=self.upscale, mode="nearest")
        out += base
        return out


# ---- SD1.5 UNet (ComfyUI comfy/ldm/modules/diffusionmodules/openaimodel.py, attention.py) ------------------
#: ComfyUI's SD15 unet_config (comfy/supported_models.py, model_detection for an SD1.5 checkpoint)
SD15_UNET_CONFIG = {"in_channels": 4, "out_channels": 4, "model_channels": 320, "channel_mult": (1, 2, 4, 4),
                    "num_res_blocks": 2, "attention_levels": (0, 1, 2), "num_heads": 8, "context_dim": 768}


def timestep_embedding(timesteps, dim: int, max_period: float = 10000.0):
    """openaimodel's sinusoidal embedding (cos first, then sin; ``repeat_only`` off)."""
    import math
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32,
                                                           device=timesteps.device) / half)
    args = timesteps[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepBlock(nn.Sequential):
    """ComfyUI's TimestepEmbedSequential: each layer gets what it takes (ResBlock: emb, transformer: context)."""

    def forward(self, x, emb, context):
        for layer in self:
            if isinstance(layer, UNetResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context)
            else:
                x = layer(x)
        return x


class UNetResBlock(nn.Module):
    """in_layers (GroupNorm32, SiLU, conv3x3), emb_layers (SiLU, Linear), out_layers (GroupNorm32, SiLU,
    Dropout, conv3x3), skip_connection (identity or 1x1 conv)."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int):
        super().__init__()
        self.in_layers = nn.Sequential(nn.GroupNorm(32, channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(nn.GroupNorm(32, out_channels), nn.SiLU(), nn.Dropout(0.0),
                                        nn.Conv2d(out_channels, out_channels, 3, padding=1))
        self.skip_connection = nn.Identity() if channels == out_channels else nn.Conv2d(channels, out_channels, 1)

    def forward(self, x, emb):
        h = self.in_layers(x) + self.emb_layers(emb)[..., None, None]
        return self.skip_connection(x) + self.out_layers(h)


class CrossAttention(nn.Module):
    def __init__(self, query_dim: int, context_dim: int | None, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        context_dim = query_dim if context_dim is None else context_dim
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x, context=None):
        context = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        b, h = q.shape[0], self.heads
        q, k, v = (t.view(b, -1, h, t.shape[-1] // h).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        return self.to_out(out.transpose(1, 2).reshape(b, -1, h * out.shape[-1]))


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, context_dim: int):
        super().__init__()
        self.attn1 = CrossAttention(dim, None, heads, dim_head)
        self.ff = nn.Module()
        self.ff.net = nn.Sequential(GEGLU(dim, dim * 4), nn.Dropout(0.0), nn.Linear(dim * 4, dim))
        self.attn2 = CrossAttention(dim, context_dim, heads, dim_head)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff.net(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    """norm (GroupNorm 32, eps 1e-6), proj_in (1x1 conv: SD1.5 has no linear projections), one
    transformer block over the pixels, proj_out (1x1 conv), plus the input."""

    def __init__(self, channels: int, heads: int, context_dim: int):
        super().__init__()
        self.norm = nn.GroupNorm(32, channels, eps=1e-6)
        self.proj_in = nn.Conv2d(channels, channels, 1)
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(channels, heads, channels // heads, context_dim)])
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x, context):
        b, c, h, w = x.shape
        y = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
        for block in self.transformer_blocks:
            y = block(y, context)
        return self.proj_out(y.transpose(1, 2).reshape(b, c, h, w)) + x


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x):
        return self.op(x)


class UNetModel(nn.Module):
    """ComfyUI's ``UNetModel`` with the SD1.5 config: ``forward(x, timesteps, context)`` -> the
    predicted noise. Module names as ComfyUI's (time_embed, input_blocks, middle_block,
    output_blocks, out), so a ComfyUI SD1.5 state dict (``model.diffusion_model.`` stripped) loads
    unchanged; ~860 M parameters."""

    def __init__(self, *, in_channels=4, out_channels=4, model_channels=320, channel_mult=(1, 2, 4, 4),
                 num_res_blocks=2, attention_levels=(0, 1, 2), num_heads=8, context_dim=768):
        super().__init__()
        ch, emb = model_channels, model_channels * 4
        self.model_channels = model_channels
        self.time_embed = nn.Sequential(nn.Linear(ch, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.input_blocks = nn.ModuleList([TimestepBlock(nn.Conv2d(in_channels, ch, 3, padding=1))])
        chans = [ch]
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers = [UNetResBlock(ch, emb, mult * model_channels)]
                ch = mult * model_channels
                if level in attention_levels:
                    layers.append(SpatialTransformer(ch, num_heads, context_dim))
                self.input_blocks.append(TimestepBlock(*layers))
                chans.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepBlock(Downsample(ch)))
                chans.append(ch)
        self.middle_block = TimestepBlock(UNetResBlock(ch, emb, ch), SpatialTransformer(ch, num_heads, context_dim),
                                          UNetResBlock(ch, emb, ch))
        self.output_blocks = nn.ModuleList()
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                layers = [UNetResBlock(ch + chans.pop(), emb, model_channels * mult)]
                ch = model_channels * mult
                if level in attention_levels:
                    layers.append(SpatialTransformer(ch, num_heads, context_dim))
                if level and i == num_res_blocks:
                    layers.append(Upsample(ch))
                self.output_blocks.append(TimestepBlock(*layers))
        self.out = nn.Sequential(nn.GroupNorm(32, ch), nn.SiLU(), nn.Conv2d(model_channels, out_channels, 3, padding=1))

    def forward(self, x, timesteps, context):
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(x.dtype))
        hs, h = [], x
        for block in self.input_blocks:
            h = block(h, emb, context)
            hs.append(h)
        h = self.middle_block(h, emb, context)
        for block in self.output_blocks:
            h = block(torch.cat([h, hs.pop()], dim=1), emb, context)
        return self.out(h)


# ---- builders ----------------------------------------------------------------------------------------------
def _randomize_norms(model: nn.Module, gen: torch.Generator) -> None:
    """GroupNorm / PReLU parameters away from their 1/0 (0.25) defaults, so a wrong weight mapping shows."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.GroupNorm) and m.affine:
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
            elif isinstance(m, nn.PReLU):
                m.weight.copy_(0.25 + 0.05 * torch.randn(m.weight.shape, generator=gen))


def _seeded(cls, cfg: dict, seed: int) -> nn.Module:
    """``cls(**cfg)`` with PyTorch's default init under ``torch.manual_seed(seed)`` in a forked RNG
    state, plus GroupNorm / PReLU parameters randomized from ``seed + 1``; float32, eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = cls(**cfg)
        _randomize_norms(m, torch.Generator().manual_seed(seed + 1))
    return m.float().eval()


def sd_vae_decoder(seed: int = 0, **config) -> Decoder:
    """The SD1.x VAE decoder with random weights (PyTorch's default init under ``torch.manual_seed``
    in a forked RNG state, plus randomized GroupNorm affines), float32, eval mode. ``config``
    overrides :data:`SD1_DECODER_CONFIG` (e.g. ``ch=32`` for a narrow test model)."""
    return _seeded(Decoder, {**SD1_DECODER_CONFIG, **config}, seed)


def compact_upscaler(seed: int = 0, **config) -> SRVGGNetCompact:
    """RealESRGAN's compact upscaler (num_feat 64, num_conv 16, x4, PReLU unless ``config`` says
    otherwise) with random weights, float32, eval mode."""
    return _seeded(SRVGGNetCompact, {**COMPACT_CONFIG, **config}, seed)


def sd15_unet(seed: int = 0, **config) -> UNetModel:
    """The SD1.5 UNet (:data:`SD15_UNET_CONFIG`, ~860 M parameters: the real tensor sizes, among them
    tensors past 2**24 elements) with PyTorch's default init under ``torch.manual_seed``, plus
    randomized GroupNorm affines, float32, eval mode. ``config`` overrides the config (e.g.
    ``model_channels=32, context_dim=32`` for a narrow smoke model)."""
    return _seeded(UNetModel, {**SD15_UNET_CONFIG, **config}, seed)
