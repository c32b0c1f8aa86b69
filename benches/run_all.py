"""Run every benchmark of benches/ in turn (``make bench``); each prints its own table.

    python benches/run_all.py [name ...]     # e.g. effects memref

Results and the conditions they were measured in go to docs/benchmarks.md.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = {
    "effects": ["bench_effects.py", "bench_nested_handlers.py"],
    "effects_abi": ["bench_effects_abi.py"],
    "memref": ["bench_memref.py"],
    "abi_contract": ["bench_abi_contract.py"],
    "autograd": ["bench_autograd.py"],
    # issue 18: compiled code at NumPy speed
    "compiled": ["bench_compiled_step.py", "bench_tape_ops.py", "bench_runtime_effects.py"],
    "kernels": ["bench_kernels.py"],
}


def main(argv):
    names = argv or list(SCRIPTS)
    failed = []
    for name in names:
        for script in SCRIPTS[name]:
            print(f"\n### {script}\n", flush=True)
            if subprocess.run([sys.executable, str(HERE / script)]).returncode != 0:
                failed.append(script)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
