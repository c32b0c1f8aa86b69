"""Collectives as effects: the process group a collective runs on, and its backends.

The model (``docs/distributed.md`` has the long version):

* Every collective finds the group it runs on by performing :data:`GROUP`
  (``Effect("kina.dist.group")``) at the call.  Its default -- what answers when
  no handler does -- is the process group: :data:`SINGLE` (one process, world
  size 1) unless the host made MPI the process group
  (:func:`install_process_group`, ``kina_distributed_init`` from C, or
  ``KINA_FX_DISTRIBUTED=mpi``).
* ``with scope(group):`` installs a handler answering :data:`GROUP` with
  ``group``; :func:`mpi` is that with an :class:`MPIGroup` over an mpi4py
  communicator.  Handlers nest: the innermost group wins.
* A :class:`Group` computes on raw arrays (NumPy, or CuPy on a GPU).  The
  differentiable collectives (:mod:`kina_fx.autograd.ops_collective`) and the
  runtime's ``all_reduce``/``broadcast`` exports (:mod:`kina_fx.runtime_ops`)
  take the group once, at the call, and keep it: a backward pass communicates
  on the group its forward pass used, wherever it runs.

Every group validates a call the same way (:meth:`Group.all_reduce` and
friends), so a program refused on one process is refused on N.  An
:class:`MPIGroup` also checks, before any payload moves, that every process
made the same call (the same collective, operation, root, dtype and shape, and
the same number of collectives before it), and bounds every wait by a timeout:
a process that died, hangs or diverged gives :class:`CommunicationError`
(status 2) on the others, never a wait without end.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import zlib
from typing import Any, Callable, Optional

import numpy as np

from . import gpu_ops
from .errors import CommunicationError, KinaTypeError, UnimplementedError, ValidationError
from .handlers import Effect, Handler, pop_handler, push_handler

__all__ = ["OPS", "GROUP", "Group", "SingleProcess", "SINGLE", "MPIGroup", "scope", "mpi",
           "current_group", "install_process_group", "process_group", "finalize_mpi",
           "AbortRequest", "DEFAULT_TIMEOUT"]

#: The reduction operations, in the order of their ABI codes (``KINA_REDUCE_SUM`` = 0,
#: ``KINA_REDUCE_MEAN`` = 1, ``KINA_REDUCE_MAX`` = 2, ``KINA_REDUCE_MIN`` = 3).
OPS = ("sum", "mean", "max", "min")

#: Performed by every collective: answers the :class:`Group` in scope.
GROUP: Effect = Effect("kina.dist.group")

#: Seconds an :class:`MPIGroup` waits for the other processes before it gives up
#: (``KINA_FX_DIST_TIMEOUT`` overrides it; ``none`` or ``0`` waits for ever).
DEFAULT_TIMEOUT = 600.0
# How long an aborting rank waits, its traceback written, before MPI_Abort (see abort).
ABORT_GRACE_SECONDS = 1.0


def current_group() -> "Group":
    """The group in scope here (performs :data:`GROUP`)."""
    return GROUP()


# ---- validation shared by every group --------------------------------------------

#: The element types every group communicates (each has an MPI type).
_DTYPES = tuple(np.dtype(c) for c in ("f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                      "c8", "c16"))
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}


def _as_array(x):
    if isinstance(x, np.ndarray):
        return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))
    cp = gpu_ops.array_module(x)
    if cp is not np:
        return x
    if isinstance(x, (bool, int, float, complex, np.generic, list, tuple)):
        return np.asarray(x)
    raise KinaTypeError(f"collectives take arrays (NumPy, CuPy) or numbers, not {type(x).__name__}")


def _check_dtype(x, op, what):
    dt = x.dtype
    if dt.kind not in "fiuc":
        raise KinaTypeError(f"{what}: arrays of {dt} cannot be communicated (numbers only)")
    if dt not in _DTYPE_CODE:
        hint = "; cast to float32" if dt.kind == "f" and dt.itemsize < 4 else ""
        raise UnimplementedError(f"{what}: {dt} has no standard MPI type{hint}")
    if op in ("max", "min") and dt.kind == "c":
        raise KinaTypeError(f"{what}: complex numbers have no {op}")
    if op == "mean" and dt.kind in "iu":
        raise KinaTypeError(f"{what}: the mean of {dt} values is not a {dt}; reduce with 'sum' "
                            "and divide by world_size()")


def check_op(op) -> str:
    """``op`` if it names a reduction (:data:`OPS`), else ValidationError."""
    if not isinstance(op, str) or op not in OPS:
        raise ValidationError(f"unknown reduction {op!r}: one of {', '.join(map(repr, OPS))}")
    return op


def op_of_code(code: int) -> str:
    """The reduction an ABI op code names (``KINA_REDUCE_*``), else ValidationError."""
    if isinstance(code, bool) or not isinstance(code, (int, np.integer)) or not 0 <= code < len(OPS):
        raise ValidationError(f"unknown reduction code {code!r}: 0 (sum), 1 (mean), 2 (max), 3 (min)")
    return OPS[int(code)]


def _check_root(root, size, what):
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise KinaTypeError(f"{what}: root must be an int, not {type(root).__name__}")
    if not 0 <= root < size:
        raise ValidationError(f"{what}: root {root} out of range [0, {size})")
    return int(root)


def _copy(x):
    return gpu_ops.array_module(x).array(x, copy=True)


class Group:
    """A set of processes that run the same program (SPMD) and communicate.

    ``rank`` (this process, ``0 <= rank < size``) and ``size`` (the world size).
    The public methods validate and return new arrays; backends implement the
    ``_``-prefixed ones on validated arrays.
    """

    rank: int = 0
    size: int = 1

    def all_reduce(self, x, op: str = "sum"):
        """``op`` (:data:`OPS`) of every process's ``x``, elementwise; same shape and dtype."""
        x = _as_array(x)
        _check_dtype(x, check_op(op), f"all_reduce({op!r})")
        return self._all_reduce(x, op)

    def broadcast(self, x, root: int = 0):
        """Process ``root``'s ``x`` on every process (every ``x`` must have its shape and dtype)."""
        x = _as_array(x)
        _check_dtype(x, None, "broadcast")
        return self._broadcast(x, _check_root(root, self.size, "broadcast"))

    def all_gather(self, x):
        """Every process's ``x`` stacked in rank order: shape ``(size, *x.shape)``."""
        x = _as_array(x)
        _check_dtype(x, None, "all_gather")
        return self._all_gather(x)

    def reduce_scatter(self, x, op: str = "sum"):
        """Row ``rank`` of the ``op`` (``sum`` or ``mean``) of every process's ``x``, whose
        leading dimension must be ``size``: the transpose of :meth:`all_gather`."""
        x = _as_array(x)
        if op not in ("sum", "mean"):
            raise ValidationError(f"reduce_scatter reduces with 'sum' or 'mean', not {op!r}")
        _check_dtype(x, op, f"reduce_scatter({op!r})")
        if x.ndim < 1 or x.shape[0] != self.size:
            raise ValidationError(f"reduce_scatter needs a leading dimension of {self.size} "
                                  f"(the world size), got shape {tuple(x.shape)}")
        return self._reduce_scatter(x, op)

    def barrier(self) -> None:
        """Return when every process has called it."""
        self._barrier()

    def abort(self, exc: BaseException) -> None:
        """End every process of the group because ``exc`` left an SPMD region here.
        Groups whose processes cannot be left waiting (world size 1) do nothing."""

    def _all_reduce(self, x, op):
        raise NotImplementedError

    def _broadcast(self, x, root):
        raise NotImplementedError

    def _all_gather(self, x):
        raise NotImplementedError

    def _reduce_scatter(self, x, op):
        raise NotImplementedError

    def _barrier(self):
        raise NotImplementedError


class SingleProcess(Group):
    """The group of this process alone (world size 1): every collective is a copy."""

    rank, size = 0, 1

    def _all_reduce(self, x, op):
        return _copy(x)

    def _broadcast(self, x, root):
        return _copy(x)

    def _all_gather(self, x):
        return _copy(x[None])

    def _reduce_scatter(self, x, op):
        return _copy(x[0])

    def _barrier(self):
        pass

    def __repr__(self):
        return "SingleProcess()"


#: The single-process group (the default when the host installs nothing).
SINGLE = SingleProcess()


# ---- MPI ---------------------------------------------------------------------------

def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise UnimplementedError("kina_fx's MPI handler needs mpi4py and an MPI library: "
                                 "pip install 'kina_fx[mpi]' (mpi4py and mpich)") from exc
    return MPI


def _timeout_from(value):
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in ("", "none", "0", "inf"):
            return None
        try:
            value = float(value)
        except ValueError:
            raise ValidationError(f"KINA_FX_DIST_TIMEOUT={value!r} is not a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ValidationError(f"timeout must be None or seconds >= 0, not {value!r}")
    return None if value == 0 or value == float("inf") else float(value)


def _default_timeout():
    return _timeout_from(os.environ.get("KINA_FX_DIST_TIMEOUT", str(DEFAULT_TIMEOUT)))


# What the processes compare before a collective moves data (MPIGroup.check):
# [sequence number, collective, op, root, dtype, ndim, 8 sides, crc of a longer shape].
_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier")
_KIND_CODE = {kind: i for i, kind in enumerate(_KINDS)}
_OP_CODE = {op: i for i, op in enumerate(OPS)}
_SIDES = 8
_SIGNATURE = 7 + _SIDES
_NO_ARRAY = [-1] * (_SIGNATURE - 4)


def _signature(seq, kind, op, root, x):
    sig = [seq, _KIND_CODE[kind], -1 if op is None else _OP_CODE[op], -1 if root is None else root]
    if x is None:
        sig += _NO_ARRAY
    else:
        shape = x.shape
        ndim = len(shape)
        sig += [_DTYPE_CODE[x.dtype], ndim]
        sig += shape[:_SIDES]
        sig += [-1] * (_SIDES - min(ndim, _SIDES))
        sig.append(zlib.crc32(repr(shape).encode()) if ndim > _SIDES else -1)
    return np.array(sig, np.int64)


def _describe(sig) -> str:
    seq, kind = int(sig[0]), _KINDS[int(sig[1])]
    args = []
    if sig[2] >= 0:
        args.append(repr(OPS[int(sig[2])]))
    if sig[3] >= 0:
        args.append(f"root={int(sig[3])}")
    text = f"{kind}({', '.join(args)})"
    if sig[4] >= 0:
        ndim = int(sig[5])
        sides = [str(int(s)) for s in sig[6:6 + min(ndim, _SIDES)]] + (["..."] if ndim > _SIDES else [])
        text += f" of {_DTYPES[int(sig[4])]} ({', '.join(sides)}{',' if ndim == 1 else ''})"
    return f"{text} as collective #{seq}"


class MPIGroup(Group):
    """The processes of an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    * ``timeout``: seconds to wait for the other processes in any collective
      (default :data:`DEFAULT_TIMEOUT`, or ``KINA_FX_DIST_TIMEOUT``); None waits
      for ever (blocking MPI calls, no polling).  On expiry: CommunicationError,
      and the group refuses every later collective (MPI may still hold the
      buffers of the abandoned call; they are kept alive).
    * ``check``: compare every process's call before moving data (one small
      all-gather per collective, polled against the timeout); a mismatch is
      ValidationError on every process, and the group refuses later
      collectives.  Once the comparison has shown every process there, the
      data moves with MPI's blocking call; without the check, the data call
      itself is the one polled against the timeout.
    * ``cupy``: how CuPy arrays travel -- ``"host"`` (copied to host memory and
      back: works with any MPI), ``"cuda_aware"`` (device pointers given to a
      CUDA-aware MPI), ``"nccl"`` (``cupy.cuda.nccl``, a NCCL communicator
      made from this one).
    """

    def __init__(self, comm: Any = None, *, timeout: Any = "default", check: bool = True,
                 cupy: str = "host"):
        MPI = _mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            raise KinaTypeError(f"MPIGroup needs an mpi4py intracommunicator, not {comm!r}")
        if comm == MPI.COMM_NULL:
            raise ValidationError("MPIGroup of MPI.COMM_NULL (this process is not in that group)")
        if cupy not in ("host", "cuda_aware", "nccl"):
            raise ValidationError(f"cupy must be 'host', 'cuda_aware' or 'nccl', not {cupy!r}")
        self._MPI = MPI
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = _default_timeout() if timeout == "default" else _timeout_from(timeout)
        self.check = bool(check)
        self.cupy = cupy
        self._seq = 0
        self._failure: Optional[str] = None
        self._stranded: list = []       # (request, buffers) MPI may still be using
        self._nccl = None
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    def __repr__(self):
        return f"<MPIGroup rank {self.rank} of {self.size}>"

    # -- waiting, with a deadline --

    def _fail(self, message):
        self._failure = message
        raise CommunicationError(message)

    def _run(self, start: Callable, what: str, buffers: tuple, blocking: Callable = None) -> None:
        """Start the nonblocking MPI call ``start`` and wait for it, at most ``timeout``
        seconds -- or make the ``blocking`` one where nothing can wait for ever:
        without a timeout, or once the call comparison (``check``) has shown every
        process here.  (MPICH's blocking collectives are also faster than its
        nonblocking ones on large messages.)"""
        if self._failure is not None:
            raise CommunicationError(f"{what}: this group is unusable since an earlier failure "
                                     f"({self._failure})")
        MPI = self._MPI
        if MPI.Is_finalized():
            raise CommunicationError(f"{what}: MPI was finalized in this process "
                                     "(kina_distributed_finalize or MPI.Finalize)")
        try:
            if blocking is not None and (self.check or self.timeout is None):
                blocking()
                return
            request = start()
            if self.timeout is None:
                request.Wait()
                return
            if request.Test():
                return
            now = time.monotonic()
            deadline, spin_until, pause = now + self.timeout, now + 2e-4, 1e-5
            while not request.Test():
                now = time.monotonic()
                if now > deadline:
                    self._stranded.append((request, buffers))
                    self._fail(f"{what} on rank {self.rank} of {self.size}: the other processes "
                               f"did not complete it within {self.timeout:g} s (one of them died, "
                               "hangs, or is in another collective)")
                if now > spin_until:      # a long wait: stop spinning, leave the CPU to others
                    time.sleep(pause)
                    pause = min(2 * pause, 1e-3)
        except MPI.Exception as exc:
            self._fail(f"{what} on rank {self.rank} of {self.size}: MPI error: {exc}")

    def _agree(self, kind, op=None, root=None, x=None) -> None:
        """Every process made this same call (``check``), or ValidationError on all of them."""
        seq = self._seq
        self._seq += 1
        if not self.check:
            return
        mine = _signature(seq, kind, op, root, x)
        every = np.empty((self.size, _SIGNATURE), np.int64)
        self._run(lambda: self.comm.Iallgather(mine, every), kind, (mine, every))
        if every.tobytes() != mine.tobytes() * self.size:
            lines = [f"rank {r}: {_describe(sig)}" for r, sig in enumerate(every)]
            message = (f"{kind}: the processes made different calls (every rank must call the "
                       "same collectives in the same order with the same shapes): "
                       + "; ".join(lines))
            self._failure = message
            raise ValidationError(message)

    # -- moving arrays --

    def _wire(self, x):
        """``(contiguous array MPI can read, function giving a result back in x's module)``."""
        if x.__class__ is np.ndarray and x.flags.c_contiguous:
            return x, _same
        xp = gpu_ops.array_module(x)
        if xp is not np and self.cupy == "host":
            x, back = x.get(), xp.asarray
        else:
            back = _same
        if not x.flags.c_contiguous:
            x = x.copy(order="C")
        if xp is not np and self.cupy != "host":
            xp.cuda.get_current_stream().synchronize()     # a CUDA-aware MPI reads it now
        return x, back

    def _nccl_for(self, x):
        if self.cupy != "nccl" or gpu_ops.array_module(x) is np:
            return None
        if self._nccl is None:
            from . import _nccl
            self._nccl = _nccl.Communicator(self)
        return self._nccl

    def _all_reduce(self, x, op):
        return self._collective("all_reduce", x, self._mpi_all_reduce, op=op)

    def _broadcast(self, x, root):
        return self._collective("broadcast", x, self._mpi_broadcast, root=root)

    def _all_gather(self, x):
        return self._collective("all_gather", x, self._mpi_all_gather)

    def _reduce_scatter(self, x, op):
        return self._collective("reduce_scatter", x, self._mpi_reduce_scatter, op=op)

    def _collective(self, kind, x, mpi, op=None, root=None):
        """The collective ``kind`` of ``x`` once every process agreed to it
        (``check``): NCCL's method of that name where it serves ``x``, else
        ``mpi(send, op, root)`` on ``x`` as MPI reads it (:meth:`_wire`)."""
        self._agree(kind, op, root, x)
        nccl = self._nccl_for(x)
        if nccl is not None:
            return getattr(nccl, kind)(x, *(a for a in (op, root) if a is not None))
        send, back = self._wire(x)
        return back(mpi(send, op, root))

    def _mpi_all_reduce(self, send, op, root):
        recv = _empty_like(send)
        mpi_op = self._ops[op]
        self._run(lambda: self.comm.Iallreduce(_buf(send), _buf(recv), mpi_op), "all_reduce",
                  (send, recv), lambda: self.comm.Allreduce(_buf(send), _buf(recv), mpi_op))
        if op == "mean":
            recv /= self.size
        return recv

    def _mpi_broadcast(self, send, op, root):
        buf = _copy(send)
        self._run(lambda: self.comm.Ibcast(_buf(buf), root), "broadcast", (buf,),
                  lambda: self.comm.Bcast(_buf(buf), root))
        return buf

    def _mpi_all_gather(self, send, op, root):
        recv = _empty_like(send, (self.size,) + tuple(send.shape))
        self._run(lambda: self.comm.Iallgather(_buf(send), _buf(recv)), "all_gather", (send, recv),
                  lambda: self.comm.Allgather(_buf(send), _buf(recv)))
        return recv

    def _mpi_reduce_scatter(self, send, op, root):
        recv = _empty_like(send, tuple(send.shape[1:]))
        self._run(lambda: self.comm.Ireduce_scatter_block(_buf(send), _buf(recv), self._MPI.SUM),
                  "reduce_scatter", (send, recv),
                  lambda: self.comm.Reduce_scatter_block(_buf(send), _buf(recv), self._MPI.SUM))
        if op == "mean":
            recv /= self.size
        return recv

    def _barrier(self):
        self._agree("barrier")
        if not self.check:      # (with check, agreeing was a barrier already)
            self._run(self.comm.Ibarrier, "barrier", (), self.comm.Barrier)

    def abort(self, exc):
        if self.size == 1:
            return
        if isinstance(exc, AbortRequest):
            why = f"kina_distributed_abort({exc.code}) was called there\n"
        else:
            why = ("an exception left the `with dist.mpi()` block there, and the other ranks "
                   "would wait for it for ever:\n"
                   + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        sys.stderr.write(f"kina_fx.distributed: rank {self.rank} of {self.size} aborts the job: {why}")
        sys.stderr.flush()
        # MPI_Abort kills the launcher's proxies at once, and a proxy killed before it
        # has read this rank's stderr pipe drops the traceback: give it time to forward.
        time.sleep(ABORT_GRACE_SECONDS)
        code = exc.code if isinstance(exc, (SystemExit, AbortRequest)) and isinstance(exc.code, int) else 1
        self.comm.Abort(code or 1)


def _same(x):
    return x


def _empty_like(x, shape=None):
    xp = np if x.__class__ is np.ndarray else gpu_ops.array_module(x)
    return xp.empty(x.shape if shape is None else shape, dtype=x.dtype)


def _buf(x):
    """The buffer mpi4py reads: 0-d arrays as one element (mpi4py wants at least 1-d)."""
    return x.reshape(-1) if x.ndim == 0 else x


# ---- which group answers -------------------------------------------------------------

_process_group: Optional[Group] = None
_process_lock = threading.Lock()
_installed = threading.local()      # .depth: group handlers installed on this thread


def install_process_group(group: Optional[Group]) -> None:
    """Make ``group`` the process group: what :data:`GROUP` answers where no
    handler does (None: back to ``KINA_FX_DISTRIBUTED``, else :data:`SINGLE`)."""
    global _process_group
    if group is not None and not isinstance(group, Group):
        raise KinaTypeError(f"install_process_group needs a Group, not {group!r}")
    with _process_lock:
        _process_group = group


def process_group() -> Group:
    """The process group (:func:`install_process_group`; else ``KINA_FX_DISTRIBUTED=mpi``
    makes it an MPIGroup of ``MPI.COMM_WORLD`` on first use; else :data:`SINGLE`)."""
    global _process_group
    group = _process_group
    if group is not None:
        return group
    want = os.environ.get("KINA_FX_DISTRIBUTED", "").strip().lower()
    if want in ("", "none", "single"):
        return SINGLE
    if want != "mpi":
        raise ValidationError(f"KINA_FX_DISTRIBUTED={want!r}: use 'mpi' (or leave it unset)")
    with _process_lock:
        if _process_group is None:
            _process_group = MPIGroup()
        return _process_group


def finalize_mpi() -> None:
    """End MPI in this process (every process of the job calls it, as MPI_Finalize);
    from then on the process group is :data:`SINGLE`.  Nothing to do if MPI was
    never started here."""
    global _process_group
    with _process_lock:
        _process_group = SINGLE
    if "mpi4py.MPI" not in sys.modules:
        return
    MPI = _mpi()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


class AbortRequest(Exception):
    """What :meth:`Group.abort` is given when a host asks for the abort itself
    (``kina_distributed_abort(code)``): ``code`` is the exit status."""

    def __init__(self, code: int):
        super().__init__(f"abort requested with code {code}")
        self.code = code


def _default_group():
    # Reached when no handler in scope answered.  If this thread has a group
    # handler installed all the same, the search skipped it: the collective is
    # inside the clause of a handler installed outside the group's (a tape over
    # memory, a logging handler that re-performs), or in a fiber that is not
    # under it.  Answering the process group there would silently compute
    # something else than the program says.
    if getattr(_installed, "depth", 0):
        raise ValidationError(
            "a collective ran where the group installed on this thread (with dist.mpi() or "
            "dist.scope()) is not in scope: inside the clause of a handler installed outside "
            "that `with` block (install the group outside every tape and handler that "
            "re-performs), or in a fiber not started under it")
    return process_group()


setattr(GROUP, "default", _default_group)


class scope:
    """``with scope(group):`` -- collectives in the block run on ``group``.

    Installs a handler answering :data:`GROUP` (``fun`` clause, in place).
    ``abort_on_error``: when an exception leaves the block on a process of a
    group of several, end every process of the group (:meth:`Group.abort`)
    rather than leave the others waiting in their next collective."""

    def __init__(self, group: Group, *, abort_on_error: bool = False):
        if not isinstance(group, Group):
            raise KinaTypeError(f"scope needs a Group, not {group!r}")
        self.group = group
        self.abort_on_error = bool(abort_on_error)
        self._handler = Handler(fun={GROUP: lambda: group})

    def __enter__(self) -> Group:
        push_handler(self._handler)
        _installed.depth = getattr(_installed, "depth", 0) + 1
        return self.group

    def __exit__(self, exc_type, exc, tb) -> bool:
        _installed.depth -= 1
        pop_handler(self._handler)
        if exc is not None and self.abort_on_error and isinstance(
                exc, (Exception, SystemExit, KeyboardInterrupt)):
            self.group.abort(exc)
        return False


def mpi(comm: Any = None, *, timeout: Any = "default", check: bool = True, cupy: str = "host",
        abort_on_error: bool = True) -> scope:
    """``with mpi(comm=None):`` -- collectives in the block run on the processes of
    ``comm`` (``MPI.COMM_WORLD`` by default); see :class:`MPIGroup` for the
    options.  An exception leaving the block aborts the job (``abort_on_error``)."""
    return scope(MPIGroup(comm, timeout=timeout, check=check, cupy=cupy),
                 abort_on_error=abort_on_error)
