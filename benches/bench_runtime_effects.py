"""What making every runtime op an effect costs, and what a tape costs, measured from C.

    .venv/bin/python benches/bench_runtime_effects.py [--baseline-ref REF] [--rounds N] [--json OUT]

1. Untaped cost (issue target: <= 0.3 us more per call than before the op
   table).  The same C program calls ``_mlir_ciface_runtime_gpu_matmul_f32``
   on 2x2 and 1024x1024 memrefs against two libraries, alternated round by
   round: this tree's, and the library built from ``--baseline-ref`` (default:
   the last commit before runtime ops performed effects) in a temporary
   directory, run with that commit's kina_fx on PYTHONPATH.  Per-call minima
   and medians of each; the difference is the added cost.
2. The same difference measured in-process: ``perform(effect, out, a, b)``
   with no handler vs calling the effect's default (the kernel) directly.
3. Recording overhead per runtime op from C: the 2x2 matmul and a
   256x784 @ 784x256 matmul inside a tape (begin, watch, N calls, end) vs
   untaped, same program, same library.
"""
from __future__ import annotations

import argparse
import json
import os
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

BASELINE_REF = "b059432"   # main before the runtime op table

C_BENCH = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kina_fx.h"

typedef struct { void *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } d2;
int32_t kina_tape_begin(int32_t, uint64_t *) __attribute__((weak));
int32_t kina_tape_watch(uint64_t, kina_unranked_memref_t *, int32_t) __attribute__((weak));
int32_t kina_tape_end(uint64_t) __attribute__((weak));
int32_t kina_tape_free(uint64_t) __attribute__((weak));

static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static d2 make(float *p, long r, long c) { d2 d = {p, p, 0, {r, c}, {c, 1}}; return d; }

/* usage: bench M K N calls reps taped */
int main(int argc, char **argv) {
    long m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
    long calls = atol(argv[4]);
    int reps = atoi(argv[5]), taped = atoi(argv[6]);
    float *a = calloc(m * k, 4), *b = calloc(k * n, 4), *o = calloc(m * n, 4);
    for (long i = 0; i < m * k; i++) a[i] = (float)(i % 7) * 0.25f;
    for (long i = 0; i < k * n; i++) b[i] = (float)(i % 5) * 0.5f;
    d2 da = make(a, m, k), db = make(b, k, n), dout = make(o, m, n);
    kina_unranked_memref_t ua = {2, &da}, ub = {2, &db}, uo = {2, &dout};
    if (_mlir_ciface_runtime_gpu_matmul_f32(&uo, &ua, &ub) != 0) {
        printf("error %s\n", kina_last_error());
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        uint64_t tape = 0;
        if (taped && (kina_tape_begin(0, &tape) || kina_tape_watch(tape, &ua, 1)
                      || kina_tape_watch(tape, &ub, 1))) {
            printf("error %s\n", kina_last_error());
            return 1;
        }
        double t0 = now();
        for (long i = 0; i < calls; i++)
            if (_mlir_ciface_runtime_gpu_matmul_f32(&uo, &ua, &ub)) {
                printf("error %s\n", kina_last_error());
                return 1;
            }
        double t1 = now();
        if (taped && (kina_tape_end(tape) || kina_tape_free(tape))) {
            printf("error %s\n", kina_last_error());
            return 1;
        }
        printf("%.1f\n", (t1 - t0) / calls * 1e9);
    }
    return 0;
}
"""


def build_baseline(ref: str, dest: Path) -> Path:
    """Commit ``ref``'s kina_fx, with its libkina_fx.so built, installed in a throwaway venv.

    The library finds its interpreter from the venv it sits in; a .pth file lends
    that venv this one's dependencies (NumPy, greenlet, cffi), not its kina_fx.
    """
    import site
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest / "venv")], check=True)
    site_dir = dest / "venv" / "lib" / f"python{sysconfig.get_python_version()}" / "site-packages"
    (site_dir / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "kina_fx"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(site_dir)], input=archive, check=True)
    package = site_dir / "kina_fx"
    native = package / "ffi" / "c" if (package / "ffi" / "c").is_dir() else package / "_native"  # before/after the move
    subprocess.run([str(dest / "venv" / "bin" / "python"), str(native / "build.py"),
                    str(package)], check=True, capture_output=True)
    return package


def compile_host(src_dir: Path, include: str, libdir: str, name: str) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    src = src_dir / "bench.c"
    src.write_text(C_BENCH)
    exe = src_dir / name
    subprocess.run([cc, "-O2", str(src), f"-I{include}", f"-L{libdir}", f"-Wl,-rpath,{libdir}",
                    "-Wl,--disable-new-dtags", "-lkina_fx", "-o", str(exe)], check=True)
    return exe


def run(exe: Path, shape, calls, reps, taped=0, baseline=False):
    env = {"KINA_FX_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    if not baseline:
        env["KINA_FX_PYTHON"] = sys.executable
    proc = subprocess.run([str(exe), *map(str, shape), str(calls), str(reps), str(taped)], env=env,
                          capture_output=True, text=True)
    out = proc.stdout
    if proc.returncode or "error" in out:
        raise RuntimeError(f"{exe.name} failed: {out}{proc.stderr}")
    return [float(x) for x in out.split()]


def in_process_perform_cost(calls=200_000, reps=7):
    from kina_fx.handlers import perform
    from kina_fx.runtime_ops import effect_of

    eff = effect_of("matmul")
    a = np.ones((2, 2), np.float32)
    o = np.empty((2, 2), np.float32)
    default = eff.default
    best = {"perform": [], "kernel": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            perform(eff, o, a, a)
        t1 = time.perf_counter()
        for _ in range(calls):
            default(o, a, a)
        t2 = time.perf_counter()
        best["perform"].append((t1 - t0) / calls * 1e9)
        best["kernel"].append((t2 - t1) / calls * 1e9)
    return best


def summary(samples):
    return {"min": min(samples), "median": statistics.median(samples)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from kina_fx import ffi as kffi

    results = {"baseline_ref": args.baseline_ref}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        base = build_baseline(args.baseline_ref, tmp / "base")
        exe_new = compile_host(tmp, kffi.header_dir(), str(Path(kffi.library_path()).parent), "bench_new")
        (tmp / "b").mkdir()
        exe_old = compile_host(tmp / "b", str(base / "include"), str(base), "bench_old")
        cases = {"matmul 2x2": ((2, 2, 2), 50_000), "matmul 1024x1024": ((1024, 1024, 1024), 3)}
        for label, (shape, calls) in cases.items():
            new, old = [], []
            for _ in range(args.rounds):
                old += run(exe_old, shape, calls, 2, baseline=True)
                new += run(exe_new, shape, calls, 2)
            results[label] = {"before_ns": summary(old), "now_ns": summary(new),
                              "added_ns_min": min(new) - min(old),
                              "added_ns_median": statistics.median(new) - statistics.median(old)}
        tape_cases = {"matmul 2x2": ((2, 2, 2), 20_000), "matmul 256x784 @ 784x256": ((256, 784, 256), 20)}
        for label, (shape, calls) in tape_cases.items():
            plain, taped = [], []
            for _ in range(args.rounds):
                plain += run(exe_new, shape, calls, 2)
                taped += run(exe_new, shape, calls, 2, taped=1)
            results["taped " + label] = {"untaped_ns": summary(plain), "taped_ns": summary(taped),
                                         "recording_ns_median": statistics.median(taped) - statistics.median(plain),
                                         "ratio_median": statistics.median(taped) / statistics.median(plain)}
    results["in-process perform vs kernel (2x2 matmul)"] = {
        k: summary(v) for k, v in in_process_perform_cost().items()}
    print("| measurement | value |\n|---|---|")
    for label, r in results.items():
        if label == "baseline_ref":
            continue
        if "added_ns_median" in r:
            print(f"| {label}: before / now per call (median) | {r['before_ns']['median'] / 1e3:.2f} us / "
                  f"{r['now_ns']['median'] / 1e3:.2f} us: added {r['added_ns_median'] / 1e3:+.2f} us "
                  f"(min-to-min {r['added_ns_min'] / 1e3:+.2f} us) |")
        elif "recording_ns_median" in r:
            print(f"| {label}: untaped / taped per call (median) | {r['untaped_ns']['median'] / 1e3:.2f} us / "
                  f"{r['taped_ns']['median'] / 1e3:.2f} us: recording {r['recording_ns_median'] / 1e3:+.2f} us "
                  f"({r['ratio_median']:.2f}x) |")
        else:
            print(f"| {label} | perform {r['perform']['median']:.0f} ns, kernel {r['kernel']['median']:.0f} ns "
                  f"(medians): {r['perform']['median'] - r['kernel']['median']:+.0f} ns |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
