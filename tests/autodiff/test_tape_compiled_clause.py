"""The compiled tape clause of the direct runtime ops against the Python clause.

With the compiled implementation, a tape answers the runtime ops that have a
direct NumPy function (matmul, add, sub, mul, div, pow, exp, log, tanh, relu) with
``kina_fx._speedups.TracerClause`` (kina_fx/_speedups_c/tape_calls.c), which
records the common case in C and hands every other call to the Python clause
(``BufferTracer.apply``).  Here generated programs run through the real
exports under ``kina_tape_*`` twice, once with the tracers' handlers built
with the compiled clause and once with the Python clause only, and agree bit
for bit: every status and error text, every buffer, the gradients, and the
recorded nodes (rule, ids, inputs, output, primitive).  Then: the compiled
clause does take the common case; a handler of the primitive's effect in
scope, or a replaced default, still sees every call; and the primitives'
kernels are the direct functions the compiled clause calls in their place.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from support.abi import Abi
from support.tapes import F32, LENIENT, OK, STRICT, Tape, free_leftovers, op_status
from kina_fx import fibers
from kina_fx.autograd import memory
from kina_fx.autograd.primitives import PRIMITIVES
from kina_fx.ffi.tapes import tape_handles
from kina_fx.handlers import Handler, perform
from kina_fx.runtime_ops import BY_NAME, RUNTIME_OPS

DIRECT = [op.name for op in RUNTIME_OPS if op.direct is not None]
BINARY = [name for name in DIRECT if len(BY_NAME[name].inputs) == 2]
UNARY = [name for name in DIRECT if len(BY_NAME[name].inputs) == 1]
needs_core = pytest.mark.skipif(fibers.speedups is None, reason="needs the compiled kina_fx._speedups")


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")
    yield
    free_leftovers()


@pytest.fixture(scope="module")
def abi():
    return Abi()


class clauses:
    """Tracers' handlers built with the compiled clause (``"compiled"``: as
    the implementation builds them) or with the Python clause only."""

    def __init__(self, kind):
        self.kind = kind

    def __enter__(self):
        self.saved = memory._compiled_clause
        if self.kind == "python":
            memory._compiled_clause = lambda op, slot, clause: None
        memory._handlers.clear()

    def __exit__(self, *exc):
        memory._compiled_clause = self.saved
        memory._handlers.clear()


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.dtype.str, a.shape, a.tobytes()


def _node(node):
    rule, i, ids, u, v, out, prim = node
    arrays = u if isinstance(u, tuple) else (u,)
    extra = v if isinstance(v, tuple) else (v,)
    return (rule, i, ids, tuple(_bits(x) if isinstance(x, np.ndarray) else x for x in arrays),
            tuple(_bits(x) if isinstance(x, np.ndarray) else x for x in extra), _bits(out), prim)


# A program: buffers of one shape (or a row for broadcasting), some watched, some
# constant, then steps: an op into a buffer from buffers, or the host writing
# a buffer (a later read of it is refused, as an overwrite).
SHAPES = [(2, 2), (3, 3), (1, 4)]


@st.composite
def programs(draw):
    n = draw(st.integers(1, 3))
    shape = draw(st.sampled_from(SHAPES))
    flags = draw(st.sampled_from([STRICT, LENIENT]))
    nbuf = draw(st.integers(3, 6))
    roles = [draw(st.sampled_from(["watch", "constant", "none"])) for _ in range(nbuf)]
    steps = []
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.integers(0, 9)) == 0:
            steps.append(("write", draw(st.integers(0, nbuf - 1))))
            continue
        name = draw(st.sampled_from(DIRECT))
        out = draw(st.integers(0, nbuf - 1))
        ins = tuple(draw(st.integers(0, nbuf - 1)) for _ in BY_NAME[name].inputs)
        steps.append((name, out, ins))
    row = draw(st.booleans())              # one buffer a row, broadcast by the binary ops
    return dict(n=n, shape=shape, flags=flags, roles=roles, steps=steps, row=row,
                seed=draw(st.integers(0, 2**16)))


def _run(abi, program, kind):
    """Statuses, error texts, buffers, gradients and nodes of ``program``."""
    rng = np.random.default_rng(program["seed"])
    shape = program["shape"]
    bufs = []
    for k, _ in enumerate(program["roles"]):
        s = (shape[-1],) if program["row"] and k == 0 else shape
        bufs.append((rng.standard_normal(s) * 1.5 + 0.25).astype(np.float32))
    seen = []

    def text(status):           # the error text, buffers named by index, not address
        message = abi.last_error() if status else ""
        for k, b in enumerate(bufs):
            message = message.replace(f"{b.ctypes.data:#x}", f"buffer {k}")
        return message
    with clauses(kind):
        t = Tape(abi, program["flags"])
        for b, role in zip(bufs, program["roles"]):
            if role != "none":
                seen.append(("role", t.call("kina_tape_" + role, b, F32)))
        last = None
        for step in program["steps"]:
            if step[0] == "write":
                bufs[step[1]][...] += 1.0
                continue
            name, out, ins = step
            status = op_status(abi, name, bufs[out], *[bufs[i] for i in ins])
            seen.append((name, status, text(status)))
            if status == OK:
                last = out
        tape = tape_handles.get(t.handle)
        t.end()
        nodes = [_node(n) for n in tape.tape._nodes]
        grads = []
        if last is not None:
            seed = np.ones_like(bufs[last])
            status = t.call("kina_tape_backward", bufs[last], seed)
            seen.append(("backward", status, text(status)))
            if status == OK:
                for b, role in zip(bufs, program["roles"]):
                    if role == "watch":
                        g = np.zeros_like(b)
                        seen.append(("grad", t.call("kina_tape_grad", b, g)))
                        grads.append(_bits(g))
        t.free()
    return seen, [_bits(b) for b in bufs], grads, nodes


@needs_core
@settings(deadline=None, max_examples=60, derandomize=True)
@given(program=programs())
def test_the_compiled_clause_records_what_the_python_clause_records(abi, program):
    for _ in range(program["n"]):
        compiled = _run(abi, program, "compiled")
        python = _run(abi, program, "python")
        assert compiled[0] == python[0]          # statuses and texts
        assert compiled[1] == python[1]          # every buffer, bit for bit
        assert compiled[2] == python[2]          # gradients
        assert compiled[3] == python[3]          # nodes


@needs_core
@pytest.mark.parametrize("name", DIRECT)
def test_the_compiled_clause_takes_the_common_case(abi, name):
    """From the second call of the same operands on, no Python function of
    the tracer runs: the compiled clause recorded the call itself."""
    op = BY_NAME[name]
    rng = np.random.default_rng(1)
    ins = [(np.abs(rng.standard_normal((3, 3))) + 0.5).astype(np.float32) for _ in op.inputs]
    out = np.zeros((3, 3), np.float32)
    t = Tape(abi)
    for a in ins:
        assert t.call("kina_tape_watch", a, F32) == OK
    assert op_status(abi, name, out, *ins) == OK
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == memory.__file__:
            seen.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        for _ in range(3):
            assert op_status(abi, name, out, *ins) == OK
    finally:
        sys.setprofile(None)
    t.end()
    assert seen == []
    tape = tape_handles.get(t.handle)
    assert len(tape.tape._nodes) == 4
    g = np.ones_like(out)
    assert t.call("kina_tape_backward", out, g) == OK
    t.free()


def _count_primitive_calls(abi, name, where):
    op = BY_NAME[name]
    effect = PRIMITIVES[op.primitive].effect
    calls = []

    def count(*args):
        calls.append(len(args))
        return perform(effect, *args)
    rng = np.random.default_rng(2)
    ins = [rng.standard_normal((2, 2)).astype(np.float32) for _ in op.inputs]
    out = np.zeros((2, 2), np.float32)
    counting = Handler(fun={effect: count})
    if where == "outside the tape":
        counting.__enter__()
    t = Tape(abi)
    if where == "inside the tape":
        counting.__enter__()
    try:
        for a in ins:
            assert t.call("kina_tape_watch", a, F32) == OK
        for _ in range(3):
            assert op_status(abi, name, out, *ins) == OK
    finally:
        if where == "inside the tape":
            counting.__exit__(None, None, None)
    t.end()
    t.free()
    if where == "outside the tape":
        counting.__exit__(None, None, None)
    return calls


@pytest.mark.parametrize("where", ["outside the tape", "inside the tape"])
@pytest.mark.parametrize("name", ["matmul", "add", "exp"])
def test_a_handler_of_the_primitive_sees_what_it_sees_with_the_python_clause(abi, name, where):
    """A handler of the primitive's effect installed before the tape sees
    every call the tape records (the tape's clause performs the primitive
    again, outwards); one installed after it does not (a clause runs outside
    its handler, and the tape's handler is below it).  Both clauses alike."""
    with clauses("compiled"):
        compiled = _count_primitive_calls(abi, name, where)
    with clauses("python"):
        python = _count_primitive_calls(abi, name, where)
    assert compiled == python
    assert compiled == ([len(BY_NAME[name].inputs)] * 3 if where == "outside the tape" else [])


def test_a_replaced_default_of_the_primitive_runs(abi):
    op = BY_NAME["mul"]
    effect = PRIMITIVES[op.primitive].effect
    saved = effect.default
    calls = []

    def default(a, b):
        calls.append(1)
        return saved(a, b)
    a = np.full((2, 2), 3, np.float32)
    b = np.full((2, 2), 2, np.float32)
    out = np.zeros((2, 2), np.float32)
    t = Tape(abi)
    assert t.call("kina_tape_watch", a, F32) == OK
    assert t.call("kina_tape_constant", b, F32) == OK
    effect.default = default
    try:
        for _ in range(3):
            assert op_status(abi, "mul", out, a, b) == OK
    finally:
        effect.default = saved
    t.end()
    g = np.zeros_like(a)
    assert t.call("kina_tape_backward", out, np.ones_like(out)) == OK
    assert t.call("kina_tape_grad", a, g) == OK
    t.free()
    assert calls == [1, 1, 1]
    np.testing.assert_array_equal(g, b)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, np.inf, -np.inf, np.nan, 1e-30, 1e30, 88.0, -104.0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("name", DIRECT)
def test_the_primitives_kernel_is_the_direct_function(name, dtype):
    """What the compiled clause relies on: on NumPy arrays of one floating
    type, the primitive's kernel (its effect's default) computes exactly
    ``op.direct(*inputs)``."""
    op = BY_NAME[name]
    kernel = PRIMITIVES[op.primitive].effect.default
    rng = np.random.default_rng(3)
    with np.errstate(all="ignore"):
        for shape in [(2, 2), (4, 3), (1, 5)]:
            ins = []
            for k in op.inputs:
                a = rng.standard_normal(shape) * 2
                a.flat[: len(SPECIAL)] = SPECIAL[: a.size]
                ins.append(rng.permuted(a.ravel()).reshape(shape).astype(dtype))
            if name == "matmul":
                ins[1] = ins[1].reshape(shape[::-1])
            expected, got = op.direct(*ins), kernel(*ins)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert got.tobytes() == expected.tobytes()


def test_a_training_loop_on_the_same_buffers_gets_each_steps_gradient(abi):
    """The same buffers every step (so the remembered views and admitted
    shapes are reused), with the host changing the input, the weights and,
    once, the shapes of the buffers between steps: each step's gradient is
    that step's, against NumPy."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    for step in range(6):
        n = 4 if step != 3 else 5                   # one step with other shapes
        x = rng.standard_normal((n, 3)).astype(np.float32)
        z = np.zeros((n, 2), np.float32)
        y = np.zeros((n, 2), np.float32)
        if step == 3:
            w = rng.standard_normal((3, 2)).astype(np.float32)
        else:
            w += np.float32(0.125)                   # the host updates the weights in place
        t = Tape(abi)
        assert t.call("kina_tape_watch", w, F32) == OK
        assert t.call("kina_tape_constant", x, F32) == OK
        for _ in range(2):                           # the same call twice: the second is remembered
            assert op_status(abi, "matmul", z, x, w) == OK
            assert op_status(abi, "mul", y, z, z) == OK
        t.end()
        g = np.zeros_like(w)
        assert t.call("kina_tape_backward", y, np.ones_like(y)) == OK
        assert t.call("kina_tape_grad", w, g) == OK
        t.free()
        expected = x.T @ (2 * (x @ w))
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-5)
