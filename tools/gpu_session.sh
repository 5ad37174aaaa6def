#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): set-up, then the steps named as arguments.
#   bash tools/gpu_session.sh env cudatests probe bench full opencl
# The second H200 session's full check (about 6 minutes; docs/GPU_H200.md):
#   BUDGET=405 TESTS_BACKENDS=cuda bash tools/gpu_session.sh half unetcuda modelprof tests vaecuda
# The third's: everything the issue asks for once (7 minutes), then the half UNet, the tests and the profile:
#   BUDGET=420 NPROC=14 bash tools/gpu_session.sh env tests unetcuda unetocl ops unetq vae modelprof
#   BUDGET=360 NPROC=14 TESTS_BACKENDS=cuda TESTS_LIMIT=100 bash tools/gpu_session.sh unethalf tests modelprof halfsweep prof vaeprof
# The next session's first call (what the third left untimed: the fitted half plan, conv_out's GEMM, the split
# norm; the tests it changed), with `-rfE` tracebacks kept in tests.log:
#   BUDGET=400 NPROC=14 TESTS_BACKENDS=cuda TESTS_LIMIT=170 bash tools/gpu_session.sh tests unethalf vaecuda halfsweep modelprof vaeprof
# Logs go to $OUT (or ./gpu-out). The pack is made importable as `anydevice` through a link;
# pyopencl comes from wheels carried in .whl/ (the machine has no registry; carry=[".whl"]). Make them here with
#   mkdir -p .whl && cd .whl && pip download --only-binary :all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 pyopencl pytest-timeout pytest-xdist
#   then delete numpy*, pytest-[0-9]*, pluggy*, packaging*, iniconfig*, pygments* (the machine has its own).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ANYDEVICE_CACHE_DIR=/tmp/adcache
mkdir -p /tmp/p && ln -sfn "$PWD" /tmp/p/anydevice
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 || echo "wheel install failed"
  export PYTHONPATH=/tmp/p:/tmp/site
else
  export PYTHONPATH=/tmp/p
fi
# NVIDIA's OpenCL driver: register it with the ICD loader if the driver ships it
lib=$(ldconfig -p | grep -o '/[^ ]*libnvidia-opencl.so.1' | head -1)
[ -z "$lib" ] && lib=$(find / -xdev -name 'libnvidia-opencl.so*' 2>/dev/null | head -1)
if [ -n "$lib" ]; then mkdir -p /etc/OpenCL/vendors; echo "$lib" > /etc/OpenCL/vendors/nvidia.icd; fi
T=${T:-}
# BUDGET (seconds from the start): no step runs past it, so $OUT comes back before the call's limit
DEADLINE=$(( $(date +%s) + ${BUDGET:-420} ))
lim() { local left=$(( DEADLINE - $(date +%s) - 5 )); [ "$left" -lt "$1" ] && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
mbench() {  # mbench NAME LIMIT ARGS...: one `anydevice bench --model` run, JSON and log in $OUT
  local name=$1 l; l=$(lim "$2"); shift 2
  echo "--- model bench $name (limit ${l}s): $*"
  timeout "$l" python3 -m anydevice bench --model "$@" --json "$OUT/model_$name.json" 2>&1 | tee "$OUT/model_$name.log" | tail -25
}
for step in "$@"; do
  echo "=================== $step ($(date +%T))"
  case $step in
    env)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
      python3 -c "import sys,torch,cupy,numpy; print(sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda, 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
      echo "opencl lib: ${lib:-none}"; ls /etc/OpenCL/vendors 2>/dev/null
      python3 -c "import pyopencl as cl; [print(p.name, p.version, [d.name for d in p.get_devices()]) for p in cl.get_platforms()]" 2>&1 | tail -3
      python3 -m anydevice devices --all 2>&1 | tee "$OUT/devices.txt" ;;
    cudatests)
      timeout 300 python3 -m pytest -q -rfEs --timeout 120 -p no:cacheprovider tests/backend/devices/cuda/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" | tail -60 ;;
    probe)
      timeout 300 python3 tools/gpu_probe.py ${PROBE_ARGS:-} --json "$OUT/probe.json" 2>&1 | tee /tmp/probe.log | tail -80 ;;
    bench)
      timeout 300 python3 -m anydevice bench --backend ${BENCH_BACKENDS:-cuda} ${BENCH_ARGS:-} --json "$OUT/bench_fp32.json" 2>&1 | tee /tmp/bench_fp32.log | tail -40 ;;
    benchtf32)
      timeout 300 python3 -m anydevice bench --tf32 --backend ${BENCH_BACKENDS:-cuda} --json "$OUT/bench_tf32.json" 2>&1 | tee /tmp/bench_tf32.log | tail -40 ;;
    benchocl)
      timeout 300 python3 -m anydevice bench --backend opencl ${BENCH_ARGS:-} --json "$OUT/bench_opencl.json" 2>&1 | tee /tmp/bench_opencl.log | tail -30 ;;
    full)
      timeout ${FULL_TIMEOUT:-500} python3 -m pytest -q -rfE --timeout 180 -n ${NPROC:-8} -p no:cacheprovider ${T} 2>&1 | tee "$OUT/full.log" | tail -60 ;;
    prof)
      cat > /tmp/prof_one.py <<'PY'
import cProfile, pstats, sys, time; sys.path.insert(0, "/tmp/p")
import numpy as np, cupy as cp
from anydevice.backend import get_backend
be = get_backend("cuda")
a = be.to_device(np.random.rand(4, 4).astype(np.float32)); b = be.to_device(np.random.rand(4, 4).astype(np.float32))
x = be.to_device(np.random.rand(32, 512, 7, 7).astype(np.float32)); w = be.to_device(np.random.rand(512, 512, 1, 1).astype(np.float32))
for _ in range(50): be.matmul(a, b); be.conv2d(x, w)
be.synchronize()
for label, fn in (("matmul 4x4", lambda: be.matmul(a, b)), ("conv k1", lambda: be.conv2d(x, w)),
                  ("relu", lambda: be.relu(a)), ("sync", lambda: None)):
    t0 = time.perf_counter()
    for _ in range(2000): fn(); be.synchronize()
    print(f"{label}: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per call + sync")
for label, fn in (("matmul 4x4", lambda: be.matmul(a, b)), ("relu", lambda: be.relu(a)), ("conv k1", lambda: be.conv2d(x, w))):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): fn(); be.synchronize()
    pr.disable(); print("=====", label); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
PY
      timeout 120 python3 /tmp/prof_one.py 2>&1 | tee "$OUT/prof.txt" | cut -c1-150 | head -70 ;;
    ncu)
      cat > /tmp/ncu_one.py <<'PY'
import sys; sys.path.insert(0, "/tmp/p")
import cupy as cp
from anydevice.backend import cuda_backend as cb
be = cb.create("cuda", 0)
a = cp.random.standard_normal((4096, 4096), dtype=cp.float32); b = cp.random.standard_normal((4096, 4096), dtype=cp.float32)
x = cp.random.standard_normal((32, 512, 7, 7), dtype=cp.float32); w = cp.random.standard_normal((512, 512, 1, 1), dtype=cp.float32)
for _ in range(2):
    be.matmul(a, b); be.conv2d(x, w)
cp.cuda.Device().synchronize()
PY
      timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section LaunchStats --section MemoryWorkloadAnalysis -k regex:ad_conv_gemm --launch-skip 2 -c 2 \
        python3 /tmp/ncu_one.py > "$OUT/ncu.txt" 2>&1; tail -150 "$OUT/ncu.txt" | grep -v "^ *$" | cut -c1-120 ;;
    unetcuda) mbench unet_cuda 150 --backend cuda --case unet --dtype float32,float16 ;;
    unetocl) mbench unet_opencl 150 --backend opencl --case unet --dtype float32,float16 ;;
    unetq) mbench unet_cuda_q 100 --backend cuda --case unet --dtype bfloat16,q8_0 ;;
    unethalf) mbench unet_cuda_half 110 --backend cuda --case unet --dtype float16,bfloat16 ;;
    vaecuda) mbench vae_cuda 90 --backend cuda --case vae --dtype float32,float16 ;;
    replay)  # compiled graphs recorded and replayed as CUDA graphs (compile/replay.py), and the compile tests on cuda
      ANYDEVICE_TEST_BACKENDS=cuda timeout "$(lim 150)" python3 -m pytest -q -rfEs --tb=short --timeout 120 -p no:cacheprovider \
        tests/backend/compile/test_replay.py tests/backend/compile/test_lowering_half.py tests/backend/compile/test_compile.py \
        -k "cuda or replay or Replay" 2>&1 | tee "$OUT/replay.log" | tail -30 ;;
    half)  # half operands on the tensor cores (test_cuda_half.py) and the recorded graphs (test_replay.py)
      ANYDEVICE_TEST_BACKENDS=cuda timeout "$(lim 150)" python3 -m pytest -q -rfEs --tb=short --timeout 120 -n 4 -p no:cacheprovider \
        tests/backend/devices/cuda/test_cuda_half.py tests/backend/compile/test_replay.py tests/backend/compile/test_lowering_half.py \
        2>&1 | tee "$OUT/half.log" | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -30 ;;
    vae) mbench vae 120 --backend cuda --backend opencl --case vae --dtype float32,float16 ;;
    upscaler) mbench upscaler 60 --backend cuda --backend opencl --case upscaler --dtype float32,float16 ;;
    ops)
      timeout "$(lim 100)" python3 -m anydevice bench --backend cuda --backend opencl --case "matmul 4096" --case seed --case "conv 32x512" \
        --json "$OUT/bench_ops.json" 2>&1 | tee "$OUT/bench_ops.log" | tail -25 ;;
    modelprof)
      timeout "$(lim 100)" python3 tools/gpu_model_profile.py --backend cuda ${PROF_DTYPES:---dtype float16} --case unet \
        > "$OUT/profile_unet_cuda.txt" 2>&1; grep -E "^(=====|---)" "$OUT/profile_unet_cuda.txt"; tail -5 "$OUT/profile_unet_cuda.txt" ;;
    tests)
      ANYDEVICE_TEST_OPENCL_PLATFORM=${ANYDEVICE_TEST_OPENCL_PLATFORM:-NVIDIA} ANYDEVICE_TEST_BACKENDS=${TESTS_BACKENDS:-cuda,opencl} ANYDEVICE_UNET_DEVICE=cuda timeout "$(lim ${TESTS_LIMIT:-200})" python3 -m pytest -v -rfE \
        --timeout 120 -n ${NPROC:-12} -p no:cacheprovider tests/backend/devices/cuda tests/conformance \
        tests/backend/compile tests/models 2>&1 | tee "$OUT/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40 ;;
    diag)  # the failures of the last `tests`, with their tracebacks
      timeout "$(lim 90)" python3 -m pytest -q --tb=short --timeout 60 -n 4 -p no:cacheprovider ${DIAG_TESTS:-} \
        > "$OUT/diag.txt" 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/diag.txt" | tail -20 ;;
    halfsweep)  # every half tile and K split on the UNet's conv shapes against the planner and cuDNN
      timeout "$(lim 90)" python3 tools/gpu_half_sweep.py > "$OUT/half_sweep.txt" 2>&1; grep -E "^(step|planner|x[0-9]+ +\(1, (1280|320), (8|64))|Error" "$OUT/half_sweep.txt" | cut -c1-220 | head -12 ;;
    vaeprof)
      timeout "$(lim 80)" python3 tools/gpu_model_profile.py --backend cuda --dtype float16 --case vae \
        > "$OUT/profile_vae_cuda.txt" 2>&1; grep -E "^(=====|---)" "$OUT/profile_vae_cuda.txt"; tail -5 "$OUT/profile_vae_cuda.txt" ;;
    tile)  # tools/gpu_tile_check.py through CUDA and the OpenCL platform named by ANYDEVICE_TEST_OPENCL_PLATFORM
      timeout "$(lim 90)" python3 tools/gpu_tile_check.py > "$OUT/tile.txt" 2>&1; grep -c " err " "$OUT/tile.txt"; grep -E "device|FAILED| err [0-9.]+e-0[0-5]| err nan| err [0-9.]+e\+" "$OUT/tile.txt" | head -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
# the device tool brings back at most 8 files from $OUT: more are packed into one archive
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 7 ]; then
  (cd "$OUT" && tar czf /tmp/gpu-out.tgz --remove-files $(find . -maxdepth 1 -type f -printf '%P\n') && mv /tmp/gpu-out.tgz out.tgz)
  echo "packed \$OUT into out.tgz (tar xzf it where the files come back)"
fi
