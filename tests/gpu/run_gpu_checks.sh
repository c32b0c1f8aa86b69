#!/usr/bin/env bash
# Every CuPy-path test and the GPU benchmarks, on a machine with an NVIDIA GPU.
# Budget: under 8 minutes (timeouts: tests 200 s, memref bench 150 s, autograd bench 90 s).  No network is assumed: it uses the machine's python3
# with its preinstalled packages (CuPy, e.g. cupy-cuda13x; numpy; cffi; pytest)
# through a --system-site-packages venv and installs kina_fx editable without
# dependencies or build isolation.
#
#   bash tests/gpu/run_gpu_checks.sh [OUTDIR]
#
# Writes OUTDIR/gpu_tests.txt, OUTDIR/gpu_bench.md and OUTDIR/gpu_bench.json
# (OUTDIR defaults to $OUT, else ./out/gpu).  Exits non-zero if a test failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR="${1:-${OUT:-out/gpu}}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
VENV="${KINA_GPU_VENV:-/tmp/kina_fx_gpu_venv}"

echo "== machine" | tee "$OUTDIR/gpu_tests.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUTDIR/gpu_tests.txt"
"$PY" -c "import cupy, numpy, cffi; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'cffi', cffi.__version__)" \
  2>&1 | tee -a "$OUTDIR/gpu_tests.txt"

# Preferred: a venv over the system packages with kina_fx installed editable.
# Fallback (no setuptools/wheel offline): build the library in place and use
# the system interpreter with PYTHONPATH (the tests here run in-process).
RUN="$VENV/bin/python"
if { [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"; } &&
   "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >"$OUTDIR/install.log" 2>&1; then
  echo "installed editable into $VENV" | tee -a "$OUTDIR/gpu_tests.txt"
else
  echo "editable install failed (see install.log); building in place" | tee -a "$OUTDIR/gpu_tests.txt"
  "$PY" kina_fx/ffi/c/build.py kina_fx >>"$OUTDIR/install.log" 2>&1 || { echo "build failed"; tail -20 "$OUTDIR/install.log"; exit 1; }
  RUN="$PY"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
for mod in pytest hypothesis greenlet; do  # offline: try a local install only if missing
  "$RUN" -c "import $mod" 2>/dev/null || "$RUN" -m pip install -q "$mod" >/dev/null 2>&1 || true
done

echo "== tests (CPU and CUDA backends)" | tee -a "$OUTDIR/gpu_tests.txt"
export KINA_FX_DEVICE=auto
timeout 200 "$RUN" -m pytest -q -p no:cacheprovider \
  tests/gpu/test_cupy_path.py tests/gpu/test_cupy_tape.py tests/abi/test_abi_exports.py tests/abi/test_memref.py \
  tests/abi/test_abi_fake_cuda.py \
  "tests/autodiff/test_autograd.py" -k "not slow" \
  2>&1 | tail -25 | tee -a "$OUTDIR/gpu_tests.txt"
status=${PIPESTATUS[0]}

echo "== benchmarks" | tee -a "$OUTDIR/gpu_tests.txt"
timeout 150 "$RUN" benches/bench_memref.py --gpu-only --json "$OUTDIR/gpu_bench.json" \
  2>&1 | tee "$OUTDIR/gpu_bench.md" | tee -a "$OUTDIR/gpu_tests.txt"
bench=${PIPESTATUS[0]}
# autograd MLP step, CuPy vs PyTorch CUDA where torch is there (prints its own table)
timeout 90 "$RUN" benches/bench_autograd.py --rounds 30 \
  2>&1 | tee -a "$OUTDIR/gpu_bench.md" | tee -a "$OUTDIR/gpu_tests.txt"
echo "tests exit $status, bench exit $bench" | tee -a "$OUTDIR/gpu_tests.txt"
[ "$status" = 0 ] && [ "$bench" = 0 ]
