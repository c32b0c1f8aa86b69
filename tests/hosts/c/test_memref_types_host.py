"""kina_fx.h's fixed-rank descriptors (kina_memref_f32_2d_t, KINA_MEMREF_TYPEDEF,
kina_unranked) in a C host built with -std=c11 -pedantic; results against NumPy."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kina_fx
from kina_fx.errors import Status
from support.hosts import run_clean

HERE = Path(__file__).parent
GCC = shutil.which("gcc")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(GCC is None, reason="gcc is not installed")]


def _results(stdout: str) -> dict[str, list[float]]:
    out = {}
    for line in stdout.splitlines():
        name, _, values = line.partition(":")
        out[name] = values.split()
    return out


def test_fixed_rank_descriptors_against_numpy(tmp_path):
    libdir = str(Path(kina_fx.get_library()).parent)
    exe = tmp_path / "memref_types_host"
    subprocess.run([GCC, "-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror",
                    str(HERE / "memref_types_host.c"), f"-I{kina_fx.get_include()}",
                    f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = run_clean([exe])
    assert result.returncode == 0, result.stdout + result.stderr
    got = _results(result.stdout)

    a = (0.5 * np.arange(6, dtype=np.float32) - 1).reshape(2, 3)
    b = (0.25 * np.arange(6, dtype=np.float32) ** 2 - 2).reshape(2, 3).T
    np.testing.assert_allclose(np.float32(got["matmul"]), (a @ b).ravel(), rtol=1e-6)

    values = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(np.float32(got["gather"]), values[[2, 0]].ravel())

    x = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    e = np.exp(x - x.max())
    np.testing.assert_allclose(np.float32(got["softmax"]), e / e.sum(), rtol=1e-6)

    halves = np.array([1.0, -2.5, 65504.0], np.float16).view(np.uint16)
    assert [int(v) for v in got["copy_f16"]] == halves.tolist()
    assert got["copy_0d"] == ["3.5"]
    assert got["bad_rank"] == [str(int(Status.VALIDATION))]
