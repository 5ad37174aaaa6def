"""Build-time tunables of the CPU kernel family, as a mixin of the OpenCL backend: the defaults for the
device's vector registers, overridden by tuning results stored per device and driver (``tune.json``
under the cache root, keyed by platform, device, driver versions), and the opt-in GEMM auto-tuner
(``ANYDEVICE_OPENCL_TUNE=1``).

The defaults follow the device's float vector width (``preferred_vector_width_float``): PoCL reports 16 on
a CPU with AVX-512 (32 zmm registers), 8 with AVX2 (16 ymm) and 4 with NEON or SSE. ``gemm_cpu``'s tile of
MR rows x 32 columns takes 2 * MR float16 accumulators: MR 12 fills 24 of 32 zmm; on 16 ymm it spilled
(58 GFLOPS at 1024^2 on a 2-core AVX2 EPYC, PyTorch 140), so narrow devices take 6 x 16 twice (NH 2:
12 ymm accumulators, 135-140 GFLOPS there)."""
from __future__ import annotations

import logging
import time

import numpy as np

from ...system import config
from ..runtime import JsonStore
from .device import _device_key, cache_root
from . import params as P
from .params import DEFAULT_TUNE, NARROW_TUNE, TUNE_BUDGET_S

log = logging.getLogger("anydevice")


class CLTuning:
    """``tunables``, ``default_tunables`` and the GEMM auto-tuner of OpenCLBackend (uses its dev, _tune, _gemm)."""

    @staticmethod
    def _tune_store() -> JsonStore:
        return JsonStore(cache_root() / "tune.json")

    @property
    def vector_width(self) -> int:
        """The device's preferred float vector width (1 where the driver does not say)."""
        try:
            return max(1, int(self.dev.preferred_vector_width_float))
        except Exception:  # noqa: BLE001 - a driver without the field
            return 1

    @property
    def narrow_vectors(self) -> bool:
        """A CPU device whose float vectors hold at most 8 values (AVX2, NEON): the narrow defaults."""
        return self.is_cpu_device and self.vector_width <= 8

    @property
    def wide_vectors(self) -> bool:
        """A CPU device whose float vectors hold more than 8 values (AVX-512): the wide paths' switches."""
        return self.is_cpu_device and not self.narrow_vectors

    @property
    def gemm_group_bytes(self) -> int:
        """Bytes of packed A a group of gemm_cpu's work order (params.gemm_grouped) takes: GEMM_GROUP_BYTES (L3) on
        narrow vectors, a fraction of the local memory (PoCL: a core's L2) on wide ones (0: no groups)."""
        if not P.GEMM_GROUP_BYTES or not self.wide_vectors:
            return P.GEMM_GROUP_BYTES
        return min(P.GEMM_GROUP_BYTES, int(int(self.dev.local_mem_size) * P.GEMM_GROUP_L2_FRACTION))

    @property
    def gemm_one_block_k(self) -> int:
        """gemm_cpu's one-block K (params.GEMM_ONE_BLOCK_K) on wide vectors; 0 (KC as tuned) elsewhere."""
        return P.GEMM_ONE_BLOCK_K if self.wide_vectors else 0

    def gemm_reads_a(self, col_tiles: int) -> bool:
        """Whether gemm_cpu reads a float32 A as stored (AU, where GEMM_A_UNPACKED allows it) rather than pack_a's
        panels, for an A used by ``col_tiles`` column tiles of 32: packed on wide vectors from GEMM_A_PACK_MIN_TILES."""
        return not self.wide_vectors or col_tiles < P.GEMM_A_PACK_MIN_TILES

    def gemm_build(self, params: dict, rows: int, K: int, col_tiles: int) -> dict:
        """gemm_cpu's build options for one launch on this device (params.gemm_grouped with its group bytes and
        one-block K)."""
        return P.gemm_grouped(params, rows, K, col_tiles, self.gemm_group_bytes, self.gemm_one_block_k)

    def default_tunables(self, fname: str) -> dict:
        """A kernel file's build-time defaults on this device (DEFAULT_TUNE, NARROW_TUNE's on narrow vectors)."""
        if self.narrow_vectors and fname in NARROW_TUNE:
            return dict(NARROW_TUNE[fname])
        return dict(DEFAULT_TUNE.get(fname, {}))

    def tunables(self, fname: str, shape_class: str = "") -> dict:
        """Build-time tunables: defaults, overridden by stored tuning results for this device."""
        params = self.default_tunables(fname)
        key = f"{fname}:{shape_class}"
        if (shape_class and key not in self._tune and fname == "gemm_cpu.cl"
                and config.get("ANYDEVICE_OPENCL_TUNE")):
            self._autotune_gemm_cpu(shape_class)
        for stored in (self._tune.get(fname), self._tune.get(key)):
            if isinstance(stored, dict):  # an entry of another type (a damaged tune.json) is ignored
                params.update(stored)
        return params

    def _tune_candidates(self) -> list[dict]:
        """gemm_cpu variants the tuner times (changes to the defaults; {} is the defaults themselves)."""
        if self.narrow_vectors:
            return [{}, {"MSUB": 2}, {"KC": 256, "KP": 128}, {"MR": 4, "MSUB": 8}, {"KC": 384, "KP": 128}]
        return [{}, {"MR": 8, "MSUB": 4, "KC": 128}, {"MR": 14, "MSUB": 2}, {"MSUB": 8}, {"KC": 512, "KP": 256}]

    def _autotune_gemm_cpu(self, shape_class: str) -> None:
        """Time a few gemm_cpu variants on a problem of this shape class (<= TUNE_BUDGET_S in all,
        shared by every class tuned in this process); store the winner on disk."""
        key = f"gemm_cpu.cl:{shape_class}"
        self._tune[key] = {}  # no recursion, and a failure is not retried
        left = TUNE_BUDGET_S - self._tune_spent
        if left <= 0.5:
            return
        size = {"s": 64, "m": 512, "l": 1024}
        M, N, K = (size[c] for c in shape_class)
        rng = np.random.default_rng(0)
        a = self._from_numpy(rng.standard_normal((M, K), dtype=np.float32))
        b = self._from_numpy(rng.standard_normal((K, N), dtype=np.float32))
        cands = self._tune_candidates()
        t_start = time.perf_counter()
        best, best_t = None, float("inf")
        log.info("anydevice opencl: auto-tuning gemm_cpu for shape class %s (budget %.1f s)", shape_class, left)
        for i, cand in enumerate(cands):
            if time.perf_counter() - t_start > left:
                break
            params = dict(self.default_tunables("gemm_cpu.cl"), **cand)
            self._tune[key] = params
            try:
                self._gemm(M, N, K, 1, a, 0, K, 1, 0, b, 0, N, 1, 0)
                self.synchronize()
                t0 = time.perf_counter()
                self._gemm(M, N, K, 1, a, 0, K, 1, 0, b, 0, N, 1, 0)
                self.synchronize()
                dt = time.perf_counter() - t0
            except Exception as exc:
                log.info("anydevice opencl: tune candidate %s failed: %s", cand, exc)
                continue
            log.info("anydevice opencl: tune %d/%d %s: %.2f GFLOPS", i + 1, len(cands), params,
                     2.0 * M * N * K / dt / 1e9)
            if dt < best_t:
                best, best_t = params, dt
        self._tune_spent += time.perf_counter() - t_start
        self._tune[key] = best or {}
        if best:
            self._tune_store().update(_device_key(self.dev), {key: best})
            log.info("anydevice opencl: tuned %s -> %s", key, best)
