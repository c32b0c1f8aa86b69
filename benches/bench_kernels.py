"""The runtime's kernels through the C exports against PyTorch's CPU kernels and a copy, same run.

    .venv/bin/python benches/bench_kernels.py [--size 4096 | --shape ROWSxCOLS] [--rounds 9] [--threads N]
        [--ops a,b,...] [--json OUT]

Each op runs on a ``size x size`` float32 input (``--shape``: ``ROWS x COLS``) through its
``_mlir_ciface_runtime_*`` export (called in process through cffi, on memrefs
over preallocated NumPy buffers), against:

* PyTorch on the same number of threads (``torch.set_num_threads``), writing
  into a preallocated ``out=`` where PyTorch's API has one;
* a copy: ``np.copyto`` of the same input into the same output buffer (one
  thread: the memory traffic of reading the input and writing the output);
* for matmul, ``np.matmul`` into a preallocated output (the BLAS itself).

The contestants of an op are interleaved round by round (the machine is
shared and noisy); the table gives medians and the median over rounds of the
same-round ratio.  Issue 18's targets: softmax, log_softmax and cross_entropy
<= 1.0x PyTorch; elementwise ops <= 1.2x a copy; matmul at BLAS speed.  The
ops along the other axis and the reductions (``softmax_axis0``,
``sum_axis1``, ...) have no target: PyTorch is their baseline.  matmul
needs a square input.
``--threads`` sets KINA_FX_THREADS and PyTorch's threads (default: every CPU
the process may use).  PyTorch is a benchmark-only extra; without it those
columns are skipped.  Its OpenMP threads wait passively
(``OMP_WAIT_POLICY=PASSIVE`` unless set): by default they spin for a while
after each of its ops, taking the cores from the contestant that runs next
(an exp of ours timed 12 ms interleaved against 7 ms alone).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _torch():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # read when torch loads its OpenMP
    try:
        import torch
    except Exception:
        return None
    return torch


def _spread(median, extremes) -> str:
    return f"{median:.2f}x [{extremes[0]:.2f}, {extremes[1]:.2f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--shape", default=None, help="ROWSxCOLS instead of size x size")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--ops", default=None, help="comma-separated subset of the ops")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    os.environ["KINA_FX_DEVICE"] = "cpu"
    if args.threads:
        os.environ["KINA_FX_THREADS"] = str(args.threads)
    from kina_fx import ffi as kffi, memref

    try:
        from kina_fx import kernel_threads
        threads = kernel_threads.thread_count()
    except ImportError:         # a tree before kina_fx.kernel_threads (a "before" run): one thread
        threads = args.threads or len(os.sched_getaffinity(0))
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(threads)
    c, lib = kffi.load_library()
    rng = np.random.default_rng(0)
    rows, cols = (int(v) for v in args.shape.lower().split("x")) if args.shape else (args.size, args.size)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    y = rng.standard_normal((rows, cols), dtype=np.float32)
    bias = rng.standard_normal(cols, dtype=np.float32)
    labels = rng.integers(0, cols, rows).astype(np.int64)
    by_row, by_col = np.empty(rows, np.float32), np.empty(cols, np.float32)
    out, spare = np.empty_like(x), np.empty_like(x)
    scalar = np.zeros((), np.float32)
    keep = []

    def ptr(a):
        m = memref.from_numpy(a)
        keep.append(m)
        return c.cast("kina_unranked_memref_t *", m.address)

    px, py, pb, pl, po, ps = ptr(x), ptr(y), ptr(bias), ptr(labels), ptr(out), ptr(scalar)
    prow, pcol = ptr(by_row), ptr(by_col)

    def export(name, *operands):
        fn = getattr(lib, name)

        def call():
            status = fn(*operands)
            if status:
                raise RuntimeError(c.string(lib.kina_last_error()).decode())
        return call

    tx, ty, tb, tl = (torch.from_numpy(a) if torch is not None else None for a in (x, y, bias, labels))
    to = torch.from_numpy(spare) if torch is not None else None

    def torch_out(fn):
        return None if torch is None else fn

    ops = {
        "softmax": (export("_mlir_ciface_runtime_gpu_softmax_f32", po, px, -1),
                    torch_out(lambda: torch._softmax(tx, -1, False)), "torch"),
        "log_softmax": (export("_mlir_ciface_runtime_log_softmax_f32", po, px, -1),
                        torch_out(lambda: torch._log_softmax(tx, -1, False)), "torch"),
        "cross_entropy": (export("_mlir_ciface_runtime_cross_entropy_f32", ps, px, pl),
                          torch_out(lambda: torch.nn.functional.cross_entropy(tx, tl)), "torch"),
        "softmax_axis0": (export("_mlir_ciface_runtime_gpu_softmax_f32", po, px, 0),
                          torch_out(lambda: torch._softmax(tx, 0, False)), "torch_only"),
        "log_softmax_axis0": (export("_mlir_ciface_runtime_log_softmax_f32", po, px, 0),
                              torch_out(lambda: torch._log_softmax(tx, 0, False)), "torch_only"),
        "sum_axis0": (export("_mlir_ciface_runtime_sum_f32", pcol, px, 0, 0),
                      torch_out(lambda: torch.sum(tx, 0)), "torch_only"),
        "sum_axis1": (export("_mlir_ciface_runtime_sum_f32", prow, px, 1, 0),
                      torch_out(lambda: torch.sum(tx, 1)), "torch_only"),
        "max_axis0": (export("_mlir_ciface_runtime_max_f32", pcol, px, 0, 0),
                      torch_out(lambda: torch.amax(tx, 0)), "torch_only"),
        "max_axis1": (export("_mlir_ciface_runtime_max_f32", prow, px, 1, 0),
                      torch_out(lambda: torch.amax(tx, 1)), "torch_only"),
        "matmul": (export("_mlir_ciface_runtime_gpu_matmul_f32", po, px, py),
                   lambda: np.matmul(x, y, out=spare), "blas"),
        "add": (export("_mlir_ciface_runtime_add_f32", po, px, py),
                torch_out(lambda: torch.add(tx, ty, out=to)), "copy"),
        "mul": (export("_mlir_ciface_runtime_mul_f32", po, px, py),
                torch_out(lambda: torch.mul(tx, ty, out=to)), "copy"),
        "add_bias": (export("_mlir_ciface_runtime_add_f32", po, px, pb),
                     torch_out(lambda: torch.add(tx, tb, out=to)), "copy"),
    }
    # log reads positive inputs (its own domain); the others read x.
    positive = np.abs(x) + np.float32(0.5)
    pp = ptr(positive)
    tp = torch.from_numpy(positive) if torch is not None else None
    for name, (operand, t_in) in {"exp": (px, tx), "log": (pp, tp), "tanh": (px, tx), "sigmoid": (px, tx),
                                  "neg": (px, tx), "relu": (px, tx)}.items():
        theirs = None
        if torch is not None:
            tfn = (lambda a, out: torch.clamp_min(a, 0, out=out)) if name == "relu" else getattr(torch, name)
            theirs = lambda f=tfn, a=t_in: f(a, out=to)  # noqa: E731
        ops[name] = (export(f"_mlir_ciface_runtime_{name}_f32", po, operand), theirs, "copy")
    if rows != cols:
        del ops["matmul"]
    if args.ops:
        ops = {k: v for k, v in ops.items() if k in args.ops.split(",")}
    copy = lambda: np.copyto(spare, x)  # noqa: E731
    results = {"threads": threads, "shape": [rows, cols], "machine": platform.machine(), "python": platform.python_version(),
               "numpy": np.__version__, "torch": getattr(torch, "__version__", None), "ops": {}}
    for name, (ours, theirs, target) in ops.items():
        contestants = {"kina_fx": ours, "copy": copy}
        if theirs is not None:
            contestants["baseline"] = theirs
        times = {k: [] for k in contestants}
        for fn in contestants.values():
            fn()
        for _ in range(args.rounds):
            for k, fn in contestants.items():
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        row = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        vs_copy = [a / b for a, b in zip(times["kina_fx"], times["copy"])]
        row["vs_copy"], row["vs_copy_range"] = statistics.median(vs_copy), (min(vs_copy), max(vs_copy))
        if "baseline" in times:
            vs = [a / b for a, b in zip(times["kina_fx"], times["baseline"])]
            row["vs_baseline"], row["vs_baseline_range"] = statistics.median(vs), (min(vs), max(vs))
        row["baseline_is"] = {"torch": "PyTorch", "copy": "PyTorch", "blas": "np.matmul (BLAS)",
                              "torch_only": "PyTorch"}[target]
        row["target"] = target
        results["ops"][name] = row
    print(f"{rows}x{cols} float32, {threads} thread(s), {args.rounds} interleaved rounds; "
          "ratios: median [min, max] over rounds of the same-round ratio")
    print("| op | kina_fx export ms | baseline | baseline ms | vs baseline | copy ms | vs copy | target |")
    print("|---|---|---|---|---|---|---|---|")
    goals = {"torch": "<= 1.0x PyTorch", "copy": "<= 1.2x copy", "blas": "= BLAS", "torch_only": "-"}
    for name, r in results["ops"].items():
        base = f"{r['baseline']:.1f}" if "baseline" in r else "-"
        vs = _spread(r["vs_baseline"], r["vs_baseline_range"]) if "vs_baseline" in r else "-"
        print(f"| {name} | {r['kina_fx']:.1f} | {r['baseline_is']} | {base} | {vs} | {r['copy']:.1f} | "
              f"{_spread(r['vs_copy'], r['vs_copy_range'])} | {goals[r['target']]} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
