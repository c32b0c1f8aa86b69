"""The tape ABI (kina_tape_*) through the real exports, in-process.

A tape records the runtime ops the calling fiber performs, by buffer; its
gradients are checked against kina_fx.autograd on the same functions and
against central differences in float64.  Every documented error returns its
status and kina_last_error text.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from support.abi import Abi, runtime_op_sample
from support.tapes import F16, F32, I64, LENIENT, OK, STRICT, TYPE, VALIDATION, Tape
from kina_fx import autograd as ad
from kina_fx.errors import Status
from kina_fx.runtime_ops import ALL_AXES, BY_NAME, RUNTIME_OPS


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


@pytest.fixture(scope="module")
def abi():
    return Abi()


def _mlp_buffers(rng, batch=5, inputs=4, hidden=3, classes=3):
    return dict(
        x=rng.standard_normal((batch, inputs)).astype(np.float32),
        labels=rng.integers(0, classes, batch).astype(np.int64),
        w1=(rng.standard_normal((inputs, hidden)) * 0.7).astype(np.float32),
        b1=(rng.standard_normal(hidden) * 0.3).astype(np.float32),
        w2=(rng.standard_normal((hidden, classes)) * 0.7).astype(np.float32),
        b2=(rng.standard_normal(classes) * 0.3).astype(np.float32))


def _mlp_through_runtime(tape, p):
    batch, hidden = p["x"].shape[0], p["w1"].shape[1]
    classes = p["w2"].shape[1]
    h0 = np.empty((batch, hidden), np.float32)
    h1 = np.empty_like(h0)
    h = np.empty_like(h0)
    z0 = np.empty((batch, classes), np.float32)
    z = np.empty_like(z0)
    loss = np.empty((), np.float32)
    tape.op("matmul", h0, p["x"], p["w1"])
    tape.op("add", h1, h0, p["b1"])
    tape.op("relu", h, h1)
    tape.op("matmul", z0, h, p["w2"])
    tape.op("add", z, z0, p["b2"])
    tape.op("cross_entropy", loss, z, p["labels"])
    return loss, h


def _mlp_python(x, labels, w1, b1, w2, b2):
    h = ad.relu(ad.matmul(x, w1) + b1)
    return ad.cross_entropy(ad.matmul(h, w2) + b2, labels)


def _mlp_float64(x, labels, w1, b1, w2, b2):
    h = np.maximum(x @ w1 + b1, 0)
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    lsm = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -lsm[np.arange(len(labels)), labels].mean()


PARAMS = ("w1", "b1", "w2", "b2")


def test_mlp_gradients_match_autograd_and_central_differences(abi):
    p = _mlp_buffers(np.random.default_rng(0))
    t = Tape(abi)
    for name in PARAMS:
        assert t.call("kina_tape_watch", p[name], F32) == OK
    assert t.call("kina_tape_constant", p["x"], F32) == OK
    assert t.call("kina_tape_constant", p["labels"], I64) == OK
    loss, _ = _mlp_through_runtime(t, p)
    t.end()
    assert t.call("kina_tape_backward", loss, np.ones((), np.float32)) == OK, abi.last_error()
    grads = {}
    for name in PARAMS:
        grads[name] = np.zeros_like(p[name])
        assert t.call("kina_tape_grad", p[name], grads[name]) == OK, abi.last_error()
    t.free()

    want = ad.grad(_mlp_python, argnums=(2, 3, 4, 5))(*(p[k] for k in ("x", "labels") + PARAMS))
    p64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in p.items()}
    assert np.isclose(loss, _mlp_float64(**p64), rtol=1e-5)
    for name, w in zip(PARAMS, want):
        np.testing.assert_allclose(grads[name], w, rtol=1e-5, atol=1e-6)
        numeric = np.zeros_like(p64[name])
        eps = 1e-6
        for i in np.ndindex(numeric.shape):
            hi, lo = dict(p64), dict(p64)
            hi[name] = p64[name].copy()
            lo[name] = p64[name].copy()
            hi[name][i] += eps
            lo[name][i] -= eps
            numeric[i] = (_mlp_float64(**hi) - _mlp_float64(**lo)) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", RUNTIME_OPS, ids=lambda op: op.name)
def test_every_op_is_recorded_with_autograds_vjp(abi, op):
    rng = np.random.default_rng(len(op.name))
    inputs, params = runtime_op_sample(op, rng)
    float_inputs = [i for i, (a, o) in enumerate(zip(inputs, op.inputs)) if o.differentiable]
    out_shape = op.check(*inputs, *params)
    out = np.zeros(out_shape, op.output.dtype)
    t = Tape(abi)
    for i, a in enumerate(inputs):
        code = {np.float32: F32, np.float16: F16, np.int64: I64}[a.dtype.type]
        if i in float_inputs:
            assert t.call("kina_tape_watch", a, code) == OK, abi.last_error()
        else:
            assert t.call("kina_tape_constant", a, code) == OK
    if op.primitive is None:                  # no derivative: refused, nothing written
        assert abi.call(op.export, out, *inputs, *params) == Status.UNIMPLEMENTED
        assert "has no derivative" in abi.last_error() and not out.any()
        t.free()
        return
    t.op(op.name, out, *inputs, *params)
    t.end()
    if op.output.dtype != np.float32:         # the f16 copy: recorded, gradients are float32-only
        t.free()
        return
    cot = rng.standard_normal(out_shape).astype(np.float32)
    assert t.call("kina_tape_backward", out, cot) == OK, abi.last_error()

    def f(*diff):
        args = list(inputs)
        for i, d in zip(float_inputs, diff):
            args[i] = d
        return op.differentiate(ad, *args, *params)

    value, pullback = ad.vjp(f, *[inputs[i] for i in float_inputs])
    np.testing.assert_allclose(out, np.asarray(value), rtol=1e-6, atol=1e-6)
    want = pullback(cot)
    for i, w in zip(float_inputs, want):
        g = np.zeros_like(inputs[i])
        assert t.call("kina_tape_grad", inputs[i], g) == OK, abi.last_error()
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)
    t.free()


def test_hessian_vector_product_with_nested_tapes(abi):
    """d/dx (grad f(x) . v) for f = sum(tanh(x * w)), both tapes driven through the C functions."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    v = rng.standard_normal((3, 4)).astype(np.float32)
    outer = Tape(abi)
    assert outer.call("kina_tape_watch", x, F32) == OK
    assert outer.call("kina_tape_constant", w, F32) == OK
    assert outer.call("kina_tape_constant", v, F32) == OK
    inner = Tape(abi)
    assert inner.call("kina_tape_watch", x, F32) == OK
    xw, th, s = np.empty_like(x), np.empty_like(x), np.empty((), np.float32)
    inner.op("mul", xw, x, w)
    inner.op("tanh", th, xw)
    inner.op("sum", s, th, ALL_AXES, 0)
    inner.end()
    assert inner.call("kina_tape_backward", s, np.ones((), np.float32)) == OK, abi.last_error()
    g = np.empty_like(x)
    assert inner.call("kina_tape_grad", x, g) == OK, abi.last_error()
    gv, dot = np.empty_like(x), np.empty((), np.float32)
    outer.op("mul", gv, g, v)
    outer.op("sum", dot, gv, ALL_AXES, 0)
    outer.end()
    assert outer.call("kina_tape_backward", dot, np.ones((), np.float32)) == OK, abi.last_error()
    hv = np.empty_like(x)
    assert outer.call("kina_tape_grad", x, hv) == OK, abi.last_error()
    inner.free()
    outer.free()

    def f(x):
        return ad.sum(ad.tanh(x * w))
    want = ad.grad(lambda x: ad.sum(ad.grad(f)(x) * v))(x)
    np.testing.assert_allclose(g, ad.grad(f)(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hv, want, rtol=1e-5, atol=1e-6)
    # and a float64 finite difference of the closed-form gradient
    x64, w64, v64 = (a.astype(np.float64) for a in (x, w, v))
    grad64 = lambda x: w64 * (1 - np.tanh(x * w64) ** 2)   # noqa: E731
    eps = 1e-6
    np.testing.assert_allclose(hv, (grad64(x64 + eps * v64) - grad64(x64 - eps * v64)) / (2 * eps),
                               rtol=1e-4, atol=1e-5)


def test_mlir_style_begin_writes_the_handle_into_a_memref(abi):
    cell = np.zeros((1,), np.int64)
    assert abi.call("_mlir_ciface_kina_tape_begin", cell, STRICT) == OK
    handle = int(cell[0])
    x = np.ones((2,), np.float32)
    y = np.empty_like(x)
    assert abi.call("_mlir_ciface_kina_tape_watch_f32", handle, x) == OK
    assert abi.call(BY_NAME["exp"].export, y, x) == OK
    assert abi.lib.kina_tape_end(handle) == OK
    assert abi.call("_mlir_ciface_kina_tape_backward_f32", handle, y, np.ones(2, np.float32)) == OK
    g = np.empty_like(x)
    assert abi.call("_mlir_ciface_kina_tape_grad_f32", handle, x, g) == OK
    np.testing.assert_allclose(g, np.e, rtol=1e-6)
    assert abi.lib.kina_tape_free(handle) == OK


def test_an_op_whose_row_names_no_primitive_is_refused_by_the_tape(abi):
    """A row without a derivative (primitive None, as a collective may be) is
    computed as usual off the tape and refused on it: status 4, nothing written,
    the tape usable afterwards."""
    op = BY_NAME["exp"]
    x = np.ones((2,), np.float32)
    y = np.zeros_like(x)
    object.__setattr__(op, "primitive", None)      # the frozen row, for this test only
    try:
        assert abi.call(op.export, y, x) == OK
        np.testing.assert_allclose(y, np.e, rtol=1e-6)
        y[...] = 0
        t = Tape(abi)
        assert t.call("kina_tape_watch", x, F32) == OK
        assert abi.call(op.export, y, x) == Status.UNIMPLEMENTED
        assert "_mlir_ciface_runtime_exp_f32 has no derivative" in abi.last_error()
        assert not y.any()
    finally:
        object.__setattr__(op, "primitive", "exp")
    t.op("exp", y, x)
    t.end()
    assert t.call("kina_tape_backward", y, np.ones(2, np.float32)) == OK, abi.last_error()
    t.free()


# ---- strict mode and overwrites ---------------------------------------------------

def test_strict_mode_refuses_a_buffer_it_cannot_account_for(abi):
    x = np.ones((2,), np.float32)
    stranger = np.full((2,), 2.0, np.float32)      # computed "by MLIR loops": never recorded
    out = np.zeros_like(x)
    t = Tape(abi)
    assert t.call("kina_tape_watch", x, F32) == OK
    assert abi.call(BY_NAME["mul"].export, out, x, stranger) == VALIDATION
    assert "was not produced by a recorded runtime op" in abi.last_error()
    assert (out == 0).all()
    t.free()


def test_lenient_mode_treats_unknown_buffers_as_constants(abi):
    x = np.ones((2,), np.float32)
    c = np.full((2,), 2.0, np.float32)
    out = np.zeros_like(x)
    t = Tape(abi, LENIENT)
    assert t.call("kina_tape_watch", x, F32) == OK
    t.op("mul", out, x, c)
    t.end()
    assert t.call("kina_tape_backward", out, np.ones(2, np.float32)) == OK
    g = np.zeros_like(x)
    assert t.call("kina_tape_grad", x, g) == OK
    assert (g == 2).all()
    t.free()


def test_integer_inputs_need_no_declaration(abi):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = np.zeros((2, 2), np.float32)
    t = Tape(abi)
    assert t.call("kina_tape_watch", x, F32) == OK
    t.op("gather", out, x, np.array([2, 0], np.int64))
    t.free()


def test_a_recorded_buffer_overwritten_then_read_is_reported(abi):
    x = np.ones((2,), np.float32)
    h, y = np.zeros_like(x), np.zeros_like(x)
    t = Tape(abi)
    assert t.call("kina_tape_watch", x, F32) == OK
    t.op("exp", h, x)
    h[0] = 5.0                                  # the host writes a recorded buffer
    assert abi.call(BY_NAME["tanh"].export, y, h) == VALIDATION
    assert "overwritten" in abi.last_error()
    t.free()


def test_backward_from_an_overwritten_output_is_reported(abi):
    x = np.ones((2,), np.float32)
    y = np.zeros_like(x)
    t = Tape(abi)
    assert t.call("kina_tape_watch", x, F32) == OK
    t.op("exp", y, x)
    t.end()
    y[...] = 0
    assert t.call("kina_tape_backward", y, np.ones(2, np.float32)) == VALIDATION
    assert "overwritten" in abi.last_error()
    t.free()


def test_inputs_overwritten_after_recording_do_not_change_gradients(abi):
    """The tape keeps copies: reusing an input's memory before backward is safe."""
    x = np.full((2,), 0.5, np.float32)
    w = np.full((2,), 3.0, np.float32)
    y = np.zeros_like(x)
    t = Tape(abi)
    assert t.call("kina_tape_watch", x, F32) == OK
    assert t.call("kina_tape_constant", w, F32) == OK
    t.op("mul", y, x, w)
    t.end()
    w[...] = -1.0
    assert t.call("kina_tape_backward", y, np.ones(2, np.float32)) == OK
    g = np.zeros_like(x)
    assert t.call("kina_tape_grad", x, g) == OK
    assert (g == 3).all()
    t.free()


def test_in_place_ops_are_recorded(abi):
    x = np.full((3,), 0.3, np.float32)
    buf = x.copy()
    t = Tape(abi)
    assert t.call("kina_tape_watch", buf, F32) == OK
    t.op("tanh", buf, buf)          # buf now holds tanh(x)
    t.op("mul", buf, buf, buf)      # and now tanh(x)**2
    t.end()
    assert abi.call("kina_tape_backward", t.handle, buf, np.ones(3, np.float32)) == OK
    g = np.zeros_like(x)
    # grad names the watched buffer by identity: the gradient is with respect to
    # the value it held when it was watched, not what the ops wrote there since
    assert abi.call("kina_tape_grad", t.handle, buf, g) == OK
    th = np.tanh(x.astype(np.float64))
    np.testing.assert_allclose(g, 2 * th * (1 - th ** 2), rtol=1e-5)
    t.free()


# ---- bad input ---------------------------------------------------------------------

def test_bad_handles_and_lifecycle_errors(abi):
    x = np.ones((2,), np.float32)
    y = np.zeros_like(x)
    lib = abi.lib
    assert lib.kina_tape_end(0) == VALIDATION
    assert lib.kina_tape_end(12345) == VALIDATION and "not a tape handle" in abi.last_error()
    t = Tape(abi)
    assert t.call("kina_tape_watch", x, I64) == TYPE and "only floating" in abi.last_error()
    assert t.call("kina_tape_watch", x, 99) == TYPE and "element type code" in abi.last_error()
    assert t.call("kina_tape_watch", x, F32) == OK
    assert t.call("kina_tape_watch", x, F32) == VALIDATION and "already watched" in abi.last_error()
    t.op("exp", y, x)
    assert t.call("kina_tape_backward", y, np.ones(2, np.float32)) == VALIDATION
    assert "kina_tape_end first" in abi.last_error()
    t.end()
    assert lib.kina_tape_end(t.handle) == VALIDATION and "already ended" in abi.last_error()
    assert t.call("kina_tape_grad", x, np.zeros(2, np.float32)) == VALIDATION
    assert "backward first" in abi.last_error()
    assert t.call("kina_tape_backward", np.ones(2, np.float32), np.ones(2, np.float32)) == VALIDATION
    assert "never produced" in abi.last_error()
    assert t.call("kina_tape_backward", y, np.ones(3, np.float32)) == VALIDATION
    assert "cotangent of shape" in abi.last_error()
    assert t.call("kina_tape_backward", y, np.ones(2, np.float32)) == OK
    assert t.call("kina_tape_grad", y, np.zeros(2, np.float32)) == VALIDATION
    assert "does not watch" in abi.last_error()
    assert t.call("kina_tape_grad", x, np.zeros(3, np.float32)) == VALIDATION
    assert t.call("kina_tape_grad", x, None) == VALIDATION and "null" in abi.last_error()
    t.free()
    assert lib.kina_tape_free(t.handle) == VALIDATION and "stale" in abi.last_error()
    assert abi.call("kina_tape_watch", t.handle, x, F32) == VALIDATION
    assert lib.kina_tape_begin(7, abi.ffi.new("kina_tape_t *")) == VALIDATION
    assert "flags" in abi.last_error()
    assert lib.kina_tape_begin(0, abi.ffi.NULL) == VALIDATION


def test_end_must_pop_the_innermost_tape(abi):
    outer, inner = Tape(abi), Tape(abi)
    assert abi.lib.kina_tape_end(outer.handle) == VALIDATION
    assert "innermost" in abi.last_error()
    inner.end()
    outer.end()
    inner.free()
    outer.free()


def test_a_tape_belongs_to_its_thread(abi):
    t = Tape(abi)
    x = np.ones((2,), np.float32)
    results = []

    def other():
        results.append(abi.lib.kina_tape_end(t.handle))
        results.append(abi.ffi.string(abi.lib.kina_last_error()).decode())
        m = abi.mem(x)
        results.append(abi.lib.kina_tape_watch(t.handle, m, F32))

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert results[0] == VALIDATION and "another OS thread" in results[1]
    assert results[2] == VALIDATION
    # and ops on the other thread were never recorded by it: its fiber has its own stack
    t.free()


def test_ops_outside_any_tape_are_untouched(abi):
    x = np.ones((2,), np.float32)
    y = np.zeros_like(x)
    assert abi.call(BY_NAME["exp"].export, y, x) == OK
    np.testing.assert_allclose(y, np.e)
