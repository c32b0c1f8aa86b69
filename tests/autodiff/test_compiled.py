"""kina_fx.compiled: calling compiled code with arrays, and ad.grad/vjp/jvp through it.

The "compiled module" is a real shared object (tests/hosts/c/compiled_fixture.c,
built with gcc against libkina_fx.so) whose functions call the runtime exports
the way MLIR-compiled code does.  Gradients are checked against the same
functions written with kina_fx.autograd and against central differences.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from support.abi import build_fixture_library
from kina_fx import autograd as ad
from kina_fx import compiled
from kina_fx.errors import ValidationError
from kina_fx.autograd.memory import TapeError

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
M = "kina_unranked_memref_t *"
DECLARATIONS = f"""
int32_t tanh_loss({M}, {M}, {M}, {M});
int32_t tanh_loss_loops({M}, {M}, {M}, {M});
int32_t double_by_hand({M}, {M});
int32_t exp_and_square({M}, {M}, {M});
"""


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    so = build_fixture_library(HERE.parent / "hosts" / "c" / "compiled_fixture.c",
                               tmp_path_factory.mktemp("compiled") / "fixture.so")
    return compiled.load(str(so), DECLARATIONS)


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


RNG = np.random.default_rng(3)
X = RNG.standard_normal((3, 4)).astype(np.float32)
W = RNG.standard_normal((4, 2)).astype(np.float32)


def python_loss(w):
    return ad.sum(ad.tanh(ad.matmul(X, w)))


def compiled_loss(mod, w, name="tanh_loss"):
    f = mod.function(name, outputs=1)
    return f(np.zeros((), np.float32), X, w, np.zeros((3, 2), np.float32))


def test_untraced_call_returns_the_output_array(mod):
    loss = compiled_loss(mod, W)
    assert isinstance(loss, np.ndarray)
    np.testing.assert_allclose(loss, np.tanh(X @ W).sum(), rtol=1e-6)


def test_grad_through_compiled_code(mod):
    g = ad.grad(lambda w: compiled_loss(mod, w))(W)
    np.testing.assert_allclose(g, ad.grad(python_loss)(W), rtol=1e-6, atol=1e-7)
    w64, eps = W.astype(np.float64), 1e-6
    f64 = lambda w: np.tanh(X.astype(np.float64) @ w).sum()   # noqa: E731
    numeric = np.zeros_like(w64)
    for i in np.ndindex(w64.shape):
        d = np.zeros_like(w64)
        d[i] = eps
        numeric[i] = (f64(w64 + d) - f64(w64 - d)) / (2 * eps)
    np.testing.assert_allclose(g, numeric, rtol=1e-4, atol=1e-5)


def test_vjp_and_jvp_through_compiled_code(mod):
    v = RNG.standard_normal(W.shape).astype(np.float32)
    value, pullback = ad.vjp(lambda w: compiled_loss(mod, w), W)
    want_value, want_pullback = ad.vjp(python_loss, W)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    np.testing.assert_allclose(pullback(np.float32(2.0)), want_pullback(np.float32(2.0)), rtol=1e-6)
    out, tangent = ad.jvp(lambda w: compiled_loss(mod, w), (W,), (v,))
    want_out, want_tangent = ad.jvp(python_loss, (W,), (v,))
    np.testing.assert_allclose(tangent, want_tangent, rtol=1e-5)


def test_second_order_through_compiled_code(mod):
    v = RNG.standard_normal(W.shape).astype(np.float32)
    hvp = ad.grad(lambda w: ad.sum(ad.grad(lambda u: compiled_loss(mod, u))(w) * v))(W)
    want = ad.grad(lambda w: ad.sum(ad.grad(python_loss)(w) * v))(W)
    np.testing.assert_allclose(hvp, want, rtol=1e-5, atol=1e-6)


def test_several_outputs_are_returned_traced(mod):
    f = mod.function("exp_and_square", outputs=2)
    x = RNG.standard_normal((2, 3)).astype(np.float32)

    def both(x):
        y, z = f(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), x)
        return ad.sum(y) + ad.sum(z)
    np.testing.assert_allclose(ad.grad(both)(x), np.exp(x) + 2 * np.exp(2 * x), rtol=1e-5)


def test_strict_mode_refuses_a_step_done_outside_the_runtime(mod):
    with pytest.raises(TapeError, match="overwritten|not produced"):
        ad.grad(lambda w: compiled_loss(mod, w, "tanh_loss_loops"))(W)


def test_an_output_written_by_hand_has_no_gradient_and_says_so(mod):
    f = mod.function("double_by_hand", outputs=1)
    with pytest.raises(TapeError, match="not written by a recorded runtime op"):
        ad.grad(lambda x: ad.sum(f(np.zeros((3, 4), np.float32), x)))(X)
    # untraced it is an ordinary call
    np.testing.assert_allclose(f(np.zeros((3, 4), np.float32), X), 2 * X)


def test_overwrites_are_caught_in_lenient_mode_too(mod):
    """Lenient mode forgives unknown buffers, never a recorded buffer that changed."""
    f = mod.function("tanh_loss_loops", outputs=1, strict=False)
    with pytest.raises(TapeError, match="overwritten"):
        ad.grad(lambda w: f(np.zeros((), np.float32), X, w, np.zeros((3, 2), np.float32)))(W)


def test_a_failing_call_raises_its_status_exception(mod):
    f = mod.function("tanh_loss", outputs=1)
    with pytest.raises(ValidationError, match="inner dimensions"):
        f(np.zeros((), np.float32), X, np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="output buffer"):
        f()


def test_compiled_code_updating_a_plain_array_argument_in_place_keeps_gradients_right(tmp_path):
    """A constant (plain array) argument updated in place by a runtime op: the tape
    keeps its own copy, so d/dw is still x, not the updated x * w."""
    src = tmp_path / "inplace.c"
    src.write_text('#include "kina_fx.h"\n'
                   "int32_t scale(kina_unranked_memref_t *loss, kina_unranked_memref_t *x,\n"
                   "              kina_unranked_memref_t *w) {\n"
                   "    int32_t rc = _mlir_ciface_runtime_mul_f32(x, x, w);   /* x *= w */\n"
                   "    return rc ? rc : _mlir_ciface_runtime_sum_f32(loss, x, KINA_ALL_AXES, 0);\n"
                   "}\n")
    so = build_fixture_library(src, tmp_path / "inplace.so")
    f = compiled.load(str(so), f"int32_t scale({M}, {M}, {M});").function("scale", outputs=1)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    w = np.array([0.5, -1.0, 4.0], np.float32)
    x_before = x.copy()
    g = ad.grad(lambda w: f(np.zeros((), np.float32), x, w))(w)
    np.testing.assert_array_equal(g, x_before)
    np.testing.assert_array_equal(x, x_before * w)     # the plain array was updated, as asked


def test_output_buffers_must_be_memref_parameters(mod):
    """A parameter declared as an int cannot be an output buffer: refused when
    the function is looked up, before any call."""
    other = compiled.load(mod.path, f"int32_t double_by_hand(int64_t, {M});")
    with pytest.raises(TypeError, match="must be memrefs"):
        other.function("double_by_hand", outputs=1)
    assert other.function("double_by_hand", outputs=0).outputs == 0


def _exp_and_square(mod, x):
    f = mod.function("exp_and_square", outputs=2)
    return f(np.zeros(x.shape, np.float32), np.zeros(x.shape, np.float32), x)


W0 = np.array([0.3, -0.5], np.float32)
E2 = np.exp(2 * W0.astype(np.float64))      # z = exp(w)^2 = exp(2w): dz = 2 E2, d2z = 4 E2


def test_compiled_code_inside_nested_tapes(mod):
    """The compiled call records through a tape nested in another: the inner
    gradient (2 exp(2w)), recorded by the outer tape, differentiates again
    (4 exp(2w)); taken after both ended it is the same."""
    with ad.Tape() as outer:
        w = outer.watch(W0)
        with ad.Tape() as inner:
            w2 = inner.watch(w)
            s = ad.sum(_exp_and_square(mod, w2)[1])
        g = inner.gradient(s, w2)
        gs = ad.sum(g)
    np.testing.assert_allclose(np.asarray(g.data), 2 * E2, rtol=1e-6)
    np.testing.assert_allclose(outer.gradient(gs, w), 4 * E2, rtol=1e-6)
    np.testing.assert_allclose(inner.gradient(s, w2).data, 2 * E2, rtol=1e-6)
    np.testing.assert_allclose(outer.gradient(s, w), 2 * E2, rtol=1e-6)


def test_compiled_code_on_an_outer_tapes_value_inside_an_inner_tape(mod):
    """The compiled call reads only the outer tape's box; the inner tape's own
    variable enters after it: each tape's gradient is its own."""
    v0 = np.array([1.0, 2.0], np.float32)
    with ad.Tape() as outer:
        w = outer.watch(W0)
        with ad.Tape() as inner:
            v = inner.watch(v0)
            s = ad.sum(_exp_and_square(mod, w)[1] * v)
        gw = outer.gradient(s, w)
    gv = inner.gradient(s, v)
    np.testing.assert_allclose(gw, 2 * E2 * v0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gv.data), E2, rtol=1e-6)


def test_jvp_through_compiled_code_inside_a_tape(mod):
    """Forward mode over the compiled call, inside a tape that differentiates the tangent."""
    with ad.Tape() as t:
        w = t.watch(W0)
        _, tangent = ad.jvp(lambda u: ad.sum(_exp_and_square(mod, u)[1]), (w,), (np.ones(2, np.float32),))
    np.testing.assert_allclose(float(tangent.data), np.sum(2 * E2), rtol=1e-6)
    np.testing.assert_allclose(t.gradient(tangent, w), 4 * E2, rtol=1e-6)
