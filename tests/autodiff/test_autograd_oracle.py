"""HIPS autograd as an oracle: for every op of the table with a ``reference``
(the op written with NumPy functions), kina_fx's values, gradients and
second derivatives agree with HIPS autograd's derivatives of the reference to
1e-7 relative.  Generic over the registry: an op added later with a
``reference`` is covered by its ``sample`` domain."""
import numpy as np
import pytest
from support.autograd import Draw, differentiable_leaves, leaves_of, with_leaves
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_fx import autograd as ad

hips = pytest.importorskip("autograd")
import autograd.numpy as anp  # noqa: E402

RTOL, ATOL = 1e-7, 1e-12
# HIPS autograd warns when a second derivative is identically zero (linear ops)
pytestmark = pytest.mark.filterwarnings("ignore:Output seems independent of input")
SETTINGS = dict(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])


def oracle_ops():
    return sorted(name for name, p in ad.PRIMITIVES.items()
                  if p.sample is not None and p.reference is not None)


def test_the_oracle_covers_the_ops_hips_autograd_has():
    # the ops without a reference have no HIPS autograd counterpart
    without = {name for name, p in ad.PRIMITIVES.items()
               if p.module.startswith("kina_fx.") and p.reference is None}
    assert without <= {"index_add", "stop_gradient"}, without


@pytest.mark.parametrize("name", oracle_ops())
@settings(**SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_values_and_derivatives_agree_with_hips_autograd(name, data, seed):
    prim = ad.PRIMITIVES[name]
    rng = np.random.default_rng(seed)
    args, kwargs = prim.sample(Draw(data, rng))
    where = differentiable_leaves(args)
    leaves = leaves_of(args, where)

    def ours(*ls):
        return prim.public(*with_leaves(args, where, ls), **kwargs)

    def theirs(*ls):
        return prim.reference(anp, *with_leaves(args, where, ls), **kwargs)

    value = np.asarray(ad.Tensor(ours(*leaves)).data)
    np.testing.assert_allclose(value, np.asarray(theirs(*leaves)), rtol=RTOL, atol=ATOL)
    if not leaves:
        return
    u = rng.standard_normal(value.shape)
    v = [rng.standard_normal(np.shape(x)) for x in leaves]

    def probe_ours(*ls):
        return ad.sum(ours(*ls) * u)

    def probe_theirs(*ls):
        return anp.sum(theirs(*ls) * u)
    k_all = tuple(range(len(leaves)))
    g_ours = ad.grad(probe_ours, argnums=k_all)(*leaves)
    for k in k_all:
        np.testing.assert_allclose(g_ours[k], hips.grad(probe_theirs, k)(*leaves),
                                   rtol=RTOL, atol=ATOL, err_msg=f"gradient {k}")

    # second order: the gradient of <grad(probe), v>
    def second_ours(*ls):
        gs = ad.grad(probe_ours, argnums=k_all)(*ls)
        return sum(ad.sum(g * vi) for g, vi in zip(gs, v))

    def second_theirs(*ls):
        return sum(anp.sum(hips.grad(probe_theirs, k)(*ls) * vi) for k, vi in zip(k_all, v))
    h_ours = ad.grad(second_ours, argnums=k_all)(*leaves)
    for k in k_all:
        np.testing.assert_allclose(h_ours[k], hips.grad(second_theirs, k)(*leaves),
                                   rtol=RTOL, atol=ATOL, err_msg=f"second derivative {k}")
