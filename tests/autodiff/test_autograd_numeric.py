"""Every op of the table against central finite differences (float64), generic
over the registry: an op added later is covered by its ``sample`` domain.

Shapes, axes, keepdims, broadcasting, negative axes, size-1 and (where the op
allows) empty dimensions are drawn with hypothesis through each op's sample
domain; values come from a seeded NumPy generator (well conditioned, away from
kinks and ties).  Each check compares directional derivatives, which tests the
whole Jacobian with a random probe:

* reverse mode: ``<u, J v>`` from finite differences vs ``<vjp(u), v>``;
* forward mode: ``J v`` from finite differences vs ``jvp``'s tangent;
* second order, reverse over reverse: the gradient of ``x -> <vjp(x)(u), v>``
  (the backward pass differentiated by an outer tape) against finite
  differences of it;
* second order, forward over reverse: ``jvp`` of ``x -> vjp(x)(u)`` against
  finite differences of it;
* float32 in, float32 values, cotangents and tangents out.
"""
import numpy as np
import pytest
from support.autograd import (Draw, FakeDeviceArray, args_on_device, differentiable_leaves,  # noqa: F401
                              fake_cupy, leaves_of, with_leaves)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_fx import autograd as ad
from kina_fx import gpu_ops

EPS = 1e-6
SETTINGS = dict(deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow])

#: Ops whose derivative is, by definition, not the function's: no sample.
EXEMPT = {"stop_gradient": "its derivative is zero by definition"}


#: Ops whose output dtype is a parameter (the float32 check does not apply).
SETS_DTYPE = {"cast"}


def sampled_ops():
    return sorted(name for name, p in ad.PRIMITIVES.items() if p.sample is not None)


def test_every_kina_fx_op_has_a_sample_domain():
    missing = [name for name, p in ad.PRIMITIVES.items()
               if p.module.startswith("kina_fx.") and p.sample is None and name not in EXEMPT]
    assert not missing, f"ops without sample= (the generic tests cannot cover them): {missing}"


def draw_case(name, data, seed, device=False):
    """(f, leaves, rng): ``f(*leaves)`` calls the op with the drawn arguments
    (with ``device``, also (f_dev, leaves_dev): every array on the CuPy stand-in)."""
    prim = ad.PRIMITIVES[name]
    rng = np.random.default_rng(seed)
    args, kwargs = prim.sample(Draw(data, rng))
    where = differentiable_leaves(args)
    if device:
        dev = args_on_device(args)

        def f_dev(*leaves):
            return prim.public(*with_leaves(dev, where, leaves), **kwargs)

        def f_host(*leaves):
            return prim.public(*with_leaves(args, where, leaves), **kwargs)
        return f_dev, leaves_of(dev, where), f_host, leaves_of(args, where), rng

    def f(*leaves):
        return prim.public(*with_leaves(args, where, leaves), **kwargs)
    return f, leaves_of(args, where), rng


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
    """The backward pass is itself differentiable, in reverse and forward mode."""
    out = np.asarray(f(*args))
    u = rng.standard_normal(out.shape)
    v = [rng.standard_normal(np.shape(a)) for a in args]

    def probe(*xs):
        _, fn = ad.vjp(f, *xs)
        total = 0.0
        for ct, vi in zip(fn(u), v):
            total = total + ad.sum(ad.mul(ct, vi))
        return total

    grads = ad.grad(probe, argnums=tuple(range(len(args))))(*args)
    dirs = [rng.standard_normal(np.shape(a)) for a in args]
    fd = _fd_directional(lambda *xs: np.asarray(probe(*xs)), args, dirs)
    lhs = sum(_dot(g, d) for g, d in zip(grads, dirs))
    np.testing.assert_allclose(lhs, float(fd), rtol=1e-4, atol=1e-5)

    def backward(*xs):
        return ad.vjp(f, *xs)[1](u)
    _, tangents = ad.jvp(backward, tuple(args), tuple(dirs))
    for k, t in enumerate(tangents):
        fd_k = _fd_directional(lambda *xs: np.asarray(backward(*xs)[k]), args, dirs)
        np.testing.assert_allclose(np.asarray(t), fd_k, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sampled_ops())
@settings(**SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_first_order_matches_finite_differences(name, data, seed):
    f, args, rng = draw_case(name, data, seed)
    check_first_order(f, args, rng)


@pytest.mark.parametrize("name", sampled_ops())
@settings(**dict(SETTINGS, max_examples=30))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_backward_pass_is_differentiable(name, data, seed):
    f, args, rng = draw_case(name, data, seed)
    check_second_order(f, args, rng)


@pytest.mark.parametrize("name", [n for n in sampled_ops() if n not in SETS_DTYPE])
@settings(**dict(SETTINGS, max_examples=15))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float32_in_float32_gradients_out(name, data, seed):
    f, args, _ = draw_case(name, data, seed)
    args32 = [a.astype(np.float32) for a in args]
    out, vjp_fn = ad.vjp(f, *args32)
    assert np.asarray(out).dtype == np.float32
    cts = vjp_fn(np.ones(np.shape(out), np.float32))
    for ct, a in zip(cts, args32):
        assert np.asarray(ct).dtype == np.float32, (name, np.asarray(ct).dtype)
        assert np.shape(ct) == a.shape
    _, t = ad.jvp(f, tuple(args32), tuple(np.ones_like(a) for a in args32))
    assert np.asarray(t).dtype == np.float32


@pytest.mark.parametrize("name", sampled_ops())
@settings(**dict(SETTINGS, max_examples=10, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))    # the stand-in is stateless
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_every_op_runs_on_the_cupy_code_path(name, data, seed, fake_cupy):
    """The same kernels and rules on CuPy-like arrays (a NumPy-backed stand-in):
    results stay on the device and equal the NumPy ones."""
    f_dev, args_dev, f, args, rng = draw_case(name, data, seed, device=True)
    out, vjp_fn = ad.vjp(f, *args)
    out_dev, vjp_dev = ad.vjp(f_dev, *args_dev)
    u = rng.standard_normal(np.shape(out))
    cts, cts_dev = vjp_fn(u), vjp_dev(u.view(FakeDeviceArray))
    _, t = ad.jvp(f, tuple(args), tuple(np.ones_like(a) for a in args))
    _, t_dev = ad.jvp(f_dev, tuple(args_dev), tuple(np.ones_like(a) for a in args_dev))
    for ours, ref in [(out_dev, out), (t_dev, t)] + list(zip(cts_dev, cts)):
        if np.ndim(ref):
            assert isinstance(ours, FakeDeviceArray), (name, type(ours))
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(gpu_ops.cupy_module() is None, reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("name", sampled_ops())
@settings(**dict(SETTINGS, max_examples=5))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_every_op_on_real_cupy_matches_numpy(name, data, seed):
    cp = gpu_ops.cupy_module()
    prim = ad.PRIMITIVES[name]
    rng = np.random.default_rng(seed)
    args, kwargs = prim.sample(Draw(data, rng))
    where = differentiable_leaves(args)
    dev = [[cp.asarray(x) if isinstance(x, np.ndarray) else x for x in a] if isinstance(a, list)
           else cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]

    def run(arrays, xp):
        f = lambda *ls: prim.public(*with_leaves(arrays, where, ls), **kwargs)  # noqa: E731
        leaves = leaves_of(arrays, where)
        out, vjp_fn = ad.vjp(f, *leaves)
        u = xp.asarray(np.random.default_rng(seed).standard_normal(np.shape(out)))
        _, t = ad.jvp(f, tuple(leaves), tuple(xp.ones_like(x) for x in leaves))
        return [out, t] + list(vjp_fn(u))
    for ours, ref in zip(run(dev, cp), run(args, np)):
        if np.ndim(ref):
            assert isinstance(ours, cp.ndarray), (name, type(ours))
        np.testing.assert_allclose(cp.asnumpy(cp.asarray(ours)), np.asarray(ref),
                                   rtol=1e-10, atol=1e-12)


# --- the float32 row loops: softmax, log_softmax, cross_entropy --------------------------
#
# On C-contiguous float32 rows the compiled implementation computes these with
# its own loops (kina_fx/_speedups_c/kernels.c), float64 with NumPy's formula:
# the float32 values, gradients and second derivatives must be the float64
# ones to float32's precision.  (Under KINA_FX_PURE_PYTHON=1 both are NumPy.)

ROW_OPS = {
    "softmax": lambda x, w, y: ad.sum(ad.softmax(x, -1) * w),
    "log_softmax": lambda x, w, y: ad.sum(ad.log_softmax(x, -1) * w),
    "cross_entropy": lambda x, w, y: ad.cross_entropy(x * w, y),
}


@pytest.mark.parametrize("name", sorted(ROW_OPS))
@settings(deadline=None, max_examples=40, derandomize=True)
@given(rows=st.integers(1, 35), classes=st.integers(1, 24), lead=st.sampled_from([(), (2,)]),
       seed=st.integers(0, 2**16))
def test_float32_rows_agree_with_float64_to_first_and_second_order(name, rows, classes, lead, seed):
    rng = np.random.default_rng(seed)
    shape = lead + (rows, classes)
    x64 = rng.standard_normal(shape) * 3
    w64 = rng.uniform(0.5, 1.5, shape)
    v64 = rng.standard_normal(shape)
    y = rng.integers(0, classes, lead + (rows,))
    f = ROW_OPS[name]

    def first_and_second(x, w, v):
        loss, g = ad.value_and_grad(lambda x: f(x, w, y))(x)
        hv = ad.grad(lambda x: ad.sum(ad.grad(lambda x: f(x, w, y))(x) * v))(x)
        return loss, g, hv

    got = first_and_second(x64.astype(np.float32), w64.astype(np.float32), v64.astype(np.float32))
    x32 = x64.astype(np.float32).astype(np.float64)      # the same inputs, in float64
    want = first_and_second(x32, w64.astype(np.float32).astype(np.float64),
                            v64.astype(np.float32).astype(np.float64))
    for g, w, what in zip(got, want, ("value", "gradient", "Hessian-vector product")):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == np.float32, what
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6 * scale, err_msg=what)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6),
       st.sampled_from([np.float32, np.float64]), st.sampled_from(["C", "F", "T"]), st.integers(0, 2**16))
def test_the_matmul_rules_fast_path_is_the_general_paths_result(m, k, n, dtype, layout, seed):
    """matmul's first-order rules on 2-D NumPy arrays compute ``g @ b.T`` and
    ``a.T @ g`` directly; the general path (promotion, transpose and matmul
    through the namespace, here the recordable one outside any trace) gives
    the same bits, for any layout of the operands."""
    from kina_fx.autograd.primitives import PRIMITIVES
    from kina_fx.autograd.tensor import kernels, recordable

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    g = rng.standard_normal((m, n)).astype(dtype)
    if layout == "F":
        a, b, g = np.asfortranarray(a), np.asfortranarray(b), np.asfortranarray(g)
    elif layout == "T":
        a, b = np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T
    out = a @ b
    for rule in PRIMITIVES["matmul"].vjp_rules:
        fast, general = rule(kernels, g, out, a, b), rule(recordable, g, out, a, b)
        assert type(fast) is type(general) and fast.dtype == general.dtype
        assert fast.shape == general.shape and fast.tobytes() == general.tobytes()
