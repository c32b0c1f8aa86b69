"""Shared helpers for the tests that call libkina_fx.so's real exports in-process."""
from __future__ import annotations

import contextlib
import ctypes
import mmap

import numpy as np

from kina_fx import ffi as kffi
from kina_fx import memref


class Abi:
    """The loaded library plus helpers that turn NumPy arrays into memref arguments."""

    def __init__(self):
        self.ffi, self.lib = kffi.load_library()
        self._keep = []

    def ptr(self, m):
        """A ``kina_unranked_memref_t *`` of the library's FFI for an UnrankedMemref."""
        if m is None:
            return self.ffi.NULL
        self._keep.append(m)
        return self.ffi.cast("kina_unranked_memref_t *", m.address)

    def mem(self, array, offset_elements=0):
        return self.ptr(memref.from_numpy(array, offset_elements))

    def call(self, name, *args):
        """Call export ``name``; NumPy arrays become memrefs, None a null pointer."""
        conv = []
        for a in args:
            if isinstance(a, np.ndarray):
                conv.append(self.mem(a))
            elif isinstance(a, memref.UnrankedMemref):
                conv.append(self.ptr(a))
            elif a is None:
                conv.append(self.ffi.NULL)
            else:
                conv.append(a)
        status = getattr(self.lib, name)(*conv)
        self._keep.clear()
        return status

    def last_error(self) -> str:
        return self.ffi.string(self.lib.kina_last_error()).decode()


def strided(array, kind, rng=None):
    """A non-contiguous view holding the same values as ``array``.

    kind: "contiguous", "transposed" (a transposed copy transposed back),
    "step" (every other element of a larger buffer), "reversed" (negative
    strides on every axis), "offset" (an interior window of a larger buffer).
    """
    a = np.asarray(array)
    if kind == "contiguous" or a.ndim == 0:
        return np.array(a, order="C", copy=True)
    if kind == "transposed":
        return np.ascontiguousarray(a.T).T
    if kind == "step":
        big = np.zeros(tuple(2 * n + 1 for n in a.shape), a.dtype)
        view = big[tuple(slice(1, 1 + 2 * n, 2) for n in a.shape)]
        view[...] = a
        return view
    if kind == "reversed":
        big = np.ascontiguousarray(a[tuple(slice(None, None, -1) for _ in a.shape)])
        return big[tuple(slice(None, None, -1) for _ in a.shape)]
    if kind == "offset":
        big = np.zeros(tuple(n + 3 for n in a.shape), a.dtype)
        view = big[tuple(slice(2, 2 + n) for n in a.shape)]
        view[...] = a
        return view
    raise ValueError(kind)


LAYOUTS = ["contiguous", "transposed", "step", "reversed", "offset"]


def build_fixture_library(source, out, gcc="gcc"):
    """Compile a C test fixture (``source``) into the shared library ``out``,
    linked against the installed libkina_fx.so (rpath included)."""
    import subprocess
    from pathlib import Path

    include, libdir = kffi.header_dir(), str(Path(kffi.library_path()).parent)
    subprocess.run([gcc, "-O1", "-shared", "-fPIC", "-Wall", "-Werror", str(source),
                    f"-I{include}", f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx", "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out


def load_module(path, name):
    """Import the script at ``path`` (a benchmark, the native build script) as ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runtime_op_sample(op, rng):
    """Valid float32/int64 inputs and int params for one runtime op."""
    name = op.name
    x = rng.standard_normal((3, 4)).astype(np.float32)
    if name in ("log",):
        return [np.abs(x) + 0.5], []
    if name in ("add", "sub", "mul", "div", "pow", "matmul"):
        b = rng.standard_normal((4,) if name != "matmul" else (4, 2)).astype(np.float32)
        if name == "pow":
            return [np.abs(x) + 0.5, b], []
        if name == "div":
            return [x, np.abs(b) + 0.5], []
        return [x, b], []
    if name in ("sum", "mean", "max"):
        return [x], [1, 0]
    if name in ("softmax", "log_softmax"):
        return [x], [-1]
    if name == "transpose":
        return [x, np.array([1, 0], np.int64)], []
    if name == "gather":
        return [x, np.array([2, 0, 2], np.int64)], []
    if name == "cross_entropy":
        return [x, np.array([0, 3, 1], np.int64)], []
    if name == "repeat_interleave":
        return [x], [1, 2]
    if name == "all_reduce":
        return [x], [int(rng.integers(0, 4))]
    if name == "broadcast":
        return [x], [0]
    if name.startswith("copy_to_device"):
        dtype = np.float16 if name.endswith("f16") else np.float32
        return [x.astype(dtype)], [0]
    return [x], []


# ---- operands nobody may touch (check order: validation before any read or copy) ----

@contextlib.contextmanager
def untouchable_page():
    """The address of a fresh PROT_NONE page: any access to it crashes the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_none = 0
    address = libc.mmap(None, mmap.PAGESIZE, prot_none, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap(PROT_NONE) failed")
    try:
        yield address
    finally:
        libc.munmap(address, mmap.PAGESIZE)


def memref_at(address, shape):
    """A row-major memref of ``shape`` whose data starts at ``address`` (no storage behind it)."""
    strides, stride = [], 1
    for n in reversed(shape):
        strides.insert(0, stride)
        stride *= max(n, 1)
    return memref.UnrankedMemref(None, len(shape), [address, address, 0, *shape, *strides])


class _ShapeOnly:
    """Just enough of an array for an op's shape check."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.size = int(np.prod(shape, dtype=object))


def _huge_operands(op):
    """Float input shapes of 2^40+ elements, real integer inputs and int32
    parameters of a valid call of runtime op ``op`` (parameters 0 unless
    named here: axis 0, device 0, reduction code 0, root 0...)."""
    h = 1 << 40
    name = op.name
    params = [1 if p == "reps" else 0 for p in op.params]
    if name == "matmul":
        return [(1 << 20, 1 << 20), (1 << 20, 1 << 20)], {}, params
    if name == "gather":
        return [(h, 1)], {1: np.array([0, 1], np.int64)}, params
    if name == "cross_entropy":
        return [(2, h)], {1: np.array([0, 1], np.int64)}, params
    if name == "transpose":
        return [(h,)], {1: np.array([0], np.int64)}, params
    return [(h,)] * len(op.inputs), {}, params


def mismatched_huge_call(op, address):
    """The arguments of a call of runtime op ``op`` whose float operands all lie
    at ``address`` with 2^40+ elements each, valid but for the output's shape
    (one more row, or rank 1 for a rank-0 output): the only right answer is
    status 1, with nothing read, copied or allocated."""
    float_shapes, ints, params = _huge_operands(op)
    shapes = iter(float_shapes)
    args, probes = [], []
    for i, operand in enumerate(op.inputs):
        if i in ints:
            args.append(ints[i])
            probes.append(ints[i])
        else:
            shape = next(shapes)
            args.append(memref_at(address, shape))
            probes.append(_ShapeOnly(shape, operand.dtype))
    shape = op.check(*probes, *params)
    out_shape = (shape[0] + 1,) + tuple(shape[1:]) if shape else (1,)
    return [memref_at(address, out_shape), *args, *params]
