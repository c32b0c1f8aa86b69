"""The ops of kina_fx/autograd/ops_math.py, ops_shape.py and ops_linalg.py.

Their primitives are rows of the op table, so the generic tests over the
registry (test_autograd_numeric.py: finite differences to second order,
float32, the CuPy code path; test_autograd_oracle.py: HIPS autograd) cover
them through their ``sample`` and ``reference``.  This file gives the same
checks to the composites of those modules (functions of primitives
registered with a sample domain, ``COMPOSITES``: hstack, split, diagonal,
eigh, svd, norm, ...), each drawn from its ``sample`` domain (shapes, axes,
keepdims, broadcasting and empty arrays by hypothesis, values from a seeded
generator) and checked in float64:

* its value against ``reference`` run on NumPy;
* reverse and forward mode against central differences (``<u, J v>`` and
  ``J v`` for random ``u``, ``v``);
* second order: the gradient of ``x -> <vjp(x)(u), v>`` (grad of vjp) and the
  jvp of the vjp, against central differences of the first derivative;
* HIPS autograd as an oracle (``reference`` run on ``autograd.numpy``):
  values and gradients agree to 1e-7 relative, and so do second derivatives;
* float32 in, float32 out (values, cotangents, tangents).

Then the decisions the generic checks cannot see: derivatives at kinks and
ties, zeros in ``prod``, degenerate spectra, clear errors for what is refused.
"""
import numpy as np
import pytest
from support.autograd import (Draw, FakeDeviceArray, args_on_device, fake_cupy,  # noqa: F401
                              on_device)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kina_fx import autograd as ad
from kina_fx.autograd import ops_linalg, ops_math, ops_shape
from kina_fx.autograd.primitives import COMPOSITES
from kina_fx.errors import KinaTypeError, UnimplementedError, ValidationError

try:
    import autograd as hips
    import autograd.numpy as hnp_np
except ImportError:           # a test-only dependency; CI installs it
    hips = hnp_np = None

EPS = 1e-6
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.filter_too_much])
_pymax = max


def needs_hips(test):
    """HIPS autograd is the oracle; marked integration, so under CI=true a
    skip (autograd not installed) fails the run."""
    for mark in (pytest.mark.integration,
                 pytest.mark.skipif(hips is None, reason="needs HIPS autograd "
                                    "(pip install autograd), the oracle"),
                 pytest.mark.filterwarnings("ignore:Output seems independent of input")):
        test = mark(test)
    return test


_MODULES = {m.__name__ for m in (ops_math, ops_shape, ops_linalg)}
#: name -> (function, sample, reference) for every breadth op
OPS = {name: (p.public, p.sample, p.reference) for name, p in ad.PRIMITIVES.items()
       if p.module in _MODULES}
OPS.update({name: (fn, fn.sample, fn.reference) for name, fn in COMPOSITES.items()
            if fn.__module__ in _MODULES})
#: the composites: the generic checks of this file (the primitives' are in
#: test_autograd_numeric.py and test_autograd_oracle.py)
NAMES = sorted(name for name in OPS if name not in ad.PRIMITIVES)


# --- one drawn call of an op, as a function of its float64 array arguments -----------------


def _is_leaf(v):
    return isinstance(v, np.ndarray) and v.dtype == np.float64


class Call:
    """``fn(*args, **kwargs)`` with the float64 arrays among ``args`` (also
    inside list arguments) as the variables."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, list(args), kwargs
        self.paths = []
        for i, a in enumerate(self.args):
            if _is_leaf(a):
                self.paths.append((i, None))
            elif isinstance(a, (list, tuple)):
                self.paths.extend((i, j) for j, x in enumerate(a) if _is_leaf(x))
        self.leaves = [self._get(p) for p in self.paths]

    def _get(self, path):
        i, j = path
        return self.args[i] if j is None else self.args[i][j]

    def arguments(self, leaves):
        args = [list(a) if isinstance(a, (list, tuple)) else a for a in self.args]
        for (i, j), v in zip(self.paths, leaves):
            if j is None:
                args[i] = v
            else:
                args[i][j] = v
        return args

    def __call__(self, *leaves):
        """The op's outputs as a list (one entry for a single array)."""
        return outputs(self.fn(*self.arguments(leaves), **self.kwargs))

    def reference(self, module, reference, leaves):
        return outputs(reference(module, *self.arguments(leaves), **self.kwargs))


def outputs(res):
    if isinstance(res, (list, tuple)) or type(res).__name__ == "SequenceBox":  # HIPS lists
        return [v for r in res for v in outputs(r)]
    return [res]


def draw_call(name, data, seed):
    fn, sample, _ = OPS[name]
    rng = np.random.default_rng(seed)
    args, kwargs = sample(Draw(data, rng))
    call = Call(fn, args, kwargs)
    assume(call.leaves)
    return call, rng


def _vdot(a, b):
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


def _fd(f, leaves, dirs):
    plus = f(*[x + EPS * d for x, d in zip(leaves, dirs)])
    minus = f(*[x - EPS * d for x, d in zip(leaves, dirs)])
    return [(np.asarray(p, np.float64) - np.asarray(m, np.float64)) / (2 * EPS)
            for p, m in zip(plus, minus)]


def _close(actual, expected, rtol, scale=1.0):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * _pymax(1.0, scale))


def _scale(*values):
    return _pymax([float(np.max(np.abs(v))) if np.size(v) else 0.0 for v in values] + [0.0])


def _randn_like(rng, values):
    return [rng.standard_normal(np.shape(v)) for v in values]


def test_every_breadth_op_has_a_sample_and_reference():
    # the list, less what lives elsewhere (clip, stack, concatenate in
    # ops_core.py; ravel, squeeze, dot, array in functions.py)
    expected = {
        "abs", "sqrt", "square", "sign", "sin", "cos", "tan", "sinh", "cosh", "arcsin",
        "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "log1p", "expm1", "log2", "log10",
        "exp2", "floor", "ceil", "maximum", "minimum", "mod", "logaddexp", "arctan2", "hypot",
        "min", "prod", "var", "std", "logsumexp", "cumsum", "tensordot", "einsum", "outer",
        "inner",
        "hstack", "vstack", "split", "expand_dims", "swapaxes", "moveaxis",
        "flip", "roll", "tile", "pad", "sort", "tril", "triu", "diag", "diagonal", "trace",
        "inv", "solve", "det", "slogdet", "cholesky", "eigh", "svd", "norm"}
    assert expected <= set(OPS), sorted(expected - set(OPS))
    for name, (fn, sample, reference) in OPS.items():
        assert callable(sample), name
        assert reference is not None, name
        assert fn.__doc__, name
        if not name.endswith("_packed"):    # eigh_packed, svd_packed: behind eigh, svd
            assert hasattr(ad, name) and name in ad.__all__, name


# --- values and first order -------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_values_match_numpy_and_derivatives_match_finite_differences(name, data, seed):
    call, rng = draw_call(name, data, seed)
    _, _, reference = OPS[name]
    leaves = call.leaves
    outs = [np.asarray(v) for v in call(*leaves)]
    expected = call.reference(np, reference, leaves)
    assert len(outs) == len(expected)
    for out, exp in zip(outs, expected):
        assert out.shape == np.shape(exp)
        _close(out, exp, 1e-12, _scale(exp))

    u = _randn_like(rng, outs)
    dirs = _randn_like(rng, leaves)
    fd = _fd(call, leaves, dirs)

    value, vjp_fn = ad.vjp(call, *leaves)
    cts = vjp_fn(u)
    assert [np.shape(c) for c in cts] == [np.shape(x) for x in leaves]
    lhs = sum(_vdot(c, d) for c, d in zip(cts, dirs))
    rhs = sum(_vdot(ui, fi) for ui, fi in zip(u, fd))
    _close(lhs, rhs, 1e-5, _scale(*cts) * _scale(*dirs))

    _, tangents = ad.jvp(call, tuple(leaves), tuple(dirs))
    assert len(tangents) == len(outs)
    for t, f, out in zip(tangents, fd, outs):
        assert np.shape(t) == out.shape
        _close(np.asarray(t), f, 1e-5, _scale(f))


# --- second order -------------------------------------------------------------------------------


def _probe(call, u, v):
    """x -> <vjp(x)(u), v>: the backward pass, as a scalar function."""
    def probe(*xs):
        _, fn = ad.vjp(call, *xs)
        total = 0.0
        for ct, vi in zip(fn(u), v):
            total = total + ad.sum(ad.mul(ct, vi))
        return total
    return probe


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_second_order_matches_finite_differences(name, data, seed):
    call, rng = draw_call(name, data, seed)
    leaves = call.leaves
    outs = call(*leaves)
    u = _randn_like(rng, outs)
    v = _randn_like(rng, leaves)
    dirs = _randn_like(rng, leaves)
    probe = _probe(call, u, v)

    # grad of vjp
    grads = ad.grad(probe, argnums=tuple(range(len(leaves))))(*leaves)
    fd = _fd(lambda *xs: [np.asarray(probe(*xs))], leaves, dirs)[0]
    lhs = sum(_vdot(g, d) for g, d in zip(grads, dirs))
    _close(lhs, float(fd), 1e-4, _scale(*grads) * _scale(*dirs))

    # jvp of vjp
    def backward(*xs):
        _, fn = ad.vjp(call, *xs)
        return list(fn(u))
    _, tangents = ad.jvp(backward, tuple(leaves), tuple(dirs))
    fd = _fd(lambda *xs: backward(*xs), leaves, dirs)
    for t, f in zip(tangents, fd):
        _close(np.asarray(t), f, 1e-4, _scale(f))


# --- HIPS autograd as the oracle -------------------------------------------------------------


def _hips_flat(outs):
    return hnp_np.concatenate([hnp_np.ravel(v) for v in outs]) if len(outs) > 1 \
        else hnp_np.ravel(outs[0])


@needs_hips
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=20, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_values_and_gradients_agree_with_hips_autograd(name, data, seed):
    call, rng = draw_call(name, data, seed)
    _, _, reference = OPS[name]
    leaves = call.leaves
    outs = [np.asarray(v) for v in call(*leaves)]
    theirs = call.reference(hnp_np, reference, leaves)
    for a, b in zip(outs, theirs):
        _close(a, np.asarray(b), 1e-7, _scale(b))
    u = _randn_like(rng, outs)
    u_flat = np.concatenate([np.ravel(x) for x in u]) if u else np.zeros(0)

    def hips_loss(xs):
        return hnp_np.sum(_hips_flat(call.reference(hnp_np, reference, xs)) * u_flat)
    expected = hips.grad(hips_loss)(list(leaves))
    _, vjp_fn = ad.vjp(call, *leaves)
    for ours, exp in zip(vjp_fn(u), expected):
        _close(np.asarray(ours), exp, 1e-7, _scale(exp))


@needs_hips
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=10, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_second_derivatives_agree_with_hips_autograd(name, data, seed):
    call, rng = draw_call(name, data, seed)
    _, _, reference = OPS[name]
    leaves = call.leaves
    outs = call(*leaves)
    u = _randn_like(rng, outs)
    v = _randn_like(rng, leaves)
    u_flat = np.concatenate([np.ravel(x) for x in u]) if u else np.zeros(0)

    def hips_probe(xs):
        g = hips.grad(lambda ys: hnp_np.sum(
            _hips_flat(call.reference(hnp_np, reference, ys)) * u_flat))(xs)
        return sum(hnp_np.sum(gi * vi) for gi, vi in zip(g, v))
    expected = hips.grad(hips_probe)(list(leaves))
    ours = ad.grad(_probe(call, u, v), argnums=tuple(range(len(leaves))))(*leaves)
    for a, b in zip(ours, expected):
        _close(np.asarray(a), b, 1e-7, _scale(b))


# --- float32 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=10, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float32_in_float32_out(name, data, seed):
    call, rng = draw_call(name, data, seed)
    leaves = [x.astype(np.float32) for x in call.leaves]
    outs, vjp_fn = ad.vjp(call, *leaves)
    for out in outs:
        assert np.asarray(out).dtype == np.float32, (name, np.asarray(out).dtype)
    cts = vjp_fn([np.ones(np.shape(o), np.float32) for o in outs])
    for ct, x in zip(cts, leaves):
        assert np.asarray(ct).dtype == np.float32 and np.shape(ct) == x.shape, name
    _, ts = ad.jvp(call, tuple(leaves), tuple(np.ones_like(x) for x in leaves))
    for t in ts:
        assert np.asarray(t).dtype == np.float32, name


# --- NumPy dispatch: every NumPy function an op claims differentiates through it --------------


def _numpy_functions(fn):
    return [f for f, rule in ad.NUMPY_RULES.items() if rule is fn]


DISPATCHED = [(name, f) for name in sorted(OPS) for f in _numpy_functions(OPS[name][0])]


def test_every_breadth_op_with_a_numpy_twin_is_dispatched():
    without = {name for name in OPS if not _numpy_functions(OPS[name][0])}
    # logsumexp is scipy.special's (not dispatched by NumPy); the others are the
    # primitives behind norm, slogdet, eigh and svd
    expected = {"logsumexp", "l2_norm", "logabsdet", "eigh_packed", "svd_packed"}
    if not hasattr(np.linalg, "svdvals"):          # NumPy 1
        expected.add("svdvals")
    assert without == expected


@pytest.mark.parametrize("name,numpy_fn", DISPATCHED,
                         ids=[f"{n}-{getattr(f, '__name__', f)}" for n, f in DISPATCHED])
@settings(max_examples=6, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_numpy_functions_on_tensors_give_the_ops_gradients(name, numpy_fn, data, seed):
    call, rng = draw_call(name, data, seed)
    via_numpy = Call(numpy_fn, call.args, call.kwargs)
    outs, vjp_ours = ad.vjp(call, *call.leaves)
    with np.errstate(all="ignore"):
        theirs, vjp_numpy = ad.vjp(lambda *xs: via_numpy(*[ad.Tensor(x) for x in xs]),
                                   *call.leaves)
    u = _randn_like(rng, outs)
    for a, b in zip(outs, theirs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(vjp_ours(u), vjp_numpy(u)):
        np.testing.assert_array_equal(a, b)


def test_tensor_methods():
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    t = ad.Tensor(x)
    np.testing.assert_allclose(abs(t).data, np.abs(x))
    np.testing.assert_allclose((t % 1.5).data, x % 1.5)
    np.testing.assert_allclose((4.0 % ad.Tensor([1.5, 2.5])).data, 4.0 % np.array([1.5, 2.5]))
    for method, kwargs in [("min", {"axis": 0}), ("prod", {"axis": -1}), ("var", {"ddof": 1}),
                           ("std", {"axis": 1, "keepdims": True}), ("cumsum", {"axis": 1})]:
        np.testing.assert_allclose(getattr(t, method)(**kwargs).data,
                                   getattr(x, method)(**kwargs), err_msg=method)
    np.testing.assert_allclose(t.swapaxes(0, 1).data, x.swapaxes(0, 1))
    np.testing.assert_allclose(t.diagonal(1).data, x.diagonal(1))
    np.testing.assert_allclose(t.trace().data, x.trace())
    g = ad.grad(lambda v: ad.sum(abs(v)) + v.prod() + (v % 2.0).sum())(x)
    np.testing.assert_allclose(g, np.sign(x) + np.prod(x) / x + 1.0)


# --- derivatives at kinks and ties: the decisions ------------------------------------------


def test_abs_has_derivative_zero_at_zero():
    x = np.array([-1.5, 0.0, 2.0])
    np.testing.assert_array_equal(ad.grad(lambda v: ad.sum(ad.abs(v)))(x), [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(ad.jvp(ad.abs, (x,), (np.ones(3),))[1], [-1.0, 0.0, 1.0])


def test_maximum_and_minimum_split_ties_equally():
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([1.0, 5.0, 0.0])
    for fn, wins in ((ad.maximum, [0.5, 0.0, 1.0]), (ad.minimum, [0.5, 1.0, 0.0])):
        ga, gb = ad.grad(lambda a, b: ad.sum(fn(a, b)), argnums=(0, 1))(a, b)
        np.testing.assert_array_equal(ga, wins)
        np.testing.assert_array_equal(gb, 1.0 - np.asarray(wins))
        _, t = ad.jvp(fn, (a, b), (np.ones(3), np.zeros(3)))
        np.testing.assert_array_equal(t, wins)
    # maximum(x, x) is x: the two halves add up to the right derivative
    assert ad.grad(lambda x: ad.maximum(x, x))(2.0) == 1.0
    # a broadcast scalar operand collects its share from every element
    assert ad.grad(lambda c: ad.sum(ad.maximum(a, c)))(2.0) == 1.5


def test_piecewise_constant_ops_have_zero_derivatives():
    x = np.array([-1.7, 0.3, 2.5])
    for fn in (ad.sign, ad.floor, ad.ceil):
        np.testing.assert_array_equal(ad.grad(lambda v: ad.sum(fn(v) * v))(x), fn(x))
        np.testing.assert_array_equal(ad.jvp(fn, (x,), (np.ones(3),))[1], np.zeros(3))


@pytest.mark.parametrize("x", [[2.0, 0.0, 3.0, 5.0], [0.0, 1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0],
                               [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
def test_prod_is_exact_with_zeros_to_second_order(x):
    x = np.array(x)
    n = len(x)
    others = np.array([np.prod(np.delete(x, i)) for i in range(n)])
    hessian = np.array([[0.0 if i == j else np.prod(np.delete(x, [i, j])) for j in range(n)]
                        for i in range(n)])
    np.testing.assert_array_equal(ad.grad(ad.prod)(x), others)
    np.testing.assert_array_equal(ad.jvp(ad.prod, (x,), (np.ones(n),))[1], others.sum())
    for i in range(n):
        e = np.eye(n)[i]
        np.testing.assert_allclose(ad.jvp(ad.grad(ad.prod), (x,), (e,))[1], hessian[i])
        np.testing.assert_allclose(ad.grad(lambda v: ad.grad(ad.prod)(v)[i])(x), hessian[i])


def test_prod_with_zeros_along_an_axis():
    x = np.array([[0.0, 2.0, 3.0], [1.0, 0.0, 0.0], [4.0, 5.0, 6.0]])
    u = np.array([1.0, -2.0, 0.5])
    g = ad.grad(lambda v: ad.sum(ad.prod(v, axis=1) * u))(x)
    expected = np.array([[6.0, 0.0, 0.0], [0.0, 0.0, 0.0], [30.0, 24.0, 20.0]]) * u[:, None]
    np.testing.assert_array_equal(g, expected)


def test_std_of_constant_groups_has_zero_gradient():
    x = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 3.0]])
    g = ad.grad(lambda v: ad.sum(ad.std(v, axis=1)))(x)
    c = x[0] - x[0].mean()
    np.testing.assert_allclose(g[0], c / (3 * np.std(x[0])))
    np.testing.assert_array_equal(g[1], 0.0)
    # a one-element std is the constant 0
    np.testing.assert_array_equal(ad.grad(lambda v: ad.sum(ad.std(v, axis=0)))(x[:1]), 0.0)


def test_logsumexp_is_stable_and_its_gradient_is_the_softmax():
    x = np.array([1000.0, 1001.0, -np.inf])
    assert float(ad.logsumexp(x)) == pytest.approx(1001.0 + np.log1p(np.exp(-1.0)))
    g = ad.grad(ad.logsumexp)(x)
    np.testing.assert_allclose(g, [1 / (1 + np.e), np.e / (1 + np.e), 0.0])


# --- what is refused, with the reason -----------------------------------------------------------


def test_einsum_forms_and_refusals():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    np.testing.assert_allclose(ad.einsum("ij , jk", a, b), a @ b)
    np.testing.assert_allclose(ad.einsum("Ba,aC", a, b), np.einsum("Ba,aC", a, b))
    np.testing.assert_allclose(ad.einsum("ba,Ac", a, b), np.einsum("ba,Ac", a, b))
    np.testing.assert_allclose(ad.einsum("ij,jk->ik", a, b, optimize=True), a @ b)
    with pytest.raises(UnimplementedError, match=r"ellipsis"):
        ad.einsum("...ij,jk->...ik", a, b)
    with pytest.raises(KinaTypeError, match="interleaved"):
        ad.einsum(a, [0, 1], b, [1, 2])
    with pytest.raises(ValidationError, match="sizes 3 and 4"):
        ad.einsum("ij,jk->ik", a, b.T)
    with pytest.raises(ValidationError, match="operand subscripts"):
        ad.einsum("ij,jk->ik", a)
    with pytest.raises(ValidationError, match="output"):
        ad.einsum("ij->k", a)
    g = ad.grad(lambda x: ad.sum(np.einsum("ij,jk->ik", x, b)))(a)
    np.testing.assert_allclose(g, np.ones((2, 4)) @ b.T)


def test_pad_refuses_other_modes_and_traced_fill_values():
    x = np.ones(3)
    with pytest.raises(UnimplementedError, match="mode='reflect'"):
        ad.pad(x, 1, mode="reflect")
    with pytest.raises(UnimplementedError, match="only mode='constant'"):
        np.pad(ad.Tensor(x), 1, "edge")
    with pytest.raises(KinaTypeError, match="constant_values must be a constant"):
        ad.grad(lambda c: ad.sum(ad.pad(x, 1, constant_values=c)))(2.0)
    with pytest.raises(ValidationError, match="negative"):
        ad.pad(x, -1)
    # padding with a constant is affine: the tangent is padded with zeros
    _, t = ad.jvp(lambda v: ad.pad(v, 1, constant_values=7.0), (x,), (np.ones(3),))
    np.testing.assert_array_equal(t, [0.0, 1.0, 1.0, 1.0, 0.0])


def test_split_and_shape_errors_are_clear():
    x = np.arange(6.0)
    with pytest.raises(ValidationError, match="equal sections"):
        ad.split(x, 4)
    assert [p.shape for p in ad.array_split(x, 4)] == [(2,), (2,), (1,), (1,)]
    assert [p.shape for p in ad.split(x, [1, -2, 10])] == [(1,), (3,), (2,), (0,)]
    with pytest.raises(ValidationError, match="out of range"):
        ad.swapaxes(x, 0, 1)
    with pytest.raises(ValidationError, match="rank"):
        ad.diag(np.ones((2, 2, 2)))
    with pytest.raises(KinaTypeError, match="order="):
        ad.sort(x, order="f")
    with pytest.raises(ValidationError, match="tensordot"):
        ad.tensordot(x, x, 2)


def test_sort_sends_each_gradient_back_to_its_element():
    x = np.array([3.0, -1.0, 2.0, 3.0])
    w = np.array([1.0, 10.0, 100.0, 1000.0])
    # sorted: -1, 2, 3 (first 3), 3 (second 3): a stable permutation
    g = ad.grad(lambda v: ad.sum(ad.sort(v) * w))(x)
    np.testing.assert_array_equal(g, [100.0, 1.0, 10.0, 1000.0])


# --- the CuPy code path, through a NumPy-backed stand-in for CuPy ---------------------------


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=10, **dict(SETTINGS, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))    # the stand-in is stateless
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_composites_run_on_the_cupy_code_path(name, data, seed, fake_cupy):
    call, rng = draw_call(name, data, seed)
    host_outs, host_vjp = ad.vjp(call, *call.leaves)
    u = _randn_like(rng, host_outs)
    device = Call(call.fn, args_on_device(call.args), call.kwargs)
    outs, vjp_fn = ad.vjp(device, *[on_device(x) for x in call.leaves])
    for out, host in zip(outs, host_outs):
        np.testing.assert_allclose(np.asarray(out), host, rtol=1e-12, atol=1e-12)
    for ct, host in zip(vjp_fn([on_device(x) for x in u]), host_vjp(u)):
        assert isinstance(ct, FakeDeviceArray), (name, type(ct))
        np.testing.assert_allclose(np.asarray(ct), host, rtol=1e-12, atol=1e-12)


# --- linear algebra: where derivatives do not exist ---------------------------------------


def test_cholesky_and_eigh_read_the_lower_triangle_and_say_so_in_the_gradient():
    a = np.array([[4.0, 100.0], [1.0, 3.0]])       # the 100 is never read
    sym = np.array([[4.0, 1.0], [1.0, 3.0]])
    np.testing.assert_allclose(ad.cholesky(a), np.linalg.cholesky(sym))
    for f in (lambda m: ad.sum(ad.cholesky(m)), lambda m: ad.sum(ad.eigh(m)[1] ** 3),
              lambda m: ad.eigvalsh(m)[1]):
        g = ad.grad(f)(a)
        assert g[0, 1] == 0.0                           # no dependence on the upper triangle
    # eigh(UPLO='U') reads the upper triangle instead
    w, _ = ad.eigh(a.T, UPLO="U")
    np.testing.assert_allclose(w, np.linalg.eigvalsh(sym))
    # the gradient of the trace (sum of eigenvalues) is the identity, at any spectrum
    np.testing.assert_allclose(ad.grad(lambda m: ad.sum(ad.eigvalsh(m)))(np.eye(3)), np.eye(3))


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_with_either_triangle_is_numpys_function_and_its_derivative(uplo):
    """eigh(a, UPLO) traced gives NumPy's values (the eigenvectors' signs are
    LAPACK's for that triangle, so the kernel must ask LAPACK for that very
    triangle) and the derivative of that function (issue 16: UPLO='U' gave
    other signs, so the value and the gradient were of another function)."""
    rng = np.random.RandomState(0)
    a, c, t = rng.randn(3, 3), rng.randn(3, 3), rng.randn(3, 3)

    def f(x):
        return np.sum(np.linalg.eigh(x, uplo)[1] * c)
    value, g = ad.value_and_grad(f)(a)
    np.testing.assert_allclose(value, f(a), rtol=1e-12)
    fd = (f(a + EPS * t) - f(a - EPS * t)) / (2 * EPS)
    np.testing.assert_allclose(np.sum(g * t), fd, rtol=1e-6)
    _, tangent = ad.jvp(f, (a,), (t,))
    np.testing.assert_allclose(tangent, fd, rtol=1e-6)
    # the gradient lies on the triangle that was read
    unread = np.triu(np.ones((3, 3)), 1) if uplo == "L" else np.tril(np.ones((3, 3)), -1)
    assert np.all(g[unread == 1] == 0.0)
    w, v = ad.eigh(a, UPLO=uplo)
    np.testing.assert_array_equal(v, np.linalg.eigh(a, UPLO=uplo)[1])
    np.testing.assert_allclose(ad.eigvalsh(a, uplo), np.linalg.eigvalsh(a, uplo), rtol=1e-12)


def test_repeated_eigenvalues_refuse_what_is_not_defined():
    a = np.diag([1.0, 1.0, 2.0])
    # a symmetric function of the repeated eigenvalues is differentiable
    np.testing.assert_allclose(ad.grad(lambda m: ad.sum(ad.eigvalsh(m)[:2]))(a),
                               np.diag([1.0, 1.0, 0.0]))
    with pytest.raises(ValidationError, match="repeated eigenvalues"):
        ad.grad(lambda m: ad.eigvalsh(m)[0])(a)         # a kink: min of the two
    with pytest.raises(ValidationError, match="repeated eigenvalues"):
        ad.grad(lambda m: ad.sum(ad.eigh(m)[1][:, 0]))(a)
    with pytest.raises(ValidationError, match="repeated eigenvalues"):
        ad.jvp(ad.eigvalsh, (a,), (np.ones((3, 3)),))
    # the eigenvector of the simple eigenvalue is fine
    g = ad.grad(lambda m: ad.sum(ad.eigh(m)[1][:, 2] ** 2))(a)
    assert np.all(np.isfinite(g))


def test_svd_refusals_and_repeated_singular_values():
    a = np.arange(6.0).reshape(2, 3) + 1.0
    with pytest.raises(UnimplementedError, match="full_matrices=False"):
        ad.svd(a)
    with pytest.raises(UnimplementedError, match="hermitian"):
        ad.svd(a, full_matrices=False, hermitian=True)
    u, s, vh = ad.svd(a, full_matrices=False)
    np.testing.assert_allclose((u * s) @ vh, a)
    np.testing.assert_allclose(ad.svd(np.eye(2)).S, [1.0, 1.0])   # square: full is reduced
    # the nuclear norm is a symmetric function of repeated singular values
    np.testing.assert_allclose(ad.grad(lambda m: ad.sum(ad.svdvals(m)))(np.eye(2)), np.eye(2))
    with pytest.raises(ValidationError, match="repeated singular values"):
        ad.grad(lambda m: ad.svd(m, full_matrices=False)[0][0, 0])(np.eye(2))
    # a zero singular value of a non-square matrix: U's extra direction is undefined
    rank_one = np.outer([1.0, 2.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValidationError, match="zero singular value"):
        ad.grad(lambda m: ad.sum(ad.svd(m, full_matrices=False)[0][:, 1]))(rank_one)
    np.testing.assert_allclose(ad.grad(lambda m: ad.svdvals(m)[0])(rank_one),
                               np.outer([1.0, 2.0, 0.0], [1.0, 1.0]) / np.sqrt(10.0))


def test_singular_matrices_raise_rather_than_return_a_wrong_gradient():
    with pytest.raises(np.linalg.LinAlgError):
        ad.grad(ad.det)(np.array([[1.0, 2.0], [2.0, 4.0]]))
    with pytest.raises(np.linalg.LinAlgError):
        ad.cholesky(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValidationError, match="square"):
        ad.inv(np.ones((2, 3)))
    with pytest.raises(ValidationError, match="solve"):
        ad.solve(np.eye(2), np.ones(3))
    sign, logabsdet = ad.slogdet(-2.0 * np.eye(3))
    assert float(sign) == -1.0 and float(logabsdet) == pytest.approx(3 * np.log(2.0))
    np.testing.assert_allclose(ad.grad(lambda m: ad.slogdet(m)[1])(-2.0 * np.eye(3)),
                               -0.5 * np.eye(3))


def test_norm_forms_and_its_gradient_at_zero():
    x = np.array([[3.0, -4.0], [0.0, 12.0]])
    for kwargs in [{}, {"ord": 1, "axis": 0}, {"ord": np.inf, "axis": 1}, {"axis": 1},
                   {"ord": "nuc"}, {"ord": 2}, {"ord": -1}, {"ord": 0, "axis": 0},
                   {"axis": (1, 0), "keepdims": True}, {"ord": 3, "axis": -1}]:
        np.testing.assert_allclose(ad.norm(x, **kwargs), np.linalg.norm(x, **kwargs),
                                   err_msg=str(kwargs))
    np.testing.assert_array_equal(ad.grad(ad.norm)(np.zeros(3)), np.zeros(3))
    np.testing.assert_array_equal(ad.jvp(ad.norm, (np.zeros(3),), (np.ones(3),))[1], 0.0)
    np.testing.assert_allclose(ad.grad(ad.norm)(np.array([3.0, 4.0])), [0.6, 0.8])
    np.testing.assert_array_equal(ad.grad(lambda v: ad.norm(v, ord=0))(x[0]), [0.0, 0.0])
    with pytest.raises(ValidationError, match="for matrices"):
        ad.norm(x[0], ord="fro")
    with pytest.raises(ValidationError, match="1-D or 2-D"):
        ad.norm(np.ones((2, 2, 2)), ord=1)
    np.testing.assert_allclose(ad.grad(lambda m: np.linalg.norm(m))(x), x / 13.0)
