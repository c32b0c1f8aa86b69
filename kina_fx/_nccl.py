"""CuPy arrays through NCCL (``cupy.cuda.nccl``), for :class:`kina_fx.collectives.MPIGroup`
with ``cupy="nccl"``.

The NCCL communicator is made from the MPI one: rank 0 draws the unique id,
MPI broadcasts it, every rank joins.  Each process must use its own GPU (NCCL
refuses two ranks on one device): select it before the first collective, e.g.
``cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()``.
Calls are enqueued on the current stream; the wait for them is bounded by the
group's timeout (the stream is polled, NCCL's asynchronous errors are
checked, and on expiry the NCCL communicator is aborted).

Not run on a GPU in this project's CI (no device was lent when it was
written): docs/distributed.md says what was and was not checked.
"""
from __future__ import annotations

import time

import numpy as np

from .errors import CommunicationError, GpuError


class Communicator:
    """One NCCL communicator over the processes of an MPIGroup."""

    def __init__(self, group):
        from cupy.cuda import nccl

        self._nccl = nccl
        self._group = group
        uid = nccl.get_unique_id() if group.rank == 0 else None
        uid = group.comm.bcast(uid, root=0)
        self._comm = nccl.NcclCommunicator(group.size, uid, group.rank)
        # ncclCommGetAsyncError exists from NCCL 2.4 (cupy raises RuntimeError before).
        self._async_errors = nccl.get_version() >= 2400
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                       np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int64): nccl.NCCL_INT64,
                       np.dtype(np.int8): nccl.NCCL_INT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
                       np.dtype(np.uint32): nccl.NCCL_UINT32, np.dtype(np.uint64): nccl.NCCL_UINT64}
        self._ops = {"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "max": nccl.NCCL_MAX,
                     "min": nccl.NCCL_MIN}

    def _flat(self, x):
        """(contiguous array, its NCCL type, element count): complex as pairs of reals."""
        x = x if x.flags.c_contiguous else x.copy(order="C")
        if x.dtype.kind == "c":
            x = x.view(x.real.dtype)
        if x.dtype not in self._types:
            raise GpuError(f"NCCL has no type for {x.dtype}")
        return x, self._types[x.dtype], x.size

    def _wait(self, stream, what):
        timeout = self._group.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while not stream.done:
            if self._async_errors:
                try:
                    self._comm.check_async_error()
                except self._nccl.NcclError as exc:
                    self._group._fail(f"{what}: NCCL error: {exc}")
            if deadline is not None and time.monotonic() > deadline:
                self._comm.abort()
                self._group._fail(f"{what} on rank {self._group.rank} of {self._group.size}: "
                                  f"NCCL did not complete it within {timeout:g} s")
            time.sleep(1e-5)

    def _call(self, what, fn):
        import cupy

        if self._group._failure is not None:
            raise CommunicationError(f"{what}: this group is unusable since an earlier failure "
                                     f"({self._group._failure})")
        stream = cupy.cuda.get_current_stream()
        try:
            fn(stream.ptr)
        except self._nccl.NcclError as exc:
            self._group._fail(f"{what}: NCCL error: {exc}")
        self._wait(stream, what)

    def all_reduce(self, x, op):
        import cupy

        send, kind, count = self._flat(x)
        out = cupy.empty_like(x)
        recv = out.view(send.dtype) if out.dtype.kind == "c" else out
        self._call(f"all_reduce({op!r})", lambda s: self._comm.allReduce(
            send.data.ptr, recv.data.ptr, count, kind, self._ops[op], s))
        if op == "mean":
            out /= self._group.size
        return out

    def broadcast(self, x, root):
        buf = x.copy(order="C")
        flat, kind, count = self._flat(buf)
        self._call(f"broadcast(root={root})", lambda s: self._comm.bcast(
            flat.data.ptr, count, kind, root, s))
        return buf

    def all_gather(self, x):
        import cupy

        send, kind, count = self._flat(x)
        out = cupy.empty((self._group.size,) + tuple(x.shape), dtype=x.dtype)
        recv = out.view(send.dtype) if out.dtype.kind == "c" else out
        self._call("all_gather", lambda s: self._comm.allGather(
            send.data.ptr, recv.data.ptr, count, kind, s))
        return out

    def reduce_scatter(self, x, op):
        import cupy

        send, kind, count = self._flat(x)
        out = cupy.empty(tuple(x.shape[1:]), dtype=x.dtype)
        recv = out.view(send.dtype) if out.dtype.kind == "c" else out
        self._call(f"reduce_scatter({op!r})", lambda s: self._comm.reduceScatter(
            send.data.ptr, recv.data.ptr, count // self._group.size, kind, self._nccl.NCCL_SUM, s))
        if op == "mean":
            out /= self._group.size
        return out
