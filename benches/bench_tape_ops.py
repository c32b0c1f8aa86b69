"""A runtime op called from C: untaped, and recorded by a tape (its share of backward included).

    .venv/bin/python benches/bench_tape_ops.py [--rounds 7] [--calls 20000] [--clock cpu|wall] [--callgrind] [--json OUT]

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
the NumPy loop; the table gives medians (and minima) over rounds.  ``--clock cpu`` (the
default) times with the calling thread's CPU time on both sides: on a shared
machine a loop that waits for a core does not count the wait.  ``--callgrind``
also counts each contestant's instructions per call (valgrind), which load
does not move.
"""
from __future__ import annotations

import argparse
import json
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

C_BENCH = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kina_fx.h"

typedef struct { void *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } d2;

static clockid_t clock_id = CLOCK_THREAD_CPUTIME_ID;

static double now(void) {
    struct timespec t; clock_gettime(clock_id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static d2 make(float *p) { d2 d = {p, p, 0, {2, 2}, {2, 1}}; return d; }

#define CHECK(call) do { if ((call) != 0) { printf("error %s\n", kina_last_error()); return 1; } } while (0)

/* usage: bench mode(0 untaped, 1 taped, 2 taped chain) calls reps [wall] */
int main(int argc, char **argv) {
    int mode = atoi(argv[1]);
    long calls = atol(argv[2]);
    int reps = atoi(argv[3]);
    if (argc > 4)
        clock_id = CLOCK_MONOTONIC;
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


def run(exe: Path, mode: int, calls: int, reps: int, clock: str) -> list:
    env = {"KINA_FX_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "KINA_FX_PYTHON": sys.executable}
    argv = [str(exe), str(mode), str(calls), str(reps)] + (["wall"] if clock == "wall" else [])
    out = subprocess.run(argv, env=env, capture_output=True, text=True)
    if out.returncode or "error" in out.stdout:
        raise RuntimeError(f"bench failed: {out.stdout}{out.stderr}")
    return [float(v) / 1e3 for v in out.stdout.split()]


NUMPY_LOOP = """
import sys
import numpy as np
a = np.array([[0.5, -0.25], [0.125, 0.75]], np.float32)
b = np.array([[0.5, 0.25], [-0.5, 0.5]], np.float32)
o = np.empty((2, 2), np.float32)
matmul = np.matmul
for _ in range(int(sys.argv[1])):
    matmul(a, b, out=o)
"""


def instructions(argv: list, env: dict, tmp: Path) -> int:
    """Instructions a program executes, counted by callgrind."""
    out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp / 'cg.out'}", *argv],
                         env=env, capture_output=True, text=True)
    counted = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or counted is None:
        raise RuntimeError(f"callgrind failed: {out.stdout}{out.stderr[-2000:]}")
    return int(counted.group(1))


def instructions_per_call(argv_for, env: dict, tmp: Path, calls=(200, 1200)) -> float:
    """Instructions per call: the difference of two runs of different lengths
    (start-up, imports and the first calls' caches cancel)."""
    few, many = (instructions(argv_for(n), env, tmp) for n in calls)
    return (many - few) / (calls[1] - calls[0])


def callgrind_counts(exe: Path, modes: dict, tmp: Path) -> dict:
    env = {"KINA_FX_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "KINA_FX_PYTHON": sys.executable}
    counts = {name: instructions_per_call(lambda n, m=mode: [str(exe), str(m), str(n), "1"], env, tmp)
              for name, mode in modes.items()}
    counts["numpy"] = instructions_per_call(lambda n: [sys.executable, "-c", NUMPY_LOOP, str(n)],
                                            {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, tmp)
    return counts


def print_counts(counts: dict) -> None:
    print("\ninstructions per call (callgrind; difference of 200- and 1,200-call runs)")
    print("| contestant | instructions | vs NumPy from Python |")
    print("|---|---|---|")
    for name, n in counts.items():
        print(f"| {name} | {n:,.0f} | {n / counts['numpy']:.2f}x |")


def numpy_loop(calls: int, clock) -> float:
    a = np.array([[0.5, -0.25], [0.125, 0.75]], np.float32)
    b = np.array([[0.5, 0.25], [-0.5, 0.5]], np.float32)
    o = np.empty((2, 2), np.float32)
    matmul = np.matmul
    t0 = clock()
    for _ in range(calls):
        matmul(a, b, out=o)
    return (clock() - t0) / calls * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--callgrind", action="store_true",
                        help="also count each contestant's instructions per call (needs valgrind)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    modes = {"untaped": 0, "taped": 1, "taped chain": 2}
    times = {name: [] for name in (*modes, "numpy")}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for _ in range(args.rounds):
            for name, mode in modes.items():
                times[name] += run(exe, mode, args.calls if mode < 2 else args.calls // 4, 2, args.clock)
            times["numpy"] += [numpy_loop(args.calls, clock) for _ in range(2)]
        counts = callgrind_counts(exe, modes, Path(tmp)) if args.callgrind else None
    res = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)} for k, v in times.items()}
    base = res["numpy"]
    print(f"2x2 float32 matmul export called from C; {args.clock} time per call")
    print("| contestant | median | min | max | vs NumPy from Python (medians) | target |")
    print("|---|---|---|---|---|---|")
    goals = {"untaped": "<= NumPy + 1 us", "taped": "<= 4 us", "taped chain": "<= 4 us", "numpy": "-"}
    for k, r in res.items():
        extra = f"{r['median_us'] - base['median_us']:+.2f} us" if k != "numpy" else "-"
        print(f"| {k} | {r['median_us']:.2f} us | {r['min_us']:.2f} us | {r['max_us']:.2f} us | {extra} | "
              f"{goals[k]} |")
    if counts is not None:
        print_counts(counts)
        res["instructions_per_call"] = counts
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
