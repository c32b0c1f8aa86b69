"""The memref runtime's callbacks (``runtime_*`` / ``_mlir_ciface_runtime_*`` exports).

Like the rest of the ffi layer this module only translates: descriptors become
arrays in :mod:`kina_fx.memref`, the ops run in :mod:`kina_fx.gpu_ops`.
:mod:`kina_fx.ffi` binds these callbacks lazily: this module, and with it
NumPy (and CuPy), is imported by the first memref call a host makes, so a host
that uses only the effects ABI never pays for them.
"""
from __future__ import annotations

import numpy as np

from . import gpu_ops, memref
from .errors import ValidationError

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
I64 = np.dtype(np.int64)

# Memoised descriptor -> view caches of the CPU path, one per dtype and role.
_VIEWS = {(dt, out): memref.ViewCache(dt, out) for dt in (F32, F16, I64) for out in (False, True)}
_F32_IN = _VIEWS[(F32, False)].view
_F32_OUT = _VIEWS[(F32, True)].view


# ---- arguments -----------------------------------------------------------------

def _check_device_ordinal(ordinal: int) -> None:
    count = 1
    if gpu_ops.device() == "cuda":
        count = gpu_ops.cupy_module().cuda.runtime.getDeviceCount()
    if not 0 <= ordinal < count:
        raise ValidationError(f"device {ordinal} out of range: {count} device(s) "
                              f"on the {gpu_ops.device()} backend")


class _Operands:
    """Arrays for one call's memrefs on the selected backend.

    CPU: zero-copy NumPy views (memoised, :class:`memref.ViewCache`).
    CUDA: zero-copy CuPy views of device/managed memory; host memory the device
    cannot address is staged, and staged outputs are written back by
    :meth:`finish`.
    """

    __slots__ = ("xp", "_write_backs")

    def __init__(self):
        self.xp = gpu_ops.backend()
        self._write_backs = []

    def get(self, ptr, dtype, name, output=False):
        if self.xp is np:
            return _VIEWS[(dtype, output)].view(ptr, name)
        d = memref.read_descriptor(ptr, name)
        if output:
            memref.check_output_layout(d, name)
        arr = memref.cupy_view(d, dtype, self.xp, name)
        if arr is None:
            arr, write_back = memref.host_staged(d, dtype, self.xp, name)
            if output:
                self._write_backs.append(write_back)
        return arr

    def finish(self):
        gpu_ops.synchronize(self.xp)
        for write_back in self._write_backs:
            write_back()


# ---- the callbacks (one per KINA_EXPORTS line of kina_runtime.c) ------------------

def _copy(dst, src, dtype):
    ops = _Operands()
    d = ops.get(dst, dtype, "dst", output=True)
    s = ops.get(src, dtype, "src")
    if d.shape != s.shape:
        raise ValidationError(f"copy: dst shape {d.shape} differs from src shape {s.shape}")
    d[...] = s
    ops.finish()
    return 0


def kina_py_copy_to_device_f32(dst, src, device):
    _check_device_ordinal(device)
    return _copy(dst, src, F32)


def kina_py_copy_to_device_f16(dst, src, device):
    _check_device_ordinal(device)
    return _copy(dst, src, F16)


def kina_py_copy_to_host_f32(dst, src):
    return _copy(dst, src, F32)


def kina_py_gpu_matmul_f32(out, a, b):
    if gpu_ops.device() == "cpu":  # the fast path: cached views, no _Operands object
        gpu_ops.matmul(_F32_IN(a, "a"), _F32_IN(b, "b"), _F32_OUT(out, "out"))
        return 0
    ops = _Operands()
    o = ops.get(out, F32, "out", output=True)
    gpu_ops.matmul(ops.get(a, F32, "a"), ops.get(b, F32, "b"), o)
    ops.finish()
    return 0


def kina_py_gpu_gather_f32(out, values, indices):
    ops = _Operands()
    o = ops.get(out, F32, "out", output=True)
    gpu_ops.gather(ops.get(values, F32, "values"), ops.get(indices, I64, "indices"), o)
    ops.finish()
    return 0


def kina_py_gpu_softmax_f32(out, x, axis):
    ops = _Operands()
    o = ops.get(out, F32, "out", output=True)
    gpu_ops.softmax(ops.get(x, F32, "x"), axis, o)
    ops.finish()
    return 0


def kina_py_gpu_repeat_interleave_f32(out, x, axis, reps):
    ops = _Operands()
    o = ops.get(out, F32, "out", output=True)
    gpu_ops.repeat_interleave(ops.get(x, F32, "x"), reps, axis, o)
    ops.finish()
    return 0


def kina_py_gpu_alloc_unranked(ptr, element_size):
    nbytes = memref.allocation_bytes(ptr, element_size, "memref")
    address = gpu_ops.allocate(nbytes, memref.ALIGNMENT)
    memref.clear_caches()
    memref.write_allocation(ptr, address, element_size, "memref")
    return 0


def kina_py_gpu_free_all():
    memref.clear_caches()
    gpu_ops.free_all()
    return 0


CALLBACKS = {name: fn for name, fn in globals().items() if name.startswith("kina_py_")}
