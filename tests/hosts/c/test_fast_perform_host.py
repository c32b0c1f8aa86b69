"""kina_perform answered by C handlers, from a pure C host
(tests/hosts/c/fast_perform_host.c), run with env -i: with the compiled
implementation through its fast path (kina_fast_perform), with the pure-Python
one through Python."""
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
def test_fast_perform_host(tmp_path):
    exe = tmp_path / "fast_perform_host"
    subprocess.run([GCC, "-O2", "-Wall", "-Werror", str(HERE / "fast_perform_host.c"),
                    *kina_fx_config("--cflags", "--libs"), "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = run_clean([exe], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checks passed" in result.stdout and "FAIL" not in result.stdout
    assert result.stderr == ""
