"""What the ABI contract's checks cost per call, against the same calls without them, same run.

    .venv/bin/python benches/bench_abi_contract.py [--batches N]

The memmove rule (kina_fx.ffi.ops.Operands copies an input whose bytes overlap an
output's; on the CPU the cached views' byte bounds are compared) runs on every
export that goes through _Operands (copy, gather, softmax, repeat_interleave;
not the CPU matmul fast path).  This times 2x2 calls of those exports from
Python through the library (cffi ABI mode, so the C wrapper, its
recursion-headroom check and the Python callback all run), alternating batches
with the check and with ``_Operands.get`` replaced by the plain cached view
(the code before the rule), and prints the minimum and median per-call times.
Prints a Markdown table.  Timings on a shared machine are noisy;
``--instructions`` counts instructions instead (valgrind's callgrind): a copy
call with the check and without, per call from the difference of a 1,000- and
a 3,000-call run (start-up cancels out).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kina_fx import ffi as kffi  # noqa: E402
from kina_fx import memref  # noqa: E402
from kina_fx.ffi import ops as ffi_ops  # noqa: E402

CALLS = 20000


def unchecked(self, ptr, dtype, name, output=False):
    """_Operands.get without the overlap check: the baseline."""
    return ffi_ops._VIEWS[(dtype, output)].view(ptr, name)


def copy_calls(mode: str, n: int) -> None:
    """n copy calls, the check on or off (run under callgrind by --instructions)."""
    ffi, lib = kffi.load_library()
    ms = [memref.from_numpy(a) for a in (np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32))]
    src, dst = (ffi.cast("kina_unranked_memref_t *", m.address) for m in ms)
    if mode == "off":
        ffi_ops.Operands.get = unchecked
    copy = lib._mlir_ciface_runtime_copy_to_host_f32
    for _ in range(n + 1):
        copy(dst, src)


def instructions() -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("on", "off"):
            for n in (1000, 3000):
                # one BLAS thread: idle OpenBLAS threads spin, and callgrind counts them
                env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
                out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg",
                                      sys.executable, __file__, "--inner", mode, str(n)],
                                     capture_output=True, text=True, check=True, env=env).stderr
                counts[mode, n] = int(re.search(r"Collected : (\d+)", out).group(1))
    per_call = {mode: (counts[mode, 3000] - counts[mode, 1000]) / 2000 for mode in ("on", "off")}
    print("| 2x2 copy_to_host_f32 call from Python | instructions per call |")
    print("|---|---|")
    print(f"| with the overlap check | {per_call['on']:,.0f} |")
    print(f"| without | {per_call['off']:,.0f} |")
    print(f"| the check | {per_call['on'] - per_call['off']:+,.0f} "
          f"({(per_call['on'] / per_call['off'] - 1) * 100:+.1f}%) |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--inner", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.inner:
        return copy_calls(options.inner[0], int(options.inner[1]))
    if options.instructions:
        return instructions()
    batches = options.batches
    ffi, lib = kffi.load_library()
    keep = []

    def ptr(array):
        m = memref.from_numpy(array)
        keep.append(m)
        return ffi.cast("kina_unranked_memref_t *", m.address)

    x, out = np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)
    wide = np.zeros((2, 4), np.float32)
    idx = np.array([1, 0], np.int64)
    px, po, pw, pi = ptr(x), ptr(out), ptr(wide), ptr(idx)
    calls = {
        "copy_to_host_f32": lambda: lib._mlir_ciface_runtime_copy_to_host_f32(po, px),
        "gather_f32": lambda: lib._mlir_ciface_runtime_gpu_gather_f32(po, px, pi),
        "softmax_f32": lambda: lib._mlir_ciface_runtime_gpu_softmax_f32(po, px, 1),
        "repeat_interleave_f32": lambda: lib._mlir_ciface_runtime_gpu_repeat_interleave_f32(pw, px, 1, 2),
    }
    checked = ffi_ops.Operands.get
    rows = []
    for name, call in calls.items():
        assert call() == 0, ffi.string(lib.kina_last_error())
        times = {"on": [], "off": []}
        for _ in range(batches):
            for mode in ("on", "off"):
                ffi_ops.Operands.get = checked if mode == "on" else unchecked
                start = time.perf_counter()
                for _ in range(CALLS):
                    call()
                times[mode].append((time.perf_counter() - start) / CALLS * 1e6)
        ffi_ops.Operands.get = checked
        on, off = times["on"], times["off"]
        rows.append((name, min(on), statistics.median(on), min(off), statistics.median(off)))
    print(f"| 2x2 call from Python ({batches} alternated batches of {CALLS}) | with the check, min / median "
          "| without, min / median | cost of the check (min) |")
    print("|---|---|---|---|")
    for name, on_min, on_med, off_min, off_med in rows:
        print(f"| {name} | {on_min:.2f} / {on_med:.2f} us | {off_min:.2f} / {off_med:.2f} us "
              f"| {on_min - off_min:+.2f} us |")


if __name__ == "__main__":
    main()
