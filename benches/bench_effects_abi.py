"""Effects C ABI benchmarks: a C host (bench_effects_abi.c) timing the ABI from C,
each row against a baseline timed by the same process in the same run.

    python benches/bench_effects_abi.py [--runs 5] [--callgrind]

Rows (targets of issue 10 in brackets):

* generator from C: kina_resume_fiber + kina_get_perform_id + _args per round
  trip vs a raw greenlet switch round trip driven from C through greenlet's C
  API [<= 1.0 us and <= 2x];
* kina_perform answered in place by a C handler vs a plain C call through a
  function pointer [<= 20 ns];
* each C handler of another effect passed on the way [<= 3 ns], each C
  handler returning KINA_FORWARD [<= 10 ns] (from 32 of them);
* 4 threads each driving its own generator fiber: round trips per second of
  all four together vs one thread alone [>= 1x];
* the first call of a host that uses only the effects ABI
  (tests/hosts/c/effects_only_host.c, Python's start-up included) [<= 30 ms];
* kina_perform answered by a Python ``fun`` clause, and the floor of one
  C -> Python call through cffi (kina_effect_id), for reference.

Each row is the median over ``--runs`` runs of the C host (each run itself
reports medians of 7); ratios are medians of the per-run ratios.
``--callgrind`` adds instruction counts (valgrind --tool=callgrind; per
operation = the difference of two loop lengths).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import cffi
import greenlet

from kina_fx import Effect, Handler
from kina_fx import ffi as kffi

HERE = Path(__file__).parent
ROOT = HERE.parent


def build(tmp: Path):
    cc = shutil.which("gcc") or shutil.which("cc")
    include, libdir = kffi.header_dir(), str(Path(kffi.library_path()).parent)
    pylibdir = sysconfig.get_config_var("LIBDIR")
    pylib = "python" + sysconfig.get_config_var("LDVERSION")
    flags = [f"-I{include}", f"-I{sysconfig.get_paths()['include']}",
             f"-I{os.path.dirname(greenlet.__file__)}",
             f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx",
             f"-L{pylibdir}", f"-Wl,-rpath,{pylibdir}", f"-l{pylib}", "-lpthread"]
    exe, so = tmp / "bench_effects_abi", tmp / "libbench_effects_abi.so"
    src = str(HERE / "bench_effects_abi.c")
    subprocess.run([cc, "-O2", src, *flags, "-o", str(exe)], check=True)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Dmain=bench_main", src, *flags, "-o", str(so)],
                   check=True)
    only = tmp / "effects_only_host"
    subprocess.run([cc, "-O2", str(ROOT / "tests" / "hosts" / "c" / "effects_only_host.c"),
                    f"-I{include}", f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx", "-ldl",
                    "-o", str(only)], check=True)
    return exe, so, only


def parse(text):
    return {name: float(v) for name, v in (line.split() for line in text.strip().splitlines())}


def run_c(exe, *args):
    return parse(subprocess.run(["env", "-i", str(exe), *map(str, args)], check=True,
                                capture_output=True, text=True).stdout)


def python_fun_from_c(so: Path):
    """Run the C benchmark in this process under a Python `fun` handler."""
    kffi.load_library()
    ffi = cffi.FFI()
    ffi.cdef("int bench_main(int argc, char **argv);")
    lib = ffi.dlopen(str(so))
    e = Effect("bench.abi.e")
    argv = [ffi.new("char[]", b"bench"), ffi.new("char[]", b"py")]
    read, write = os.pipe()
    saved = os.dup(1)
    sys.stdout.flush()
    os.dup2(write, 1)
    try:
        with Handler(fun={e: lambda i: i}):
            lib.bench_main(2, ffi.new("char *[]", argv))
    finally:
        os.dup2(saved, 1)
        os.close(write)
    return parse(os.read(read, 4096).decode())


def first_call_ms(only: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        # (not check=True: a build that imports NumPy fails the host's own check,
        # and its time is what a "before" run measures)
        out = subprocess.run(["env", "-i", str(only)], capture_output=True, text=True).stdout
        times.append(float(out.split("first_call_us")[1].split()[0]) / 1000)
    return statistics.median(times)


def instructions(exe, name, n):
    """Instructions per operation of loop ``name`` (callgrind, two lengths)."""
    counts = []
    for k in (n, 2 * n):
        out = subprocess.run(["env", "-i", shutil.which("valgrind"), "--tool=callgrind",
                              "--callgrind-out-file=/dev/null", str(exe), name, str(k)],
                             capture_output=True, text=True).stderr
        counts.append(int(out.split("Collected :")[1].split()[0]))
    return (counts[1] - counts[0]) / n


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        exe, so, only = build(Path(tmp))
        runs = [run_c(exe) for _ in range(opts.runs)]
        py_fun = python_fun_from_c(so)["python_fun"]
        first = first_call_ms(only, 7)
        counts = {}
        if opts.callgrind:
            for name, n in (("c_call", 1000000), ("greenlet_rt", 20000), ("generator", 20000),
                            ("in_place", 20000), ("pass_32", 5000), ("forward_32", 5000)):
                counts[name] = instructions(exe, name, n)

    def med(key):
        return statistics.median(r[key] for r in runs)

    def ratio(a, b):
        return statistics.median(r[a] / r[b] for r in runs)

    def per_level(key, levels=32):
        return statistics.median((r[key] - r["in_place"]) / levels for r in runs)

    print(f"Python {sys.version.split()[0]}, greenlet {greenlet.__version__}; "
          f"medians of {opts.runs} runs of the C host\n")
    print("| benchmark (from a C host) | kina_fx | baseline (same run) | ratio | target |")
    print("|---|---|---|---|---|")
    gen, raw = med("generator"), med("greenlet_rt")
    print(f"| generator: resume + get_perform_id + get_perform_args | {gen:.0f} ns | raw greenlet "
          f"switch round trip from C {raw:.0f} ns | {ratio('generator', 'greenlet_rt'):.2f}x | "
          f"<= 1.0 us and <= 2x |")
    print(f"| perform answered in place by a C handler | {med('in_place'):.1f} ns | plain C call "
          f"through a function pointer {med('c_call'):.1f} ns | {ratio('in_place', 'c_call'):.1f}x | "
          f"<= 20 ns |")
    print(f"| each C handler of another effect passed | {per_level('pass_32'):.1f} ns | - | - | <= 3 ns |")
    print(f"| each C handler returning KINA_FORWARD | {per_level('forward_32'):.1f} ns | - | - | <= 10 ns |")
    t1, t4 = med("threads_1"), med("threads_4")
    print(f"| 4 threads, each its own generator fiber | {t4 / 1e6:.2f} M round trips/s | one thread "
          f"{t1 / 1e6:.2f} M/s | {statistics.median(r['threads_4'] / r['threads_1'] for r in runs):.2f}x "
          f"| >= 1x |")
    print(f"| first call of an effects-only host (Python start-up included) | {first:.1f} ms | - | - "
          f"| <= 30 ms |")
    print(f"| perform answered by a Python `fun` clause | {py_fun:.0f} ns | - | - | - |")
    print(f"| floor: one C -> Python call through cffi (kina_effect_id) | {med('call_floor'):.0f} ns "
          f"| - | - | - |")
    if counts:
        print("\n| loop (callgrind) | instructions per operation |")
        print("|---|---|")
        print(f"| plain C call through a function pointer | {counts['c_call']:.0f} |")
        print(f"| in-place perform answered by a C handler | {counts['in_place']:.0f} |")
        print(f"| each handler of another effect passed | {(counts['pass_32'] - counts['in_place']) / 32:.0f} |")
        print(f"| each KINA_FORWARD handler | {(counts['forward_32'] - counts['in_place']) / 32:.0f} |")
        print(f"| raw greenlet switch round trip from C | {counts['greenlet_rt']:.0f} |")
        print(f"| generator round trip from C | {counts['generator']:.0f} "
              f"({counts['generator'] / counts['greenlet_rt']:.2f}x the raw round trip) |")


if __name__ == "__main__":
    main()
