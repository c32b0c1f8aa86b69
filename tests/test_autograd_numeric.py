"""Every primitive's derivatives against central finite differences (float64).

Shapes, axes and broadcasting are drawn with hypothesis; values come from a
seeded NumPy generator (well conditioned, away from kinks and ties).  Each
check compares directional derivatives, which tests the whole Jacobian with a
random probe:

* reverse mode: ``<u, J v>`` from finite differences vs ``<vjp(u), v>``;
* forward mode: ``J v`` from finite differences vs ``jvp``'s tangent;
* second order: the gradient of ``x -> <vjp(x)(u), v>`` (the backward pass,
  differentiated by an outer tape) against finite differences of it.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kina_fx import autograd as ad

EPS = 1e-6
SETTINGS = dict(deadline=None, max_examples=30,
                suppress_health_check=[HealthCheck.too_slow])

small_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
nonscalar_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)


def _values(rng, shape, kind="any"):
    x = rng.standard_normal(shape)
    if kind == "positive":
        x = np.abs(x) + 0.5
    elif kind == "away_from_zero":
        x = np.where(x >= 0, x + 0.2, x - 0.2)
    return np.asarray(x, dtype=np.float64)


def _dot(a, b):
    return float(np.sum(np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)))


def _fd_directional(f, args, dirs):
    plus = f(*[a + EPS * d for a, d in zip(args, dirs)])
    minus = f(*[a - EPS * d for a, d in zip(args, dirs)])
    return (np.asarray(plus, np.float64) - np.asarray(minus, np.float64)) / (2 * EPS)


def check_first_order(f, args, rng):
    """vjp and jvp of ``f`` at ``args`` against central differences."""
    out = np.asarray(f(*args))
    u = rng.standard_normal(out.shape)
    dirs = [rng.standard_normal(np.shape(a)) for a in args]
    fd = _fd_directional(f, args, dirs)

    value, vjp_fn = ad.vjp(f, *args)
    np.testing.assert_allclose(np.asarray(value), out, rtol=1e-12, atol=1e-12)
    cts = vjp_fn(u)
    assert len(cts) == len(args)
    for ct, a in zip(cts, args):
        assert np.shape(ct) == np.shape(a)
    lhs = sum(_dot(ct, d) for ct, d in zip(cts, dirs))
    np.testing.assert_allclose(lhs, _dot(u, fd), rtol=1e-5, atol=1e-6)

    _, tangent = ad.jvp(f, tuple(args), tuple(dirs))
    assert np.shape(tangent) == out.shape
    np.testing.assert_allclose(np.asarray(tangent), fd, rtol=1e-5, atol=1e-6)


def check_second_order(f, args, rng):
    """The backward pass is itself differentiable: grad of <vjp(u), v>."""
    out = np.asarray(f(*args))
    u = rng.standard_normal(out.shape)
    v = [rng.standard_normal(np.shape(a)) for a in args]

    def probe(*xs):
        _, fn = ad.vjp(f, *xs)
        cts = fn(u)
        total = 0.0
        for ct, vi in zip(cts, v):
            total = total + ad.sum(ad.mul(ct, vi))
        return total

    grads = ad.grad(probe, argnums=tuple(range(len(args))))(*args)
    dirs = [rng.standard_normal(np.shape(a)) for a in args]
    fd = _fd_directional(lambda *xs: np.asarray(probe(*xs)), args, dirs)
    lhs = sum(_dot(g, d) for g, d in zip(grads, dirs))
    np.testing.assert_allclose(lhs, float(fd), rtol=1e-4, atol=1e-5)


# --- the cases: (name, draw(data, rng) -> (f, args)) ----------------------------

def _unary(fn, kind="any"):
    def draw(data, rng):
        shape = data.draw(small_shapes, label="shape")
        return fn, [_values(rng, shape, kind)]
    return draw


def _binary(fn, kind_a="any", kind_b="any"):
    def draw(data, rng):
        shapes = data.draw(hnp.mutually_broadcastable_shapes(
            num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=3), label="shapes")
        a_shape, b_shape = shapes.input_shapes
        return fn, [_values(rng, a_shape, kind_a), _values(rng, b_shape, kind_b)]
    return draw


def _axis_strategy(ndim):
    if ndim == 0:
        return st.just(None)
    single = st.integers(-ndim, ndim - 1)
    many = st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(
        lambda axes: tuple(a - ndim if i % 2 else a for i, a in enumerate(axes)))
    return st.one_of(st.none(), single, many)


def _reduction(fn):
    def draw(data, rng):
        shape = data.draw(small_shapes, label="shape")
        axis = data.draw(_axis_strategy(len(shape)), label="axis")
        keepdims = data.draw(st.booleans(), label="keepdims")
        return (lambda x: fn(x, axis=axis, keepdims=keepdims)), [_values(rng, shape)]
    return draw


def _draw_matmul(data, rng):
    m, k, n = (data.draw(st.integers(1, 3)) for _ in range(3))
    case = data.draw(st.sampled_from(["2d", "vec_mat", "mat_vec", "vec_vec", "batched"]))
    if case == "2d":
        a, b = (m, k), (k, n)
    elif case == "vec_mat":
        a, b = (k,), (k, n)
    elif case == "mat_vec":
        a, b = (m, k), (k,)
    elif case == "vec_vec":
        a, b = (k,), (k,)
    else:
        batch = data.draw(hnp.mutually_broadcastable_shapes(
            num_shapes=2, min_dims=1, max_dims=2, min_side=1, max_side=3))
        a = batch.input_shapes[0] + (m, k)
        b = batch.input_shapes[1] + (k, n)
    return ad.matmul, [_values(rng, a), _values(rng, b)]


def _draw_reshape(data, rng):
    shape = data.draw(small_shapes)
    size = int(np.prod(shape))
    target = data.draw(st.sampled_from([(size,), (1, size), (size, 1), (-1,), (1, -1, 1)]))
    return (lambda x: ad.reshape(x, target)), [_values(rng, shape)]


def _draw_transpose(data, rng):
    shape = data.draw(small_shapes)
    axes = data.draw(st.one_of(st.none(), st.permutations(range(len(shape))).map(tuple)))
    if axes is not None and axes:
        axes = tuple(a - len(shape) if i % 2 else a for i, a in enumerate(axes))
    return (lambda x: ad.transpose(x, axes)), [_values(rng, shape)]


def _draw_broadcast_to(data, rng):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(
        num_shapes=1, min_dims=0, max_dims=3, min_side=1, max_side=3))
    src = shapes.input_shapes[0]
    return (lambda x: ad.broadcast_to(x, shapes.result_shape)), [_values(rng, src)]


def _draw_gather(data, rng):
    shape = data.draw(nonscalar_shapes)
    idx_shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4))
    idx = rng.integers(0, shape[0], size=idx_shape)        # repeats are likely: they add up
    return (lambda v: ad.gather(v, idx)), [_values(rng, shape)]


def _draw_getitem(data, rng):
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=4))
    kind = data.draw(st.sampled_from(["slice", "int", "fancy", "mixed", "newaxis", "bool"]))
    if kind == "slice":
        index = (slice(1, None), slice(None, None, -1))
    elif kind == "int":
        index = -1
    elif kind == "fancy":
        index = rng.integers(0, shape[0], size=5)
    elif kind == "mixed":
        index = (Ellipsis, rng.integers(0, shape[-1], size=3))
    elif kind == "newaxis":
        index = (None, 0)
    else:
        index = rng.random(shape[0]) > 0.5
    return (lambda x: x[index] * 1.0 if isinstance(x, ad.Tensor) else ad.getitem(x, index)), \
        [_values(rng, shape)]


def _draw_axis_op(fn):
    def draw(data, rng):
        shape = data.draw(nonscalar_shapes)
        axis = data.draw(st.integers(-len(shape), len(shape) - 1))
        return (lambda x: fn(x, axis=axis)), [_values(rng, shape)]
    return draw


def _draw_cross_entropy(data, rng):
    lead = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4))
    classes = data.draw(st.integers(1, 5))
    labels = rng.integers(0, classes, size=lead)
    return (lambda z: ad.cross_entropy(z, labels)), [_values(rng, lead + (classes,))]


def _draw_repeat_interleave(data, rng):
    shape = data.draw(nonscalar_shapes)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    reps = data.draw(st.integers(0, 3))
    return (lambda x: ad.repeat_interleave(x, reps, axis)), [_values(rng, shape)]


def _draw_where(data, rng):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(
        num_shapes=3, min_dims=0, max_dims=3, min_side=1, max_side=3))
    c_shape, a_shape, b_shape = shapes.input_shapes
    cond = rng.random(c_shape) > 0.5
    return (lambda a, b: ad.where(cond, a, b)), [_values(rng, a_shape), _values(rng, b_shape)]


def _draw_pow_traced(data, rng):
    return _binary(ad.pow, "positive", "any")(data, rng)


def _draw_pow_const(data, rng):
    shape = data.draw(small_shapes)
    p = data.draw(st.sampled_from([0, 1, 2, 3, -1, 0.5, 2.5]))
    return (lambda x: ad.pow(x, p)), [_values(rng, shape, "positive")]


CASES = {
    "add": _binary(ad.add),
    "sub": _binary(ad.sub),
    "mul": _binary(ad.mul),
    "div": _binary(ad.div, "any", "away_from_zero"),
    "pow": _draw_pow_traced,
    "pow_const": _draw_pow_const,
    "neg": _unary(ad.neg),
    "exp": _unary(ad.exp),
    "log": _unary(ad.log, "positive"),
    "tanh": _unary(ad.tanh),
    "sigmoid": _unary(ad.sigmoid),
    "relu": _unary(ad.relu, "away_from_zero"),
    "matmul": _draw_matmul,
    "sum": _reduction(ad.sum),
    "mean": _reduction(ad.mean),
    "max": _reduction(ad.max),
    "reshape": _draw_reshape,
    "transpose": _draw_transpose,
    "broadcast_to": _draw_broadcast_to,
    "gather": _draw_gather,
    "getitem": _draw_getitem,
    "softmax": _draw_axis_op(ad.softmax),
    "log_softmax": _draw_axis_op(ad.log_softmax),
    "cross_entropy": _draw_cross_entropy,
    "repeat_interleave": _draw_repeat_interleave,
    "where": _draw_where,
}


@pytest.mark.parametrize("name", sorted(CASES))
@settings(**SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_first_order_matches_finite_differences(name, data, seed):
    rng = np.random.default_rng(seed)
    f, args = CASES[name](data, rng)
    check_first_order(f, args, rng)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(**dict(SETTINGS, max_examples=12))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_backward_pass_is_differentiable(name, data, seed):
    rng = np.random.default_rng(seed)
    f, args = CASES[name](data, rng)
    check_second_order(f, args, rng)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(**dict(SETTINGS, max_examples=8))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float32_in_float32_gradients_out(name, data, seed):
    rng = np.random.default_rng(seed)
    f, args = CASES[name](data, rng)
    args32 = [a.astype(np.float32) for a in args]
    out, vjp_fn = ad.vjp(f, *args32)
    assert np.asarray(out).dtype == np.float32
    cts = vjp_fn(np.ones(np.shape(out), np.float32))
    for ct, a in zip(cts, args32):
        assert np.asarray(ct).dtype == np.float32, (name, np.asarray(ct).dtype)
        assert np.shape(ct) == a.shape
    _, t = ad.jvp(f, tuple(args32), tuple(np.ones_like(a) for a in args32))
    assert np.asarray(t).dtype == np.float32
