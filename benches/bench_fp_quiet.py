"""What quiet floating-point conditions cost an export (docs/abi.md, "Floating-point conditions").

    .venv/bin/python benches/bench_fp_quiet.py [--batches 15] [--calls 50000]

Every memref and tape callback runs under ``gpu_ops.quiet_fp`` (NumPy's
``errstate(all="ignore")``).  This calls the 2x2 matmul export's Python
callback (what the C wrapper calls) on cached memrefs in alternated batches:
as bound (quiet), unwrapped (``__wrapped__``: the same-run baseline), and
wrapped in a plain ``with np.errstate(all="ignore")`` (the public API it
replaces).  Prints min and median per call over the batches, in CPU time of
this process (the machines are shared: wall time moves with the load).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("KINA_FX_DEVICE", "cpu")

from kina_fx import ffi as kffi  # noqa: E402
from kina_fx import memref  # noqa: E402
from kina_fx.ffi import ops as ffi_ops  # noqa: E402
from kina_fx.ffi.exports import op_callback  # noqa: E402
from kina_fx.runtime_ops import BY_NAME  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--calls", type=int, default=50000)
    args = parser.parse_args()

    ffi, _lib = kffi.load_library()
    a = np.float32([[1, 2], [3, 4]])
    b = np.float32([[5, 6], [7, 8]])
    o = np.zeros((2, 2), np.float32)
    ms = [memref.from_numpy(x) for x in (o, a, b)]
    ptrs = [m.pointer_for(ffi) for m in ms]
    quiet = ffi_ops.CALLBACKS[op_callback(BY_NAME["matmul"])]
    bare = quiet.__wrapped__

    def with_errstate(*p):
        with np.errstate(all="ignore"):
            return bare(*p)

    variants = {"quiet_fp (as bound)": quiet, "unwrapped (baseline)": bare,
                "np.errstate per call": with_errstate}
    times = {name: [] for name in variants}
    for _ in range(args.batches):
        for name, fn in variants.items():
            t0 = time.process_time()
            for _ in range(args.calls):
                fn(*ptrs)
            times[name].append((time.process_time() - t0) / args.calls * 1e6)
    np.testing.assert_array_equal(o, a @ b)
    base_min, base_med = min(times["unwrapped (baseline)"]), statistics.median(times["unwrapped (baseline)"])
    print(f"| 2x2 matmul callback | min (us) | median (us) | over the baseline (min / median) |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        lo, med = min(ts), statistics.median(ts)
        print(f"| {name} | {lo:.3f} | {med:.3f} | {lo - base_min:+.3f} / {med - base_med:+.3f} |")


if __name__ == "__main__":
    main()
