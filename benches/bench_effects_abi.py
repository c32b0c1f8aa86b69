"""Effects C ABI benchmarks: a C host (bench_effects_abi.c) timing performs through
libkina_fx.so, next to the pure-Python numbers of the same operations, one run.

    python benches/bench_effects_abi.py

1. perform + resume round trip through a suspending handler, driven from C
   (kina_resume_fiber / kina_perform), target <= 2.5 us;
2. perform answered in place by a C handler (kina_push_handler), target <= 1 us;
3. perform from C answered in place by a Python `fun` clause;
4. the floor: one C -> Python call into the library (kina_effect_id);
and, for comparison, the pure-Python `on` round trip and `fun` perform.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import cffi

from kina_fx import Effect, Handler
from kina_fx import ffi as kffi

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import bench_effects  # noqa: E402


def build(tmp: Path):
    cc = shutil.which("gcc") or shutil.which("cc")
    include, libdir = kffi.header_dir(), str(Path(kffi.library_path()).parent)
    flags = [f"-I{include}", f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx"]
    exe, so = tmp / "bench_effects_abi", tmp / "libbench_effects_abi.so"
    src = str(HERE / "bench_effects_abi.c")
    subprocess.run([cc, "-O2", src, *flags, "-o", str(exe)], check=True)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Dmain=bench_main", src, *flags, "-o", str(so)], check=True)
    return exe, so


def parse(text):
    return {name: float(ns) for name, ns in (line.split() for line in text.strip().splitlines())}


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


def main():
    with tempfile.TemporaryDirectory() as tmp:
        exe, so = build(Path(tmp))
        c = parse(subprocess.run(["env", "-i", str(exe)], check=True, capture_output=True,
                                 text=True).stdout)
        c.update(python_fun_from_c(so))
    py_on = bench_effects.per_op(bench_effects.on_perform_resume) * 1e9
    py_fun = bench_effects.per_op(bench_effects.fun_perform) * 1e9
    rows = [
        ("perform + resume round trip, suspending handler, from C", c["suspend_resume_round_trip"], 2500),
        ("perform answered in place by a C handler, from C", c["c_handler_in_place"], 1000),
        ("perform from C answered by a Python `fun` clause", c["python_fun_in_place"], None),
        ("floor: one C -> Python call (kina_effect_id)", c["call_floor"], None),
        ("pure Python: `on` perform + resume round trip", py_on, None),
        ("pure Python: `fun` perform", py_fun, None),
    ]
    print(f"Python {sys.version.split()[0]}; medians of 7 runs\n")
    print("| benchmark | median | target |")
    print("|---|---|---|")
    for name, ns, target in rows:
        verdict = "-" if target is None else (f"<= {target} ns " + ("(met)" if ns <= target else "(missed)"))
        print(f"| {name} | {ns:.0f} ns | {verdict} |")


if __name__ == "__main__":
    main()
