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
import subprocess
from pathlib import Path

import pytest
from mlir_tools import compile_object, jit, link_executable, lower, needs_mlir, skip_unless_tools

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration

CHECKS = 26  # number of @expect calls in host.mlir


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """host.mlir lowered to the LLVM dialect."""
    skip_unless_tools()
    return lower(HERE / "host.mlir", tmp_path_factory.mktemp("mlir") / "host.llvm.mlir")


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
    exe = link_executable(compile_object(lowered, tmp_path / "host.o"), tmp_path / "host")
    result = subprocess.run(["env", "-i", str(exe)], capture_output=True, text=True, timeout=300)
    assert "mlir host: 0 failures" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0
    assert result.stderr == ""


@needs_mlir
def test_mlir_host_under_the_jit(lowered):
    result = jit(lowered)
    # The runner exits 0 whatever main returns: read what it printed.
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mlir host: 0 failures" in result.stdout, result.stdout + result.stderr
    assert re.search(r"^0$", result.stdout, re.M), result.stdout  # main's return value
    assert "failed" not in result.stdout


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
    result = jit(lower(src, tmp_path / "broken.llvm.mlir"), env_clean=False)
    assert "mlir host: check 17 failed" in result.stdout, result.stdout + result.stderr
    assert "mlir host: 1 failures" in result.stdout
