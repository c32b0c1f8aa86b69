"""A model of the tape ABI's states, checked call by call (hypothesis, stateful).

The model is written from docs/autograd-abi.md alone: tapes (strict or
lenient) begun, nested, ended and freed on the main thread's root fiber;
watch, constant, runtime ops, host writes, backward and grad; tapes left
recording on host fibers that end (stale); calls from another thread.  For
every call it predicts the status, and checks

* on failure, that no buffer changed (a failed call changes nothing; the
  model's state does not change either, so every later prediction checks that
  the tape did not change);
* on success, the values written: an op's output against a float64
  evaluation of what the tape recorded, a gradient against float64 central
  differences of the recorded function (through nested tapes: a gradient
  recorded by an outer tape is differentiated by nested central differences).

Each tensor a tape knows is an expression over watched variables; a tape
differentiates with respect to its own variables, sees through the variables
of tapes nested inside it (a nested watch boxes the outer value) and holds
every other variable constant.

Bounded in the default run; ``CI=true`` runs many more programs, and CI's
long run on one version (``KINA_MODEL_EXAMPLES``) more again: run longer, it
found the silently wrong gradients of nested tapes fixed on 2026-12-03.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from support.abi import Abi
from support.tapes import F32, LENIENT, OK, STRICT, VALIDATION, op_status
from kina_fx.runtime_ops import ALL_AXES

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

VECTORS = ("v0", "v1", "v2", "v3")
SCALARS = ("s0", "s1")
BUFFERS = VECTORS + SCALARS
UNARY = ("neg", "exp", "tanh", "sigmoid")
BINARY = ("add", "sub", "mul")
EPS = 1e-5
LIMIT = 1e3            # gradients are compared only where every value stays below this


def _shape(name):
    return (3,) if name in VECTORS else ()


# ---- expressions: what a tape knows a buffer holds ---------------------------------------

class Const:
    def __init__(self, value):
        self.value = np.asarray(value, np.float64)


class Var:
    """A watched buffer of one tape: ``base`` is what it boxes (an outer tape's
    expression, or a constant), ``value`` its value when watched."""

    def __init__(self, tape, base, value):
        self.tape, self.base, self.value = tape, base, np.asarray(value, np.float64)


class Op:
    def __init__(self, name, args):
        self.name, self.args = name, args


class Grad:
    """The gradient a tape's backward gave for one of its variables, as a
    function of everything outside that tape (an outer tape recorded it)."""

    def __init__(self, tape, output, seed, var):
        self.tape, self.output, self.seed, self.var = tape, output, seed, var


F64 = {
    "neg": np.negative, "exp": np.exp, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "sum": np.sum,
}


def evaluate(e, bind, see_through):
    """``e`` in float64: variables in ``bind`` take those values, variables of
    tapes in ``see_through`` are their boxed expression, others their value."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        if e in bind:
            return bind[e]
        if e.tape in see_through:
            return evaluate(e.base, bind, see_through)
        return e.value
    if isinstance(e, Op):
        with np.errstate(all="ignore"):
            return np.asarray(F64[e.name](*[evaluate(a, bind, see_through) for a in e.args]), np.float64)
    # Grad: central differences with respect to its variable, seen from its tape
    inner = see_through | e.tape.descendants()
    var = e.var
    x0 = bind[var] if var in bind else evaluate(var, bind, see_through)
    return central_difference(lambda x: np.sum(evaluate(e.output, {**bind, var: x}, inner) * e.seed), x0)


def central_difference(f, x0):
    g = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        hi, lo = x0.copy(), x0.copy()
        hi[i] += EPS
        lo[i] -= EPS
        g[i] = (f(hi) - f(lo)) / (2 * EPS)
    return g


def _depth(e):
    """How many Grad nodes deep ``e`` goes (1: a first derivative; 2: second)."""
    if isinstance(e, Grad):
        return 1 + _depth(e.output)
    if isinstance(e, Op):
        return max((_depth(a) for a in e.args), default=0)
    if isinstance(e, Var):
        return _depth(e.base)
    return 0


class Entry:
    def __init__(self, kind, expr, value):
        self.kind, self.expr, self.value = kind, expr, np.array(value, copy=True)


class ModelTape:
    def __init__(self, handle, strict, parent):
        self.handle, self.strict, self.parent = handle, strict, parent
        self.state = "recording"          # ended, freed, stale
        self.table: dict = {}
        self.watched: dict = {}
        self.gradients = None             # name -> expected float64 gradient, after backward
        self.backward_of = None           # (expression, seed) of the last backward

    def lookup(self, name):
        tape = self
        while tape is not None:
            if name in tape.table:
                return tape.table[name]
            tape = tape.parent
        return None

    def ancestors(self):
        tape = self.parent
        while tape is not None:
            yield tape
            tape = tape.parent

    def descendants(self):
        return {t for t in ALL_TAPES if self in t.ancestors()}


ALL_TAPES: list = []      # every model tape of the running program


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def _finite(*values):
    return all(np.all(np.isfinite(v)) and np.all(np.abs(v) < LIMIT) for v in values)


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


_ABI = None


class TapeModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        global _ABI
        if _ABI is None:
            _ABI = Abi()
        self.abi = _ABI
        self.buf = {name: np.zeros(_shape(name), np.float32) for name in BUFFERS}
        self.root: list = []              # tapes recording on the root fiber, innermost last
        self.tapes: list = []             # every tape begun, in order
        ALL_TAPES.clear()

    # -- helpers --
    def snapshot(self):
        return {n: b.copy() for n, b in self.buf.items()}

    def assert_untouched(self, before, what):
        for n, b in self.buf.items():
            assert np.array_equal(_bits(b), _bits(before[n])), f"failed {what} wrote {n}"

    def unchanged(self, name, entry):
        return np.array_equal(_bits(self.buf[name]), _bits(entry.value))

    def holds(self, tape, name):
        entry = tape.table.get(name)
        return entry if entry is not None and self.unchanged(name, entry) else None

    def expect(self, status, want, what, before):
        event(f"{what.split()[0]}: {'ok' if want == OK else 'refused'}")
        assert status == want, f"{what}: status {status}, the model says {want} ({self.abi.last_error()})"
        if status != OK:
            self.assert_untouched(before, what)

    def usable(self, tape):
        return tape.state not in ("freed", "stale")

    @staticmethod
    def pick(data, preferred, everything):
        """Mostly one of ``preferred`` (calls that can succeed), sometimes anything."""
        preferred = list(preferred)
        if preferred and data.draw(st.integers(0, 4)) != 0:
            return data.draw(st.sampled_from(preferred))
        return data.draw(st.sampled_from(list(everything)))

    def recording_tape(self, data):
        return self.pick(data, self.root[-1:], self.tapes)

    def known(self, tape, names):
        """The buffers among ``names`` a recorded op may read under ``tape`` now."""
        if tape is None:
            return names
        return [n for n in names if (e := tape.lookup(n)) is not None and self.unchanged(n, e)]

    # -- the calls, each checked against the model --
    def do_begin(self, lenient):
        h = self.abi.ffi.new("kina_tape_t *")
        assert self.abi.lib.kina_tape_begin(LENIENT if lenient else STRICT, h) == OK
        tape = ModelTape(h[0], not lenient, self.root[-1] if self.root else None)
        self.root.append(tape)
        self.tapes.append(tape)
        ALL_TAPES.append(tape)
        return tape

    def do_watch(self, tape, name):
        before = self.snapshot()
        status = self.abi.call("kina_tape_watch", tape.handle, self.buf[name], F32)
        known = self.holds(tape, name) if self.usable(tape) else None
        ok = (self.usable(tape) and tape.state == "recording" and name not in tape.watched
              and (known is None or known.kind not in ("produced", "constant")))
        self.expect(status, OK if ok else VALIDATION, f"watch {name}", before)
        if ok:
            outer = tape.parent.lookup(name) if tape.parent is not None else None
            base = outer.expr if outer is not None and self.unchanged(name, outer) else Const(self.buf[name])
            var = Var(tape, base, self.buf[name])
            tape.watched[name] = var
            tape.table[name] = Entry("watched", var, self.buf[name])

    def do_constant(self, tape, name):
        before = self.snapshot()
        status = self.abi.call("kina_tape_constant", tape.handle, self.buf[name], F32)
        known = self.holds(tape, name) if self.usable(tape) else None
        ok = (self.usable(tape) and tape.state == "recording"
              and (known is None or known.kind not in ("watched", "produced")))
        self.expect(status, OK if ok else VALIDATION, f"constant {name}", before)
        if ok:
            outer = tape.parent.lookup(name) if tape.parent is not None else None
            if outer is not None and self.unchanged(name, outer):
                tape.table[name] = Entry("constant", outer.expr, outer.value)
            else:
                tape.table[name] = Entry("constant", Const(self.buf[name]), self.buf[name])

    def draw_op(self, data):
        """(op, out, inputs, params), reading mostly buffers the tape knows."""
        tape = self.root[-1] if self.root else None
        readable = self.known(tape, BUFFERS)
        kind = data.draw(st.sampled_from(("unary", "binary", "sum")))
        if kind == "unary":
            name = data.draw(st.sampled_from(UNARY))
            inputs = [self.pick(data, readable, BUFFERS)]
            params = []
        elif kind == "binary":
            name = data.draw(st.sampled_from(BINARY))
            inputs = [self.pick(data, readable, BUFFERS), self.pick(data, readable, BUFFERS)]
            params = []
        else:
            name, params = "sum", [ALL_AXES, 0]
            inputs = [self.pick(data, [n for n in readable if n in VECTORS], VECTORS)]
        vector = name != "sum" and any(i in VECTORS for i in inputs)
        out = data.draw(st.sampled_from(VECTORS if vector else SCALARS))
        return name, out, inputs, params

    def do_op(self, name, out, inputs, params):
        tape = self.root[-1] if self.root else None
        before = self.snapshot()
        exprs, pending, ok = [], {}, True
        for i in inputs:
            if tape is None:
                exprs.append(Const(self.buf[i]))
                continue
            entry = tape.lookup(i) or pending.get(i)
            if entry is None:
                if tape.strict:
                    ok = False
                    break
                entry = pending[i] = Entry("constant", Const(self.buf[i]), self.buf[i])
            if not self.unchanged(i, entry):
                ok = False
                break
            exprs.append(entry.expr)
        status = op_status(self.abi, name, self.buf[out], *[self.buf[i] for i in inputs], *params)
        self.expect(status, OK if ok else VALIDATION, f"op {name} -> {out}", before)
        if not ok:
            return
        expr = Op(name, exprs)
        want = evaluate(expr, {}, set())
        got = self.buf[out]
        if _finite(want):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} -> {out}")
        if tape is None:
            return
        entry = Entry("produced", expr, got)
        for t in (tape, *tape.ancestors()):
            t.table[out] = entry
        for i, e in pending.items():
            tape.table.setdefault(i, e)

    def do_end(self, tape):
        before = self.snapshot()
        status = self.abi.lib.kina_tape_end(tape.handle)
        ok = tape.state == "recording" and self.root[-1] is tape
        self.expect(status, OK if ok else VALIDATION, "end", before)
        if ok:
            self.root.pop()
            tape.state = "ended"

    def do_backward(self, tape, name, seed):
        before = self.snapshot()
        status = self.abi.call("kina_tape_backward", tape.handle, self.buf[name], seed)
        entry = tape.table.get(name) if self.usable(tape) else None
        ok = (self.usable(tape) and tape.state == "ended" and entry is not None
              and entry.kind in ("produced", "watched") and self.unchanged(name, entry))
        self.expect(status, OK if ok else VALIDATION, f"backward {name}", before)
        if ok:
            see = tape.descendants()
            event(f"backward through {_depth(entry.expr)} levels of recorded gradients")
            seed64 = seed.astype(np.float64)
            tape.backward_of = (entry.expr, seed64)
            tape.gradients = {
                w: central_difference(lambda x, v=var: np.sum(evaluate(entry.expr, {v: x}, see) * seed64),
                                      var.value)
                for w, var in tape.watched.items()}

    def do_grad(self, tape, name, out):
        before = self.snapshot()
        status = self.abi.call("kina_tape_grad", tape.handle, self.buf[name], self.buf[out])
        ok = self.usable(tape) and name in tape.watched and tape.gradients is not None
        self.expect(status, OK if ok else VALIDATION, f"grad {name}", before)
        if not ok:
            return
        want = tape.gradients[name]
        compared = _finite(want, self.buf[name])
        event(f"grad of a {'nested' if tape.parent else 'top'} tape, {'' if compared else 'not '}compared")
        if compared:
            np.testing.assert_allclose(self.buf[out], want, rtol=2e-3, atol=2e-4, err_msg=f"grad {name}")
        parent = tape.parent
        if parent is not None and parent.state == "recording":
            expr, seed = tape.backward_of
            event("a gradient recorded by an outer tape")
            entry = Entry("produced", Grad(tape, expr, seed, tape.watched[name]), self.buf[out])
            for t in (parent, *parent.ancestors()):
                t.table[out] = entry

    def do_free(self, tape):
        before = self.snapshot()
        status = self.abi.lib.kina_tape_free(tape.handle)
        ok = tape.state != "freed" and (tape.state != "recording" or self.root[-1] is tape)
        self.expect(status, OK if ok else VALIDATION, "free", before)
        if ok:
            if tape.state == "recording":
                self.root.pop()
            tape.state = "freed"
            tape.table.clear()

    def draw_seed(self, data, name):
        seed = np.float32(data.draw(st.lists(st.integers(-4, 4), min_size=3, max_size=3)))
        return (seed[:self.buf[name].size] / 4).reshape(_shape(name))

    def draw_backward_target(self, data, tape):
        return self.pick(data, [n for n, e in tape.table.items() if e.kind in ("produced", "watched")
                                and self.unchanged(n, e)], BUFFERS)

    # -- rules: one call each --
    @rule(name=st.sampled_from(BUFFERS), data=st.data())
    def host_writes(self, name, data):
        values = data.draw(st.lists(st.integers(-8, 8), min_size=3, max_size=3))
        self.buf[name][...] = np.float32(values)[:self.buf[name].size].reshape(_shape(name)) / 8

    @precondition(lambda self: len(self.tapes) < 8)
    @rule(lenient=st.booleans())
    def begin(self, lenient):
        self.do_begin(lenient)

    @precondition(lambda self: self.tapes)
    @rule(data=st.data(), name=st.sampled_from(BUFFERS))
    def watch(self, data, name):
        self.do_watch(self.recording_tape(data), name)

    @precondition(lambda self: self.tapes)
    @rule(data=st.data(), name=st.sampled_from(BUFFERS))
    def constant(self, data, name):
        self.do_constant(self.recording_tape(data), name)

    @rule(data=st.data())
    def runtime_op(self, data):
        self.do_op(*self.draw_op(data))

    @precondition(lambda self: self.tapes)
    @rule(data=st.data())
    def end(self, data):
        self.do_end(self.recording_tape(data))

    @precondition(lambda self: self.tapes)
    @rule(data=st.data())
    def backward(self, data):
        tape = self.pick(data, [t for t in self.tapes if t.state == "ended"], self.tapes)
        name = self.draw_backward_target(data, tape)
        self.do_backward(tape, name, self.draw_seed(data, name))

    @precondition(lambda self: self.tapes)
    @rule(data=st.data())
    def grad(self, data):
        tape = self.pick(data, [t for t in self.tapes if t.gradients is not None and self.usable(t)],
                         self.tapes)
        name = self.pick(data, tape.watched, BUFFERS)
        self.do_grad(tape, name, data.draw(st.sampled_from(VECTORS if name in VECTORS else SCALARS)))

    @precondition(lambda self: self.tapes)
    @rule(data=st.data())
    def free(self, data):
        self.do_free(self.pick(data, [t for t in self.tapes if t.state in ("ended", "stale")]
                               + self.root[-1:], self.tapes))

    # -- a whole session: what a host does, nested in whatever records now --
    @precondition(lambda self: len(self.tapes) < 8)
    @rule(data=st.data(), lenient=st.booleans(), keep_recording=st.booleans(),
          watch=st.lists(st.sampled_from(BUFFERS), min_size=1, max_size=3, unique=True),
          constant=st.lists(st.sampled_from(BUFFERS), max_size=2, unique=True),
          steps=st.integers(1, 5))
    def session(self, data, lenient, keep_recording, watch, constant, steps):
        """begin, watch, constant, ops, end, backward, grad of everything watched,
        free; or (keep_recording) stop after the ops, for later rules (an outer
        tape for the next session)."""
        tape = self.do_begin(lenient)
        for name in watch:
            self.do_watch(tape, name)
        for name in constant:
            self.do_constant(tape, name)
        for _ in range(steps):
            self.do_op(*self.draw_op(data))
        if keep_recording:
            return
        self.do_end(tape)
        name = self.draw_backward_target(data, tape)
        self.do_backward(tape, name, self.draw_seed(data, name))
        for name in list(tape.watched):
            self.do_grad(tape, name, data.draw(st.sampled_from(VECTORS if name in VECTORS else SCALARS)))
        if data.draw(st.booleans()):
            self.do_free(tape)

    @precondition(lambda self: len(self.tapes) < 8)
    @rule(name=st.sampled_from(VECTORS), out=st.sampled_from(VECTORS), compute=st.booleans())
    def tape_left_on_an_ended_fiber(self, name, out, compute):
        """A host fiber begins a tape (nested in the root's innermost one),
        watches a buffer, maybe computes, and returns while it records."""
        ffi, lib = self.abi.ffi, self.abi.lib
        parent = self.root[-1] if self.root else None
        watched = self.buf[name].copy()
        outer = parent.lookup(name) if parent is not None else None
        base = outer.expr if outer is not None and self.unchanged(name, outer) else Const(watched)
        results = []

        def body(_arg):
            h = ffi.new("kina_tape_t *")
            results.append(lib.kina_tape_begin(STRICT, h))
            results.append(h[0])
            results.append(self.abi.call("kina_tape_watch", h[0], self.buf[name], F32))
            if compute:
                results.append(op_status(self.abi, "exp", self.buf[out], self.buf[name]))
            return 0
        never = ffi.new("int32_t *")
        assert lib.kina_effect_id(b"tests.tape_model.never", never) == OK
        entry = ffi.callback("int64_t(void *)", body)
        fiber, state = ffi.new("kina_fiber_t *"), ffi.new("int32_t *")
        assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", entry), ffi.NULL, never, 1, fiber) == OK
        assert lib.kina_resume_fiber(fiber[0], 0, state) == OK and state[0] == 3, self.abi.last_error()
        assert lib.kina_fiber_destroy(fiber[0]) == OK
        assert results[0] == OK
        tape = ModelTape(results[1], True, parent)
        self.tapes.append(tape)
        ALL_TAPES.append(tape)
        assert results[2] == OK, self.abi.last_error()
        var = Var(tape, base, watched)
        tape.watched[name] = var
        if compute:
            assert results[3] == OK, self.abi.last_error()
            entry = Entry("produced", Op("exp", [var]), self.buf[out])
            for t in (tape, *tape.ancestors()):
                t.table[out] = entry
        tape.state = "stale"
        tape.table.clear()

    @precondition(lambda self: self.tapes)
    @rule(data=st.data(), name=st.sampled_from(BUFFERS))
    def another_thread_calls(self, data, name):
        """Every call on a tape from another OS thread is status 1; a runtime op
        made there is not recorded by this thread's tapes (a host write)."""
        tape = data.draw(st.sampled_from(self.tapes))
        before = self.snapshot()
        statuses = []

        def other():
            statuses.append(self.abi.lib.kina_tape_end(tape.handle))
            statuses.append(self.abi.call("kina_tape_watch", tape.handle, self.buf[name], F32))
        th = threading.Thread(target=other)
        th.start()
        th.join()
        assert statuses == [VALIDATION, VALIDATION], statuses
        self.assert_untouched(before, "calls from another thread")

    @invariant()
    def the_root_stack_is_the_models(self):
        for tape in self.root:
            assert tape.state == "recording"

    def teardown(self):
        lib = self.abi.lib
        while self.root:
            tape = self.root.pop()
            assert lib.kina_tape_free(tape.handle) == OK, self.abi.last_error()
            tape.state = "freed"
        for tape in self.tapes:
            if tape.state != "freed":
                assert lib.kina_tape_free(tape.handle) == OK, self.abi.last_error()
                tape.state = "freed"
        ALL_TAPES.clear()


#: KINA_MODEL_EXAMPLES: how many programs (CI's long run on one version sets more).
EXAMPLES = int(os.environ.get("KINA_MODEL_EXAMPLES", 400 if CI else 30))

TapeModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=50 if CI else 25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_tape_abi_model = TapeModel.TestCase
