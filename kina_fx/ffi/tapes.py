"""The Python side of the tape ABI (``kina_tape_*``; their rows: :mod:`kina_fx.ffi.exports`).

Only translation: handles become :class:`kina_fx.autograd.memory.MemoryTape`
objects (generation-tagged, like fiber handles: a stale or freed handle is
status 1), memref descriptors become views, ``KINA_DTYPE_*`` codes become
dtypes.  :mod:`kina_fx.ffi` attaches these callbacks with its error
translation.  The ``kina_py_mlir_*`` callbacks serve the
``_mlir_ciface_kina_tape_*`` exports, the same functions in the form MLIR's
``llvm.emit_c_interface`` calls (the handle as an ``i64``, the element type in
the name).
"""
from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..gpu_ops import quiet_fp
from .effects import HandleTable
from .ops import Operands
from ..autograd.memory import MemoryTape, dtype_of_code

TAPE_KIND = 3
KINA_TAPE_STRICT, KINA_TAPE_LENIENT = 0, 1
F32, I64 = np.dtype(np.float32), np.dtype(np.int64)

tape_handles = HandleTable(TAPE_KIND, "tape")


def _require(pointer, name):
    if not pointer:
        raise ValidationError(f"{name} is NULL")


def _tape(handle) -> MemoryTape:
    handle = int(handle) & 0xFFFFFFFFFFFFFFFF
    tape = tape_handles.get(handle)
    if tape.stale:
        raise ValidationError(f"tape handle {handle:#x} is stale: the fiber it recorded on ended "
                              "before kina_tape_end (kina_tape_free releases the handle)")
    return tape


def _with_views(fn, *buffers):
    """``fn(*views)`` for ``(pointer, dtype, name, output)`` buffers, on the selected backend."""
    ops = Operands()
    try:
        result = fn(*[ops.get(ptr, dtype, name, output) for ptr, dtype, name, output in buffers])
        ops.finish()
        return result
    finally:
        ops.release()


def _begin(flags) -> int:
    if flags not in (KINA_TAPE_STRICT, KINA_TAPE_LENIENT):
        raise ValidationError(f"kina_tape_begin: unknown flags {flags} "
                              "(KINA_TAPE_STRICT = 0, KINA_TAPE_LENIENT = 1)")
    tape = MemoryTape(strict=flags == KINA_TAPE_STRICT)
    handle = tape_handles.add(tape)
    try:
        tape.begin()
    except BaseException:
        tape_handles.remove(handle)
        raise
    return handle


def kina_py_tape_begin(flags, out_tape):
    _require(out_tape, "out_tape")
    out_tape[0] = _begin(flags)
    return 0


def kina_py_mlir_tape_begin(out_handle, flags):
    def begin(view):
        if view.size < 1:
            raise ValidationError("out_handle must have at least one element")
        view.flat[0] = _begin(flags)    # kind << 56 | ...: always a positive int64
    _with_views(begin, (out_handle, I64, "out_handle", True))
    return 0


def _watch(handle, buffer, dtype):
    _with_views(_tape(handle).watch, (buffer, dtype, "buffer", False))
    return 0


def _constant(handle, buffer, dtype):
    _with_views(_tape(handle).constant, (buffer, dtype, "buffer", False))
    return 0


def kina_py_tape_watch(handle, buffer, dtype):
    return _watch(handle, buffer, dtype_of_code(dtype))


def kina_py_tape_constant(handle, buffer, dtype):
    return _constant(handle, buffer, dtype_of_code(dtype))


def kina_py_mlir_tape_watch_f32(handle, buffer):
    return _watch(handle, buffer, F32)


def kina_py_mlir_tape_constant_f32(handle, buffer):
    return _constant(handle, buffer, F32)


def kina_py_mlir_tape_constant_i64(handle, buffer):
    return _constant(handle, buffer, I64)


def kina_py_tape_end(handle):
    _tape(handle).end()
    return 0


def kina_py_tape_backward(handle, output, cotangent):
    _with_views(_tape(handle).backward, (output, F32, "output", False),
                (cotangent, F32, "cotangent", False))
    return 0


def kina_py_tape_grad(handle, watched, out_grad):
    _with_views(_tape(handle).grad, (watched, F32, "watched", False),
                (out_grad, F32, "out_grad", True))
    return 0


kina_py_mlir_tape_backward_f32 = kina_py_tape_backward
kina_py_mlir_tape_grad_f32 = kina_py_tape_grad


def kina_py_tape_free(handle):
    handle = int(handle) & 0xFFFFFFFFFFFFFFFF
    tape_handles.get(handle).free()         # a stale tape is freed from any thread
    tape_handles.remove(handle)
    return 0


#: Callback name -> function, floating-point conditions quiet (docs/abi.md).
CALLBACKS = {name: quiet_fp(fn) for name, fn in globals().items() if name.startswith("kina_py_")}
