"""Kernel presets (Conv2D), colour matrices (Linear) and seeded initialisers.

These only build small constant arrays; applying them is the backend's job.
"""
from __future__ import annotations

import math

import numpy as np

# ---- Conv2D kernels -----------------------------------------------------------------------------
#: presets whose size follows the kernel_size input; the others are fixed 3x3
SIZED_KERNELS = ("identity", "box_blur", "gaussian")
FIXED_KERNELS = {
    "sharpen": [[0, -1, 0], [-1, 5, -1], [0, -1, 0]],
    "sobel_x": [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]],
    "sobel_y": [[-1, -2, -1], [0, 0, 0], [1, 2, 1]],
    "laplacian": [[0, 1, 0], [1, -4, 1], [0, 1, 0]],
    "emboss": [[-2, -1, 0], [-1, 1, 1], [0, 1, 2]],
}
KERNEL_PRESETS = ("identity", "box_blur", "gaussian", "sharpen", "sobel_x", "sobel_y", "laplacian", "emboss")


def kernel_preset(name: str, size: int = 3, sigma: float = 1.0) -> np.ndarray:
    """A 2-D float32 kernel (kh, kw)."""
    if name in FIXED_KERNELS:
        return np.asarray(FIXED_KERNELS[name], dtype=np.float32)
    if name == "identity":
        k = np.zeros((size, size), np.float32)
        k[(size - 1) // 2, (size - 1) // 2] = 1.0
        return k
    if name == "box_blur":
        return np.full((size, size), 1.0 / (size * size), np.float32)
    if name == "gaussian":
        if not sigma > 0:
            raise ValueError("sigma must be positive")
        x = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
        g = np.exp(-(x * x) / (2.0 * sigma * sigma))
        k = np.outer(g, g)
        return (k / k.sum()).astype(np.float32)
    raise ValueError(f"unknown kernel preset; choose one of {', '.join(KERNEL_PRESETS)}")


# ---- Linear colour matrices (weight rows = output channels, y = x @ W.T + b) ---------------------
_LUMA = [0.299, 0.587, 0.114]
COLOR_PRESETS: dict[str, tuple[list, list | None]] = {
    "identity": ([[1, 0, 0], [0, 1, 0], [0, 0, 1]], None),
    "grayscale": ([_LUMA, _LUMA, _LUMA], None),
    "sepia": ([[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]], None),
    "swap_red_blue": ([[0, 0, 1], [0, 1, 0], [1, 0, 0]], None),
    "rotate_channels": ([[0, 1, 0], [0, 0, 1], [1, 0, 0]], None),
    "invert": ([[-1, 0, 0], [0, -1, 0], [0, 0, -1]], [1, 1, 1]),
    "desaturate_50": ([[0.5 + 0.5 * _LUMA[0], 0.5 * _LUMA[1], 0.5 * _LUMA[2]],
                       [0.5 * _LUMA[0], 0.5 + 0.5 * _LUMA[1], 0.5 * _LUMA[2]],
                       [0.5 * _LUMA[0], 0.5 * _LUMA[1], 0.5 + 0.5 * _LUMA[2]]], None),
    "warm": ([[1.1, 0, 0], [0, 1.0, 0], [0, 0, 0.85]], None),
    "cool": ([[0.85, 0, 0], [0, 1.0, 0], [0, 0, 1.1]], None),
}
LINEAR_PRESETS = tuple(COLOR_PRESETS)


def color_preset(name: str, in_features: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(weight (out, in), bias or None). "identity" fits any channel count."""
    if name == "identity":
        return np.eye(in_features, dtype=np.float32), None
    if name not in COLOR_PRESETS:
        raise ValueError(f"unknown preset; choose one of {', '.join(LINEAR_PRESETS)}")
    w, b = COLOR_PRESETS[name]
    return np.asarray(w, np.float32), (None if b is None else np.asarray(b, np.float32))


# ---- seeded initialisers (PyTorch's default nn.Linear / nn.Conv2d ranges) -------------------------
def seeded_uniform(seed: int, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), reproducible on every machine for a given seed."""
    bound = 1.0 / math.sqrt(max(1, fan_in))
    rng = np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def seeded_tensor(seed: int, shape: tuple[int, ...], dist: str) -> np.ndarray:
    rng = np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF)
    if dist == "normal":
        return rng.standard_normal(size=shape, dtype=np.float32)
    return rng.random(size=shape, dtype=np.float32)
