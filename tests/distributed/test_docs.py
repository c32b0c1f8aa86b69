"""docs/distributed.md's ```python blocks run as written, in order: on one process,
and on two (``KINA_FX_DISTRIBUTED=mpi mpiexec -n 2``, the process group made
from the environment), where every process must reach the end."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.mpi import mpiexec_or_skip

PAGE = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    assert len(blocks) >= 4
    path = tmp_path_factory.mktemp("docs") / "distributed_page.py"
    # Each process also leaves a file of its own: mpiexec interleaves the ranks' stdout.
    path.write_text("\n".join(blocks) + "\nimport os as _os, pathlib as _pathlib\n"
                    "_line = f'page ran on rank {dist.rank()} of {dist.world_size()}'\n"
                    "print(_line)\n"
                    "if 'PAGE_OUT' in _os.environ:\n"
                    "    (_pathlib.Path(_os.environ['PAGE_OUT']) / f'rank{dist.rank()}').write_text(_line)\n")
    return path


def test_the_page_runs_on_one_process(script):
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "page ran on rank 0 of 1" in result.stdout


@pytest.mark.integration
def test_the_page_runs_on_two_processes(script, tmp_path):
    mpiexec = mpiexec_or_skip()
    env = dict(os.environ, KINA_FX_DISTRIBUTED="mpi", KINA_FX_DIST_TIMEOUT="60", PAGE_OUT=str(tmp_path))
    result = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script)], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    for r in range(2):
        marker = tmp_path / f"rank{r}"
        assert marker.exists(), result.stdout + result.stderr
        assert marker.read_text() == f"page ran on rank {r} of 2"
