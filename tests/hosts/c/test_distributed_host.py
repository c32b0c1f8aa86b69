"""distributed_host.c: a C host calling the collective and kina_distributed_* exports under mpiexec.

Built with ``kina-fx config --cflags --libs`` and run with a clean environment
(only PATH, for mpiexec's own helpers): MPI made the process group by
``kina_distributed_init(0)`` (``-n 2``, ``-n 4``) or by ``KINA_FX_DISTRIBUTED=mpi``;
a rank that never joins gives the others status 2 with kina_last_error, and
``kina_distributed_abort`` then ends the job with its code.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.mpi import run_in_a_clean_environment as run_ranks

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration


def kina_fx_config(*flags):
    script = Path(sys.executable).parent / "kina-fx"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kina_fx.cli"]
    return subprocess.run(cmd + ["config", *flags], check=True, capture_output=True, text=True).stdout.split()


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    exe = tmp_path_factory.mktemp("dist-host") / "distributed_host"
    subprocess.run([gcc, "-O2", "-Wall", "-Werror", str(HERE / "distributed_host.c"), f"-I{HERE}",
                    *kina_fx_config("--cflags", "--libs"), "-lm", "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def _all_passed(result, n):
    assert result.returncode == 0, result.stdout + result.stderr
    found = sorted(re.findall(r"distributed host rank (\d+) of (\d+): (\d+) checks, (\d+) failures",
                              result.stdout))
    assert [(r, s, f) for r, s, _, f in found] == sorted((str(r), str(n), "0") for r in range(n)), \
        result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("n", [2, 4])
def test_kina_distributed_init(host, n):
    _all_passed(run_ranks(n, [host]), n)


def test_the_environment_variable(host):
    _all_passed(run_ranks(2, [host, "env"], KINA_FX_DISTRIBUTED="mpi"), 2)


def test_a_rank_that_never_joins_is_status_2_then_abort(host):
    result = run_ranks(2, [host, "hang"], KINA_FX_DIST_TIMEOUT="2")
    assert "rank 0: all_reduce status 2: CommunicationError: all_reduce on rank 0 of 2: the other " \
           "processes did not complete it within 2 s" in result.stdout, result.stdout + result.stderr
    assert "rank 0 of 2 aborts the job: kina_distributed_abort(3) was called there" in result.stderr
    assert result.returncode == 3
