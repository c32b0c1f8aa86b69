"""Differentiable compiled code on a real CUDA device (skipped where CuPy sees none).

Run by tests/gpu/run_gpu_checks.sh.  The same paths as tests/autodiff/test_memory_tape.py
and tests/autodiff/test_compiled.py, on the CuPy backend: runtime ops on managed memory
(zero-copy) and on host memory (staged per call), a tape's gradients, and
ad.grad of the MLIR-compiled MLP forward with CuPy arrays.
"""
from __future__ import annotations

import numpy as np
import pytest

from kina_fx import autograd as ad
from kina_fx import compiled, gpu_ops
from kina_fx import ffi as kffi
from kina_fx import memref

cp = gpu_ops.cupy_module()
pytestmark = pytest.mark.skipif(cp is None, reason="needs CuPy and a CUDA device")


@pytest.fixture(autouse=True)
def cuda(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cuda")


def _ptr(ffi, m):
    return ffi.cast("kina_unranked_memref_t *", m.address)


def test_tape_over_device_and_host_memory():
    ffi, lib = kffi.load_library()
    x_dev = cp.asarray(np.array([0.5, -1.0, 2.0], np.float32))
    h_host = np.zeros(3, np.float32)                  # staged on every call
    y_dev = cp.zeros((), cp.float32)
    mx, mh, my = memref.descriptor_of(x_dev), memref.descriptor_of(h_host), memref.descriptor_of(y_dev)
    tape = ffi.new("kina_tape_t *")
    assert lib.kina_tape_begin(0, tape) == 0
    assert lib.kina_tape_watch(tape[0], _ptr(ffi, mx), 1) == 0, ffi.string(lib.kina_last_error())
    assert lib._mlir_ciface_runtime_tanh_f32(_ptr(ffi, mh), _ptr(ffi, mx)) == 0
    assert lib._mlir_ciface_runtime_sum_f32(_ptr(ffi, my), _ptr(ffi, mh), -(2 ** 31), 0) == 0
    assert lib.kina_tape_end(tape[0]) == 0
    one = memref.descriptor_of(cp.ones((), cp.float32))
    assert lib.kina_tape_backward(tape[0], _ptr(ffi, my), _ptr(ffi, one)) == 0, ffi.string(lib.kina_last_error())
    g = cp.zeros(3, cp.float32)
    mg = memref.descriptor_of(g)
    assert lib.kina_tape_grad(tape[0], _ptr(ffi, mx), _ptr(ffi, mg)) == 0
    np.testing.assert_allclose(cp.asnumpy(g), 1 - np.tanh(cp.asnumpy(x_dev)) ** 2, rtol=1e-5)
    np.testing.assert_allclose(h_host, np.tanh(cp.asnumpy(x_dev)), rtol=1e-5)
    assert lib.kina_tape_free(tape[0]) == 0


@pytest.mark.skipif(bool(compiled.missing_mlir_tools()), reason="needs MLIR 19 tools")
def test_grad_of_the_compiled_mlp_on_cupy(tmp_path):
    from kina_fx.demos import compiled as demo_compiled

    so = compiled.compile_mlir(compiled.example_path("mlp.mlir"), str(tmp_path / "mlp.so"))
    f = compiled.load(so, demo_compiled.DECLARATION).function("_mlir_ciface_mlp_loss", outputs=1)
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    y = cp.asarray(rng.integers(0, 4, 16).astype(np.int64))
    params = [cp.asarray((rng.standard_normal(s) * 0.5).astype(np.float32)) for s in ((8, 6), (6,), (6, 4), (4,))]

    def compiled_loss(w1, b1, w2, b2):
        return f(cp.zeros((), cp.float32), x, y, w1, b1, w2, b2)

    def python_loss(w1, b1, w2, b2):
        return ad.cross_entropy(ad.relu(x @ w1 + b1) @ w2 + b2, y)

    got = ad.grad(compiled_loss, argnums=(0, 1, 2, 3))(*params)
    want = ad.grad(python_loss, argnums=(0, 1, 2, 3))(*params)
    for g, w in zip(got, want):
        assert isinstance(g, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(g), cp.asnumpy(w), rtol=1e-4, atol=1e-6)
