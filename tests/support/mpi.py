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
