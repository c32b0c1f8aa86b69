"""Benchmarks of the memref runtime ABI (libkina_fx.so) against its baselines, same run.

    .venv/bin/python benches/bench_memref.py [--json OUT.json] [--gpu-only | --cpu-only]

1. Call overhead from C: a C program (compiled here with gcc via ``kina-fx
   config``) calls ``_mlir_ciface_runtime_gpu_matmul_f32`` on 2x2 memrefs in a
   loop; baseline: the same ``np.matmul(a, b, out=o)`` called from Python.
   Overhead = C-call time - NumPy-call time (target <= 5 us).
2. Throughput through the ABI vs NumPy directly: matmul 1024^2 and softmax
   4096^2 f32 (target >= 0.9x), measured interleaved, medians.
3. GPU (only with CuPy and a CUDA device): matmul 4096^2 and 8192^2 through the
   ABI on runtime-allocated managed memory vs ``cupy.matmul`` (target >= 0.95x);
   softmax 8192^2 bandwidth as a fraction of the device's copy bandwidth.

Prints a Markdown table; ``--json`` also writes the raw numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
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

from kina_fx import ffi as kffi  # noqa: E402
from kina_fx import gpu_ops, memref  # noqa: E402

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

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, o[4];
    d2 da = {a, a, 0, {2, 2}, {2, 1}}, db = {b, b, 0, {2, 2}, {2, 1}}, dout = {o, o, 0, {2, 2}, {2, 1}};
    kina_unranked_memref_t ua = {2, &da}, ub = {2, &db}, uo = {2, &dout};
    if (_mlir_ciface_runtime_gpu_matmul_f32(&uo, &ua, &ub) != 0) {
        printf("error %s\n", kina_last_error());
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (long i = 0; i < n; i++)
            _mlir_ciface_runtime_gpu_matmul_f32(&uo, &ua, &ub);
        double t1 = now();
        for (long i = 0; i < n; i++)
            runtime_gpu_free_all();
        double t2 = now();
        for (long i = 0; i < n; i++)
            kina_abi_version();
        double t3 = now();
        printf("%.1f %.1f %.1f\n", (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, (t3 - t2) / n * 1e9);
    }
    return 0;
}
"""


def kina_fx_config(*flags):
    script = Path(sys.executable).parent / "kina-fx"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kina_fx.cli"]
    return subprocess.run(cmd + ["config", *flags], check=True, capture_output=True, text=True).stdout.split()


def time_python(fn, number, reps=7):
    """Per-call seconds of ``fn`` for each of ``reps`` batches of ``number`` calls."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t0) / number)
    return out


def bench_call_overhead(results, calls=50_000, rounds=7):
    """C loop vs NumPy loop, alternated ``rounds`` times; min and median of each.

    The machine is shared and noisy: alternating gives both sides the same
    background load, and the minimum is the least disturbed estimate.
    """
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        results["call_overhead"] = {"skipped": "no C compiler"}
        return
    a = np.array([[1, 2], [3, 4]], np.float32)
    b = np.array([[5, 6], [7, 8]], np.float32)
    o = np.empty((2, 2), np.float32)
    c_rows, numpy_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "bench_call.c"
        src.write_text(C_BENCH)
        exe = Path(tmp) / "bench_call"
        subprocess.run([cc, "-O2", str(src), *kina_fx_config("--cflags", "--libs"), "-o", str(exe)], check=True)
        for _ in range(rounds):
            out = subprocess.run(["env", "-i", "KINA_FX_DEVICE=cpu", str(exe), str(calls), "2"],
                                 check=True, capture_output=True, text=True).stdout
            c_rows += [list(map(float, line.split())) for line in out.splitlines() if line.strip()]
            numpy_s += time_python(lambda: np.matmul(a, b, out=o), calls, reps=2)
    numpy_ns = [t * 1e9 for t in numpy_s]
    col = lambda i: [r[i] for r in c_rows]  # noqa: E731
    results["call_overhead"] = {
        "abi_matmul_2x2_from_c_us": min(col(0)) / 1e3,
        "abi_matmul_2x2_from_c_median_us": statistics.median(col(0)) / 1e3,
        "numpy_matmul_2x2_from_python_us": min(numpy_ns) / 1e3,
        "numpy_matmul_2x2_from_python_median_us": statistics.median(numpy_ns) / 1e3,
        "overhead_us": (min(col(0)) - min(numpy_ns)) / 1e3,
        "overhead_median_us": (statistics.median(col(0)) - statistics.median(numpy_ns)) / 1e3,
        "abi_free_all_noop_from_c_us": min(col(1)) / 1e3,
        "pure_c_export_us": min(col(2)) / 1e3,
        "calls_per_batch": calls,
        "batches": len(c_rows),
    }


def interleaved(fns: dict, reps: int):
    """Median seconds per call of each fn, measured round-robin to share the noise."""
    times = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm up
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_cpu_throughput(results, reps=9):
    os.environ["KINA_FX_DEVICE"] = "cpu"
    c, lib = kffi.load_library()
    rng = np.random.default_rng(0)

    def ptr(m):
        return c.cast("kina_unranked_memref_t *", m.address)

    n = 1024
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    o1, o2 = np.empty((n, n), np.float32), np.empty((n, n), np.float32)
    ma, mb, mo = memref.from_numpy(a), memref.from_numpy(b), memref.from_numpy(o1)
    pa, pb, po = ptr(ma), ptr(mb), ptr(mo)
    mm = lib._mlir_ciface_runtime_gpu_matmul_f32
    t = interleaved({"abi": lambda: mm(po, pa, pb), "numpy": lambda: np.matmul(a, b, out=o2)}, reps)
    assert np.allclose(o1, o2, rtol=1e-4, atol=1e-3)
    results["matmul_1024"] = {"abi_ms": t["abi"] * 1e3, "numpy_ms": t["numpy"] * 1e3,
                              "ratio_numpy_over_abi": t["numpy"] / t["abi"]}

    n = 4096
    x = rng.standard_normal((n, n), dtype=np.float32)
    s1, s2, s3 = (np.empty((n, n), np.float32) for _ in range(3))
    mx, ms = memref.from_numpy(x), memref.from_numpy(s1)
    px, ps = ptr(mx), ptr(ms)
    sm = lib._mlir_ciface_runtime_gpu_softmax_f32

    def numpy_softmax():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        s3[...] = e  # NumPy writes the result into a caller's buffer too

    def numpy_softmax_noout():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        return e

    t = interleaved({"abi": lambda: sm(ps, px, -1),
                     "gpu_ops": lambda: gpu_ops.softmax(x, -1, s2),
                     "numpy": numpy_softmax,
                     "numpy_no_out": numpy_softmax_noout}, reps)
    assert np.allclose(s1, s2) and np.allclose(s1, s3, rtol=1e-5, atol=1e-7)
    results["softmax_4096"] = {
        "abi_ms": t["abi"] * 1e3, "gpu_ops_direct_ms": t["gpu_ops"] * 1e3,
        "numpy_into_out_ms": t["numpy"] * 1e3, "numpy_no_out_ms": t["numpy_no_out"] * 1e3,
        "ratio_numpy_over_abi": t["numpy"] / t["abi"],
        "ratio_numpy_no_out_over_abi": t["numpy_no_out"] / t["abi"],
        "ratio_gpu_ops_over_abi": t["gpu_ops"] / t["abi"]}


def bench_gpu(results, reps=7):
    cp = gpu_ops.cupy_module()
    if cp is None:
        results["gpu"] = {"skipped": "no CuPy or no CUDA device"}
        return
    os.environ["KINA_FX_DEVICE"] = "cuda"
    c, lib = kffi.load_library()
    sync = cp.cuda.get_current_stream().synchronize
    props = cp.cuda.runtime.getDeviceProperties(0)
    gpu = {"device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])}

    def alloc(shape):
        m = memref.empty_descriptor(shape)
        assert lib._mlir_ciface_runtime_gpu_alloc_unranked(c.cast("kina_unranked_memref_t *", m.address), 4) == 0, \
            c.string(lib.kina_last_error())
        d = m.descriptor()
        return m, memref.cupy_view(d, np.float32, cp)

    def ptr(m):
        return c.cast("kina_unranked_memref_t *", m.address)

    for n in (4096, 8192):
        ma, a = alloc((n, n))
        mb, b = alloc((n, n))
        mo, o = alloc((n, n))
        a[...] = cp.random.standard_normal((n, n), dtype=cp.float32)
        b[...] = cp.random.standard_normal((n, n), dtype=cp.float32)
        da, db = cp.asarray(a).copy(), cp.asarray(b).copy()  # plain device memory for the baseline
        do = cp.empty((n, n), cp.float32)
        mm = lib._mlir_ciface_runtime_gpu_matmul_f32
        pa, pb, po = ptr(ma), ptr(mb), ptr(mo)

        def via_abi():
            assert mm(po, pa, pb) == 0, c.string(lib.kina_last_error())

        def via_cupy():
            cp.matmul(da, db, out=do)
            sync()

        t = interleaved({"abi": via_abi, "cupy": via_cupy}, reps)
        flops = 2 * n ** 3
        gpu[f"matmul_{n}"] = {"abi_ms": t["abi"] * 1e3, "cupy_ms": t["cupy"] * 1e3,
                              "ratio_cupy_over_abi": t["cupy"] / t["abi"],
                              "abi_tflops": flops / t["abi"] / 1e12}
        assert bool(cp.allclose(o, do, rtol=1e-3, atol=1e-2))
        del a, b, o, da, db, do
        lib.runtime_gpu_free_all()

    n = 8192
    mx, x = alloc((n, n))
    ms, s = alloc((n, n))
    x[...] = cp.random.standard_normal((n, n), dtype=cp.float32)
    src = cp.asarray(x).copy()
    dst = cp.empty_like(src)
    px, ps = ptr(mx), ptr(ms)
    sm = lib._mlir_ciface_runtime_gpu_softmax_f32

    def softmax_abi():
        assert sm(ps, px, -1) == 0

    def copy():
        cp.copyto(dst, src)
        sync()

    t = interleaved({"abi": softmax_abi, "copy": copy}, reps)
    nbytes = n * n * 4
    softmax_bw = 2 * nbytes / t["abi"]  # one read of x, one write of out: the minimum traffic
    copy_bw = 2 * nbytes / t["copy"]
    gpu["softmax_8192"] = {"abi_ms": t["abi"] * 1e3, "copy_ms": t["copy"] * 1e3,
                           "softmax_GBps": softmax_bw / 1e9, "copy_GBps": copy_bw / 1e9,
                           "fraction_of_copy_bandwidth": softmax_bw / copy_bw}
    lib.runtime_gpu_free_all()
    results["gpu"] = gpu


def markdown(results) -> str:
    lines = ["| benchmark | result | baseline | ratio / overhead |", "|---|---|---|---|"]
    co = results.get("call_overhead", {})
    if "overhead_us" in co:
        lines.append(f"| 2x2 matmul call from C (min of {co['batches']} batches) | "
                     f"{co['abi_matmul_2x2_from_c_us']:.2f} us | "
                     f"np.matmul from Python {co['numpy_matmul_2x2_from_python_us']:.2f} us | "
                     f"overhead {co['overhead_us']:.2f} us (target <= 5) |")
        lines.append(f"| 2x2 matmul call from C (medians) | {co['abi_matmul_2x2_from_c_median_us']:.2f} us | "
                     f"np.matmul from Python {co['numpy_matmul_2x2_from_python_median_us']:.2f} us | "
                     f"overhead {co['overhead_median_us']:.2f} us |")
        lines.append(f"| no-op export (free_all, nothing allocated) from C | {co['abi_free_all_noop_from_c_us']:.2f} us | "
                     f"pure-C export {co['pure_c_export_us'] * 1e3:.0f} ns | C->Python round trip |")
    if "matmul_1024" in results:
        m = results["matmul_1024"]
        lines.append(f"| matmul 1024^2 f32 | {m['abi_ms']:.2f} ms | np.matmul {m['numpy_ms']:.2f} ms | "
                     f"{m['ratio_numpy_over_abi']:.3f}x (target >= 0.9) |")
    if "softmax_4096" in results:
        s = results["softmax_4096"]
        lines.append(f"| softmax 4096^2 f32 | {s['abi_ms']:.1f} ms | NumPy softmax into a buffer "
                     f"{s['numpy_into_out_ms']:.1f} ms | {s['ratio_numpy_over_abi']:.3f}x (target >= 0.9) |")
        lines.append(f"| softmax 4096^2 f32 | {s['abi_ms']:.1f} ms | NumPy softmax, fresh result "
                     f"{s['numpy_no_out_ms']:.1f} ms | {s['ratio_numpy_no_out_over_abi']:.3f}x |")
        lines.append(f"| softmax 4096^2 f32 | {s['abi_ms']:.1f} ms | gpu_ops.softmax called directly "
                     f"{s['gpu_ops_direct_ms']:.1f} ms | {s['ratio_gpu_ops_over_abi']:.3f}x |")
    g = results.get("gpu", {})
    if "skipped" in g:
        lines.append(f"| GPU | skipped: {g['skipped']} | | |")
    for n in (4096, 8192):
        if f"matmul_{n}" in g:
            m = g[f"matmul_{n}"]
            lines.append(f"| GPU matmul {n}^2 f32 ({g['device']}) | {m['abi_ms']:.2f} ms "
                         f"({m['abi_tflops']:.1f} TFLOP/s) | cupy.matmul {m['cupy_ms']:.2f} ms | "
                         f"{m['ratio_cupy_over_abi']:.3f}x (target >= 0.95) |")
    if "softmax_8192" in g:
        s = g["softmax_8192"]
        lines.append(f"| GPU softmax 8192^2 f32 | {s['abi_ms']:.2f} ms ({s['softmax_GBps']:.0f} GB/s) | "
                     f"device copy {s['copy_GBps']:.0f} GB/s | {s['fraction_of_copy_bandwidth']:.2f} of copy bandwidth |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--gpu-only", action="store_true")
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args(argv)
    results = {"machine": {"python": platform.python_version(), "numpy": np.__version__,
                           "cpus": os.cpu_count(), "platform": platform.platform()}}
    if not args.gpu_only:
        bench_call_overhead(results)
        bench_cpu_throughput(results, args.reps)
    if not args.cpu_only:
        bench_gpu(results, max(3, args.reps - 2))
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
