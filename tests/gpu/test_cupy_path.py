"""The CuPy path on a real CUDA device (skipped where CuPy sees no device).

Run by tests/gpu/run_gpu_checks.sh on a GPU machine, with the CPU/CUDA
parametrised export tests.  Checks what only a device can show: managed memory
from runtime_gpu_alloc_unranked is wrapped zero-copy by memref.cupy_view,
strided device views are honoured, the ops agree with NumPy, and
gpu_ops runs the same code on cupy arrays as on numpy arrays.
"""
from __future__ import annotations

import numpy as np
import pytest

from kina_fx import ffi as kffi
from kina_fx import gpu_ops, memref
from kina_fx.errors import Status

cp = gpu_ops.cupy_module()
pytestmark = pytest.mark.skipif(cp is None, reason="needs CuPy and a CUDA device")


@pytest.fixture(autouse=True)
def cuda(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cuda")
    yield
    _, lib = kffi.load_library()
    lib.runtime_gpu_free_all()


def lib_and_ptr():
    c, lib = kffi.load_library()
    return lib, (lambda m: c.cast("kina_unranked_memref_t *", m.address)), c


def device_buffer(shape, values=None):
    """A runtime allocation (managed memory) and a CuPy view of it."""
    lib, ptr, c = lib_and_ptr()
    m = memref.empty_descriptor(shape)
    assert lib._mlir_ciface_runtime_gpu_alloc_unranked(ptr(m), 4) == 0, c.string(lib.kina_last_error())
    arr = memref.cupy_view(m.descriptor(), np.float32, cp)
    assert arr is not None, "managed memory must be wrapped zero-copy"
    if values is not None:
        arr[...] = cp.asarray(values)
    return m, arr


def test_managed_allocation_is_zero_copy_for_host_and_device():
    m, dev = device_buffer((4, 8))
    dev[...] = cp.arange(32, dtype=cp.float32).reshape(4, 8)
    cp.cuda.get_current_stream().synchronize()
    host = memref.numpy_view(m.descriptor(), np.float32)  # managed memory is host-visible
    np.testing.assert_array_equal(host, np.arange(32, dtype=np.float32).reshape(4, 8))
    d = m.descriptor()
    attrs = cp.cuda.runtime.pointerGetAttributes(d.aligned)
    assert attrs.type == 3  # cudaMemoryTypeManaged


@pytest.mark.parametrize("n", [64, 512])
def test_ops_on_managed_memory_match_numpy(n):
    lib, ptr, c = lib_and_ptr()
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    ma, _ = device_buffer((n, n), a)
    mb, _ = device_buffer((n, n), b)
    mo, o = device_buffer((n, n))
    assert lib._mlir_ciface_runtime_gpu_matmul_f32(ptr(mo), ptr(ma), ptr(mb)) == 0, c.string(lib.kina_last_error())
    np.testing.assert_allclose(cp.asnumpy(o), a @ b, rtol=1e-3, atol=1e-3)
    assert lib._mlir_ciface_runtime_gpu_softmax_f32(ptr(mo), ptr(ma), -1) == 0
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(cp.asnumpy(o), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_strided_device_views():
    """A transposed, offset window of a managed buffer, seen through its descriptor."""
    lib, ptr, c = lib_and_ptr()
    m, big = device_buffer((6, 8), np.arange(48, dtype=np.float32).reshape(6, 8))
    d = m.descriptor()
    # The 3x2 window big[1:4, 2:6:2], transposed: sizes (2, 3), strides (2, 8), offset 10.
    window = memref.UnrankedMemref(None, 2, [d.allocated, d.aligned, 10, 2, 3, 2, 8])
    view = memref.cupy_view(window.descriptor(), np.float32, cp)
    np.testing.assert_array_equal(cp.asnumpy(view), np.arange(48, dtype=np.float32).reshape(6, 8)[1:4, 2:6:2].T)
    out = np.zeros((2, 3), np.float32)
    src = memref.from_numpy(out)
    assert lib._mlir_ciface_runtime_gpu_softmax_f32(ptr(src), ptr(window), 1) == 0
    ref = np.arange(48, dtype=np.float64).reshape(6, 8)[1:4, 2:6:2].T
    e = np.exp(ref - ref.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("op", ["matmul", "gather", "softmax", "log_softmax", "repeat_interleave",
                                "softmax_axis0", "log_softmax_axis0", "sum_axis0", "mean_axis1",
                                "max_axis2", "add_bias"])
def test_gpu_ops_same_results_on_both_backends(op):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4, 6), dtype=np.float32)
    y = rng.standard_normal((5, 6, 3), dtype=np.float32)
    bias = rng.standard_normal(6, dtype=np.float32)
    idx = np.array([[4, 0], [2, 2]], np.int64)
    calls = {
        "matmul": lambda xp: gpu_ops.matmul(xp.asarray(x), xp.asarray(y)),
        "gather": lambda xp: gpu_ops.gather(xp.asarray(x), xp.asarray(idx)),
        "softmax": lambda xp: gpu_ops.softmax(xp.asarray(x), 1),
        "log_softmax": lambda xp: gpu_ops.log_softmax(xp.asarray(x), -1),
        "repeat_interleave": lambda xp: gpu_ops.repeat_interleave(xp.asarray(x), 3, 2),
        # the kernels whose NumPy path has blocks or tiling of its own (CuPy: one call)
        "softmax_axis0": lambda xp: gpu_ops.softmax(xp.asarray(x), 0),
        "log_softmax_axis0": lambda xp: gpu_ops.log_softmax(xp.asarray(x), 0),
        "sum_axis0": lambda xp: gpu_ops.reduce_sum(xp.asarray(x), 0, False),
        "mean_axis1": lambda xp: gpu_ops.reduce_mean(xp.asarray(x), 1, True),
        "max_axis2": lambda xp: gpu_ops.reduce_max(xp.asarray(x), 2, False),
        "add_bias": lambda xp: gpu_ops.add(xp.asarray(x), xp.asarray(bias)),
    }
    on_cpu = calls[op](np)
    on_gpu = calls[op](cp)
    assert isinstance(on_gpu, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(on_gpu), on_cpu, rtol=1e-4, atol=1e-5)


def test_alloc_beyond_free_device_memory():
    lib, ptr, c = lib_and_ptr()
    free, _ = cp.cuda.runtime.memGetInfo()
    m = memref.empty_descriptor((free // 4 + (1 << 20),))
    assert lib._mlir_ciface_runtime_gpu_alloc_unranked(ptr(m), 4) == Status.RESOURCE
    assert "free" in c.string(lib.kina_last_error()).decode()
