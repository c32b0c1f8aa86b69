"""The Python side of the runtime ops' C exports, one callback per row of the op table.

Each ``_mlir_ciface_runtime_*`` export calls the callback built here for its
row of :data:`kina_fx.runtime_ops.RUNTIME_OPS` (its row of the export table,
:mod:`kina_fx.ffi.exports`, names it).
The callback only translates: memref descriptors become NumPy (CuPy) views,
then it performs the op's effect with those views and the ``int32_t``
parameters.  The effect's default runs the kernel; a tape answers it instead
(:mod:`kina_fx.autograd.memory`).  Exceptions become status codes in
:mod:`kina_fx.ffi`, which attaches these callbacks.
"""
from __future__ import annotations

import numpy as np

from .. import gpu_ops, memref
from ..errors import ValidationError
from ..handlers import perform
from ..runtime_ops import RUNTIME_OPS
from .exports import op_callback

F32, F16, I64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)

# Memoised descriptor -> view caches of the CPU path, one per dtype and role.
_VIEWS = {(dt, out): memref.ViewCache(dt, out) for dt in (F32, F16, I64) for out in (False, True)}


def check_device_ordinal(ordinal: int) -> None:
    """ValidationError unless ``ordinal`` names a device of the selected backend."""
    count = 1
    if gpu_ops.device() == "cuda":
        count = gpu_ops.cupy_module().cuda.runtime.getDeviceCount()
    if not 0 <= ordinal < count:
        raise ValidationError(f"device {ordinal} out of range: {count} device(s) "
                              f"on the {gpu_ops.device()} backend")


class Operands:
    """Arrays for one call's memrefs on the selected backend.

    CPU: zero-copy NumPy views (memoised, :class:`memref.ViewCache`).
    CUDA: zero-copy CuPy views of device/managed memory; host memory the device
    cannot address is staged (copied to the device), and staged outputs are
    written back by :meth:`finish`.  :meth:`get` stages at once; an op's
    callback takes :meth:`unstaged` views and stages them with
    :meth:`validated`, after checking the call: a call refused by validation
    copies nothing (docs/abi.md, "Check order").

    The views are the caller's memory itself, overlaps included: a handler
    of the op's effect (a tape) must see the buffers the caller passed, and
    the effect's default gives the kernel memmove semantics
    (:mod:`kina_fx.runtime_ops`).
    """

    __slots__ = ("xp", "_write_backs", "_staged", "_host")

    def __init__(self):
        self.xp = gpu_ops.backend()
        self._write_backs = []
        self._staged = []
        self._host = {}         # id of an unstaged host view -> (view, is it an output)

    def get(self, ptr, dtype, name, output=False):
        return self._stage(self.unstaged(ptr, dtype, name, output))

    def unstaged(self, ptr, dtype, name, output=False):
        """The operand's view; on CUDA, host memory as a NumPy view, not yet staged."""
        if self.xp is np:
            return _VIEWS[(dtype, output)].view(ptr, name)
        d = memref.read_descriptor(ptr, name)
        if output:
            memref.check_output_layout(d, name)
        arr = memref.cupy_view(d, dtype, self.xp, name)
        if arr is None:
            arr = memref.numpy_view(d, dtype, name)
            self._host[id(arr)] = (arr, output)
        return arr

    def validated(self, op, arrays, params):
        """``arrays`` with host memory staged, once runtime op ``op``'s call is
        checked (nothing to stage: the op's kernel or a tape checks it)."""
        if not self._host:
            return arrays
        op.check_output(arrays[0], *arrays[1:], *params)
        return [self._stage(a) for a in arrays]

    def _stage(self, arr):
        host = self._host.pop(id(arr), None)
        if host is None:
            return arr
        dev, write_back = memref.stage(arr, self.xp)
        self._staged.append(dev)
        if host[1]:
            self._write_backs.append(write_back)
        return dev

    def finish(self):
        """Make the results visible to the host: synchronise, write staged outputs back."""
        gpu_ops.synchronize(self.xp)
        for write_back in self._write_backs:
            write_back()

    def release(self):
        """Forget the staged copies (after the call, whether it succeeded or not)."""
        memref.release_staged(self._staged)
        self._staged.clear()
        self._host.clear()


def _make_callback(op):
    effect = op.effect
    roles = tuple((o.dtype, i == 0, o.name) for i, o in enumerate(op.operands))
    n = len(roles)
    check_device = "device" in op.params
    device_index = op.params.index("device") if check_device else -1
    device = gpu_ops.device

    def call(*args):
        params = args[n:]
        ops = Operands()
        try:
            # Check order (docs/abi.md): the memrefs, in parameter order, then
            # the rest, then the call (shapes); only then staging copies.
            arrays = [ops.unstaged(p, dt, name, out) for p, (dt, out, name) in zip(args, roles)]
            if check_device:
                check_device_ordinal(params[device_index])
            perform(effect, *ops.validated(op, arrays, params), *params)
            ops.finish()
        finally:
            ops.release()
        return 0

    if n == 3 and not op.params:
        # The hottest shape (matmul, the binary ops): no varargs, cached views.
        (d0, _, n0), (d1, _, n1), (d2, _, n2) = roles
        out_view, in1_view, in2_view = _VIEWS[(d0, True)].view, _VIEWS[(d1, False)].view, _VIEWS[(d2, False)].view

        def callback(out, a, b):
            if device() == "cpu":
                perform(effect, out_view(out, n0), in1_view(a, n1), in2_view(b, n2))
                return 0
            return call(out, a, b)
    else:
        callback = call
    callback.__name__ = callback.__qualname__ = op_callback(op)
    callback.__doc__ = f"The callback of {op.export}: {op.doc}."
    return callback


#: Callback name -> function, for :func:`kina_fx.ffi.attach` (floating-point
#: conditions quiet: docs/abi.md).
CALLBACKS = {op_callback(op): gpu_ops.quiet_fp(_make_callback(op)) for op in RUNTIME_OPS}


def _cpu_selected() -> bool:
    return gpu_ops.device() == "cpu"


def _direct_call(op):
    """What the fast path needs to call ``op.direct`` itself, or None:
    ``(the effect's default, op.direct, np.ndarray, {}, op.calls_direct)``.
    The dict, filled by the C code, holds the operands' shapes that
    ``calls_direct`` admitted; the default is compared by identity, so an
    effect given another default never takes the direct call."""
    if op.direct is None or op.params:
        return None
    return (op.effect.default, op.direct, np.ndarray, {}, op.calls_direct)


# What the C fast path of the op exports (kina_fx/_speedups_c/op_calls.c)
# reads, with the compiled implementation: what the callbacks above do on the
# CPU backend.  Per row of the op table, its effect, the ViewCache dict of
# each memref operand and its direct call (None: rows with a device ordinal
# to check stay on the callbacks); and perform with quiet floating-point
# conditions, which C uses only where it cannot set them itself through
# gpu_ops.QUIET_FP_CONTEXT (NumPy 1.x).
FAST_ROWS = tuple(None if "device" in op.params else
                  (op.effect, tuple(_VIEWS[(o.dtype, i == 0)].views for i, o in enumerate(op.operands)),
                   _direct_call(op))
                  for op in RUNTIME_OPS)
_fast_perform = gpu_ops.quiet_fp(perform)
# Row index -> the operands of that op's last direct call: (their ranks and
# descriptors' bytes, then their views), filled by op_calls.c; emptied with
# the view caches.  FAST_LAST_VIEWS: the same for its last call through the
# effect (a tape answering it), which saves the calls of a taped training
# loop the view-cache lookups.
FAST_LAST_DIRECT: dict = {}
FAST_LAST_VIEWS: dict = {}
memref.register_cache(FAST_LAST_DIRECT)
memref.register_cache(FAST_LAST_VIEWS)
