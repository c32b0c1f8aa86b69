"""The CUDA-backend code of the exports, run in CI without a GPU.

A NumPy-backed stand-in for CuPy (only what kina_fx touches) makes
``KINA_FX_DEVICE=cuda`` select the CUDA path of kina_fx.ffi, kina_fx.memref and
kina_fx.gpu_ops: managed allocation through ``cudaMallocManaged``'s stand-in,
the free-memory check, staging of host operands the "device" cannot address
and their write-back, stream synchronisation, device-ordinal checks and the
translation of CuPy errors to status 3.  The real CuPy path (zero-copy views of
managed memory) runs in tests/gpu/ on a GPU machine.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from support.abi import LAYOUTS, Abi, mismatched_huge_call, strided, untouchable_page
from kina_fx import gpu_ops, memref
from kina_fx.errors import Status
from kina_fx.runtime_ops import RUNTIME_OPS


class CUDARuntimeError(RuntimeError):
    """Looks like cupy_backends' error class to kina_fx.ffi (same module name)."""


CUDARuntimeError.__module__ = "cupy_backends.cuda.api.runtime"


def make_fake_cupy(free_bytes=1 << 30):
    state = types.SimpleNamespace(buffers={}, frees=[], syncs=0, free_bytes=free_bytes, fail_sync=False)

    def mallocManaged(nbytes, flags=1):
        buf = np.empty(nbytes + 256, np.uint8)
        address = (buf.__array_interface__["data"][0] + 255) // 256 * 256
        state.buffers[address] = buf
        return address

    def free(address):
        state.buffers.pop(address)
        state.frees.append(address)

    def pointerGetAttributes(address):
        return types.SimpleNamespace(type=0)  # plain host memory: operands get staged

    class Stream:
        def synchronize(self):
            if state.fail_sync:
                raise CUDARuntimeError("cudaErrorLaunchFailure: unspecified launch failure")
            state.syncs += 1

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, memGetInfo=lambda: (state.free_bytes, 1 << 34),
        mallocManaged=mallocManaged, free=free, pointerGetAttributes=pointerGetAttributes,
        CUDARuntimeError=CUDARuntimeError)
    cuda = types.SimpleNamespace(runtime=runtime, get_current_stream=lambda: Stream())
    fake = types.SimpleNamespace(
        cuda=cuda, ndarray=type("FakeDeviceArray", (), {}),
        asarray=lambda a: np.array(a, copy=True), asnumpy=np.asarray, empty=np.empty,
        may_share_memory=np.may_share_memory)
    return fake, state


@pytest.fixture(scope="module")
def abi():
    return Abi()


@pytest.fixture
def fake(monkeypatch):
    cp, state = make_fake_cupy()
    monkeypatch.setattr(gpu_ops, "_cupy", cp)
    monkeypatch.setattr(gpu_ops, "_cupy_checked", True)
    monkeypatch.setattr(gpu_ops, "_device_memo", (None, None))
    monkeypatch.setenv("KINA_FX_DEVICE", "cuda")
    assert gpu_ops.device() == "cuda"
    yield state
    gpu_ops.free_all()
    memref.clear_caches()
    gpu_ops._device_memo = (None, None)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ops_stage_host_operands_and_write_back(abi, fake, layout):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((3, 4), dtype=np.float32), rng.standard_normal((4, 5), dtype=np.float32)
    out = strided(np.zeros((3, 5), np.float32), layout)
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, strided(a, layout), strided(b, layout)) == 0, \
        abi.last_error()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-6)

    x = rng.standard_normal((4, 6), dtype=np.float32)
    sm = strided(np.zeros_like(x), layout)
    assert abi.call("_mlir_ciface_runtime_gpu_softmax_f32", sm, strided(x, layout), 0) == 0
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(sm, e / e.sum(0), rtol=1e-5)

    idx = np.array([[3, 0], [1, 1]], np.int64)
    g = strided(np.zeros((2, 2, 6), np.float32), layout)
    assert abi.call("_mlir_ciface_runtime_gpu_gather_f32", g, strided(x, layout), idx) == 0
    np.testing.assert_array_equal(g, x[idx])

    r = strided(np.zeros((4, 12), np.float32), layout)
    assert abi.call("_mlir_ciface_runtime_gpu_repeat_interleave_f32", r, strided(x, layout), -1, 2) == 0
    np.testing.assert_array_equal(r, np.repeat(x, 2, axis=-1))
    assert fake.syncs >= 4


def test_alloc_uses_managed_memory_and_free_all_frees_it(abi, fake):
    ms = [memref.empty_descriptor((4, 5)) for _ in range(3)]
    for m in ms:
        assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", m, 4) == 0, abi.last_error()
    addresses = [m.descriptor().aligned for m in ms]
    assert set(addresses) == set(fake.buffers)
    assert all(gpu_ops.allocations()[a] == ("cuda", 80) for a in addresses)
    src = np.arange(20, dtype=np.float32).reshape(4, 5)
    assert abi.call("_mlir_ciface_runtime_copy_to_device_f32", ms[0], src, 0) == 0
    back = np.zeros((4, 5), np.float32)
    assert abi.call("_mlir_ciface_runtime_copy_to_host_f32", back, ms[0]) == 0
    np.testing.assert_array_equal(back, src)
    assert abi.call("runtime_gpu_free_all") == 0
    assert sorted(fake.frees) == sorted(addresses) and fake.buffers == {}
    assert abi.call("runtime_gpu_free_all") == 0
    assert len(fake.frees) == 3


def test_alloc_larger_than_free_device_memory_is_refused(abi, fake):
    fake.free_bytes = 1000
    m = memref.empty_descriptor((251,))  # 1004 bytes
    assert abi.call("_mlir_ciface_runtime_gpu_alloc_unranked", m, 4) == Status.RESOURCE
    assert "free" in abi.last_error()
    assert fake.buffers == {} and m.descriptor().aligned == 0


def test_device_ordinal_is_checked_against_the_device_count(abi, fake):
    x = np.ones(3, np.float32)
    assert abi.call("_mlir_ciface_runtime_copy_to_device_f32", np.zeros(3, np.float32), x, 0) == 0
    assert abi.call("_mlir_ciface_runtime_copy_to_device_f32", np.zeros(3, np.float32), x, 1) == Status.VALIDATION
    assert "1 device" in abi.last_error()


def test_cuda_failures_are_gpu_errors(abi, fake):
    fake.fail_sync = True
    out = np.zeros((2, 2), np.float32)
    assert abi.call("_mlir_ciface_runtime_gpu_matmul_f32", out, out, out) == Status.GPU
    assert "launch failure" in abi.last_error()


def test_a_tape_identifies_staged_host_buffers_by_their_host_memory(abi, fake):
    """On CUDA, host operands are copied to the device for each call; a tape must
    still see one buffer (the host memory), not a new copy per call."""
    ffi, lib = abi.ffi, abi.lib
    x = np.array([0.5, -1.0, 2.0], np.float32)
    h, y = np.zeros_like(x), np.zeros((), np.float32)
    tape = ffi.new("kina_tape_t *")
    assert lib.kina_tape_begin(0, tape) == 0
    assert abi.call("kina_tape_watch", tape[0], x, 1) == 0, abi.last_error()
    assert abi.call("_mlir_ciface_runtime_tanh_f32", h, x) == 0, abi.last_error()
    assert abi.call("_mlir_ciface_runtime_sum_f32", y, h, -(2 ** 31), 0) == 0, abi.last_error()
    assert lib.kina_tape_end(tape[0]) == 0
    assert abi.call("kina_tape_backward", tape[0], y, np.ones((), np.float32)) == 0, abi.last_error()
    g = np.zeros_like(x)
    assert abi.call("kina_tape_grad", tape[0], x, g) == 0, abi.last_error()
    np.testing.assert_allclose(g, 1 - np.tanh(x) ** 2, rtol=1e-6)
    assert lib.kina_tape_free(tape[0]) == 0
    assert not memref._staged           # every staged copy was released


@pytest.mark.parametrize("op", RUNTIME_OPS, ids=lambda op: op.name)
def test_host_operands_are_staged_only_after_the_call_is_validated(abi, fake, op):
    """Staging copies host memory to the device: a call refused by validation
    copies nothing (docs/abi.md, "Check order").  The operands lie on a page
    nobody may touch, with 2^40+ elements: a copy before validating would be
    status 2 (or a crash), not 1."""
    with untouchable_page() as address:
        assert abi.call(op.export, *mismatched_huge_call(op, address)) == Status.VALIDATION, \
            abi.last_error()
    assert "shape" in abi.last_error()
    assert not memref._staged
