"""User-defined derivatives: JAX's custom_vjp/custom_jvp and HIPS autograd's
primitive/defvjp/defjvp, checked numerically (central differences, float64)
and to second order."""
import math

import numpy as np
import pytest

from kina_fx import autograd as ad
from kina_fx.errors import KinaTypeError, ValidationError

EPS = 1e-6


def fd_grad(f, x):
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = EPS
        g[i] = (float(f(x + d)) - float(f(x - d))) / (2 * EPS)
    return g


# --- HIPS style -------------------------------------------------------------------------


def make_logsumexp():
    @ad.primitive
    def logsumexp(x):
        m = np.max(x)
        return m + np.log(np.sum(np.exp(x - m)))

    # the rule is written with kina_fx operations: differentiable again
    ad.defvjp(logsumexp, lambda ans, x: lambda g: g * ad.exp(x - ans))
    ad.defjvp(logsumexp, lambda g, ans, x: ad.sum(g * ad.exp(x - ans)))
    return logsumexp


def test_primitive_defvjp_first_and_second_order():
    lse = make_logsumexp()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4)
    p = np.exp(x - x.max())
    p /= p.sum()
    np.testing.assert_allclose(ad.grad(lse)(x), p, rtol=1e-12)
    np.testing.assert_allclose(ad.grad(lse)(x), fd_grad(lse, x), rtol=1e-6)
    # second order through the rule: the Hessian is diag(p) - p p^T
    v = rng.standard_normal(4)
    hv = ad.grad(lambda z: ad.sum(ad.grad(lse)(z) * v))(x)
    np.testing.assert_allclose(hv, (np.diag(p) - np.outer(p, p)) @ v, rtol=1e-10)
    # forward mode through defjvp, and forward over reverse
    _, t = ad.jvp(lse, (x,), (v,))
    assert float(t) == pytest.approx(float(p @ v))
    _, hv2 = ad.jvp(ad.grad(lse), (x,), (v,))
    np.testing.assert_allclose(hv2, hv, rtol=1e-10)
    # it is a row of the op table and runs on raw arrays without any trace
    assert lse.primitive.name in ad.PRIMITIVES
    assert float(lse(x)) == pytest.approx(math.log(np.exp(x).sum()))


def test_primitive_with_two_arguments_and_keywords():
    @ad.primitive
    def scaled_sum(x, y, scale=1.0):
        return scale * np.sum(x * y)
    ad.defvjp(scaled_sum, lambda ans, x, y, scale=1.0: lambda g: g * scale * y,
              lambda ans, x, y, scale=1.0: lambda g: g * scale * x)
    x, y = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    gx, gy = ad.grad(lambda a, b: scaled_sum(a, b, scale=2.0), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, 2 * y)
    np.testing.assert_allclose(gy, 2 * x)


def test_primitive_missing_rule_is_an_error_and_none_is_zero():
    @ad.primitive
    def f(x, y):
        return x * y
    ad.defvjp(f, lambda ans, x, y: lambda g: g * y, None)
    assert ad.grad(f, argnums=1)(2.0, 3.0) == 0.0      # declared zero by None
    with pytest.raises(KinaTypeError, match="no JVP"):
        ad.jvp(lambda x: f(x, 3.0), (2.0,), (1.0,))

    @ad.primitive
    def g(x):
        return x * 2
    with pytest.raises(KinaTypeError, match="no VJP"):
        ad.grad(g)(1.0)
    with pytest.raises(KinaTypeError, match="not a primitive"):
        ad.defvjp(lambda x: x, None)


def test_two_primitives_of_the_same_name_are_distinct():
    made = []
    for k in (2.0, 3.0):
        @ad.primitive
        def scale(x, k=k):
            return k * x
        ad.defvjp(scale, lambda ans, x, k=k: lambda g: k * g)
        made.append(scale)
    assert made[0].primitive is not made[1].primitive
    assert ad.grad(made[0])(1.0) == 2.0 and ad.grad(made[1])(1.0) == 3.0


# --- JAX style ----------------------------------------------------------------------------


def make_log1pexp():
    @ad.custom_vjp
    def log1pexp(x):
        return ad.log(1.0 + ad.exp(x))

    def fwd(x):
        return log1pexp(x), (x,)

    def bwd(res, g):
        (x,) = res
        return (g * ad.sigmoid(x),)                   # stable where exp overflows
    log1pexp.defvjp(fwd, bwd)
    return log1pexp


def test_custom_vjp_replaces_the_derivative_and_is_stable():
    f = make_log1pexp()
    x = np.array([-3.0, 0.5, 800.0])
    with np.errstate(over="ignore"):
        g = ad.grad(lambda v: ad.sum(f(v)))(x)
    assert np.all(np.isfinite(g))                     # the plain derivative is NaN at 800
    np.testing.assert_allclose(g, 1 / (1 + np.exp(-x)), rtol=1e-12)
    xs = np.array([-1.0, 0.3, 2.0])
    np.testing.assert_allclose(ad.grad(lambda v: ad.sum(f(v)))(xs),
                               fd_grad(lambda v: ad.sum(f(v)), xs), rtol=1e-6)
    # second order: the enclosing tape differentiates bwd (sigmoid' = s (1 - s))
    h = ad.grad(ad.grad(lambda v: f(v)))(0.3)
    s = 1 / (1 + math.exp(-0.3))
    assert h == pytest.approx(s * (1 - s))
    # untraced it is just the function
    assert float(f(np.array(0.0))) == pytest.approx(math.log(2.0))


def test_custom_vjp_gradient_clipping_and_nondiff_argnums():
    @ad.custom_vjp
    def clip_gradient(lo, hi, x):
        return x

    def fwd(lo, hi, x):
        return x, None

    def bwd(lo, hi, res, g):
        return (ad.clip(g, lo, hi),)
    clip_gradient = ad.custom_vjp(clip_gradient.fun, nondiff_argnums=(0, 1))
    clip_gradient.defvjp(fwd, bwd)
    g = ad.grad(lambda x: ad.sum(clip_gradient(-1.0, 1.0, x) * 5.0))(np.array([1.0, 2.0]))
    np.testing.assert_allclose(g, [1.0, 1.0])


def test_custom_vjp_refuses_forward_mode_and_checks_bwd():
    f = make_log1pexp()
    with pytest.raises(KinaTypeError, match="custom_vjp"):
        ad.jvp(f, (1.0,), (1.0,))

    @ad.custom_vjp
    def h(x):
        return x * 2.0
    h.defvjp(lambda x: (x * 2.0, None), lambda res, g: g * 2.0)     # not a tuple
    with pytest.raises(KinaTypeError, match="tuple"):
        ad.grad(h)(1.0)
    h.defvjp(lambda x: (x * 2.0, None), lambda res, g: (np.ones(3),))
    with pytest.raises(ValidationError, match="shape"):
        ad.grad(h)(1.0)

    @ad.custom_vjp
    def undefined(x):
        return x
    with pytest.raises(KinaTypeError, match="defvjp"):
        undefined(1.0)


def make_safe_norm():
    @ad.custom_jvp
    def safe_norm(x):
        return ad.sum(x * x) ** 0.5

    @safe_norm.defjvp
    def safe_norm_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        n = safe_norm(x)
        scale = ad.where(ad.Tensor(n).data == 0, 0.0, 1.0 / ad.where(ad.Tensor(n).data == 0,
                                                                     1.0, n))
        return n, ad.sum(x * t) * scale
    return safe_norm


def test_custom_jvp_forward_reverse_and_second_order():
    f = make_safe_norm()
    x = np.array([3.0, -4.0])
    v = np.array([0.5, 2.0])
    _, t = ad.jvp(f, (x,), (v,))
    assert float(t) == pytest.approx(float(x @ v / 5.0))
    # reverse mode: the rule transposed
    np.testing.assert_allclose(ad.grad(f)(x), x / 5.0, rtol=1e-12)
    np.testing.assert_allclose(ad.grad(f)(x), fd_grad(f, x), rtol=1e-6)
    # at zero the custom rule gives 0, not NaN
    np.testing.assert_array_equal(ad.grad(f)(np.zeros(2)), [0.0, 0.0])
    # second order: Hessian of the norm is (I - x x^T / n^2) / n
    n = 5.0
    closed = (np.eye(2) - np.outer(x, x) / n ** 2) / n
    hv = ad.grad(lambda z: ad.sum(ad.grad(f)(z) * v))(x)
    np.testing.assert_allclose(hv, closed @ v, rtol=1e-10)
    _, hv2 = ad.jvp(ad.grad(f), (x,), (v,))
    np.testing.assert_allclose(hv2, closed @ v, rtol=1e-10)


def test_custom_jvp_with_two_arguments():
    @ad.custom_jvp
    def f(x, y):
        return x * y

    @f.defjvp
    def f_jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        return f(x, y), tx * y + x * ty
    gx, gy = ad.grad(f, argnums=(0, 1))(2.0, 3.0)
    assert (gx, gy) == (3.0, 2.0)
    assert ad.grad(f, argnums=1)(2.0, 3.0) == 2.0
