"""The Python side of the distributed exports (``kina_distributed_*``).

A C host makes MPI the process group with ``kina_distributed_init(0)`` (or by
running with ``KINA_FX_DISTRIBUTED=mpi``): from then on the collective exports
(``_mlir_ciface_runtime_all_reduce_f32``, ``..._broadcast_f32``) and the
queries below run on ``MPI_COMM_WORLD``, unless a Python caller installed
another group around the call (``with dist.mpi(...)``), which wins as any
handler does.  ``kina_distributed_finalize()`` ends MPI (call it on every
process before exiting: the embedded interpreter never runs Python's exit
hooks, and MPICH's ``mpiexec`` ends the whole job when one process exits
without finalizing).  docs/distributed.md, "From C and MLIR".
"""
from __future__ import annotations

from .. import collectives
from ..errors import ValidationError


def _require(pointer, name):
    if not pointer:
        raise ValidationError(f"{name} is NULL")


def kina_py_distributed_init(flags):
    if flags != 0:
        raise ValidationError(f"kina_distributed_init: unknown flags {flags} (0 is the only one)")
    collectives.install_process_group(collectives.MPIGroup())
    return 0


def kina_py_distributed_finalize():
    collectives.finalize_mpi()
    return 0


def kina_py_distributed_rank(out_rank):
    _require(out_rank, "out_rank")
    out_rank[0] = collectives.current_group().rank
    return 0


def kina_py_distributed_size(out_size):
    _require(out_size, "out_size")
    out_size[0] = collectives.current_group().size
    return 0


def kina_py_distributed_barrier():
    collectives.current_group().barrier()
    return 0


def kina_py_distributed_abort(code):
    collectives.current_group().abort(collectives.AbortRequest(int(code)))
    return 0


CALLBACKS = {name: fn for name, fn in globals().items() if name.startswith("kina_py_")}

