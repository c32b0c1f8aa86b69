"""jacobian (both modes), hessian, hvp, elementwise_grad, and the Tensor's
shape and reduction methods, against central differences (float64)."""
import numpy as np
import pytest

from kina_fx import autograd as ad
from kina_fx.errors import KinaTypeError, ValidationError

EPS = 1e-6
RNG = np.random.default_rng(7)
A = RNG.standard_normal((2, 3))


def fd_jacobian(f, x):
    x = np.asarray(x, dtype=np.float64)
    out = np.asarray(f(x))
    J = np.zeros(out.shape + x.shape)
    for i in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[i] = EPS
        J[(Ellipsis,) + i] = (np.asarray(f(x + d)) - np.asarray(f(x - d))) / (2 * EPS)
    return J


def net(v):
    return ad.tanh(A @ v) * ad.sum(v * v)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_jacobian_matches_finite_differences(mode):
    x = RNG.standard_normal(3)
    J = ad.jacobian(net, mode=mode)(x)
    assert J.shape == (2, 3)
    np.testing.assert_allclose(J, fd_jacobian(net, x), rtol=1e-6, atol=1e-8)
    m = RNG.standard_normal((2, 2))
    J2 = ad.jacobian(lambda w: ad.exp(w) @ m, mode=mode)(m)
    assert J2.shape == (2, 2, 2, 2)
    np.testing.assert_allclose(J2, fd_jacobian(lambda w: np.exp(w) @ m, m), rtol=1e-6)
    assert ad.jacobian(lambda v: v * 3.0, mode=mode)(2.0) == pytest.approx(3.0)


def test_jacfwd_and_jacrev_agree_with_pytrees_and_argnums():
    x, y = RNG.standard_normal(3), RNG.standard_normal(2)

    def f(a, b):
        return {"u": a * ad.sum(b), "v": (ad.sum(a) * b,)}
    for jac in (ad.jacfwd, ad.jacrev):
        J = jac(f, argnums=(0, 1))(x, y)
        assert set(J) == {"u", "v"}
        ju_a, ju_b = J["u"]
        assert ju_a.shape == (3, 3) and ju_b.shape == (3, 2)
        np.testing.assert_allclose(ju_a, np.eye(3) * y.sum())
        np.testing.assert_allclose(ju_b, np.outer(x, np.ones(2)))
        jv_a, jv_b = J["v"][0]
        np.testing.assert_allclose(jv_a, np.outer(y, np.ones(3)))
        np.testing.assert_allclose(jv_b, np.eye(2) * x.sum())


def test_hessian_and_hvp():
    x = RNG.standard_normal(3)

    def f(v):
        return ad.sum(ad.tanh(A @ v) ** 2) + ad.sum(ad.exp(v)) * v[0]
    H = ad.hessian(f)(x)
    assert H.shape == (3, 3)
    fd = fd_jacobian(lambda v: ad.grad(f)(v), x)
    np.testing.assert_allclose(H, fd, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(H, H.T, rtol=1e-10)
    v = RNG.standard_normal(3)
    np.testing.assert_allclose(ad.hvp(f, (x,), (v,)), H @ v, rtol=1e-10)
    # several arguments: blocks, and the hvp is a tuple
    g = lambda a, b: ad.sum(a * a * b) + ad.sum(ad.exp(b))          # noqa: E731
    a, b = RNG.standard_normal(2), RNG.standard_normal(2)
    (Haa, Hab), (Hba, Hbb) = ad.hessian(g, argnums=(0, 1))(a, b)
    np.testing.assert_allclose(Haa, np.diag(2 * b))
    np.testing.assert_allclose(Hab, np.diag(2 * a))
    np.testing.assert_allclose(Hbb, np.diag(np.exp(b)))
    hv_a, hv_b = ad.hvp(g, (a, b), (np.ones(2), np.zeros(2)))
    np.testing.assert_allclose(hv_a, 2 * b)
    np.testing.assert_allclose(hv_b, 2 * a)


def test_jacobian_of_a_jacobian_is_the_third_derivative():
    third = ad.jacobian(ad.jacobian(ad.jacobian(ad.tanh), mode="forward"))(0.4)
    t = np.tanh(0.4)
    assert float(third) == pytest.approx(-2 * (1 - t * t) ** 2 + 4 * t * t * (1 - t * t))


def test_jacobian_errors_and_empty_shapes():
    with pytest.raises(ValidationError):
        ad.jacobian(net, mode="sideways")
    J = ad.jacobian(lambda v: v[:0] * 2.0)(np.ones(3))
    assert J.shape == (0, 3)
    Jf = ad.jacfwd(lambda v: ad.sum(v) * 2.0)(np.ones(0))
    assert Jf.shape == (0,)


def test_elementwise_grad():
    x = RNG.standard_normal(4)
    np.testing.assert_allclose(ad.elementwise_grad(ad.tanh)(x), 1 - np.tanh(x) ** 2)
    np.testing.assert_allclose(ad.elementwise_grad(lambda v: v ** 3)(x), 3 * x ** 2)
    gx, gy = ad.elementwise_grad(lambda a, b: a * b, argnums=(0, 1))(x, 2 * x)
    np.testing.assert_allclose(gx, 2 * x)
    np.testing.assert_allclose(gy, x)


def test_tensor_shape_and_reduction_methods_are_differentiable():
    x0 = RNG.standard_normal((2, 1, 3))
    w = RNG.standard_normal(6)

    def f(x):
        return (ad.sum(x.ravel() * w) + ad.sum(x.flatten() * w * w)
                + ad.sum(x.squeeze() * x.squeeze(1)) + x.sum() + x.mean(axis=-1).sum()
                + x.max() + ad.sum(x.reshape(3, 2) ** 2) + ad.sum(x.reshape((6,))))
    assert x0.reshape(6).shape == ad.Tensor(x0).ravel().shape
    assert ad.Tensor(x0).squeeze().shape == (2, 3)
    with pytest.raises(ValidationError):
        ad.Tensor(x0).squeeze(0)
    g = ad.grad(f)(x0)
    fd = fd_jacobian(lambda v: f(ad.Tensor(v)).data, x0)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


# value_and_grad takes an argument that is one NumPy array without flattening
# it as a pytree, returns that leaf's gradient without _like's checks, and
# passes a 0-d floating Tensor output without check_real_output: each shortcut
# must answer what the general path answers for the same leaf inside a tuple.
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.bool_,
                                   np.complex128])
@pytest.mark.parametrize("output", ["sum", "float", "vector", "mean", "int"])
def test_an_array_argument_gets_what_the_same_leaf_in_a_tuple_gets(dtype, output):
    x = (np.arange(6).reshape(2, 3) % 3 + 0.5).astype(dtype)

    def f(v):
        if output == "sum":
            return ad.sum(v * v)
        if output == "float":
            return 2.0
        if output == "vector":
            return v * 3.0
        if output == "mean":
            return ad.mean(v)
        return 3

    def outcome(call, unpack):
        try:
            value, g = call()
        except Exception as e:      # the two paths must refuse alike
            return type(e), str(e)
        g = unpack(g)
        return type(value), np.asarray(value).dtype, np.asarray(value).tolist(), \
            type(g), np.asarray(g).dtype, np.asarray(g).tolist()

    plain = outcome(lambda: ad.value_and_grad(f)(x), lambda g: g)
    tupled = outcome(lambda: ad.value_and_grad(lambda t: f(t[0]))((x,)), lambda g: g[0])
    assert plain == tupled
    if output in ("vector", "int"):
        assert plain[0] is KinaTypeError
    if dtype in (np.float32, np.float64) and output == "sum":
        np.testing.assert_array_equal(ad.grad(f)(x), 2 * x)


def test_argnums_are_checked_on_every_call_with_a_new_number_of_arguments():
    vg = ad.value_and_grad(lambda *a: ad.sum(a[0]), argnums=2)
    with pytest.raises(ValidationError):
        vg(np.ones(2), np.ones(2))
    assert vg(np.ones(2), np.ones(2), np.ones(2))[1].tolist() == [0.0, 0.0]
    with pytest.raises(ValidationError):
        vg(np.ones(2))
