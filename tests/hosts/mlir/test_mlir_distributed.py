"""distributed.mlir: an MLIR program calling the collective exports under mpiexec.

Ahead of time (clang-19, linked against libkina_fx.so) under ``mpiexec -n 2`` and
``-n 4``, and under mlir-cpu-runner-19's JIT with ``-n 2``.  Each process checks
its own results; the test reads every rank's line.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.mpi import run_in_a_clean_environment as run_ranks
from mlir_tools import TOOLS, compile_object, kina_fx_config, link_executable, lower, skip_unless_tools

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    skip_unless_tools()
    return lower(HERE / "distributed.mlir", tmp_path_factory.mktemp("mlir-dist") / "distributed.llvm.mlir")


def _check(result, n):
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(re.findall(r"mlir distributed rank (\d+) of (\d+): (\d+) failures", result.stdout))
    assert lines == sorted((str(r), str(n), "0") for r in range(n)), result.stdout + result.stderr
    assert "failed" not in result.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_ahead_of_time_under_mpiexec(lowered, tmp_path, n):
    exe = link_executable(compile_object(lowered, tmp_path / "distributed.o"), tmp_path / "distributed")
    _check(run_ranks(n, [exe]), n)


def test_under_the_jit_under_mpiexec(lowered):
    (library,) = kina_fx_config("--library")
    result = run_ranks(2, [TOOLS["mlir-cpu-runner-19"], "-e", "main", "-entry-point-result=i32",
                           f"-shared-libs={library}", lowered])
    _check(result, 2)
    assert re.findall(r"^0$", result.stdout, re.M) == ["0", "0"], result.stdout   # main's results


def test_the_checks_can_fail(lowered, tmp_path):
    """A program expecting a wrong sum reports it (and returns non-zero)."""
    text = (HERE / "distributed.mlir").read_text()
    broken = text.replace("%half = arith.constant 0.5 : f32", "%half = arith.constant 0.75 : f32", 1)
    assert broken != text
    src = tmp_path / "broken.mlir"
    src.write_text(broken)
    exe = link_executable(compile_object(lower(src, tmp_path / "broken.llvm.mlir"), tmp_path / "b.o"),
                          tmp_path / "broken")
    result = run_ranks(2, [exe])
    assert "check 10 failed" in result.stdout or "check 20 failed" in result.stdout, result.stdout
    assert re.search(r"rank 0 of 2: [1-9]\d* failures", result.stdout)
