"""A runtime op called from C: untaped, and recorded by a tape (its share of backward included).

    .venv/bin/python benches/bench_tape_ops.py [--rounds 7] [--calls 20000] [--json OUT]

One C program (compiled here against the installed library, run under
``env -i`` as a C host runs) calls ``_mlir_ciface_runtime_gpu_matmul_f32`` on
2x2 float32 memrefs in three ways, each reporting the time per call:

* ``untaped``: N calls;
* ``taped``: ``kina_tape_begin``, watch ``a`` and ``b``, N calls into the same
  ``out``, ``kina_tape_end``, ``kina_tape_backward`` from ``out``,
  ``kina_tape_grad`` of ``a``, ``kina_tape_free`` -- all of it divided by N
  (the tape's share of backward is in it; only the last call's node is live);
* ``taped chain``: the same, but each call multiplies the previous result by
  ``b`` (``x_{i+1} = x_i @ b``, two buffers in turn), so every recorded node
  is on the path backward walks: N nodes' rules run.

Baseline, timed in this process between the C runs: ``np.matmul(a, b, out=o)``
on 2x2 float32 arrays from Python.  Issue 18's targets: taped <= 4 us per call;
untaped <= 1 us more than the NumPy call.  Rounds alternate the C runs with
the NumPy loop; the table gives medians (and minima) over rounds.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

C_BENCH = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kina_fx.h"

typedef struct { void *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } d2;

static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static d2 make(float *p) { d2 d = {p, p, 0, {2, 2}, {2, 1}}; return d; }

#define CHECK(call) do { if ((call) != 0) { printf("error %s\n", kina_last_error()); return 1; } } while (0)

/* usage: bench mode(0 untaped, 1 taped, 2 taped chain) calls reps */
int main(int argc, char **argv) {
    int mode = atoi(argv[1]);
    long calls = atol(argv[2]);
    int reps = atoi(argv[3]);
    float a[4] = {0.5f, -0.25f, 0.125f, 0.75f}, b[4] = {0.5f, 0.25f, -0.5f, 0.5f};
    float x[2][4], one[4] = {1, 1, 1, 1}, g[4];
    d2 da = make(a), db = make(b), dx0 = make(x[0]), dx1 = make(x[1]), done = make(one), dg = make(g);
    kina_unranked_memref_t ua = {2, &da}, ub = {2, &db}, ux[2] = {{2, &dx0}, {2, &dx1}};
    kina_unranked_memref_t uone = {2, &done}, ug = {2, &dg};
    CHECK(_mlir_ciface_runtime_gpu_matmul_f32(&ux[0], &ua, &ub));       /* start Python, warm the caches */
    CHECK(_mlir_ciface_runtime_gpu_matmul_f32(&ux[1], &ux[0], &ub));
    for (int r = 0; r < reps; r++) {
        kina_tape_t tape = 0;
        double t0 = now();
        kina_unranked_memref_t *last = &ux[0];
        if (mode > 0) {
            CHECK(kina_tape_begin(KINA_TAPE_STRICT, &tape));
            CHECK(kina_tape_watch(tape, &ua, KINA_DTYPE_F32));
            CHECK(kina_tape_watch(tape, &ub, KINA_DTYPE_F32));
        }
        if (mode == 2) {
            CHECK(_mlir_ciface_runtime_gpu_matmul_f32(&ux[0], &ua, &ub));
            for (long i = 1; i < calls; i++) {
                CHECK(_mlir_ciface_runtime_gpu_matmul_f32(&ux[i & 1], &ux[(i - 1) & 1], &ub));
                last = &ux[i & 1];
            }
        } else {
            for (long i = 0; i < calls; i++)
                CHECK(_mlir_ciface_runtime_gpu_matmul_f32(&ux[0], &ua, &ub));
        }
        if (mode > 0) {
            CHECK(kina_tape_end(tape));
            CHECK(kina_tape_backward(tape, last, &uone));
            CHECK(kina_tape_grad(tape, &ub, &ug));
            CHECK(kina_tape_free(tape));
        }
        double t1 = now();
        printf("%.1f\n", (t1 - t0) / calls * 1e9);
    }
    return 0;
}
"""


def build(tmp: Path) -> Path:
    from kina_fx import ffi as kffi

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("needs a C compiler")
    src = tmp / "bench_tape_ops.c"
    src.write_text(C_BENCH)
    exe = tmp / "bench_tape_ops"
    libdir = str(Path(kffi.library_path()).parent)
    subprocess.run([cc, "-O2", str(src), f"-I{kffi.header_dir()}", f"-L{libdir}",
                    f"-Wl,-rpath,{libdir}", "-lkina_fx", "-o", str(exe)], check=True)
    return exe


def run(exe: Path, mode: int, calls: int, reps: int) -> list:
    env = {"KINA_FX_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "KINA_FX_PYTHON": sys.executable}
    out = subprocess.run([str(exe), str(mode), str(calls), str(reps)], env=env, capture_output=True,
                         text=True)
    if out.returncode or "error" in out.stdout:
        raise RuntimeError(f"bench failed: {out.stdout}{out.stderr}")
    return [float(v) / 1e3 for v in out.stdout.split()]


def numpy_loop(calls: int) -> float:
    a = np.array([[0.5, -0.25], [0.125, 0.75]], np.float32)
    b = np.array([[0.5, 0.25], [-0.5, 0.5]], np.float32)
    o = np.empty((2, 2), np.float32)
    matmul = np.matmul
    t0 = time.perf_counter()
    for _ in range(calls):
        matmul(a, b, out=o)
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    modes = {"untaped": 0, "taped": 1, "taped chain": 2}
    times = {name: [] for name in (*modes, "numpy")}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for _ in range(args.rounds):
            for name, mode in modes.items():
                times[name] += run(exe, mode, args.calls if mode < 2 else args.calls // 4, 2)
            times["numpy"] += [numpy_loop(args.calls) for _ in range(2)]
    res = {k: {"median_us": statistics.median(v), "min_us": min(v)} for k, v in times.items()}
    base = res["numpy"]
    print("2x2 float32 matmul export called from C; times per call")
    print("| contestant | median | min | vs NumPy from Python (medians) | target |")
    print("|---|---|---|---|---|")
    goals = {"untaped": "<= NumPy + 1 us", "taped": "<= 4 us", "taped chain": "<= 4 us", "numpy": "-"}
    for k, r in res.items():
        extra = f"{r['median_us'] - base['median_us']:+.2f} us" if k != "numpy" else "-"
        print(f"| {k} | {r['median_us']:.2f} us | {r['min_us']:.2f} us | {extra} | {goals[k]} |")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
