"""Launching tests/distributed/dist_worker.py under ``mpiexec -n N`` (the ``mpirun`` fixture).

``mpiexec`` is the one next to this interpreter (``pip install 'kina_fx[mpi]'``
puts MPICH's there; ``make test`` installs it), else the one on PATH.  Without
it, or without mpi4py, the tests skip -- which fails the run under ``CI=true``
(they are integration tests).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.mpi import mpiexec_or_skip

HERE = Path(__file__).parent
WORKER = HERE / "dist_worker.py"


class Launch:
    """One ``mpiexec -n N python dist_worker.py CASE OUT ARGS`` run and what each rank saved."""

    def __init__(self, n, case, out, result):
        self.n, self.case, self.out, self.result = n, case, out, result

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr

    def ranks(self):
        """Every rank's saved results (a dict per rank, in rank order)."""
        assert self.result.returncode == 0, f"mpiexec -n {self.n} {self.case} failed:\n{self.output}"
        files = [self.out / f"{self.case}.{r}.npz" for r in range(self.n)]
        missing = [f.name for f in files if not f.exists()]
        assert not missing, f"ranks saved nothing: {missing}\n{self.output}"
        return [dict(np.load(f)) for f in files]


@pytest.fixture
def mpirun(tmp_path):
    """``mpirun(n, case, *args, timeout=..., env=...)`` -> :class:`Launch`."""
    mpiexec = mpiexec_or_skip()

    def run(n, case, *args, timeout=150, env=None):
        environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        environment.update(env or {})
        cmd = [mpiexec, "-n", str(n), sys.executable, str(WORKER), case, str(tmp_path), *map(str, args)]
        # A session of its own, so that a job that hangs is killed whole (mpiexec and every rank).
        # No stdin: MPICH's mpiexec forwards its own to rank 0.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=environment, cwd=str(HERE), start_new_session=True)
        start = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"mpiexec -n {n} {case} {args} still ran after {timeout} s (killed):\n"
                        f"{stdout}{stderr}")
        result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        launch = Launch(n, case, tmp_path, result)
        launch.seconds = time.monotonic() - start
        return launch
    return run
