"""The op registry (kina_fx/autograd/primitives.py): what a block may say.

An elementwise op writes its derivative once, ``d_<input>(o, v, out, ...)``:
the derivative is diagonal, hence its own transpose, so the registry makes
the jvp (``d`` of the tangent, broadcast to the output) and the vjp (``d``
of the cotangent, summed over the broadcast axes) from it.  Checked here on
an op registered by the test, with broadcasting, against central
differences to second order; that every elementwise op of kina_fx is written
that way; and that the registry refuses blocks that would be wrong.
"""
import numpy as np
import pytest

from kina_fx import autograd as ad
from kina_fx.errors import ValidationError

EPS = 1e-6
RNG = np.random.default_rng(17)


@ad.op(name="test_registry.softplus_times", elementwise=True)
class softplus_times:
    """``log(1 + exp(a)) * b``: two inputs, broadcast."""
    def kernel(a, b):
        return np.logaddexp(0.0, a) * b

    def d_a(o, v, out, a, b):
        return o.mul(v, o.mul(o.sigmoid(a), b))

    def d_b(o, v, out, a, b):
        return o.mul(v, o.logaddexp(0.0, a))


def _fd(f, xs, dirs):
    plus = f(*[x + EPS * d for x, d in zip(xs, dirs)])
    minus = f(*[x - EPS * d for x, d in zip(xs, dirs)])
    return (np.asarray(plus) - np.asarray(minus)) / (2 * EPS)


@pytest.mark.parametrize("shapes", [((3, 1), (4,)), ((2, 3), (2, 3)), ((), (2,)), ((1, 2), ())])
def test_one_derivative_rule_gives_the_vjp_and_the_jvp(shapes):
    a, b = (RNG.standard_normal(s) for s in shapes)
    out = softplus_times(a, b)
    np.testing.assert_allclose(out, np.logaddexp(0.0, a) * b)
    u = RNG.standard_normal(np.shape(out))
    dirs = [RNG.standard_normal(np.shape(x)) for x in (a, b)]
    fd = _fd(softplus_times, (a, b), dirs)
    _, vjp_fn = ad.vjp(softplus_times, a, b)
    cts = vjp_fn(u)
    assert [np.shape(c) for c in cts] == [np.shape(a), np.shape(b)]   # summed back
    np.testing.assert_allclose(sum(np.sum(c * d) for c, d in zip(cts, dirs)), np.sum(u * fd),
                               rtol=1e-6)
    _, tangent = ad.jvp(softplus_times, (a, b), tuple(dirs))
    assert np.shape(tangent) == np.shape(out)                           # broadcast out
    np.testing.assert_allclose(tangent, fd, rtol=1e-6, atol=1e-9)
    # one-sided: only b traced
    _, vjp_b = ad.vjp(lambda y: softplus_times(a, y), b)
    np.testing.assert_allclose(vjp_b(u)[0], cts[1])


def test_the_derived_rules_are_differentiable_again():
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal(3)
    v = RNG.standard_normal((2, 3))

    def g(x):               # d/dx of <softplus_times(x, b), v>: the vjp, recorded
        return ad.vjp(lambda y: softplus_times(y, b), x)[1](v)[0]
    d = RNG.standard_normal(a.shape)
    _, tangent = ad.jvp(g, (a,), (d,))
    np.testing.assert_allclose(tangent, _fd(g, (a,), (d,)), rtol=1e-5, atol=1e-8)
    w = RNG.standard_normal(a.shape)
    second = ad.grad(lambda x: ad.sum(g(x) * w))(a)
    np.testing.assert_allclose(np.sum(second * d), np.sum(_fd(g, (a,), (d,)) * w), rtol=1e-5)


def test_every_elementwise_op_of_kina_fx_writes_its_derivative_once():
    twice = []
    for name, p in ad.PRIMITIVES.items():
        if not p.module.startswith("kina_fx.") or not p.elementwise or p.linear:
            continue
        for k, inp in enumerate(p.inputs):
            if p.diff[k] and getattr(p.jvp_rules[k], "__name__", "") != f"d_{inp}":
                twice.append(f"{name}.{inp}")
    assert not twice, f"elementwise ops with separate vjp/jvp rules: {twice}"
    count = sum(1 for p in ad.PRIMITIVES.values()
                if p.module.startswith("kina_fx.") and p.elementwise and not p.linear
                and any(p.diff))
    assert count >= 24


def _register(name, **options):
    def block(body):
        return ad.op(name=name, **options)(body)
    return block


def test_a_derivative_rule_needs_an_elementwise_op():
    with pytest.raises(ValidationError, match="elementwise"):
        @_register("test_registry.not_elementwise")
        class not_elementwise:
            def kernel(x):
                return np.cumsum(x)

            def d_x(o, v, out, x):
                return v
    assert "test_registry.not_elementwise" not in ad.PRIMITIVES


def test_one_input_has_one_kind_of_rule():
    with pytest.raises(ValidationError, match="same input"):
        @_register("test_registry.both", elementwise=True)
        class both:
            def kernel(x):
                return np.sin(x)

            def d_x(o, v, out, x):
                return o.mul(v, o.cos(x))

            def vjp_x(o, g, out, x):
                return o.mul(g, o.cos(x))
    with pytest.raises(ValidationError, match="vjp_x without jvp_x"):
        @_register("test_registry.half")
        class half:
            def kernel(x):
                return np.sin(x)

            def vjp_x(o, g, out, x):
                return o.mul(g, o.cos(x))
    assert not {"test_registry.both", "test_registry.half"} & set(ad.PRIMITIVES)
