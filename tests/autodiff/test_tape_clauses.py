"""The compiled clause of a Tape for elementwise and binary primitives against the Python clause.

With the compiled implementation, a Tape's handler answers the one-input
elementwise primitives (tanh, exp, ...) and the binary ones (add, mul, ...) with
``kina_fx._speedups.TapeClause`` (kina_fx/_speedups_c/tape_clauses.c), which
records the common case in C -- a box of the tape, with a box or a Python
number -- and hands every other call to the Python clause it wraps.  Here
generated programs mix every kind of operand (boxes, Python and NumPy numbers,
bools, arrays, plain Tensors, boxes of an enclosing trace, boxes of a finished
one) and run with the handlers built both ways: the values, the first and
second derivatives, the recorded nodes and the errors agree exactly.  Then:
the compiled clause does take the common case without its fallback, and a
handler of the primitive's effect around the tape or inside it still sees
every call.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kina_fx import autograd as ad
from kina_fx import fibers
from kina_fx.autograd import tape as tape_module
from kina_fx.autograd.primitives import PRIMITIVES
from kina_fx.errors import KinaTypeError
from kina_fx.handlers import Handler, perform

needs_core = pytest.mark.skipif(fibers.speedups is None, reason="needs the compiled kina_fx._speedups")

UNARY = ["tanh", "exp", "sin", "neg", "sigmoid"]
BINARY = ["add", "sub", "mul"]
SETTINGS = dict(max_examples=60, deadline=None)


class clauses:
    """Tapes' handlers built with the compiled clause (``"compiled"``, as the
    implementation builds them) or with the Python clause only."""

    def __init__(self, kind):
        self.kind = kind

    def __enter__(self):
        self.saved = tape_module._speedups
        if self.kind == "python":
            tape_module._speedups = None
        tape_module._tape_pool.items.clear()

    def __exit__(self, *exc):
        tape_module._speedups = self.saved
        tape_module._tape_pool.items.clear()


def _bits(v):
    v = v.data if isinstance(v, ad.Tensor) else v
    if isinstance(v, (np.ndarray, np.generic)):
        a = np.asarray(v)
        return ("array", a.dtype.str, a.shape, a.tobytes())
    return (type(v).__name__, repr(v))


def _node(node):
    rule, i, ids, u, v, out, prim = node
    def flat(x):
        return tuple(_bits(y) for y in x) if isinstance(x, tuple) else _bits(x)
    return (rule, i, ids, flat(u), flat(v), _bits(out), prim)


OPERANDS = ("box", "box", "box", "float", "int", "bool", "np_float", "array", "plain_tensor")


@st.composite
def programs(draw):
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            steps.append(("unary", draw(st.sampled_from(UNARY))))
        else:
            steps.append(("binary", draw(st.sampled_from(BINARY)), draw(st.sampled_from(OPERANDS)),
                          draw(st.booleans()), draw(st.floats(-2, 2, allow_nan=False))))
    return steps


def _operand(kind, c, boxes, shape):
    if kind == "box":
        return boxes[int(abs(c) * 10) % len(boxes)]
    if kind == "float":
        return float(c)
    if kind == "int":
        return int(c * 3)
    if kind == "bool":
        return c > 0
    if kind == "np_float":
        return np.float64(c)
    if kind == "array":
        return np.full(shape, c)
    return ad.Tensor(np.full(shape, c))


def run_program(steps, x, shape):
    """The program's value at ``x`` (of ``shape``; boxes kept for the operands of later steps)."""
    boxes = [x]
    y = x
    for step in steps:
        if step[0] == "unary":
            y = getattr(ad, step[1])(y)
        else:
            _, name, kind, y_first, c = step
            other = _operand(kind, c, boxes, shape)
            fn = getattr(ad, name)
            y = fn(y, other) if y_first else fn(other, y)
        boxes.append(y)
    return ad.sum(y)


def everything(steps, x0):
    """Value, gradient, second derivative along ones, and the nodes of a Tape."""
    def f(x):
        return run_program(steps, x, np.shape(x0))
    with ad.Tape() as t:
        x = t.watch(x0)
        y = f(x)
    nodes = [_node(n) for n in t._nodes]
    g = t.gradient(y, x)
    hvp = ad.grad(lambda x: ad.sum(ad.grad(f)(x)))(x0)
    return _bits(y), _bits(g), _bits(hvp), nodes


@needs_core
@settings(**SETTINGS)
@given(steps=programs(), x=st.lists(st.floats(-1.5, 1.5, allow_nan=False), min_size=1, max_size=3),
       scalar=st.booleans())
def test_programs_agree_with_the_python_clause(steps, x, scalar):
    x0 = np.float64(x[0]) if scalar else np.array(x)
    results = {}
    for kind in ("compiled", "python"):
        with clauses(kind), np.errstate(all="ignore"):
            results[kind] = everything(steps, x0)
    assert results["compiled"] == results["python"]


@needs_core
@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_a_finished_box_is_refused_by_both(kind):
    with clauses(kind):
        with ad.Tape() as t1:
            kept = t1.watch(np.array([1.0, 2.0])) * 2.0
        with ad.Tape() as t2:
            x = t2.watch(np.array([3.0, 4.0]))
            with pytest.raises(KinaTypeError, match="which has finished"):
                x * kept
            with pytest.raises(KinaTypeError, match="which has finished"):
                ad.tanh(kept) + x


@needs_core
def test_the_compiled_clause_takes_the_common_case_itself():
    prim = PRIMITIVES["tanh"]
    with ad.Tape() as t:
        clause = t._handler[0].fun[prim.effect]
        assert type(clause).__name__ == "TapeClause"
        x = t.watch(np.array([0.5, -0.5]))
        calls = []
        fallback = clause.fallback

        def counting(*args):
            calls.append(args)
            return fallback(*args)
        spy = fibers.speedups.TapeClause(counting, t._handler[1],
                                         (1, prim.effect, prim, prim.vjp_rules[0], None, None, None,
                                          None, ad.Tensor))
        y = spy(x)
        assert calls == [] and y._trace is t and t._nodes[-1][0] is prim.vjp_rules[0]
        spy(np.array([1.0]))                       # not a box: the Python clause
        assert len(calls) == 1


@needs_core
@pytest.mark.parametrize("kind", ["compiled", "python"])
@pytest.mark.parametrize("where", ["around", "inside"])
def test_a_handler_of_the_primitive_sees_every_call(kind, where):
    seen = []
    mul = PRIMITIVES["mul"].effect
    tanh = PRIMITIVES["tanh"].effect

    def spy(effect):
        def clause(*args):
            seen.append(effect)
            return perform(effect, *args)
        return clause
    handler = Handler(fun={mul: spy(mul), tanh: spy(tanh)})

    def f(x):
        return ad.sum(ad.tanh(x) * 1.5)

    with clauses(kind):
        if where == "around":
            with handler:
                g = ad.grad(f)(np.array([0.25, 0.5]))
        else:
            g = ad.grad(lambda x: handler.run(f, x))(np.array([0.25, 0.5]))
    np.testing.assert_allclose(g, 1.5 * (1 - np.tanh([0.25, 0.5]) ** 2))
    assert seen.count(tanh) >= 1 and seen.count(mul) >= 1
