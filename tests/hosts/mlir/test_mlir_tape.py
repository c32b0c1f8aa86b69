"""Differentiating MLIR-compiled code through tapes (docs/autograd-abi.md).

mlp.mlir is a two-layer MLP whose every tensor op is a runtime call.  It is
lowered once and used four ways:

* in this process, through :mod:`kina_fx.compiled`: its own ``@mlp_grads``
  (begin/watch/backward/grad called from MLIR), and ``ad.grad``/``ad.vjp``/
  ``ad.jvp`` of Python functions that call its ``@mlp_loss``;
* by tests/hosts/c/tape_host.c, a C host linked against it and libkina_fx.so
  that drives tapes around the compiled forward (gradients, a Hessian-vector
  product with nested tapes, misuse of the tape ABI);
* under mlir-cpu-runner-19, whose ``@main`` prints its gradients and the
  tape's answers to misuse.

Every gradient is checked against kina_fx.autograd on the same network written
in Python and against central differences of a float64 NumPy forward.  Both
hosts print ``status <check> <code>`` / ``error <check>: <text>`` /
``value <name> <k> <v>`` lines; :data:`EXPECTED` holds the code and message of
every check, for whichever hosts make it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from mlir_tools import (compile_object, jit, kina_fx_config, link_shared_object, lower, needs_mlir,
                        skip_unless_tools)

from kina_fx import autograd as ad
from kina_fx import compiled
from kina_fx.autograd import memory as memory_tape
from kina_fx.errors import ValidationError
from kina_fx.ffi.tapes import tape_handles

HERE = Path(__file__).parent
MLP_SOURCE = Path(compiled.example_path("mlp.mlir"))
C_HOSTS = HERE.parent / "c"
pytestmark = pytest.mark.integration

N, D, H, C = 6, 4, 5, 3           # the problem @main and tape_host.c build
PARAMS = ("w1", "b1", "w2", "b2")

_FORWARD = ("kina_memref_descriptor_t *loss, kina_memref_descriptor_t *x, kina_memref_descriptor_t *labels, "
            "kina_memref_descriptor_t *w1, kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2, "
            "kina_memref_descriptor_t *b2")
DECLARATIONS = f"""
int32_t _mlir_ciface_mlp_loss({_FORWARD});
int32_t _mlir_ciface_mlp_loss_loops({_FORWARD});
int32_t _mlir_ciface_mlp_grads(kina_memref_descriptor_t *loss, kina_memref_descriptor_t *gw1,
    kina_memref_descriptor_t *gb1, kina_memref_descriptor_t *gw2, kina_memref_descriptor_t *gb2,
    kina_memref_descriptor_t *x, kina_memref_descriptor_t *labels, kina_memref_descriptor_t *w1,
    kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2, kina_memref_descriptor_t *b2);
int32_t _mlir_ciface_mlp_grads_loops(kina_memref_descriptor_t *loss, kina_memref_descriptor_t *gw1,
    kina_memref_descriptor_t *gb1, kina_memref_descriptor_t *gw2, kina_memref_descriptor_t *gb2,
    kina_memref_descriptor_t *x, kina_memref_descriptor_t *labels, kina_memref_descriptor_t *w1,
    kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2, kina_memref_descriptor_t *b2);
int32_t _mlir_ciface_mlp_problem(kina_memref_descriptor_t *x, kina_memref_descriptor_t *labels,
    kina_memref_descriptor_t *w1, kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2,
    kina_memref_descriptor_t *b2);
int32_t _mlir_ciface_relu_any(kina_unranked_memref_t *out, kina_unranked_memref_t *x);
int32_t _mlir_ciface_scale_in_place(kina_unranked_memref_t *loss, kina_unranked_memref_t *x,
    kina_unranked_memref_t *w);
int32_t _mlir_ciface_read_then_clear(kina_unranked_memref_t *loss, kina_memref_descriptor_t *x,
    kina_unranked_memref_t *w);
"""

# check -> (status, text kina_last_error must contain or None); the hosts that
# make a check print it, tests below say which hosts must.
STRICT_LOOPS = (1, "matmul input 'a'")
EXPECTED = {
    "problem": (0, None), "setup": (0, None), "c_grads": (0, None), "c_hvp": (0, None),
    "mlp_grads": (0, None),
    # strictness and overwrites
    "mlp_grads_loops": STRICT_LOOPS, "c_strict_loops": STRICT_LOOPS, "c_lenient_loops": (0, None),
    "c_setup_loss": (0, None), "c_setup_hidden": (0, None),
    "overwritten_loss": (1, "was overwritten after the tape recorded it"),
    "overwritten_hidden": (1, "sum input 'x'"),
    "overwritten_watched": (1, "matmul input 'b'"),
    "free_after_overwrite": (0, None), "free_recording": (0, None),
    # misuse
    "begin_bad_flags": (1, "unknown flags 7"),
    "null_out_tape": (1, "out_tape is NULL"),
    "mlir_null_out_handle": (1, "out_handle: null memref pointer"),
    "foreign_handle": (1, "0x3039 is not a tape handle"),
    "zero_handle": (1, "0x0 is not a tape handle"),
    "watch_int64": (6, "cannot watch a int64 buffer"),
    "bad_dtype_code": (6, "unknown element type code 99"),
    "watch_twice": (1, "is already watched by this tape"),
    "null_buffer": (1, "buffer: null memref pointer"),
    "null_descriptor": (1, "buffer: null descriptor pointer"),
    "wrong_thread": (1, "belongs to another OS thread"),
    "wrong_thread_end": (1, None), "wrong_thread_free": (1, None),
    "begin_nested": (0, None),
    "end_not_innermost": (1, "is not the innermost handler of this fiber: end the tapes"),
    "end_nested": (0, None), "free_nested": (0, None),
    "backward_before_end": (1, "backward needs an ended tape"),
    "end_twice": (1, "the tape was already ended"),
    "watch_after_end": (1, "watch needs a recording tape"),
    "grad_before_backward": (1, "grad before backward"),
    "backward_not_produced": (1, "which this tape never produced or watched"),
    "cotangent_shape": (1, "cotangent of shape [6, 4] for an output of shape [6, 5]"),
    "null_cotangent": (1, "cotangent: null memref pointer"),
    "backward_ok": (0, None),
    "grad_unwatched": (1, "which this tape does not watch"),
    "grad_out_shape": (1, "grad: out has shape [5, 4], the watched buffer [4, 5]"),
    "null_out_grad": (1, "out_grad: null memref pointer"),
    "grad_ok": (0, None), "free_ok": (0, None),
    "stale_handle": (1, "is stale (freed, reused, or its fiber ended)"),
    "freed_twice": (1, "is stale (freed, reused, or its fiber ended)"),
}
MLIR_CHECKS = ["mlp_grads", "mlp_grads_loops", "overwritten_loss", "begin_bad_flags", "setup",
               "backward_before_end", "end_twice", "watch_after_end", "grad_before_backward",
               "backward_not_produced", "cotangent_shape", "backward_ok", "grad_unwatched", "free_ok",
               "stale_handle", "freed_twice"]
C_CHECKS = [name for name in EXPECTED if name not in ("mlp_grads", "mlp_grads_loops")]


# ---- building and running -----------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """mlp.mlir lowered, and compiled into libmlp.so (linked against libkina_fx.so)."""
    skip_unless_tools()
    out = tmp_path_factory.mktemp("mlp")
    lowered = lower(MLP_SOURCE, out / "mlp.llvm.mlir")
    library = link_shared_object(compile_object(lowered, out / "mlp.o", pic=True), out / "libmlp.so")
    return SimpleNamespace(dir=out, lowered=lowered, library=library)


@pytest.fixture(scope="module", params=["linked by hand", "compile_mlir"])
def mlp(built, request):
    """The compiled functions, callable with arrays (kina_fx.compiled): from
    the library linked above, whose traced arguments are all copied, and from
    compile_mlir's, which passes those @mlp_loss only reads as they are
    (docs/autograd-abi.md, "Arguments the code only reads are not copied")."""
    library = built.library
    patch = pytest.MonkeyPatch()
    if request.param == "compile_mlir":
        library = compiled.compile_mlir(str(MLP_SOURCE), str(built.dir / "libmlp_proven.so"))
        patch.setattr(compiled, "AS_IS_BYTES", 0)      # as they are from the first call, at any size
    mod = compiled.load(str(library), DECLARATIONS)
    assert bool(mod.read_only) == (request.param == "compile_mlir")
    yield SimpleNamespace(
        loss=mod.function("_mlir_ciface_mlp_loss", outputs=1),
        loss_loops=mod.function("_mlir_ciface_mlp_loss_loops", outputs=1),
        loss_loops_lenient=mod.function("_mlir_ciface_mlp_loss_loops", outputs=1, strict=False),
        grads=mod.function("_mlir_ciface_mlp_grads", outputs=5),
        grads_loops=mod.function("_mlir_ciface_mlp_grads_loops", outputs=5),
        problem=mod.function("_mlir_ciface_mlp_problem", outputs=6),
        relu_any=mod.function("_mlir_ciface_relu_any", outputs=1),
        scale_in_place=mod.function("_mlir_ciface_scale_in_place", outputs=1),
        read_then_clear=mod.function("_mlir_ciface_read_then_clear", outputs=1),
    )
    patch.undo()


@pytest.fixture(scope="module")
def problem(mlp):
    """The deterministic problem @mlp_problem builds, as @main and tape_host.c build it."""
    x, labels, w1, b1, w2, b2 = mlp.problem(np.zeros((N, D), np.float32), np.zeros(N, np.int64),
                                            np.zeros((D, H), np.float32), np.zeros(H, np.float32),
                                            np.zeros((H, C), np.float32), np.zeros(C, np.float32))
    # Central differences need every relu input away from the kink.
    assert np.abs(x.astype(np.float64) @ w1 + b1).min() > 1e-3
    assert set(labels.tolist()) <= set(range(C))
    return SimpleNamespace(x=x, labels=labels, params=(w1, b1, w2, b2))


def parse(stdout: str) -> SimpleNamespace:
    """The status/error/value lines of a host's output."""
    statuses, errors, values = {}, {}, {}
    for line in stdout.splitlines():
        if m := re.fullmatch(r"status (\w+) (-?\d+)", line):
            statuses[m[1]] = int(m[2])
        elif m := re.fullmatch(r"error (\w+): (.*)", line):
            errors[m[1]] = m[2]
        elif m := re.fullmatch(r"value (\w+) (\d+) (\S+)", line):
            got = values.setdefault(m[1], [])
            assert int(m[2]) == len(got), line
            got.append(float(m[3]))
    return SimpleNamespace(statuses=statuses, errors=errors,
                           values={k: np.array(v) for k, v in values.items()}, stdout=stdout)


@pytest.fixture(scope="module")
def jit_run(built):
    result = jit(built.lowered)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^0$", result.stdout, re.M), result.stdout   # @main's return value
    assert result.stderr == ""
    return parse(result.stdout)


@pytest.fixture(scope="module")
def c_run(built):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    exe = built.dir / "tape_host"
    subprocess.run([gcc, "-O2", "-Wall", "-Wextra", "-Werror", str(C_HOSTS / "tape_host.c"),
                    *kina_fx_config("--cflags", "--libs"), f"-L{built.dir}", "-lmlp",
                    f"-Wl,-rpath,{built.dir}", "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = subprocess.run(["env", "-i", str(exe)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tape host: done" in result.stdout
    assert result.stderr == ""
    return parse(result.stdout)


# ---- references: the same network in kina_fx.autograd and in float64 NumPy ----------

def autograd_loss(x, labels, w1, b1, w2, b2):
    hidden = ad.relu(ad.add(ad.matmul(x, w1), b1))
    return ad.cross_entropy(ad.add(ad.matmul(hidden, w2), b2), labels)


def autograd_gradients(p, params=None):
    params = p.params if params is None else params
    return ad.grad(lambda *q: autograd_loss(p.x, p.labels, *q), argnums=(0, 1, 2, 3))(*params)


def numpy_loss64(x, labels, w1, b1, w2, b2) -> float:
    logits = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


def central_differences(p, eps=1e-6):
    """d loss / d params by central differences of the float64 forward."""
    x = p.x.astype(np.float64)
    params = [q.astype(np.float64) for q in p.params]
    grads = []
    for q in params:
        g = np.zeros_like(q)
        for i in np.ndindex(q.shape):
            keep = q[i]
            q[i] = keep + eps
            up = numpy_loss64(x, p.labels, *params)
            q[i] = keep - eps
            down = numpy_loss64(x, p.labels, *params)
            q[i] = keep
            g[i] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def direction(p):
    """The Hessian-vector product's direction, as tape_host.c builds it."""
    return [((np.arange(q.size) % 7 - 3) / 8).astype(np.float32).reshape(q.shape) for q in p.params]


def autograd_hvp(p, v):
    """H v by nested ad.grad of the Python network (float32)."""
    def directional(*q):
        gs = ad.grad(lambda *r: autograd_loss(p.x, p.labels, *r), argnums=(0, 1, 2, 3))(*q)
        total = ad.sum(ad.mul(gs[0], v[0]))
        for g, d in zip(gs[1:], v[1:]):
            total = ad.add(total, ad.sum(ad.mul(g, d)))
        return total
    return ad.grad(directional, argnums=(0, 1, 2, 3))(*p.params)


def central_hvp(p, v, eps=1e-5):
    """H v by central differences of float64 autograd gradients along v."""
    x = p.x.astype(np.float64)
    params = [q.astype(np.float64) for q in p.params]

    def g(sign):
        q = [a + sign * eps * d.astype(np.float64) for a, d in zip(params, v)]
        return ad.grad(lambda *r: autograd_loss(x, p.labels, *r), argnums=(0, 1, 2, 3))(*q)
    return [(np.asarray(a) - np.asarray(b)) / (2 * eps) for a, b in zip(g(1), g(-1))]


@pytest.fixture(scope="module")
def reference(problem):
    grads = [np.asarray(g) for g in autograd_gradients(problem)]
    central = central_differences(problem)
    for g, c in zip(grads, central):   # the references agree with each other
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-6)
    v = direction(problem)
    hvp = [np.asarray(h) for h in autograd_hvp(problem, v)]
    hvp_central = central_hvp(problem, v)
    for a, b in zip(hvp, hvp_central):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    assert max(np.abs(h).max() for h in hvp) > 1e-2     # a product worth comparing
    loss = numpy_loss64(problem.x.astype(np.float64), problem.labels,
                        *[q.astype(np.float64) for q in problem.params])
    return SimpleNamespace(grads=grads, central=central, hvp=hvp, hvp_central=hvp_central, loss=loss)


def assert_gradients(got, ref, rtol=1e-5, atol=1e-6):
    """float32 gradients against autograd's (same kernels) and central differences (float64)."""
    for name, g, want, central in zip(PARAMS, got, ref.grads, ref.central):
        g = np.asarray(g)
        assert g.shape == want.shape, name
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=name)
        np.testing.assert_allclose(g, central, rtol=1e-4, atol=1e-5, err_msg=name)


def host_gradients(run, names, p):
    return [run.values[n].reshape(q.shape) for n, q in zip(names, p.params)]


def assert_check(run, name):
    status, text = EXPECTED[name]
    assert run.statuses.get(name) == status, (name, run.statuses.get(name), run.errors.get(name))
    if text is not None:
        assert text in run.errors.get(name, ""), (name, run.errors.get(name))
    elif status == 0:
        assert name not in run.errors


@pytest.fixture
def no_leftovers():
    """A test leaves no tape handle live and no tracer on this thread's handler stack."""
    live = tape_handles.live()
    yield
    assert tape_handles.live() == live
    assert memory_tape.current_tracer() is None


# ---- (a) MLIR's own tape: @mlp_grads ---------------------------------------------

@needs_mlir
def test_mlir_grads_equal_autograd_and_central_differences(mlp, problem, reference, no_leftovers):
    outs = [np.zeros((), np.float32)] + [np.zeros_like(q) for q in problem.params]
    loss, *grads = mlp.grads(*outs, problem.x, problem.labels, *problem.params)
    assert loss is outs[0]
    assert float(loss) == pytest.approx(reference.loss, rel=1e-6)
    assert_gradients(grads, reference)


@needs_mlir
def test_jit_main_prints_the_same_gradients(jit_run, problem, reference):
    assert_check(jit_run, "mlp_grads")
    assert jit_run.values["loss"][0] == pytest.approx(reference.loss, rel=1e-6)
    grads = host_gradients(jit_run, ("gw1", "gb1", "gw2", "gb2"), problem)
    assert_gradients(grads, reference, rtol=1e-6, atol=1e-7)   # printed with 9 digits
    flat = np.concatenate([g.ravel() for g in grads])
    weights = np.arange(1, flat.size + 1)
    (checksum,) = jit_run.values["checksum"]
    assert checksum == pytest.approx(float(weights @ flat), rel=1e-6)   # the print is complete
    want = np.concatenate([g.ravel() for g in reference.grads]).astype(np.float64)
    assert checksum == pytest.approx(float(weights @ want), rel=1e-5)


# ---- (b) Python: ad.grad / ad.vjp / ad.jvp through the compiled forward ----------

def compiled_loss(mlp, p, fn=None):
    fn = fn or mlp.loss
    return lambda *q: fn(np.zeros((), np.float32), p.x, p.labels, *q)


@needs_mlir
def test_untraced_call_computes_the_loss(mlp, problem, reference):
    out = np.zeros((), np.float32)
    assert mlp.loss(out, problem.x, problem.labels, *problem.params) is out
    assert float(out) == pytest.approx(reference.loss, rel=1e-6)


@needs_mlir
def test_ad_grad_through_the_compiled_forward(mlp, problem, reference, no_leftovers):
    grads = ad.grad(compiled_loss(mlp, problem), argnums=(0, 1, 2, 3))(*problem.params)
    assert_gradients(grads, reference)
    value, grads = ad.value_and_grad(compiled_loss(mlp, problem), argnums=(0, 1, 2, 3))(*problem.params)
    assert float(value) == pytest.approx(reference.loss, rel=1e-6)
    assert_gradients(grads, reference)


@needs_mlir
def test_ad_vjp_through_the_compiled_forward(mlp, problem, reference, no_leftovers):
    value, pullback = ad.vjp(compiled_loss(mlp, problem), *problem.params)
    assert float(value) == pytest.approx(reference.loss, rel=1e-6)
    cotangent = np.float32(-2.5)
    scaled = SimpleNamespace(grads=[-2.5 * g for g in reference.grads],
                             central=[-2.5 * g for g in reference.central])
    assert_gradients(pullback(cotangent), scaled)


@needs_mlir
def test_ad_jvp_through_the_compiled_forward(mlp, problem, reference, no_leftovers):
    v = direction(problem)
    value, tangent = ad.jvp(compiled_loss(mlp, problem), tuple(problem.params), tuple(v))
    assert float(value) == pytest.approx(reference.loss, rel=1e-6)
    want = sum(float((g * d).sum()) for g, d in zip(reference.grads, v))
    assert float(tangent) == pytest.approx(want, rel=1e-5, abs=1e-6)
    eps = 1e-6
    x, params = problem.x.astype(np.float64), [q.astype(np.float64) for q in problem.params]
    up = numpy_loss64(x, problem.labels, *[q + eps * d for q, d in zip(params, v)])
    down = numpy_loss64(x, problem.labels, *[q - eps * d for q, d in zip(params, v)])
    assert float(tangent) == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-6)


@needs_mlir
def test_hessian_vector_product_through_the_compiled_forward(mlp, problem, reference, no_leftovers):
    """grad of (grad . v), and jvp of grad, with the compiled forward inside both levels."""
    v = direction(problem)
    loss = compiled_loss(mlp, problem)

    def directional(*q):
        gs = ad.grad(loss, argnums=(0, 1, 2, 3))(*q)
        total = ad.sum(ad.mul(gs[0], v[0]))
        for g, d in zip(gs[1:], v[1:]):
            total = ad.add(total, ad.sum(ad.mul(g, d)))
        return total
    reverse_over_reverse = ad.grad(directional, argnums=(0, 1, 2, 3))(*problem.params)
    _, forward_over_reverse = ad.jvp(ad.grad(loss, argnums=(0, 1, 2, 3)), tuple(problem.params), tuple(v))
    for hvp in (reverse_over_reverse, forward_over_reverse):
        for name, h, want, central in zip(PARAMS, hvp, reference.hvp, reference.hvp_central):
            np.testing.assert_allclose(np.asarray(h), want, rtol=1e-5, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(np.asarray(h), central, rtol=1e-3, atol=1e-5, err_msg=name)


@needs_mlir
def test_hessian_vector_product_of_the_modules_own_tape_gradients(mlp, problem, reference, no_leftovers):
    """@mlp_grads runs its own tape (kina_tape_*) inside the compiled code; under
    ad.grad, ad.jvp and a Python Tape that tape nests in the buffer tracer, and
    its backward pass is recorded: the second derivatives are H v."""
    v = direction(problem)

    def module_gradients(*q):
        outs = [np.zeros((), np.float32)] + [np.zeros_like(np.asarray(getattr(a, "data", a))) for a in q]
        return mlp.grads(*outs, problem.x, problem.labels, *q)[1:]

    def directional(*q):
        total = None
        for g, d in zip(module_gradients(*q), v):
            term = ad.sum(ad.mul(g, d))
            total = term if total is None else ad.add(total, term)
        return total
    reverse_over_reverse = ad.grad(directional, argnums=(0, 1, 2, 3))(*problem.params)
    _, forward_over_reverse = ad.jvp(lambda *q: tuple(module_gradients(*q)), tuple(problem.params), tuple(v))
    with ad.Tape() as t:
        boxes = [t.watch(q) for q in problem.params]
        total = directional(*boxes)
    by_tape = t.gradient(total, boxes)
    for hvp in (reverse_over_reverse, forward_over_reverse, by_tape):
        for name, h, want, central in zip(PARAMS, hvp, reference.hvp, reference.hvp_central):
            np.testing.assert_allclose(np.asarray(getattr(h, "data", h)), want, rtol=1e-5, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(np.asarray(getattr(h, "data", h)), central, rtol=1e-3, atol=1e-5,
                                       err_msg=name)


@needs_mlir
def test_a_batch_of_one(mlp, no_leftovers):
    """Length-1 dimensions (x is 1 x D) keep their identity across the call
    (MLIR leaves their strides arbitrary), in MLIR's tape and in Python's."""
    x, labels, *params = mlp.problem(np.zeros((1, D), np.float32), np.zeros(1, np.int64),
                                     np.zeros((D, H), np.float32), np.zeros(H, np.float32),
                                     np.zeros((H, C), np.float32), np.zeros(C, np.float32))
    one = SimpleNamespace(x=x, labels=labels, params=params)
    want = [np.asarray(g) for g in autograd_gradients(one)]
    assert np.abs(want[0]).max() > 1e-3
    got = ad.grad(compiled_loss(mlp, one), argnums=(0, 1, 2, 3))(*params)
    outs = [np.zeros((), np.float32)] + [np.zeros_like(q) for q in params]
    _loss, *from_mlir = mlp.grads(*outs, x, labels, *params)
    for name, a, b, w in zip(PARAMS, got, from_mlir, want):
        np.testing.assert_allclose(np.asarray(a), w, rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(b, w, rtol=1e-5, atol=1e-7, err_msg=name)


def _layouts(a):
    """``a``'s values in other layouts: strided, column-major, reversed twice, at an offset."""
    spread = np.zeros(tuple(2 * n for n in a.shape), a.dtype)
    spread[tuple(slice(None, None, 2) for _ in a.shape)] = a
    return {"strided": spread[tuple(slice(None, None, 2) for _ in a.shape)],
            "column-major": np.asfortranarray(a),
            "reversed twice": np.ascontiguousarray(a[::-1])[::-1],
            "at an offset": np.concatenate([a, a])[len(a):]}


@needs_mlir
@pytest.mark.parametrize("layout", ["strided", "column-major", "reversed twice", "at an offset"])
def test_ranked_parameters_take_any_layout_untraced_and_traced(mlp, problem, reference, layout,
                                                               no_leftovers):
    """A ranked memref<?x?xf32, strided<[?, ?], offset: ?>> parameter gets a
    descriptor of the array's own memory whatever its layout
    (memref.ranked_descriptor): fresh views every call give the contiguous
    arrays' loss and gradients, and the output may be a view too."""
    x = _layouts(problem.x)[layout]
    params = [_layouts(q)[layout] for q in problem.params]
    labels = _layouts(problem.labels)[layout]
    assert not x.flags.c_contiguous or layout in ("reversed twice", "at an offset")
    out = np.zeros(3, np.float32)[1:2].reshape(())
    assert mlp.loss(out, x, labels, *params) is out
    assert float(out) == pytest.approx(reference.loss, rel=1e-6)
    value, grads = ad.value_and_grad(lambda *q: mlp.loss(np.zeros((), np.float32), x, labels, *q),
                                     argnums=(0, 1, 2, 3))(*params)
    assert float(value) == pytest.approx(reference.loss, rel=1e-6)
    assert_gradients(grads, reference)


@needs_mlir
def test_unranked_parameters_take_any_rank_and_differentiate(mlp, no_leftovers):
    """The other memref form: an export taking memref<*xf32> gets kina_unranked_memref_t *."""
    x = np.array([[[-1.5, 2.0], [0.5, -0.25]]], np.float32)
    out = mlp.relu_any(np.zeros_like(x), x)
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    g = ad.grad(lambda t: ad.sum(ad.mul(mlp.relu_any(np.zeros_like(x), t), x)))(x)
    np.testing.assert_array_equal(np.asarray(g), np.where(x > 0, x, 0))


@needs_mlir
def test_compiled_code_updating_a_traced_argument_in_place(mlp, no_leftovers):
    """The tape differentiates what the call saw: x's value before x *= w, not after."""
    x0 = np.array([1.5, -2.0, 0.25], np.float32)
    w0 = np.array([2.0, 3.0, -4.0], np.float32)
    x, w = x0.copy(), w0.copy()
    gx, gw = ad.grad(lambda a, b: mlp.scale_in_place(np.zeros((), np.float32), a, b), argnums=(0, 1))(x, w)
    np.testing.assert_array_equal(np.asarray(gw), x0)
    np.testing.assert_array_equal(np.asarray(gx), w0)
    np.testing.assert_array_equal(x, x0)        # a traced argument's array is not written
    untraced = x0.copy()
    assert float(mlp.scale_in_place(np.zeros((), np.float32), untraced, w0)) == pytest.approx(float(x0 @ w0))
    np.testing.assert_array_equal(untraced, x0 * w0)   # untraced: the call's own effect


@needs_mlir
@pytest.mark.parametrize("x, w", [(3.0, 0.5), (-2.0, 4.0), (0.25, -8.0)])
def test_numpy_scalar_arguments_are_passed_as_zero_d_copies_held_for_the_call(mlp, x, w, no_leftovers):
    """A NumPy scalar is not an array (nor weakly referenceable): the call makes
    a 0-d copy of each and holds it until the call returns, so two scalars get
    two buffers (freed at once, the second would have reused the first's)."""
    got = mlp.scale_in_place(np.zeros((), np.float32), np.float32(x), np.float32(w))
    assert float(got) == x * w
    value, (gx, gw) = ad.value_and_grad(
        lambda a, b: mlp.scale_in_place(np.zeros((), np.float32), a, b), argnums=(0, 1))(
            np.float32(x), np.float32(w))
    assert (float(value), float(gx), float(gw)) == (x * w, w, x)


@needs_mlir
def test_compiled_loops_clearing_an_argument_after_it_was_read_keep_gradients_right(mlp, no_leftovers):
    """MLIR code (not a runtime op) zeroes x after sum(x * w) read it: the tape
    differentiates the x that was read (its own copy), not the zeros x holds now."""
    x0 = np.array([1.5, -2.0, 0.25], np.float32)
    w = np.array([2.0, 3.0, -4.0], np.float32)
    x = x0.copy()
    gw = ad.grad(lambda b: mlp.read_then_clear(np.zeros((), np.float32), x, b))(w)
    np.testing.assert_array_equal(np.asarray(gw), x0)
    assert not x.any()                     # the call's own effect on its argument happened
    out = np.zeros((), np.float32)
    cleared = x0.copy()
    assert float(mlp.read_then_clear(out, cleared, w)) == pytest.approx(float(x0 @ w))   # untraced
    assert not cleared.any()


# ---- (c) the C host ---------------------------------------------------------------

@needs_mlir
def test_c_host_gradients(c_run, problem, reference):
    assert_check(c_run, "problem")
    assert_check(c_run, "c_grads")
    assert c_run.values["loss"][0] == pytest.approx(reference.loss, rel=1e-6)
    assert_gradients(host_gradients(c_run, ("gw1", "gb1", "gw2", "gb2"), problem), reference,
                     rtol=1e-6, atol=1e-7)


@needs_mlir
def test_c_host_hessian_vector_product_with_nested_tapes(c_run, problem, reference):
    assert_check(c_run, "c_hvp")
    hvp = host_gradients(c_run, ("hw1", "hb1", "hw2", "hb2"), problem)
    for name, h, want, central in zip(PARAMS, hvp, reference.hvp, reference.hvp_central):
        np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(h, central, rtol=1e-3, atol=1e-5, err_msg=name)


# ---- (d) strict mode: the relu done in MLIR loops ------------------------------------

def assert_names_hidden_activation(text):
    assert "matmul input 'a'" in text and f"shape [{N}, {H}]" in text, text
    assert "was not produced by a recorded runtime op, watched, or declared constant" in text, text


@needs_mlir
def test_strict_mode_catches_the_loops_forward_from_mlir(jit_run):
    assert_check(jit_run, "mlp_grads_loops")
    assert_names_hidden_activation(jit_run.errors["mlp_grads_loops"])


@needs_mlir
def test_strict_mode_catches_the_loops_forward_from_c(c_run):
    assert_check(c_run, "c_strict_loops")
    assert_names_hidden_activation(c_run.errors["c_strict_loops"])


@needs_mlir
def test_strict_mode_catches_the_loops_forward_from_python(mlp, problem, no_leftovers):
    with pytest.raises(memory_tape.TapeError) as caught:    # the runtime's own exception
        ad.grad(compiled_loss(mlp, problem, mlp.loss_loops), argnums=(0, 1, 2, 3))(*problem.params)
    assert_names_hidden_activation(str(caught.value))
    outs = [np.zeros((), np.float32)] + [np.zeros_like(q) for q in problem.params]
    with pytest.raises(ValidationError) as caught:
        mlp.grads_loops(*outs, problem.x, problem.labels, *problem.params)
    assert_names_hidden_activation(str(caught.value))


@needs_mlir
def test_a_lenient_tape_silently_drops_what_it_cannot_see(mlp, c_run, problem, reference, no_leftovers):
    """Why strict is the default: a lenient tape takes the loops' output for a
    constant, so the first layer's gradients come out zero, with status 0."""
    assert_check(c_run, "c_lenient_loops")
    lenient = host_gradients(c_run, ("lenient_gw1", "lenient_gb1", "lenient_gw2", "lenient_gb2"), problem)
    grads = ad.grad(compiled_loss(mlp, problem, mlp.loss_loops_lenient), argnums=(0, 1, 2, 3))(*problem.params)
    for got in (lenient, [np.asarray(g) for g in grads]):
        assert not got[0].any() and not got[1].any()
        assert np.abs(reference.grads[0]).max() > 1e-2 and np.abs(reference.grads[1]).max() > 1e-2
        np.testing.assert_allclose(got[2], reference.grads[2], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[3], reference.grads[3], rtol=1e-5, atol=1e-6)


# ---- (e) recorded buffers overwritten before use -----------------------------------

@needs_mlir
def test_overwritten_loss_is_reported_from_mlir(jit_run):
    assert_check(jit_run, "overwritten_loss")
    assert "backward: buffer at 0x" in jit_run.errors["overwritten_loss"]
    assert "(shape [], strides [], float32)" in jit_run.errors["overwritten_loss"]


@needs_mlir
@pytest.mark.parametrize("check, shape", [("overwritten_loss", "[]"), ("overwritten_hidden", f"[{N}, {H}]"),
                                          ("overwritten_watched", f"[{D}, {H}]")])
def test_overwritten_buffers_are_reported_from_c(c_run, check, shape):
    assert_check(c_run, check)
    assert f"(shape {shape}" in c_run.errors[check] and "overwritten" in c_run.errors[check]
    assert_check(c_run, "free_after_overwrite")
    assert_check(c_run, "free_recording")


# ---- (f) misuse of the tape ABI ----------------------------------------------------

@needs_mlir
@pytest.mark.parametrize("check", C_CHECKS)
def test_c_host_check(c_run, check):
    assert_check(c_run, check)


@needs_mlir
@pytest.mark.parametrize("check", MLIR_CHECKS)
def test_mlir_host_check_under_the_jit(jit_run, check):
    assert_check(jit_run, check)


def test_every_check_is_made_by_its_hosts():
    """Each expected check is printed by the hosts said to make it, and nothing else is expected."""
    mlir_source = MLP_SOURCE.read_text()
    c_source = (C_HOSTS / "tape_host.c").read_text()
    for name in MLIR_CHECKS:
        assert f'("{name}\\00")' in mlir_source, name
    for name in C_CHECKS:
        assert f'"{name}"' in c_source or f"status {name} " in c_source, name
    assert set(EXPECTED) == set(MLIR_CHECKS) | set(C_CHECKS)
