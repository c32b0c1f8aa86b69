"""The MLIR host (host.mlir) against libkina_fx.so, ahead-of-time and under the JIT.

host.mlir declares the runtime functions as a Kina-compiled module does
(``llvm.emit_c_interface`` on ``memref<*xf32>`` / ``memref<*xi64>``), calls every
one -- alloc path included -- and checks results against references it computes
itself, plus error paths.  It is lowered by Debian's mlir-opt-19 and
mlir-translate-19, then either compiled by clang-19 and linked against the
library (run with ``env -i``), or run by mlir-cpu-runner-19 with
``-shared-libs``.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration

TOOLS = {name: shutil.which(name) for name in
         ("mlir-opt-19", "mlir-translate-19", "clang-19", "mlir-cpu-runner-19")}
missing = sorted(name for name, path in TOOLS.items() if path is None)
needs_mlir = pytest.mark.skipif(bool(missing), reason=f"missing MLIR 19 tools: {missing}")

PIPELINE = [
    "--convert-linalg-to-loops", "--convert-scf-to-cf", "--expand-strided-metadata", "--lower-affine",
    "--finalize-memref-to-llvm", "--convert-math-to-llvm", "--convert-func-to-llvm",
    "--convert-arith-to-llvm", "--convert-cf-to-llvm", "--reconcile-unrealized-casts",
]
CHECKS = 26  # number of @expect calls in host.mlir


def kina_fx_config(*flags: str) -> list[str]:
    script = Path(sys.executable).parent / "kina-fx"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kina_fx.cli"]
    return subprocess.run(cmd + ["config", *flags], check=True, capture_output=True, text=True).stdout.split()


def run(cmd, **kw):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert result.returncode == 0, f"{cmd[0]} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """host.mlir lowered to the LLVM dialect."""
    if missing:
        pytest.skip(f"missing MLIR 19 tools: {missing}")
    out = tmp_path_factory.mktemp("mlir") / "host.llvm.mlir"
    run([TOOLS["mlir-opt-19"], HERE / "host.mlir", *PIPELINE, "-o", out])
    return out


def test_host_calls_every_export():
    """The module declares and calls each of the specification's memref exports
    (the ops added since are called by mlp.mlir, test_mlir_tape.py)."""
    text = (HERE / "host.mlir").read_text()
    from kina_fx.runtime_ops import RUNTIME_OPS
    exports = [op.export for op in RUNTIME_OPS if op.seed]
    exports += ["_mlir_ciface_runtime_gpu_alloc_unranked", "runtime_gpu_free_all"]
    assert len(exports) == 9
    for name in exports:
        short = name.removeprefix("_mlir_ciface_")
        assert re.search(rf"func\.func private @{short}\(", text), name
        assert re.search(rf"call @{short}\(", text), name
    assert text.count("call @expect(") == CHECKS


@needs_mlir
def test_mlir_host_ahead_of_time(lowered, tmp_path):
    ll = tmp_path / "host.ll"
    run([TOOLS["mlir-translate-19"], "--mlir-to-llvmir", lowered, "-o", ll])
    obj = tmp_path / "host.o"
    run([TOOLS["clang-19"], "-c", "-Wno-override-module", ll, "-o", obj])
    exe = tmp_path / "host"
    run([TOOLS["clang-19"], obj, *kina_fx_config("--libs"), "-lm", "-o", exe])
    result = subprocess.run(["env", "-i", str(exe)], capture_output=True, text=True, timeout=300)
    assert "mlir host: 0 failures" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0
    assert result.stderr == ""


@needs_mlir
def test_mlir_host_under_the_jit(lowered):
    (library,) = kina_fx_config("--library")
    result = subprocess.run(
        ["env", "-i", TOOLS["mlir-cpu-runner-19"], "-e", "main", "-entry-point-result=i32",
         f"-shared-libs={library}", str(lowered)],
        capture_output=True, text=True, timeout=300)
    # The runner exits 0 whatever main returns: read what it printed.
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mlir host: 0 failures" in result.stdout, result.stdout + result.stderr
    assert re.search(r"^0$", result.stdout, re.M), result.stdout  # main's return value
    assert "failed" not in result.stdout


@needs_mlir
@needs_mlir
def test_mlir_host_detects_a_wrong_result(lowered, tmp_path):
    """The checks can fail: a host expecting a different gather result reports it."""
    text = (HERE / "host.mlir").read_text()
    # Corrupt the reference of the gather check after it was computed.
    broken = text.replace(
        "    %gout = memref.alloc() : memref<3x4xf32>\n",
        "    %bogus = arith.constant 123.0 : f32\n"
        "    memref.store %bogus, %gref[%c1, %c1] : memref<3x4xf32>\n"
        "    %gout = memref.alloc() : memref<3x4xf32>\n", 1)
    assert broken != text
    src = tmp_path / "broken.mlir"
    src.write_text(broken)
    lowered_broken = tmp_path / "broken.llvm.mlir"
    run([TOOLS["mlir-opt-19"], src, *PIPELINE, "-o", lowered_broken])
    (library,) = kina_fx_config("--library")
    result = subprocess.run([TOOLS["mlir-cpu-runner-19"], "-e", "main", "-entry-point-result=i32",
                             f"-shared-libs={library}", str(lowered_broken)],
                            capture_output=True, text=True, timeout=300)
    assert "mlir host: check 17 failed" in result.stdout, result.stdout + result.stderr
    assert "mlir host: 1 failures" in result.stdout
