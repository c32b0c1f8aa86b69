"""Whether MPI can run here: ``mpiexec`` and mpi4py (both from ``pip install 'kina_fx[mpi]'``)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Optional


def mpiexec_path() -> Optional[str]:
    """The ``mpiexec`` next to this interpreter (MPICH's, from the ``mpi`` extra), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def have_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpiexec_or_skip() -> str:
    """:func:`mpiexec_path`, skipping the test (a failure under ``CI=true``) where MPI cannot run."""
    import pytest

    path = mpiexec_path()
    if path is None or not have_mpi4py():
        pytest.skip("needs mpi4py and mpiexec: pip install 'kina_fx[mpi]'")
    return path


def run_in_a_clean_environment(n: int, argv, timeout: float = 150, **env: str):
    """``argv`` under ``mpiexec -n n`` with only PATH (and ``env``) set: a host
    finds everything through its own arguments.  No stdin: mpiexec would forward
    its own to rank 0."""
    import os
    import subprocess

    mpiexec = mpiexec_or_skip()
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    extra = [f"{k}={v}" for k, v in env.items()]
    return subprocess.run(["env", "-i", f"PATH={path}", *extra, mpiexec, "-n", str(n), *map(str, argv)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
