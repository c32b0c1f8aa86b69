"""kina_fx.distributed: collectives are effects, so one program runs on one process or on many.

::

    from kina_fx import distributed as dist

    with dist.mpi():                        # mpiexec -n 4 python train.py
        x = shard_of_the_data(dist.rank(), dist.world_size())
        loss, grads = ad.value_and_grad(local_loss)(params, x)
        grads = dist.all_reduce_tree(grads, "sum")     # the DDP step

Without ``dist.mpi()`` (or another group) every collective answers as the
single process it is (world size 1), so the same program runs unchanged under
``python`` and under ``mpiexec``.  The collectives take NumPy arrays, CuPy
arrays and :class:`kina_fx.autograd.Tensor` objects (they are differentiable:
:mod:`kina_fx.autograd.ops_collective` has the rules); ``docs/distributed.md``
is the guide: the model, the derivative rules, the replicated-parameter
gradient, launching, faults, GPUs and measured figures.

The optional extra ``kina_fx[mpi]`` installs mpi4py and MPICH.
"""
from __future__ import annotations

import math
from typing import Any

from . import autograd as ad
from .autograd.ops_collective import all_gather, all_reduce, broadcast, reduce_scatter
from .autograd.pytree import flatten
from .autograd.tensor import _raw
from .collectives import (DEFAULT_TIMEOUT, GROUP, OPS, SINGLE, Group, MPIGroup, SingleProcess,
                          current_group, install_process_group, mpi, process_group, scope)
from .errors import CommunicationError
from .gpu_ops import array_module

__all__ = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "rank",
           "world_size", "all_reduce_tree", "shard", "mpi", "scope", "Group", "SingleProcess",
           "MPIGroup", "SINGLE", "GROUP", "OPS", "DEFAULT_TIMEOUT", "CommunicationError",
           "current_group", "install_process_group", "process_group"]


def rank() -> int:
    """This process's rank in the group in scope (0 on a single process)."""
    return current_group().rank


def world_size() -> int:
    """The number of processes in the group in scope (1 on a single process)."""
    return current_group().size


def barrier() -> None:
    """Wait until every process of the group in scope has called ``barrier()``."""
    current_group().barrier()


def all_reduce_tree(tree: Any, op: str = "sum", group: Group | None = None) -> Any:
    """:func:`all_reduce` of every leaf of a pytree (dicts, lists, tuples of
    arrays or Tensors) in one collective per dtype: the leaves are flattened
    into one buffer, reduced, and cut back.  Same structure out; Tensors in
    give Tensors out (differentiable), arrays give arrays (views of the
    reduced buffer)."""
    group = current_group() if group is None else group
    leaves, rebuild = flatten(tree)
    values = [_raw(leaf) for leaf in leaves]
    traced = any(isinstance(leaf, ad.Tensor) for leaf in leaves)
    buckets: dict = {}
    for i, value in enumerate(values):
        buckets.setdefault(getattr(value, "dtype", type(value)), []).append(i)
    out = list(leaves)
    for indices in buckets.values():
        if traced:
            parts = [ad.reshape(leaves[i], (-1,)) for i in indices]
            flat = parts[0] if len(parts) == 1 else ad.concatenate(parts, 0)
        else:
            xp = array_module(*[values[i] for i in indices])
            flat = xp.concatenate([xp.ravel(values[i]) for i in indices])
        reduced = all_reduce(flat, op, group)
        start = 0
        for i in indices:
            shape = tuple(getattr(values[i], "shape", ()))
            size = math.prod(shape)
            piece = reduced[start:start + size]
            out[i] = ad.reshape(piece, shape) if traced else piece.reshape(shape)
            start += size
    return rebuild(out)


def shard(x: Any, axis: int = 0, group: Group | None = None) -> Any:
    """This process's part of ``x`` along ``axis``: ``numpy.array_split``'s
    ``rank``-th piece (sizes differ by at most one; a piece may be empty)."""
    group = current_group() if group is None else group
    n = x.shape[axis]
    base, extra = divmod(n, group.size)
    start = group.rank * base + min(group.rank, extra)
    stop = start + base + (1 if group.rank < extra else 0)
    index = [slice(None)] * len(x.shape)
    index[axis] = slice(start, stop)
    return x[tuple(index)]
