"""Python Tapes begun, nested, ended and differentiated in any order, checked against a model.

A stateful hypothesis test of ``ad.Tape`` itself (``test_tape_model.py`` does
the same for the tapes of the C ABI): tapes are entered and exited in nesting
order; each step watches a value (an array, a box of the innermost tape, of an
enclosing one, or of one that has finished) with the innermost tape, computes
an op on any two values or a ``jvp`` on one (forward mode over whatever
records; its tangent is a value the tapes may differentiate further), or
takes any tape's gradient -- while it records,
while tapes nested in it record, or after it finished -- of any value.

Each value is an expression over the tapes' variables.  A tape's gradient is
checked against float64 central differences of the target with respect to
each of its variables, seeing through the variables of tapes nested in it
(a nested watch boxes the outer value) and holding every other one constant.
An op or a gradient may instead be refused with the documented
``KinaTypeError`` ("... which has finished") only when a value of a finished
tape is involved; a wrong number is never allowed.  The finished tapes'
watched leaves are not watched again here: adopting them in place (as
TensorFlow's ``watch``) is tested by ``test_autograd.py``.
"""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kina_fx import autograd as ad
from kina_fx.errors import KinaTypeError

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
EPS = 1e-6
UNARY = {"tanh": (ad.tanh, np.tanh), "sin": (ad.sin, np.sin), "neg": (ad.neg, np.negative)}
BINARY = {"add": (ad.add, np.add), "sub": (ad.sub, np.subtract), "mul": (ad.mul, np.multiply)}


class Var:
    def __init__(self, tape, base, value):
        self.tape, self.base, self.value = tape, base, np.asarray(value, np.float64)


class Op:
    """An op on expressions, and the tapes that recorded it (``recorded_by``)."""

    def __init__(self, name, args, recorded_by):
        self.name, self.args, self.recorded_by = name, args, recorded_by
        self.value = evaluate(self, {}, None)


def evaluate(e, bind, see_through, by=None):
    """``e`` in float64: a variable in ``bind`` takes that value, one of a tape in
    ``see_through`` is its base expression, any other its value when watched.
    ``by``: the tape differentiating; an op it did not record is the constant
    it computed (``see_through`` None: every op's value as computed)."""
    if isinstance(e, (np.ndarray, np.generic)):
        return e
    if isinstance(e, Var):
        if e in bind:
            return bind[e]
        if see_through is not None and e.tape in see_through:
            return evaluate(e.base, bind, see_through, by)
        return e.value
    if see_through is None and hasattr(e, "value"):
        return e.value
    if by is not None and by not in e.recorded_by:
        return e.value
    fn = NUMPY_OF[e.name] if e.name in NUMPY_OF else UNARY[e.name][1] if e.name in UNARY else BINARY[e.name][1]
    return fn(*[evaluate(a, bind, see_through, by) for a in e.args])


def jvp_function(z):
    """What the ``jvp`` rule differentiates forward: sum(sin(z) * z)."""
    return ad.sum(ad.sin(z) * z)


#: The model's float64 forms of what no single op of UNARY or BINARY is:
#: ``jvp_primal`` and ``jvp_tangent`` are jvp_function and its derivative along ones.
NUMPY_OF = {
    "sum": np.sum,
    "jvp_primal": lambda z: np.sum(np.sin(z) * z),
    "jvp_tangent": lambda z: np.sum(np.cos(z) * z + np.sin(z)),
    # test_tape_nesting_compiled.py's: a float32 cast (the model's values stay
    # float64: rounding would swamp the central differences), exp and its square
    "cast32": lambda z: z,
    "exp": np.exp,
    "exp_square": lambda z: np.exp(z) ** 2,
}


def traced(value) -> bool:
    """Whether ``value`` is a box of some trace (else an op made it where no
    trace records: a constant)."""
    return isinstance(value, ad.Tensor) and value._trace is not None


class ModelTape:
    def __init__(self, tape, parent):
        self.tape, self.parent, self.live = tape, parent, True
        self.vars: list = []          # (Var, its box)

    def ancestors(self):
        t = self.parent
        while t is not None:
            yield t
            t = t.parent


class NestingModel(RuleBasedStateMachine):
    #: how close values and gradients must be (float64 ops: exact up to rounding)
    VALUE_RTOL, VALUE_ATOL, GRAD_RTOL, GRAD_ATOL = 1e-12, 1e-12, 1e-5, 1e-6
    #: whether later values are checked against each step's computed value
    #: (float32 steps: one rounding per step, not a chain of them)
    REBASE = False

    def __init__(self):
        super().__init__()
        self.stack: list = []         # live ModelTapes, innermost last
        self.tapes: list = []
        start = np.array([0.3, -0.7])
        # (object, expression, the tape it is a box of or None, the tapes whose boxes
        # are in its chain: it holds one of each, one level out after the other)
        self.values = [(start, start.copy(), None, frozenset())]

    def descendants(self, tape):
        return {t for t in self.tapes if tape in t.ancestors()}

    def involves_finished(self, *indices):
        """Whether one of these values is a box of a tape that has finished."""
        return any(self.values[i][2] is not None and not self.values[i][2].live for i in indices)

    def recorders(self, indices):
        """The live tapes an op on these values is recorded by: each whose box
        is in an operand's chain (boxes of finished tapes are lifted away)."""
        return frozenset(t for i in indices for t in self.values[i][3] if t.live)

    def owner(self, value):
        """The model of the tape ``value`` is a box of, or None."""
        trace = value._trace if isinstance(value, ad.Tensor) else None
        return next((t for t in self.tapes if t.tape is trace), None)

    @precondition(lambda self: len(self.tapes) < 6)
    @rule()
    def begin(self):
        tape = ad.Tape()
        tape.__enter__()
        model = ModelTape(tape, self.stack[-1] if self.stack else None)
        self.stack.append(model)
        self.tapes.append(model)

    @precondition(lambda self: self.stack)
    @rule()
    def end(self):
        model = self.stack.pop()
        model.tape.__exit__(None, None, None)
        model.live = False

    @precondition(lambda self: self.stack)
    @rule(data=st.data())
    def watch(self, data):
        i = data.draw(st.integers(0, len(self.values) - 1))
        obj, expr, owner, chain = self.values[i]
        if owner is not None and not owner.live and any(box is obj for _, box in owner.vars):
            return                    # a finished tape's leaf: adopted in place (see the docstring)
        model = self.stack[-1]
        plain = isinstance(obj, ad.Tensor) and obj._trace is None
        box = model.tape.watch(obj)
        assert box._trace is model.tape
        var = Var(model, expr, evaluate(expr, {}, None))
        model.vars.append((var, box))
        entry = (box, var, model, frozenset({model}) | {t for t in chain if t.live})
        if plain:
            assert box is obj               # a plain Tensor: adopted in place (TensorFlow's watch)
            self.values[i] = entry
        else:
            assert box is not obj
            self.values.append(entry)

    @rule(data=st.data())
    def op(self, data):
        name = data.draw(st.sampled_from(sorted(UNARY) + sorted(BINARY)))
        n = 1 if name in UNARY else 2
        idx = [data.draw(st.integers(0, len(self.values) - 1)) for _ in range(n)]
        fn = UNARY[name][0] if n == 1 else BINARY[name][0]
        try:
            out = fn(*[self.values[i][0] for i in idx])
        except KinaTypeError as exc:
            assert "which has finished" in str(exc) and self.involves_finished(*idx), exc
            return
        recorded_by = self.recorders(idx)
        expr = Op(name, [self.values[i][1] for i in idx], recorded_by)
        got = out.data if isinstance(out, ad.Tensor) else out
        np.testing.assert_allclose(np.asarray(got, np.float64), expr.value, rtol=self.VALUE_RTOL,
                                   atol=self.VALUE_ATOL)
        if self.REBASE:
            expr.value = np.asarray(got, np.float64)
        assert traced(out) == bool(recorded_by), (out, recorded_by)
        self.values.append((out, expr, self.owner(out), recorded_by))

    @rule(data=st.data())
    def jvp(self, data):
        """Forward mode inside (or outside) the tapes: its primal and tangent are
        values the tapes recording now may differentiate further."""
        i = data.draw(st.integers(0, len(self.values) - 1))
        obj = self.values[i][0]
        try:
            primal, tangent = ad.jvp(jvp_function, (obj,), (np.ones(np.shape(getattr(obj, "data", obj))),))
        except KinaTypeError as exc:
            assert "which has finished" in str(exc) and self.involves_finished(i), exc
            return
        recorded_by = self.recorders([i])
        for name, out in (("jvp_primal", primal), ("jvp_tangent", tangent)):
            expr = Op(name, [self.values[i][1]], recorded_by)
            got = out.data if isinstance(out, ad.Tensor) else out
            np.testing.assert_allclose(np.asarray(got, np.float64), expr.value, rtol=self.VALUE_RTOL,
                                       atol=self.VALUE_ATOL)
            if self.REBASE:
                expr.value = np.asarray(got, np.float64)
            self.values.append((out, expr, self.owner(out), recorded_by))

    @precondition(lambda self: any(t.vars for t in self.tapes))
    @rule(data=st.data())
    def gradient(self, data):
        model = data.draw(st.sampled_from([t for t in self.tapes if t.vars]))
        i = data.draw(st.integers(0, len(self.values) - 1))
        target, expr = self.values[i][:2]
        boxes = [box for _, box in model.vars]
        try:
            total = ad.sum(target)
            expr = Op("sum", [expr], self.recorders([i]))
            grads = model.tape.gradient(total, boxes)
        except KinaTypeError as exc:
            assert "which has finished" in str(exc) and self.involves_finished(i), exc
            return
        see = self.descendants(model)
        for (var, _), g in zip(model.vars, grads):
            want = np.zeros_like(var.value)
            for k in np.ndindex(var.value.shape):
                hi, lo = var.value.copy(), var.value.copy()
                hi[k] += EPS
                lo[k] -= EPS
                want[k] = (evaluate(expr, {var: hi}, see, model) - evaluate(expr, {var: lo}, see, model)) / (2 * EPS)
            got = np.asarray(g.data if isinstance(g, ad.Tensor) else g, np.float64)
            np.testing.assert_allclose(got, want, rtol=self.GRAD_RTOL, atol=self.GRAD_ATOL)

    def teardown(self):
        while self.stack:
            self.stack.pop().tape.__exit__(None, None, None)


NestingModel.TestCase.settings = settings(
    max_examples=1500 if CI else 40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_tape_nesting_model = NestingModel.TestCase
