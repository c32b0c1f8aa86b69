"""The MLIR 19 tool chain as the MLIR host tests use it (test_mlir_host.py, test_mlir_tape.py).

One lowering pipeline for every module here: mlir-opt-19 with :data:`PIPELINE`
to the LLVM dialect, then either mlir-translate-19 + clang-19 (an executable or
a shared object linked against libkina_fx.so through ``kina-fx config
--libs``) or mlir-cpu-runner-19 with ``-shared-libs=libkina_fx.so``.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kina_fx.compiled import MLIR_PIPELINE

TOOLS = {name: shutil.which(name) for name in
         ("mlir-opt-19", "mlir-translate-19", "clang-19", "mlir-cpu-runner-19")}
MISSING = sorted(name for name, path in TOOLS.items() if path is None)
needs_mlir = pytest.mark.skipif(bool(MISSING), reason=f"missing MLIR 19 tools: {MISSING}")

# The one lowering pipeline: kina_fx.compiled.compile_mlir's (docs/autograd-abi.md).
PIPELINE = list(MLIR_PIPELINE)


def skip_unless_tools() -> None:
    """Skip the calling test or fixture when a tool is missing (a failure under CI=true)."""
    if MISSING:
        pytest.skip(f"missing MLIR 19 tools: {MISSING}")


def kina_fx_config(*flags: str) -> list[str]:
    """Flags from the installed ``kina-fx config`` console script."""
    script = Path(sys.executable).parent / "kina-fx"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kina_fx.cli"]
    return subprocess.run(cmd + ["config", *flags], check=True, capture_output=True, text=True).stdout.split()


def run(cmd, **kw) -> subprocess.CompletedProcess:
    """Run a build step; fail the test with its output when it fails."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert result.returncode == 0, f"{cmd[0]} failed:\n{result.stdout}\n{result.stderr}"
    return result


def lower(source: Path, out: Path) -> Path:
    """``source`` lowered to the LLVM dialect by mlir-opt-19."""
    run([TOOLS["mlir-opt-19"], source, *PIPELINE, "-o", out])
    return out


def compile_object(lowered: Path, out: Path, pic: bool = False) -> Path:
    """An object file from lowered MLIR: mlir-translate-19 to LLVM IR, clang-19 -c."""
    ll = out.with_suffix(".ll")
    run([TOOLS["mlir-translate-19"], "--mlir-to-llvmir", lowered, "-o", ll])
    run([TOOLS["clang-19"], "-c", "-O2", "-Wno-override-module", *(["-fPIC"] if pic else []), ll, "-o", out])
    return out


def link_executable(obj: Path, out: Path) -> Path:
    run([TOOLS["clang-19"], obj, *kina_fx_config("--libs"), "-lm", "-o", out])
    return out


def link_shared_object(obj: Path, out: Path) -> Path:
    """A shared object whose runtime calls resolve to libkina_fx.so (rpath included)."""
    run([TOOLS["clang-19"], "-shared", obj, *kina_fx_config("--libs"), "-lm", "-o", out])
    return out


def jit(lowered: Path, entry: str = "main", env_clean: bool = True) -> subprocess.CompletedProcess:
    """Run ``entry`` (returning i32) of lowered MLIR under mlir-cpu-runner-19 with libkina_fx.so.

    The runner exits 0 whatever ``entry`` returns and prints the value on a line
    of its own; callers read stdout."""
    (library,) = kina_fx_config("--library")
    cmd = [TOOLS["mlir-cpu-runner-19"], "-e", entry, "-entry-point-result=i32",
           f"-shared-libs={library}", str(lowered)]
    return subprocess.run((["env", "-i"] if env_clean else []) + cmd,
                          capture_output=True, text=True, timeout=300)
