"""C handlers that re-enter kina_perform until Python's recursion limit stops them.

Run as a script by tests/abi/test_abi_contract.py with any interpreter that has
kina_fx installed:  python reentry_check.py OUTDIR [DEPTHS]

Builds tests/hosts/c/contract_lib.c against that interpreter's libkina_fx.so,
then runs ``ct_recursion`` from DEPTHS different Python stack depths (so that
the limit falls on every kind of frame of the re-entry cycle, the entry of a
cffi callback included).  Each run must end in status 5 (a RecursionError)
with nothing printed; prints ``reentry ok`` and exits 0 when all did.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def main() -> int:
    from kina_fx import Effect
    from kina_fx import ffi as kffi

    outdir = Path(sys.argv[1])
    depths = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    ffi, lib = kffi.load_library()
    source = Path(__file__).parents[1] / "hosts" / "c" / "contract_lib.c"
    out = outdir / f"libcontract{sys.version_info[0]}{sys.version_info[1]}.so"
    libdir = os.path.dirname(kffi.library_path())
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(source), f"-I{kffi.header_dir()}",
                    f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx", "-o", str(out)], check=True)
    ffi.cdef("int32_t ct_recursion(int32_t effect); extern int64_t ct_levels;")
    clib = ffi.dlopen(str(out))
    effect = Effect("reentry_check.e")

    def at_depth(n):
        return at_depth(n - 1) if n else clib.ct_recursion(effect.id)

    failures = []
    for depth in range(depths):
        status = at_depth(depth)
        message = ffi.string(lib.kina_last_error()).decode()
        if status != 5 or clib.ct_levels < 10:
            failures.append((depth, status, clib.ct_levels, message))
    if failures:
        print("reentry FAILED", failures)
        return 1
    print("reentry ok", sys.version.split()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
