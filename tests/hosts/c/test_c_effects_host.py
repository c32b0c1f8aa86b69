"""The effects C ABI driven by a pure C host (tests/hosts/c/effects_host.c), run with env -i."""
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
def test_effects_host(tmp_path):
    exe = tmp_path / "effects_host"
    subprocess.run([GCC, "-O2", "-Wall", "-Werror", str(HERE / "effects_host.c"),
                    *kina_fx_config("--cflags", "--libs"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = run_clean([exe])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checks passed" in result.stdout and "FAIL" not in result.stdout
    assert result.stderr == ""
