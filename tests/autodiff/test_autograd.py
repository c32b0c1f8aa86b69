"""Autograd semantics: nesting, perturbation confusion, transforms' conventions,
the Tape API, handlers stacked around and inside tapes, and the Tensor surface."""
import math

import numpy as np
import pytest

from support.autograd import FakeDeviceArray, fake_cupy, on_device  # noqa: F401

from kina_fx import autograd as ad
from kina_fx import gpu_ops
from kina_fx.errors import KinaTypeError, ValidationError
from kina_fx.handlers import Effect, Handler, perform


# --- higher order, against closed forms --------------------------------------


@pytest.mark.parametrize("x", [-1.3, -0.2, 0.0, 0.7, 2.1])
def test_second_and_third_derivatives_of_scalar_functions(x):
    t = math.tanh(x)
    s = 1 / (1 + math.exp(-x))
    assert ad.grad(ad.grad(ad.tanh))(x) == pytest.approx(-2 * t * (1 - t * t))
    assert ad.grad(ad.grad(ad.grad(ad.tanh)))(x) == pytest.approx(
        -2 * (1 - t * t) ** 2 + 4 * t * t * (1 - t * t))
    assert ad.grad(ad.grad(ad.sigmoid))(x) == pytest.approx(s * (1 - s) * (1 - 2 * s))
    assert ad.grad(ad.grad(ad.exp))(x) == pytest.approx(math.exp(x))
    assert ad.grad(ad.grad(lambda v: v ** 3))(x) == pytest.approx(6 * x)
    assert ad.grad(ad.grad(lambda v: ad.exp(v) * v * v))(x) == pytest.approx(
        math.exp(x) * (x * x + 4 * x + 2))
    if x > 0:
        assert ad.grad(ad.grad(ad.log))(x) == pytest.approx(-1 / (x * x))
        assert ad.grad(ad.grad(lambda v: v ** 2.5))(x) == pytest.approx(2.5 * 1.5 * x ** 0.5)


def test_mixed_partials_and_argnums():
    f = lambda x, y: x * y * y + ad.exp(x * y)           # noqa: E731
    x, y = 0.3, -0.8
    dfdx = ad.grad(f, argnums=0)
    # d/dy d/dx = 2y + exp(xy) (1 + xy)
    assert ad.grad(dfdx, argnums=1)(x, y) == pytest.approx(2 * y + math.exp(x * y) * (1 + x * y))
    gx, gy = ad.grad(f, argnums=(0, 1))(x, y)
    assert gx == pytest.approx(y * y + y * math.exp(x * y))
    assert gy == pytest.approx(2 * x * y + x * math.exp(x * y))
    # negative argnums count from the end
    assert ad.grad(f, argnums=-1)(x, y) == pytest.approx(gy)


def test_hessian_vector_products_jvp_of_grad_and_grad_of_grad():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5)
    v = rng.standard_normal(5)

    def f(z):
        return ad.sum(ad.exp(z) * z * z)

    hv_closed = np.exp(x) * (x * x + 4 * x + 2) * v        # the Hessian is diagonal
    _, hv = ad.jvp(ad.grad(f), (x,), (v,))
    np.testing.assert_allclose(hv, hv_closed, rtol=1e-12)
    hv2 = ad.grad(lambda z: ad.sum(ad.grad(f)(z) * v))(x)   # reverse over reverse
    np.testing.assert_allclose(hv2, hv_closed, rtol=1e-12)
    _, vjp_fn = ad.vjp(ad.grad(f), x)                         # reverse over reverse, vjp
    np.testing.assert_allclose(vjp_fn(v)[0], hv_closed, rtol=1e-12)
    g = ad.grad(lambda z: ad.jvp(f, (z,), (v,))[1])(x)       # reverse over forward
    np.testing.assert_allclose(g, hv_closed, rtol=1e-12)


def test_logsumexp_hessian_is_softmax_covariance():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4)
    p = np.exp(x - x.max())
    p /= p.sum()
    closed = np.diag(p) - np.outer(p, p)

    def lse(z):                                  # logsumexp(z) = z0 - log_softmax(z)[0]
        return z[0] - ad.log_softmax(z)[0]

    hess = np.stack([ad.jvp(ad.grad(lse), (x,), (e,))[1] for e in np.eye(4)])
    np.testing.assert_allclose(hess, closed, rtol=1e-10, atol=1e-12)

    def ce(z):
        return ad.cross_entropy(z, np.array(2))
    hess_ce = np.stack([ad.grad(lambda z: ad.sum(ad.grad(ce)(z) * e))(x) for e in np.eye(4)])
    np.testing.assert_allclose(hess_ce, closed, rtol=1e-10, atol=1e-12)


def test_matmul_second_derivative():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4))
    w = rng.standard_normal((4, 2))
    # f(w) = sum(tanh(a @ w));  Hessian-vector product in closed form
    v = rng.standard_normal((4, 2))
    z = a @ w
    t = np.tanh(z)
    hv_closed = a.T @ (-2 * t * (1 - t * t) * (a @ v))
    _, hv = ad.jvp(ad.grad(lambda m: ad.sum(ad.tanh(a @ m))), (w,), (v,))
    np.testing.assert_allclose(hv, hv_closed, rtol=1e-10)


# --- perturbation confusion ---------------------------------------------------


def test_no_perturbation_confusion_reverse_over_reverse():
    # d/dx [x * d/dy (x + y) at y=1] at x=1 is 1 (a shared tape gives 2).
    def f(x):
        return x * ad.grad(lambda y: x + y)(1.0)
    assert ad.grad(f)(1.0) == 1.0


def test_no_perturbation_confusion_forward_over_forward():
    def f(x):
        inner = ad.jvp(lambda y: x + y, (1.0,), (1.0,))[1]
        return x * inner
    assert ad.jvp(f, (1.0,), (1.0,))[1] == 1.0


def test_no_perturbation_confusion_mixed_modes():
    def f(x):
        return x * ad.jvp(lambda y: x * y, (2.0,), (1.0,))[1]      # x * x
    assert ad.grad(f)(3.0) == pytest.approx(6.0)

    def g(x):
        return x * ad.grad(lambda y: x * y)(2.0)                  # x * x
    assert ad.jvp(g, (3.0,), (1.0,))[1] == pytest.approx(6.0)


def test_each_grad_call_has_its_own_tag():
    tags = set()

    def f(x):
        tags.add(x._trace.tag)
        return x * x
    g = ad.grad(f)
    g(1.0)
    g(2.0)
    assert len(tags) == 2


def test_leaked_box_of_a_finished_tape_is_seen_through():
    leaked = []

    def f(x):
        def inner(y):
            z = x * y
            leaked.append(z)
            return z
        ad.grad(inner)(2.0)
        # the inner tape is finished: its box now stands for its outer value x*2
        return leaked[0] * x
    assert ad.grad(f)(3.0) == pytest.approx(4 * 3.0)


# --- transforms' conventions ----------------------------------------------------


def test_kinds_of_gradients_follow_the_inputs():
    f = lambda x: ad.sum(x * x)                           # noqa: E731
    g = ad.grad(f)(np.arange(3.0))
    assert type(g) is np.ndarray and g.dtype == np.float64
    g = ad.grad(f)(ad.Tensor(np.arange(3.0)))
    assert isinstance(g, ad.Tensor)
    np.testing.assert_array_equal(g.numpy(), [0.0, 2.0, 4.0])
    g = ad.grad(lambda x: x * x)(3.0)
    assert type(g) is float and g == 6.0
    g = ad.grad(lambda x: x * x)(3)
    assert type(g) is float and g == 6.0


def test_pytrees_in_and_out():
    params = {"w": np.ones((2, 3)), "b": [np.zeros(3), (np.full(3, 2.0),)]}
    x = np.arange(2.0)

    def loss(p, x):
        h = x @ p["w"] + p["b"][0] * p["b"][1][0]
        return ad.sum(h * h)

    g = ad.grad(loss)(params, x)
    assert set(g) == {"w", "b"} and isinstance(g["b"], list) and isinstance(g["b"][1], tuple)
    h = x @ params["w"]
    np.testing.assert_allclose(g["w"], np.outer(x, 2 * h))
    np.testing.assert_allclose(g["b"][0], 2 * h * 2.0)
    np.testing.assert_allclose(g["b"][1][0], np.zeros(3))
    value, (gp, gx) = ad.value_and_grad(loss, argnums=(0, 1))(params, x)
    assert value == pytest.approx(float(np.sum(h * h)))
    np.testing.assert_allclose(gx, params["w"] @ (2 * h))

    out, vjp_fn = ad.vjp(lambda p: {"a": p["w"] * 2, "b": (ad.sum(p["w"]),)}, params)
    assert set(out) == {"a", "b"}
    (ct,) = vjp_fn({"a": np.ones((2, 3)), "b": (np.array(1.0),)})
    np.testing.assert_allclose(ct["w"], np.full((2, 3), 3.0))
    np.testing.assert_allclose(ct["b"][0], 0.0)

    primal, tangent = ad.jvp(lambda p: [p["w"].sum(), p["b"][0]], (params,),
                             ({"w": np.ones((2, 3)), "b": [np.ones(3), (np.ones(3),)]},))
    assert isinstance(primal, list) and tangent[0] == 6.0
    np.testing.assert_allclose(tangent[1], np.ones(3))


def test_has_aux():
    def f(x):
        y = ad.sum(x * x)
        return y, {"norm": y ** 0.5}
    g, aux = ad.grad(f, has_aux=True)(np.array([3.0, 4.0]))
    np.testing.assert_allclose(g, [6.0, 8.0])
    assert float(aux["norm"]) > 0
    (v, aux), g = ad.value_and_grad(f, has_aux=True)(np.array([3.0, 4.0]))
    assert v == 25.0


def test_vjp_fn_can_be_called_repeatedly_and_jvp_is_linear():
    x = np.array([0.5, -1.0, 2.0])
    out, vjp_fn = ad.vjp(ad.tanh, x)
    d = 1 - np.tanh(x) ** 2
    np.testing.assert_allclose(vjp_fn(np.ones(3))[0], d)
    np.testing.assert_allclose(vjp_fn(2 * np.ones(3))[0], 2 * d)
    _, t1 = ad.jvp(ad.tanh, (x,), (np.ones(3),))
    _, t3 = ad.jvp(ad.tanh, (x,), (3 * np.ones(3),))
    np.testing.assert_allclose(t3, 3 * t1)


def test_grad_rejects_non_scalar_outputs_and_integer_inputs():
    # a TypeError, as in JAX and HIPS autograd (see "What kina_fx refuses")
    with pytest.raises(KinaTypeError, match="scalar output"):
        ad.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(KinaTypeError):
        ad.grad(lambda x: ad.sum(x))(np.arange(3))


def test_output_independent_of_input_gives_zeros():
    g = ad.grad(lambda x, y: ad.sum(y * 2.0), argnums=0)(np.ones(3, np.float32), np.ones(2))
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, np.zeros(3))


def test_stop_gradient_stops_every_level():
    assert ad.grad(lambda x: x * ad.stop_gradient(x))(3.0) == 3.0
    # and the outer level too
    assert ad.grad(lambda x: ad.grad(lambda y: ad.stop_gradient(x * y) * y)(1.0))(2.0) == 0.0
    assert ad.jvp(lambda x: x * ad.stop_gradient(x), (3.0,), (1.0,))[1] == 3.0


# --- the Tape API --------------------------------------------------------------------


def test_tape_used_directly():
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((3, 2))
    b0 = rng.standard_normal(2)
    xs = rng.standard_normal((4, 3))
    with ad.Tape() as t:
        w = t.watch(w0, "w")
        b = t.watch(b0, "b")
        h = ad.tanh(xs @ w + b)
        loss = ad.mean(h * h)
    gw, gb = t.gradient(loss, [w, b])
    dh = 2 * np.tanh(xs @ w0 + b0) / h.size * (1 - np.tanh(xs @ w0 + b0) ** 2)
    np.testing.assert_allclose(gw, xs.T @ dh)
    np.testing.assert_allclose(gb, dh.sum(0))
    # a single source gives a single gradient; the tape can be asked again
    np.testing.assert_allclose(t.gradient(loss, b), gb)
    # with respect to an intermediate value
    gh = t.gradient(loss, h)
    np.testing.assert_allclose(gh, 2 * np.tanh(xs @ w0 + b0) / h.size)


def test_tape_to_dot_draws_the_graph():
    with ad.Tape() as t:
        x = t.watch(np.ones(3), "x")
        y = ad.sum(ad.exp(x) * 2.0)
    dot = t.to_dot()
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    for op in ("exp", "mul", "sum"):
        assert f'label="{op}"' in dot
    assert dot.count("shape=box") == 3
    assert 'label="x\\n(3,) float64"' in dot
    assert float(t.gradient(y, x).sum()) == pytest.approx(6 * math.e)


@pytest.mark.integration                # Graphviz is one of CI's system packages
def test_to_dot_is_valid_graphviz(tmp_path):
    import shutil
    import subprocess
    dot_exe = shutil.which("dot")
    if dot_exe is None:
        pytest.skip("Graphviz's dot is not installed")
    with ad.Tape() as t:
        x = t.watch(np.ones(3, np.float32), "x")
        ad.sum(ad.tanh(x @ np.ones((3, 2), np.float32)) * 2.0)
    src = tmp_path / "tape.dot"
    src.write_text(t.to_dot())
    out = tmp_path / "tape.svg"
    subprocess.run([dot_exe, "-Tsvg", str(src), "-o", str(out)], check=True)
    assert "matmul" in out.read_text()


def test_tape_ignores_values_it_does_not_own():
    with ad.Tape() as t:
        x = t.watch(np.array(2.0))
        c = np.array(5.0) * np.array(3.0)       # not a box: nothing recorded
        y = x * c
    assert len(t._nodes) == 1
    assert t.gradient(y, x) == 15.0


# --- handlers stacked around and inside tapes ------------------------------------------


def flop_counter():
    """A handler that counts matmul FLOPs, then lets the outer handler compute."""
    counts = {"flops": 0}
    mm = ad.effect_of("matmul")

    def count(a, b):
        a_shape, b_shape = np.shape(ad.Tensor(a).data), np.shape(ad.Tensor(b).data)
        counts["flops"] += 2 * int(np.prod(a_shape)) * b_shape[-1]
        return perform(mm, a, b)
    return Handler(fun={mm: count}), counts


def test_flop_counter_around_a_tape():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 5))
    w = rng.standard_normal((5, 3))
    loss = lambda w: ad.sum(ad.relu(x @ w))         # noqa: E731
    handler, counts = flop_counter()
    with handler:
        g = ad.grad(loss)(w)
    assert counts["flops"] == 2 * 8 * 5 * 3             # forward only: fast backward path
    handler, counts = flop_counter()
    with handler, ad.observe_backward():
        g2 = ad.grad(loss)(w)
    # forward x@w, backward x.T@g: the gradient w.r.t. x is not needed
    assert counts["flops"] == 2 * (2 * 8 * 5 * 3)
    np.testing.assert_allclose(g, g2)
    np.testing.assert_allclose(g, x.T @ (x @ w > 0).astype(float))


def test_op_logger_inside_a_tape_sees_boxes_and_changes_nothing():
    log = []

    def logging_handler():
        fun = {}
        for name, prim in ad.PRIMITIVES.items():
            def clause(*args, _eff=prim.effect, _name=name):
                log.append(_name)
                return perform(_eff, *args)
            fun[prim.effect] = clause
        return Handler(fun=fun)

    def f(x):
        with logging_handler():
            return ad.sum(ad.tanh(x) * x)
    x = np.array([0.1, -0.4])
    np.testing.assert_allclose(ad.grad(f)(x), (1 - np.tanh(x) ** 2) * x + np.tanh(x))
    assert log == ["tanh", "mul", "sum"]


def test_float16_cast_handler_around_a_tape():
    mul = ad.effect_of("mul")

    def half(a, b):
        return perform(mul, ad.cast(a, np.float16), ad.cast(b, np.float16))
    x = np.array([1.0 / 3.0, 2.0 / 3.0], dtype=np.float32)
    with Handler(fun={mul: half}):
        y, g = ad.value_and_grad(lambda v: ad.sum(ad.cast(v * v, np.float32)))(x)
    assert g.dtype == np.float32
    # the product was computed in float16: the value carries float16 rounding
    h = x.astype(np.float16)
    assert float(y) == pytest.approx(float(np.sum((h * h).astype(np.float32))), rel=1e-6)
    np.testing.assert_allclose(g, 2 * x, rtol=2e-3)


def test_primitives_without_any_tape_are_plain_numpy():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert type(ad.exp(x)) is np.ndarray
    np.testing.assert_allclose(ad.softmax(x), gpu_ops.softmax(x))
    np.testing.assert_allclose(ad.gather(x, np.array([1, 1, 0])), x[[1, 1, 0]])
    with pytest.raises(ValidationError):
        ad.gather(x, np.array([2]))
    assert ad.cross_entropy(x, np.array([0, 1])) == pytest.approx(
        -np.mean(gpu_ops.log_softmax(x)[[0, 1], [0, 1]]))
    eff = Effect("kina_fx.autograd.exp")
    assert eff is ad.effect_of("exp")


# --- the Tensor surface -----------------------------------------------------------------


def test_tensor_operators_and_mixing():
    a = ad.Tensor([[1.0, 2.0], [3.0, 4.0]])
    n = np.array([[0.5], [2.0]])
    assert a.shape == (2, 2) and a.dtype == np.float64 and a.ndim == 2 and len(a) == 2
    checks = [
        (a + n, a.numpy() + n), (n + a, n + a.numpy()), (a - 1, a.numpy() - 1),
        (1 - a, 1 - a.numpy()), (a * n, a.numpy() * n), (2 / a, 2 / a.numpy()),
        (a / n, a.numpy() / n), (a ** 2, a.numpy() ** 2), (2 ** a, 2 ** a.numpy()),
        (-a, -a.numpy()), (a @ a, a.numpy() @ a.numpy()), (n.T @ a, n.T @ a.numpy()),
        (a.T, a.numpy().T), (a[1], a.numpy()[1]), (a[:, ::-1], a.numpy()[:, ::-1]),
        (a.sum(axis=0), a.numpy().sum(0)), (a.mean(), a.numpy().mean()),
        (a.max(axis=-1, keepdims=True), a.numpy().max(-1, keepdims=True)),
        (a.reshape(4), a.numpy().reshape(4)), (a.reshape(1, 4), a.numpy().reshape(1, 4)),
        (a.exp(), np.exp(a.numpy())),
    ]
    for got, want in checks:
        assert isinstance(got, ad.Tensor)
        np.testing.assert_allclose(got.numpy(), want)
    assert (a > 2).tolist() == [[False, False], [True, True]]
    assert np.asarray(a).shape == (2, 2)
    assert "Tensor" in repr(a)


def test_gradient_through_tensor_operators_and_indexing():
    x0 = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])

    def f(x):
        y = (2 - x.T) ** 2 / 3 + (x[:, 0] @ x).reshape(3, 1)
        return (y[[0, 0, 2]] * x[1, ::2]).sum()
    g = ad.grad(f)(x0)
    eps = 1e-6
    fd = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        d = np.zeros_like(x0)
        d[i] = eps
        fd[i] = (float(f(ad.Tensor(x0 + d))) - float(f(ad.Tensor(x0 - d)))) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_where_and_comparisons():
    x = np.array([-2.0, -0.5, 0.5, 2.0])
    g = ad.grad(lambda v: ad.sum(ad.where(v > 0, v * v, -v)))(x)
    np.testing.assert_allclose(g, np.where(x > 0, 2 * x, -1.0))


def test_repeat_interleave_matches_gpu_ops():
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(ad.repeat_interleave(x, 2, -1),
                                  gpu_ops.repeat_interleave(x, 2, -1))
    g = ad.grad(lambda v: ad.sum(ad.repeat_interleave(v, 3, 0) * 2.0))(x)
    np.testing.assert_array_equal(g, np.full((2, 3), 6.0))


def test_max_ties_share_the_gradient():
    g = ad.grad(lambda v: ad.max(v))(np.array([1.0, 3.0, 3.0, 0.0]))
    np.testing.assert_allclose(g, [0.0, 0.5, 0.5, 0.0])


def test_deep_chain_does_not_recurse():
    def f(x):
        for _ in range(5000):
            x = x * 1.0001
        return x
    assert ad.grad(f)(1.0) == pytest.approx(1.0001 ** 5000)


# --- the CuPy backend, when a GPU is present --------------------------------------------


@pytest.mark.skipif(gpu_ops.cupy_module() is None, reason="needs CuPy and a CUDA device")
def test_cupy_backend_matches_numpy():
    cp = gpu_ops.cupy_module()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    labels = rng.integers(0, 4, size=16)
    idx = np.array([0, 0, 3])

    def loss(w, x, labels, idx):
        h = ad.tanh(x @ w) + ad.relu(x @ w) * ad.sigmoid(x @ w)
        return (ad.cross_entropy(h, labels) + ad.mean(ad.gather(w, idx) ** 2)
                + ad.max(ad.log_softmax(h, axis=0)) + ad.sum(h[::2, 1:] * 3.0))
    g_np = ad.grad(loss, argnums=(0, 1))(w, x, labels, idx)
    g_cp = ad.grad(loss, argnums=(0, 1))(cp.asarray(w), cp.asarray(x), cp.asarray(labels),
                                         cp.asarray(idx))
    for a, b in zip(g_cp, g_np):
        assert isinstance(a, cp.ndarray) and a.dtype == np.float32
        np.testing.assert_allclose(cp.asnumpy(a), b, rtol=1e-4, atol=1e-5)
    # forward over reverse on the device too
    v = np.ones_like(w)
    _, hv_np = ad.jvp(lambda w: ad.grad(loss)(w, x, labels, idx), (w,), (v,))
    _, hv_cp = ad.jvp(lambda w: ad.grad(loss)(w, cp.asarray(x), cp.asarray(labels),
                                               cp.asarray(idx)), (cp.asarray(w),), (cp.asarray(v),))
    np.testing.assert_allclose(cp.asnumpy(hv_cp), hv_np, rtol=1e-3, atol=1e-4)


# --- the CuPy code path, without a GPU: a NumPy-backed stand-in for CuPy ----------------


def test_cupy_code_path_with_a_stand_in(fake_cupy):
    rng = np.random.default_rng(6)
    x = on_device(rng.standard_normal((6, 5)))
    w = on_device(rng.standard_normal((5, 3)))
    labels = on_device(rng.integers(0, 3, size=6))
    idx = on_device(np.array([0, 0, 4]))

    def loss(w, x):
        h = ad.tanh(x @ w) + ad.sigmoid(ad.relu(x @ w))
        return (ad.cross_entropy(h, labels) + ad.sum(ad.gather(w, idx) ** 2)
                + ad.mean(ad.log_softmax(h, axis=0) * ad.softmax(h)) + ad.max(x[:, 1:] * 2.0))
    gw, gx = ad.grad(loss, argnums=(0, 1))(w, x)
    assert isinstance(gw, FakeDeviceArray) and isinstance(gx, FakeDeviceArray)
    ref_w, ref_x = ad.grad(loss, argnums=(0, 1))(w.get(), x.get())
    np.testing.assert_allclose(gw.get(), ref_w, rtol=1e-12)
    np.testing.assert_allclose(gx.get(), ref_x, rtol=1e-12)
    _, tangent = ad.jvp(lambda w: loss(w, x), (w,), (np.ones_like(w),))
    assert float(tangent) == pytest.approx(float(np.sum(ref_w)))
    assert isinstance(ad.Tensor(w).numpy(), np.ndarray)
    # the kernels went through the stand-in's array module, not NumPy's
    assert {"tanh", "maximum", "zeros", "ones", "exp", "log"} <= fake_cupy.calls


def test_tapes_are_freed_without_the_cycle_collector():
    # A tape holds every intermediate array; a reference cycle would keep them
    # (and fresh page faults on every step) until the next gc run.
    import gc
    import weakref
    refs = []

    def f(x):
        refs.append(weakref.ref(x._trace))
        return ad.sum(ad.tanh(x) * 2.0 + ad.exp(x)[0])

    gc.collect()
    gc.disable()
    try:
        ad.grad(f)(np.ones(3))
        ad.grad(ad.grad(lambda x: ad.sum(ad.tanh(x))))(0.5)
        ad.jvp(lambda x: f(x), (np.ones(3),), (np.ones(3),))
        ad.vjp(f, np.ones(3))[1](1.0)
        with ad.Tape() as t:
            x = t.watch(np.ones(3))
            y = ad.sum(ad.sigmoid(x) ** 2)
        t.gradient(y, x)
        tape_ref = weakref.ref(t)
        del t, x, y
        assert all(r() is None for r in refs)
        assert tape_ref() is None
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_box_of_a_finished_tape_is_refused_by_later_tapes_and_its_data_is_a_constant():
    # Tapes reuse pooled handlers: a leaked box must not pass for a box of the
    # tape that now uses its old tape's handler.  Nor is it silently a
    # constant (what a multi-shot continuation's replay would feed a new
    # tape: test_grad_through_effects.py): it is refused, as JAX refuses a
    # leaked tracer; its .data is the explicit constant.
    leaked = []

    def f(x):
        leaked.append(x)
        return x * x
    ad.grad(f)(2.0)
    with pytest.raises(KinaTypeError, match="which has finished"):
        ad.grad(lambda y: y * leaked[0] + leaked[0] * leaked[0])(3.0)
    with pytest.raises(KinaTypeError, match="which has finished"):
        ad.grad(lambda y: y + ad.sin(leaked[0]))(3.0)
    c = leaked[0].data
    assert ad.grad(lambda y: y * c + c * c)(3.0) == 2.0
    with ad.Tape() as t:
        y = t.watch(np.array(3.0))
        z = y * c
    assert float(t.gradient(z, y)) == 2.0
    assert float(ad.sin(leaked[0])) == np.sin(2.0)        # outside any trace: a constant


@pytest.mark.parametrize("x", [-0.9, 0.4, 1.7])
def test_every_pairing_of_transforms_gives_the_second_derivative(x):
    f = lambda v: ad.exp(v) * ad.tanh(v)                      # noqa: E731
    t, e = math.tanh(x), math.exp(x)
    d1 = lambda v: e * (t + (1 - t * t))                      # noqa: E731
    d2 = e * (t + 2 * (1 - t * t) - 2 * t * (1 - t * t))

    def fwd(g):
        return lambda v: ad.jvp(g, (v,), (1.0,))[1]

    def rev(g):
        return ad.grad(g)

    def rev_vjp(g):
        return lambda v: ad.vjp(g, v)[1](1.0)[0]
    for outer in (fwd, rev, rev_vjp):
        assert outer(f)(x) == pytest.approx(d1(x))
        for inner in (fwd, rev, rev_vjp):
            assert float(outer(inner(f))(x)) == pytest.approx(d2), (outer, inner)


def test_grads_in_several_threads_at_once():
    import threading
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            x = rng.standard_normal(7)
            for _ in range(200):
                g = ad.grad(lambda v: ad.sum(ad.tanh(v) * v))(x)
                np.testing.assert_allclose(g, (1 - np.tanh(x) ** 2) * x + np.tanh(x))
        except Exception as exc:          # reported below, in the main thread
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_watching_a_finished_tapes_result_leaves_that_tapes_gradient_right():
    """A finished tape's result is not adopted by a later tape's watch (it got
    a new box): adopting it in place made the first tape's gradient of it
    silently zero.  A finished tape's watched leaf is still adopted (below)."""
    with ad.Tape() as t1:
        x = t1.watch(np.array(2.0))
        y = x * 3.0
    with ad.Tape() as t2:
        y2 = t2.watch(y)
        z = y2 * y2
    assert y2 is not y
    assert float(t2.gradient(z, y2)) == 12.0
    assert float(t1.gradient(y, x)) == 3.0


def test_a_tape_differentiates_a_result_of_a_tape_nested_in_it():
    """y is the inner tape's box; its value one level out is t's box of x * 2,
    so t's gradient of y is 2, while inner records and after it finished (it
    was silently 0: t took y for a constant)."""
    with ad.Tape() as t:
        x = t.watch(np.array(3.0))
        with ad.Tape() as inner:
            y = inner.watch(x) * 2.0
            assert float(t.gradient(y, x)) == 2.0
        assert float(t.gradient(y, x)) == 2.0
    assert float(t.gradient(y, x)) == 2.0
    assert float(t.gradient(ad.Tensor(np.array(1.0)), x)) == 0.0    # a constant target


def test_a_nested_tapes_gradient_after_its_enclosing_tape_ended_is_recorded_by_the_outer_one():
    """tc's values are boxes of tb, which has ended when tc's gradient is taken
    under ta: what they hold now is what ta records -- a box of ta (xb), or a
    constant (vb, which tb watched from a plain value; it was refused as a value
    that escaped its trace) -- so the gradient is a function of ta's variable
    (second order through three tapes)."""
    with ad.Tape() as ta:
        w = ta.watch(np.array(3.0))
        with ad.Tape() as tb:
            xb = tb.watch(2.0 * w)
            vb = tb.watch(np.array(0.5))
            with ad.Tape() as tc:
                xc = tc.watch(xb)
                y = xc * xc * xc * vb
        g = tc.gradient(y, xc)                       # 3 xc^2 vb = 6 w^2
    assert float(g.data) == 54.0
    assert float(ta.gradient(g, w)) == 36.0          # 12 w


def test_a_dual_of_a_finished_jvp_is_refused_by_later_jvps_and_its_data_is_a_constant():
    leaked = []

    def f(x):
        leaked.append(x)
        return x * x
    ad.jvp(f, (2.0,), (1.0,))
    with pytest.raises(KinaTypeError, match="which has finished"):
        ad.jvp(lambda y: y * leaked[0] + leaked[0] * leaked[0], (3.0,), (1.0,))
    c = leaked[0].data
    _, t = ad.jvp(lambda y: y * c + c * c, (3.0,), (1.0,))
    assert float(t) == 2.0


def test_tape_watch_adopts_a_plain_tensor_in_place():
    x = ad.Tensor(np.array([1.0, 2.0]))
    with ad.Tape() as t:
        t.watch(x)                       # TensorFlow style: no reassignment
        y = ad.sum(x * x * x)
    np.testing.assert_allclose(t.gradient(y, [x])[0], 3 * np.array([1.0, 2.0]) ** 2)
    # afterwards x acts as a plain Tensor again, and another tape can watch it
    z = x * 2.0
    assert z._trace is None
    with ad.Tape() as t2:
        t2.watch(x)
        w = ad.sum(ad.exp(x))
    np.testing.assert_allclose(t2.gradient(w, x), np.exp([1.0, 2.0]))
    # the same Tensor passed twice to grad gives two independent leaves
    gx, gy = ad.grad(lambda a, b: ad.sum(a * b * b), argnums=(0, 1))(x, x)
    np.testing.assert_allclose(gx.numpy(), [1.0, 4.0])
    np.testing.assert_allclose(gy.numpy(), [2.0, 8.0])
