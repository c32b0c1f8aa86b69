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
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.mpi import mpiexec_or_skip

HERE = Path(__file__).parent
WORKER = HERE / "dist_worker.py"


#: What MPICH's mpiexec (hydra) prints when its own bookkeeping fails: a race in
#: the launcher (pmodels/mpich #1455, #1820) after which it may no longer end the
#: other ranks of a job one rank aborted.  A launch that shows it is run again.
LAUNCHER_FAILURE = "assert (!closed) failed"
LAUNCH_TRIES = 3


class Launch:
    """One ``mpiexec -n N python dist_worker.py CASE OUT ARGS`` run and what each rank saved.

    ``seconds`` is how long the job took; ``seen(text)`` how long after its start
    a line holding ``text`` came out (stdout or stderr), or None."""

    def __init__(self, n, case, out, result, seconds, lines):
        self.n, self.case, self.out, self.result = n, case, out, result
        self.seconds, self._lines = seconds, lines

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr

    def seen(self, text):
        return min((t for t, line in self._lines if text in line), default=None)

    def ranks(self):
        """Every rank's saved results (a dict per rank, in rank order)."""
        assert self.result.returncode == 0, f"mpiexec -n {self.n} {self.case} failed:\n{self.output}"
        files = [self.out / f"{self.case}.{r}.npz" for r in range(self.n)]
        missing = [f.name for f in files if not f.exists()]
        assert not missing, f"ranks saved nothing: {missing}\n{self.output}"
        return [dict(np.load(f)) for f in files]


def _read_lines(stream, start, lines, sink):
    for line in stream:
        lines.append((time.monotonic() - start, line))
        sink.append(line)


def _launch(cmd, environment, timeout):
    """Run ``cmd``; its result, its duration and each output line with its time."""
    # A session of its own, so that a job that hangs is killed whole (mpiexec and every rank).
    # No stdin: MPICH's mpiexec forwards its own to rank 0.
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=environment, cwd=str(HERE), start_new_session=True)
    start = time.monotonic()
    lines, out, err = [], [], []
    readers = [threading.Thread(target=_read_lines, args=(stream, start, lines, sink), daemon=True)
               for stream, sink in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = True
    else:
        killed = False
    seconds = time.monotonic() - start
    for reader in readers:
        reader.join()
    result = subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err))
    return result, seconds, lines, killed


@pytest.fixture
def mpirun(tmp_path):
    """``mpirun(n, case, *args, timeout=..., env=...)`` -> :class:`Launch`."""
    mpiexec = mpiexec_or_skip()

    def run(n, case, *args, timeout=150, env=None):
        environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        environment.update(env or {})
        cmd = [mpiexec, "-n", str(n), sys.executable, str(WORKER), case, str(tmp_path), *map(str, args)]
        for _ in range(LAUNCH_TRIES):
            result, seconds, lines, killed = _launch(cmd, environment, timeout)
            if LAUNCHER_FAILURE not in result.stderr:
                break
        if killed:
            pytest.fail(f"mpiexec -n {n} {case} {args} still ran after {timeout} s (killed):\n"
                        f"{result.stdout}{result.stderr}")
        return Launch(n, case, tmp_path, result, seconds, lines)
    return run
