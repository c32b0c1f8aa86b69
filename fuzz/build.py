"""Build the libFuzzer targets against the installed libkina_fx.so.

    python fuzz/build.py OUTDIR        # writes OUTDIR/fuzz_memref and OUTDIR/fuzz_effects

clang-19 with ``-fsanitize=fuzzer,address`` (Debian: clang-19 and
libclang-rt-19-dev).  The library itself is the installed one (not
instrumented: it is mostly Python); the harness, its arena checks and the
C handlers and entry functions the effects target runs are.  How to run them
and for how long: docs/abi.md, "Fuzzing".
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ("fuzz_memref", "fuzz_effects")


def clang() -> str | None:
    return shutil.which("clang-19") or shutil.which("clang")


def environment() -> dict:
    """The environment to run a target in: CPU backend, ASan options for a Python process."""
    env = dict(os.environ)
    env["KINA_FX_DEVICE"] = "cpu"
    # Python never frees everything at exit: leak reports would be noise; the
    # effects target checks handles instead.
    # A failed huge allocation (NumPy's, say) is NULL, as without ASan (a
    # MemoryError: status 2), not an abort: the check-order rule names it.
    env["ASAN_OPTIONS"] = (f"detect_leaks=0:allocator_may_return_null=1:suppressions={HERE / 'asan.supp'}:"
                           + env.get("ASAN_OPTIONS", ""))
    return env


def build(outdir: str | os.PathLike) -> dict:
    """Compile both targets into ``outdir``; returns {target: path}."""
    sys.path.insert(0, str(HERE.parent))
    from kina_fx import ffi as kffi

    cc = clang()
    if cc is None:
        raise RuntimeError("clang-19 is not installed")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    gen = subprocess.run([sys.executable, str(HERE / "gen_exports.py"), str(out / "memref_exports.h")],
                         capture_output=True, text=True)
    if gen.returncode:
        raise RuntimeError(gen.stdout + gen.stderr)
    libdir = str(Path(kffi.library_path()).parent)
    built = {}
    for target in TARGETS:
        exe = out / target
        cmd = [cc, "-g", "-O1", "-fsanitize=fuzzer,address", "-Wall", "-Wextra", "-Werror",
               f"-I{out}", f"-I{kffi.header_dir()}", str(HERE / f"{target}.c"),
               f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx", "-lm", "-o", str(exe)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(" ".join(cmd) + "\n" + result.stdout + result.stderr)
        built[target] = exe
    return built


if __name__ == "__main__":
    for name, path in build(sys.argv[1] if len(sys.argv) > 1 else HERE / "out").items():
        print(name, path)
