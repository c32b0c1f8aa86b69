"""The Python side of libkina_fx.so's C exports: argument checks and error translation.

libkina_fx.so (built from ``kina_fx/_native``) exports hand-written C wrappers;
each starts Python if needed and calls a static ``extern "Python"`` callback.
:func:`attach` runs inside the library's embedded module at start-up and binds
every callback to the function of the same name in :data:`CALLBACKS` with
``@ffi.def_extern(error=INTERNAL, onerror=...)``: an exception becomes its
status code (:func:`kina_fx.errors.status_of`) and its message goes to the
thread-local ``kina_last_error``.  Nothing unwinds into C and nothing is printed.

This module only translates between C and Python: descriptors become arrays in
:mod:`kina_fx.memref`, the ops run in :mod:`kina_fx.gpu_ops`.

:func:`load_library` opens the built library from Python (ABI mode), as the
in-process tests and benchmarks do.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from . import ffi_effects, gpu_ops, memref
from .errors import GpuError, InternalError, Status, ValidationError, status_of

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
I64 = np.dtype(np.int64)

_lib = None  # the embedded module's lib, once attached

# Memoised descriptor -> view caches of the CPU path, one per dtype and role.
_VIEWS = {(dt, out): memref.ViewCache(dt, out) for dt in (F32, F16, I64) for out in (False, True)}
_F32_IN = _VIEWS[(F32, False)].view
_F32_OUT = _VIEWS[(F32, True)].view


# ---- error translation -----------------------------------------------------------

def _is_cuda_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("cupy", "cupy_backends")) and not isinstance(exc, MemoryError)


def status_and_message(exc: BaseException) -> tuple[int, str]:
    """The status code and kina_last_error text for an exception."""
    if _is_cuda_error(exc):
        exc = GpuError(f"{type(exc).__name__}: {exc}")
    status = int(status_of(exc))
    return status, f"{type(exc).__name__}: {exc}"


def _onerror(exc_type, exc_value, _traceback):
    """cffi's onerror hook: record the message and return the status (never raises)."""
    try:
        status, message = status_and_message(exc_value if exc_value is not None else exc_type())
        _lib.kina__set_last_error(message.encode("utf-8", "replace")[:1000])
        return status
    except BaseException:  # even formatting failed: still a code, never a traceback
        return int(Status.INTERNAL)


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

    Every export reads its inputs as they were before it wrote anything, for
    any overlap of an input with an output (memmove semantics, docs/abi.md):
    an input that may share memory with an output taken before it is copied
    first.  (NumPy's ufuncs, ``take`` and ``matmul`` handle overlap
    themselves, but its assignment does not for every pair of strides, and
    CuPy promises nothing.)
    """

    __slots__ = ("xp", "_write_backs", "_outputs")

    def __init__(self):
        self.xp = gpu_ops.backend()
        self._write_backs = []
        self._outputs = []

    def get(self, ptr, dtype, name, output=False):
        if self.xp is np:      # the cached views know their byte bounds: overlap is two compares
            arr, lo, hi = _VIEWS[(dtype, output)].view_and_bounds(ptr, name)
            if output:
                self._outputs.append((lo, hi))
                return arr
            for out_lo, out_hi in self._outputs:
                if lo < out_hi and out_lo < hi:
                    return arr.copy()
            return arr
        d = memref.read_descriptor(ptr, name)
        if output:
            memref.check_output_layout(d, name)
        arr = memref.cupy_view(d, dtype, self.xp, name)
        if arr is None:
            arr, write_back = memref.host_staged(d, dtype, self.xp, name)
            if output:
                self._write_backs.append(write_back)
        if output:
            self._outputs.append(arr)
            return arr
        return apart_from(self._outputs, arr, self.xp)   # CuPy arrays: may_share_memory

    def finish(self):
        gpu_ops.synchronize(self.xp)
        for write_back in self._write_backs:
            write_back()


def apart_from(outputs, x, xp):
    """``x``, or a copy of it when it may share memory with one of ``outputs``."""
    if x.size == 0:
        return x
    for out in outputs:
        if out.size and xp.may_share_memory(out, x):
            return x.copy()
    return x


# ---- the callbacks (one per KINA_EXPORTS line of kina_runtime.c) ------------------

def _copy(dst, src, dtype, device=None):
    ops = _Operands()
    d = ops.get(dst, dtype, "dst", output=True)
    s = ops.get(src, dtype, "src")
    if device is not None:
        _check_device_ordinal(device)
    if d.shape != s.shape:
        raise ValidationError(f"copy: dst shape {d.shape} differs from src shape {s.shape}")
    d[...] = s
    ops.finish()
    return 0


def kina_py_copy_to_device_f32(dst, src, device):
    return _copy(dst, src, F32, device)


def kina_py_copy_to_device_f16(dst, src, device):
    return _copy(dst, src, F16, device)


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
    gpu_ops.device()        # KINA_FX_DEVICE is checked first, as by every other export
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


def attach(ffi, lib) -> None:
    """Bind every ``extern "Python"`` callback of the embedded module (run by its init code).

    Raises InternalError if the C table names a callback this module lacks, so
    the library reports 5 instead of cffi's silent 0.
    """
    global _lib
    _lib = lib
    callbacks = dict(CALLBACKS)
    callbacks.update(ffi_effects.attach(ffi))
    names = []
    i = 0
    while True:
        name = lib.kina__callback_name(i)
        if name == ffi.NULL:
            break
        names.append(ffi.string(name).decode())
        i += 1
    missing = [n for n in names if n not in callbacks]
    if missing:
        raise InternalError(f"kina_fx.ffi has no callback for {missing}")
    for name in names:
        ffi.def_extern(name=name, error=int(Status.INTERNAL), onerror=_onerror)(callbacks[name])


# ---- loading the library from Python -------------------------------------------

#: The C declarations of kina_fx.h that Python callers need (ABI mode).
CDEF = """
typedef struct { int64_t rank; void *descriptor; } kina_unranked_memref_t;
int32_t kina_abi_version(void);
const char *kina_last_error(void);
int32_t _mlir_ciface_runtime_copy_to_device_f32(kina_unranked_memref_t *, kina_unranked_memref_t *, int32_t);
int32_t _mlir_ciface_runtime_copy_to_device_f16(kina_unranked_memref_t *, kina_unranked_memref_t *, int32_t);
int32_t _mlir_ciface_runtime_copy_to_host_f32(kina_unranked_memref_t *, kina_unranked_memref_t *);
int32_t _mlir_ciface_runtime_gpu_matmul_f32(kina_unranked_memref_t *, kina_unranked_memref_t *, kina_unranked_memref_t *);
int32_t _mlir_ciface_runtime_gpu_gather_f32(kina_unranked_memref_t *, kina_unranked_memref_t *, kina_unranked_memref_t *);
int32_t _mlir_ciface_runtime_gpu_softmax_f32(kina_unranked_memref_t *, kina_unranked_memref_t *, int32_t);
int32_t _mlir_ciface_runtime_gpu_repeat_interleave_f32(kina_unranked_memref_t *, kina_unranked_memref_t *, int32_t, int32_t);
int32_t _mlir_ciface_runtime_gpu_alloc_unranked(kina_unranked_memref_t *, int32_t);
int32_t runtime_gpu_free_all(void);
typedef uint64_t kina_fiber_t;
typedef uint64_t kina_handler_t;
typedef int64_t (*kina_fiber_fn)(void *arg);
typedef int32_t (*kina_handler_fn)(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value);
int32_t kina_effect_id(const char *name, int32_t *out_id);
int32_t kina_fiber_create(kina_fiber_fn entry, void *arg, const int32_t *catch_effects, int32_t ncatch, kina_fiber_t *out_fiber);
int32_t kina_resume_fiber(kina_fiber_t fiber, int64_t value, int32_t *out_state);
int32_t kina_get_perform_id(kina_fiber_t fiber, int32_t *out_effect);
int32_t kina_get_perform_args(kina_fiber_t fiber, int64_t *out_args, int32_t cap, int32_t *out_nargs);
int32_t kina_fiber_state(kina_fiber_t fiber, int32_t *out_state);
int32_t kina_fiber_result(kina_fiber_t fiber, int64_t *out_value);
int32_t kina_cancel_fiber(kina_fiber_t fiber, int32_t *out_state);
int32_t kina_fiber_destroy(kina_fiber_t fiber);
int32_t kina_perform(int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value);
int32_t kina_push_handler(kina_handler_fn fn, void *ctx, const int32_t *effects, int32_t neffects, kina_handler_t *out_handler);
int32_t kina_pop_handler(kina_handler_t handler);
"""

_loaded = None
_load_lock = threading.Lock()


def library_path() -> str:
    """Where the installed libkina_fx.so is (next to this module)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkina_fx.so")


def header_dir() -> str:
    """The directory holding the installed kina_fx.h."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def load_library():
    """``(ffi, lib)`` for the built libkina_fx.so, opened in this process (ABI mode).

    Inside a running Python the library uses this interpreter; the exports
    release the GIL around the call as any cffi ABI call does.
    """
    global _loaded
    with _load_lock:
        if _loaded is None:
            import cffi

            path = library_path()
            if not os.path.exists(path):
                raise InternalError(f"{path} is missing: reinstall kina_fx (pip install -e .) to build it")
            c = cffi.FFI()
            c.cdef(CDEF)
            _loaded = (c, c.dlopen(path))
        return _loaded
