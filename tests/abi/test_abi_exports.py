"""The real exported symbols of libkina_fx.so, called in-process through cffi.

Results are checked against NumPy on random data, across ranks 0-4 and strided
inputs (transposed, stepped, reversed, offset), and every documented error path
is checked for its status code, its kina_last_error message, and that nothing
was written or printed.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from support.abi import LAYOUTS, Abi, strided
from kina_fx import gpu_ops, memref
from kina_fx.errors import Status

OK, VALIDATION, RESOURCE, GPU, INTERNAL, TYPE = (
    Status.SUCCESS, Status.VALIDATION, Status.RESOURCE, Status.GPU, Status.INTERNAL, Status.TYPE)


@pytest.fixture(scope="module")
def abi():
    return Abi()


# Every test runs on the CPU backend, and on CUDA too where CuPy sees a device
# (tests/gpu/run_gpu_checks.sh on a GPU machine).
DEVICES = ["cpu"] + (["cuda"] if gpu_ops.cupy_module() is not None else [])


@pytest.fixture(autouse=True, params=DEVICES)
def backend(request, monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", request.param)
    yield request.param
    gpu_ops.free_all()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def softmax_ref(x, axis):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---- matmul ---------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3,), (3,)),               # vector . vector -> rank-0 out
    ((4,), (4, 5)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (5, 3, 4)),     # batched
    ((5, 2, 3), (3, 4)),        # batch broadcast
    ((2, 1, 3, 4), (6, 4, 2)),  # rank 4 with broadcasting
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_matches_numpy(abi, rng, sa, sb, layout):
    a, b = rand(rng, sa), rand(rng, sb)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = strided(np.zeros(want.shape, np.float32), layout)
    status = abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, strided(a, layout), strided(b, layout))
    assert status == OK, abi.last_error()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_matmul_out_may_alias_an_input(abi, rng):
    a, b = rand(rng, (4, 4)), rand(rng, (4, 4))
    want = a @ b
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", memref.from_numpy(a),
                    memref.from_numpy(a), memref.from_numpy(b)) == OK
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb,so", [
    ((), (3,), ()),              # rank 0 operand
    ((2, 3), (4, 5), (2, 5)),    # inner dimensions differ
    ((2, 3), (3, 4), (2, 5)),    # wrong out shape
    ((2, 2, 3), (3, 3, 4), (2, 2, 4)),  # batch dims do not broadcast
])
def test_matmul_shape_errors(abi, sa, sb, so):
    out = np.full(so, 7.0, np.float32)
    status = abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, np.ones(sa, np.float32), np.ones(sb, np.float32))
    assert status == VALIDATION
    assert "matmul" in abi.last_error()
    assert (out == 7.0).all()  # validated before touching memory


# ---- gather ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("vshape,ishape", [
    ((5,), ()), ((5,), (3,)), ((6, 3), (4,)), ((6, 3), (2, 2)), ((4, 2, 3), (3,)),
    ((3, 2, 2, 2), (2, 1)),
])
def test_gather_matches_numpy(abi, rng, vshape, ishape, layout):
    values = rand(rng, vshape)
    idx = rng.integers(0, vshape[0], size=ishape).astype(np.int64)
    want = values[idx]
    out = strided(np.zeros(want.shape, np.float32), layout)
    status = abi.call("_mlir_ciface_runtime_gpu_gather_f32", out, strided(values, layout), strided(idx, layout))
    assert status == OK, abi.last_error()
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("bad", [-1, 5, 1 << 40])
def test_gather_index_out_of_range(abi, bad):
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    idx = np.array([0, bad, 1], np.int64)
    out = np.full((3, 2), -3.0, np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_gather_f32", out, values, idx) == VALIDATION
    assert "out of range" in abi.last_error() and str(bad) in abi.last_error()
    assert (out == -3.0).all()


def test_gather_rank0_values_and_bad_out_shape(abi):
    idx = np.zeros(2, np.int64)
    assert abi.call("_mlir_ciface_runtime_gpu_gather_f32", np.zeros(2, np.float32),
                    np.zeros((), np.float32), idx) == VALIDATION
    assert abi.call("_mlir_ciface_runtime_gpu_gather_f32", np.zeros((3, 2), np.float32),
                    np.zeros((4, 2), np.float32), idx) == VALIDATION
    assert "shape" in abi.last_error()


# ---- softmax --------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 3, 2, 5)])
def test_softmax_every_axis(abi, rng, shape, layout):
    x = rand(rng, shape) * 10
    for axis in range(-len(shape), len(shape)):
        out = strided(np.zeros(shape, np.float32), layout)
        status = abi.call("_mlir_ciface_runtime_gpu_softmax_f32", out, strided(x, layout), axis)
        assert status == OK, abi.last_error()
        np.testing.assert_allclose(out, softmax_ref(x, axis), rtol=1e-5, atol=1e-6)


def test_softmax_in_place_and_stable(abi):
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]], np.float32)
    want = softmax_ref(x, -1)
    m = memref.from_numpy(x)
    assert abi.call("_mlir_ciface_runtime_gpu_softmax_f32", m, m, -1) == OK
    assert np.isfinite(x).all()
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape,axis", [((), 0), ((3, 4), 2), ((3, 4), -3), ((3,), 1 << 30)])
def test_softmax_bad_axis(abi, shape, axis):
    out = np.full(shape, 9.0, np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_softmax_f32", out, np.zeros(shape, np.float32), axis) == VALIDATION
    assert "axis" in abi.last_error()
    assert (out == 9.0).all()


def test_softmax_shape_mismatch(abi):
    assert abi.call("_mlir_ciface_runtime_gpu_softmax_f32", np.zeros((3, 4), np.float32),
                    np.zeros((4, 3), np.float32), -1) == VALIDATION


# ---- repeat_interleave ----------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(4,), (2, 3), (2, 3, 2), (1, 2, 3, 2)])
@pytest.mark.parametrize("reps", [0, 1, 3])
def test_repeat_interleave_matches_numpy(abi, rng, shape, reps, layout):
    x = rand(rng, shape)
    for axis in range(-len(shape), len(shape)):
        want = np.repeat(x, reps, axis=axis)
        out = strided(np.zeros(want.shape, np.float32), layout)
        status = abi.call("_mlir_ciface_runtime_gpu_repeat_interleave_f32", out, strided(x, layout), axis, reps)
        assert status == OK, abi.last_error()
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("xshape,oshape,axis,reps", [
    ((3,), (3,), 0, -1),       # negative reps
    ((3,), (6,), 1, 2),        # axis out of range
    ((), (), 0, 2),            # rank 0 has no axis
    ((2, 3), (2, 7), 1, 2),    # wrong out shape
])
def test_repeat_interleave_errors(abi, xshape, oshape, axis, reps):
    out = np.full(oshape, 5.0, np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_repeat_interleave_f32", out,
                    np.zeros(xshape, np.float32), axis, reps) == VALIDATION
    assert (out == 5.0).all()


# ---- copies ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4), (2, 2, 3, 2)])
@pytest.mark.parametrize("name,dtype", [
    ("_mlir_ciface_runtime_copy_to_device_f32", np.float32),
    ("_mlir_ciface_runtime_copy_to_device_f16", np.float16),
    ("_mlir_ciface_runtime_copy_to_host_f32", np.float32),
])
def test_copies(abi, rng, name, dtype, shape, layout):
    src = rand(rng, shape, dtype)
    dst = strided(np.zeros(shape, dtype), layout)
    args = (dst, strided(src, layout)) + ((0,) if "device" in name else ())
    assert abi.call(name, *args) == OK, abi.last_error()
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("device", [-1, 4096, 1 << 30])
def test_copy_to_device_checks_the_device_ordinal(abi, device):
    dst = np.zeros(3, np.float32)
    assert abi.call("_mlir_ciface_runtime_copy_to_device_f32", dst, np.ones(3, np.float32), device) == VALIDATION
    assert "device" in abi.last_error()
    assert (dst == 0).all()


def test_copy_shape_mismatch(abi):
    assert abi.call("_mlir_ciface_runtime_copy_to_host_f32", np.zeros((2, 3), np.float32),
                    np.zeros((3, 2), np.float32)) == VALIDATION
    assert "shape" in abi.last_error()


# ---- alloc / free_all -----------------------------------------------------------

@pytest.mark.parametrize("sizes", [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 5), (0, 3)])
@pytest.mark.parametrize("element_size,dtype", [(2, np.float16), (4, np.float32), (8, np.int64)])
def test_alloc_fills_the_descriptor_in_place(abi, sizes, element_size, dtype):
    m = memref.empty_descriptor(sizes)
    struct_before = bytes(memref.ffi.buffer(m.struct))
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", m, element_size) == OK, abi.last_error()
    assert bytes(memref.ffi.buffer(m.struct)) == struct_before  # {rank, descriptor} untouched
    d = m.descriptor()
    assert d.sizes == tuple(sizes)
    assert d.offset == 0 and d.aligned == d.allocated and d.aligned != 0
    assert d.aligned % memref.ALIGNMENT == 0
    row_major = [int(np.prod([max(n, 1) for n in sizes[i + 1:]])) for i in range(len(sizes))]
    assert list(d.strides) == row_major
    # The buffer is usable: write through one view, read through the runtime.
    view = memref.numpy_view(d, dtype)
    view[...] = np.arange(view.size, dtype=dtype).reshape(view.shape)
    assert d.aligned in gpu_ops.allocations()
    assert gpu_ops.allocations()[d.aligned] == (gpu_ops.device(), int(np.prod(sizes)) * element_size)
    assert abi.call("runtime_gpu_free_all") == OK
    assert gpu_ops.allocations() == {}


def test_alloc_result_serves_later_calls(abi, rng):
    a, b = rand(rng, (3, 4)), rand(rng, (4, 2))
    dev = memref.empty_descriptor((3, 2))
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", dev, 4) == OK
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", dev, a, b) == OK
    host = np.zeros((3, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_copy_to_host_f32", host, dev) == OK
    np.testing.assert_allclose(host, a @ b, rtol=1e-5)
    assert abi.call("runtime_gpu_free_all") == OK


@pytest.mark.parametrize("element_size", [0, 1, 3, 5, 16, -4])
def test_alloc_rejects_element_sizes(abi, element_size):
    m = memref.empty_descriptor((2, 2))
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", m, element_size) == TYPE
    assert "element_size" in abi.last_error()
    assert m.descriptor().aligned == 0


def test_alloc_errors(abi):
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", None, 4) == VALIDATION
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", memref.empty_descriptor((2, -1)), 4) == VALIDATION
    assert "negative" in abi.last_error()
    huge = memref.empty_descriptor((1 << 40, 1 << 20))  # 4 PiB
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", huge, 4) == RESOURCE
    overflow = memref.empty_descriptor((1 << 62, 1 << 62))
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", overflow, 8) == RESOURCE
    assert huge.descriptor().aligned == 0 and overflow.descriptor().aligned == 0


def test_free_all_is_repeatable(abi):
    for _ in range(3):
        m = memref.empty_descriptor((4,))
        assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", m, 4) == OK
    assert len(gpu_ops.allocations()) >= 3
    assert abi.call("runtime_gpu_free_all") == OK
    assert abi.call("runtime_gpu_free_all") == OK
    assert gpu_ops.allocations() == {}


# ---- descriptor validation, shared by every export ---------------------------------

def bad_memrefs():
    """(label, UnrankedMemref or None) for each malformed descriptor."""
    ok = np.zeros((2, 2), np.float32)
    yield "null pointer", None
    yield "rank -1", memref.UnrankedMemref(ok, -1, [0, 0, 0])
    yield "rank 33", memref.UnrankedMemref(ok, 33, [0] * 69)
    m = memref.from_numpy(ok)
    m.struct.descriptor = memref.ffi.NULL
    yield "null descriptor", m
    yield "negative size", memref.UnrankedMemref(ok, 2, [0, ok.ctypes.data, 0, 2, -2, 2, 1])
    yield "null data", memref.UnrankedMemref(ok, 2, [0, 0, 0, 2, 2, 2, 1])


EXPORT_ARGS = {
    "_mlir_ciface_runtime_copy_to_device_f32": ("mm", (0,)),
    "_mlir_ciface_runtime_copy_to_device_f16": ("mm", (0,)),
    "_mlir_ciface_runtime_copy_to_host_f32": ("mm", ()),
    "_mlir_ciface_runtime_gpu_matmul_f32": ("mmm", ()),
    "_mlir_ciface_runtime_gpu_gather_f32": ("mmi", ()),
    "_mlir_ciface_runtime_gpu_softmax_f32": ("mm", (-1,)),
    "_mlir_ciface_runtime_gpu_repeat_interleave_f32": ("mm", (0, 1)),
}


def good_args(name):
    kinds, scalars = EXPORT_ARGS[name]
    dtype = np.float16 if name.endswith("f16") else np.float32
    arrays = [np.zeros((2, 2), np.int64) if k == "i" else np.zeros((2, 2), dtype) for k in kinds]
    if name.endswith("gather_f32"):
        arrays[0] = np.zeros((2, 2, 2), np.float32)
    return arrays, scalars


@pytest.mark.parametrize("name", sorted(EXPORT_ARGS))
def test_every_memref_argument_is_validated(abi, name):
    arrays, scalars = good_args(name)
    assert abi.call(name, *arrays, *scalars) == OK, abi.last_error()
    for position in range(len(arrays)):
        for label, bad in bad_memrefs():
            args = list(arrays)
            args[position] = bad
            status = abi.call(name, *args, *scalars)
            assert status == VALIDATION, (name, position, label, abi.last_error())
            assert abi.last_error(), (name, label)


def test_outputs_must_not_alias_themselves(abi):
    x = np.ones(3, np.float32)
    out = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (4, 3), (0, 4))
    assert abi.call("_mlir_ciface_runtime_gpu_repeat_interleave_f32", memref.from_numpy(out),
                    x, 0, 1) == VALIDATION
    assert "stride 0" in abi.last_error()


def test_broadcast_inputs_are_fine(abi):
    a = np.lib.stride_tricks.as_strided(np.arange(3, dtype=np.float32), (4, 3), (0, 4))
    out = np.zeros((4, 2), np.float32)
    b = np.ones((3, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, memref.from_numpy(a), b) == OK
    np.testing.assert_allclose(out, np.asarray(a) @ b)


def test_nonzero_offset(abi, rng):
    a = rand(rng, (3, 3))
    out = np.zeros((3, 3), np.float32)
    m = memref.from_numpy(a, offset_elements=5)
    assert m.descriptor().offset == 5
    assert abi.call("_mlir_ciface_runtime_gpu_softmax_f32", memref.from_numpy(out, 2), m, 0) == OK
    np.testing.assert_allclose(out, softmax_ref(a, 0), rtol=1e-5)


# ---- error translation -----------------------------------------------------------

@pytest.mark.parametrize("exc,status", [
    (RuntimeError("boom"), INTERNAL),
    (KeyError("k"), INTERNAL),
    (TypeError("t"), TYPE),
    (MemoryError("m"), RESOURCE),
    (ValueError("v"), VALIDATION),
    (KeyboardInterrupt(), INTERNAL),
    (SystemExit(3), INTERNAL),
])
def test_python_failures_become_codes_silently(abi, monkeypatch, capfd, exc, status):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(gpu_ops, "matmul", fail)
    out = np.zeros((2, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, out, out) == status
    assert type(exc).__name__ in abi.last_error()
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_cuda_requested_without_a_device_is_a_gpu_error(abi, monkeypatch, backend):
    if backend != "cpu" or gpu_ops.cupy_module() is not None:
        pytest.skip("a CUDA device is present")
    monkeypatch.setenv("KINA_FX_DEVICE", "cuda")
    out = np.zeros((2, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, out, out) == GPU
    assert "CUDA" in abi.last_error() or "CuPy" in abi.last_error()


def test_bad_device_setting(abi, monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "tpu")
    out = np.zeros((2, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, out, out) == VALIDATION
    assert "KINA_FX_DEVICE" in abi.last_error()


def test_last_error_is_thread_local(abi):
    out = np.zeros((2, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_softmax_f32", out, out, 5) == VALIDATION
    mine = abi.last_error()
    seen = {}

    def other():
        # A fresh thread has no error yet; its own failure does not touch ours.
        seen["before"] = abi.last_error()
        abi.lib._mlir_ciface_runtime_gpu_matmul_f32(abi.ffi.NULL, abi.ffi.NULL, abi.ffi.NULL)
        seen["after"] = abi.last_error()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] == ""
    assert "null" in seen["after"]
    assert abi.last_error() == mine


def test_abi_version(abi):
    assert abi.lib.kina_abi_version() == 1000


def test_concurrent_callers(abi, rng):
    """Several OS threads calling exports at once each get their own correct result."""
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        a, b = rand(r, (8, 8)), rand(r, (8, 8))
        out = np.zeros((8, 8), np.float32)
        for _ in range(50):
            if abi.lib._mlir_ciface_runtime_gpu_matmul_f32(abi.mem(out), abi.mem(a), abi.mem(b)) != 0:
                errors.append(abi.last_error())
            if not np.allclose(out, a @ b, rtol=1e-5, atol=1e-5):
                errors.append("wrong result")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---- the shape rule behind the matmul export, against NumPy ------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=0, max_size=4),
       st.lists(st.integers(1, 3), min_size=0, max_size=4))
def test_matmul_shape_rule_is_numpys(sa, sb):
    try:
        want = np.matmul(np.ones(sa, np.float32), np.ones(sb, np.float32)).shape
    except ValueError:
        want = None
    try:
        got = gpu_ops.matmul_shape(tuple(sa), tuple(sb))
    except ValueError:  # ValidationError is a ValueError
        got = None
    assert got == want, (sa, sb)
