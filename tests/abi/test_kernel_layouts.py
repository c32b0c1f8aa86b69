"""The kernels' layouts chosen for speed against the plain ones.

* ``gpu_ops.numpy_relu`` (relu's kernel and direct function on NumPy)
  compares with an array of zeros instead of a broadcast scalar: it must give
  ``np.maximum(x, 0)`` bit for bit, for every bit pattern (NaNs, signed zeros,
  infinities, subnormals), every float type, strided and in-place.
* softmax, log_softmax, cross_entropy and its gradient reduce a short axis
  (``gpu_ops.SHORT_AXIS``) in a copy with that axis swapped first: the
  results must agree with the plain layout (``SHORT_AXIS = 0``) and with a
  float64 reference, on every axis, type and special value.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kina_fx import gpu_ops
from kina_fx.autograd.primitives import PRIMITIVES

UINT = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}
FLOATS = [np.float16, np.float32, np.float64]


def random_bits(shape, dtype, seed):
    """Every bit pattern of ``dtype`` is equally likely, specials planted at the front."""
    uint = UINT[dtype]
    bits = np.random.default_rng(seed).integers(0, np.iinfo(uint).max, size=shape, dtype=uint,
                                                endpoint=True)
    x = bits.view(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0], dtype)
    x.reshape(-1)[: min(x.size, special.size)] = special[: x.size]
    return x


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 2), (31, 33), (64, 64), (3, 500, 7), (1 << 20,), ((1 << 20) + 1,)])
def test_relu_is_maximum_with_zero_bit_for_bit(dtype, shape):
    x = random_bits(shape, dtype, seed=sum(shape))
    expected = np.maximum(x, 0)
    assert same_bits(gpu_ops.numpy_relu(x), expected)
    assert same_bits(gpu_ops.relu(x), expected)
    out = np.full_like(x, 7)
    assert gpu_ops.numpy_relu(x, out) is out and same_bits(out, expected)
    y = x.copy()
    gpu_ops.numpy_relu(y, y)                    # in place
    assert same_bits(y, expected)


@pytest.mark.parametrize("dtype", FLOATS)
def test_relu_on_strided_views_and_outputs(dtype):
    base = random_bits((96, 80), dtype, seed=5)
    x = base[::3, 1::2]                         # 32 x 40: in the zero array's range
    expected = np.maximum(x, 0)
    assert same_bits(gpu_ops.numpy_relu(x), expected)
    out_base = np.zeros((64, 80), dtype)
    out = out_base[::2, ::2]
    gpu_ops.numpy_relu(x, out)
    assert same_bits(np.ascontiguousarray(out), expected)
    assert not out_base[1::2].any()             # rows between the view's are untouched


def test_the_zero_arrays_stay_zero_and_read_only():
    x = np.ones((40, 40), np.float32)
    gpu_ops.numpy_relu(x)
    zeros = gpu_ops._zeros_shaped(x)
    assert not zeros.flags.writeable and not zeros.any()
    with pytest.raises(ValueError):
        zeros[0, 0] = 1


# ---- the short-axis layout ----------------------------------------------------------


def reference_log_softmax(x, axis):
    """In float64, by the op table's reference formula."""
    return PRIMITIVES["log_softmax"].reference(np, x.astype(np.float64), axis)


def plain_layout(monkeypatch):
    monkeypatch.setattr(gpu_ops, "SHORT_AXIS", 0)


shapes = st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 3)).map(
    lambda t: (t[0] * 8, t[1], t[2]))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=shapes, ndim=st.integers(2, 3), dtype=st.sampled_from(FLOATS), data=st.data())
def test_softmax_and_log_softmax_on_a_short_axis(shape, ndim, dtype, data):
    shape = shape[:ndim]
    axis = data.draw(st.integers(-ndim, ndim - 1))
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 5).astype(dtype)
    tol = {np.float16: 3e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    with pytest.MonkeyPatch.context() as mp:
        plain_layout(mp)
        plain = gpu_ops.softmax(x, axis), gpu_ops.log_softmax(x, axis)
    got = gpu_ops.softmax(x, axis), gpu_ops.log_softmax(x, axis)
    ref = reference_log_softmax(x, axis)
    for g, p, r in zip(got, plain, (np.exp(ref), ref)):
        assert g.dtype == x.dtype and g.shape == x.shape and g.flags.c_contiguous
        np.testing.assert_allclose(g, p, rtol=4 * tol, atol=4 * tol)
        np.testing.assert_allclose(g, r, rtol=8 * tol, atol=8 * tol)
    for fn, expected in zip((gpu_ops.softmax, gpu_ops.log_softmax), got):
        y = x.copy()
        assert fn(y, axis, y) is y              # out aliasing x
        assert same_bits(y, expected)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.integers(1, 600), classes=st.integers(1, 40), lead=st.integers(1, 3),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_cross_entropy_and_its_gradient_on_a_short_axis(rows, classes, lead, dtype, seed):
    rng = np.random.default_rng(seed)
    shape = (lead, rows, classes) if lead > 1 else (rows, classes)
    logits = (rng.standard_normal(shape) * 5).astype(dtype)
    labels = rng.integers(0, classes, shape[:-1])
    with pytest.MonkeyPatch.context() as mp:
        plain_layout(mp)
        plain = gpu_ops.cross_entropy(logits, labels), gpu_ops.cross_entropy_grad(logits, labels, 0.5)
    loss, grad = gpu_ops.cross_entropy(logits, labels), gpu_ops.cross_entropy_grad(logits, labels, 0.5)
    ref = reference_log_softmax(logits, -1).reshape(-1, classes)
    picked = np.take_along_axis(ref, labels.reshape(-1, 1), axis=1)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    assert loss.dtype == dtype and grad.dtype == dtype and grad.shape == shape
    np.testing.assert_allclose(loss, -picked.mean(), rtol=8 * tol, atol=8 * tol)
    np.testing.assert_allclose(loss, plain[0], rtol=4 * tol, atol=4 * tol)
    onehot = np.eye(classes)[labels]
    np.testing.assert_allclose(grad, (np.exp(ref).reshape(shape) - onehot) * 0.5, rtol=8 * tol, atol=8 * tol)
    np.testing.assert_allclose(grad, plain[1], rtol=4 * tol, atol=4 * tol)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_special_values_on_a_short_axis_as_in_the_plain_layout(fn, monkeypatch):
    x = np.random.default_rng(1).standard_normal((64, 10)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, :] = -np.inf
    x[2, 5] = np.nan
    x[3, :] = 1e30
    x[4, 2] = -np.inf
    with np.errstate(all="ignore"):
        got = getattr(gpu_ops, fn)(x, -1)
        plain_layout(monkeypatch)
        plain = getattr(gpu_ops, fn)(x, -1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(plain))
    np.testing.assert_allclose(got[~np.isnan(got)], plain[~np.isnan(plain)], rtol=2e-6, atol=2e-6)
