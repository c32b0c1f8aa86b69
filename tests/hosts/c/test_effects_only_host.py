"""A pure C host that uses only the effects ABI (tests/hosts/c/effects_only_host.c),
run with env -i under both implementations: NumPy is not imported until its
first memref call, which then works.  (Its first-call time is a benchmark,
benches/bench_effects_abi.py, not a test threshold.)"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support.hosts import kina_fx_config, run_clean

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration
GCC = shutil.which("gcc")


@pytest.mark.skipif(GCC is None, reason="gcc is not installed")
def test_numpy_is_imported_by_the_first_memref_call_only(tmp_path):
    exe = tmp_path / "effects_only_host"
    subprocess.run([GCC, "-O2", "-Wall", "-Werror", str(HERE / "effects_only_host.c"),
                    *kina_fx_config("--cflags", "--libs"), "-ldl", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = run_clean([exe], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "numpy_before_memref 0" in result.stdout and "numpy_after_memref 1" in result.stdout
    assert "checks passed, 0 failed" in result.stdout and "FAIL" not in result.stdout
    assert result.stderr == ""
