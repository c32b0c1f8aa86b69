"""Gradients through effect handlers: random programs whose traced values flow
through handlers of every kind, checked against the same program run untraced.

A program is a body of steps over a value ``v`` (a float64 vector): an op
(``sin``, ``tanh``, an affine map, a product with the input ``x``), a
``perform`` of one of three effects with ``v`` as its argument (``v`` becomes
the answer), or a nested body run under a handler.  A handler is a ``fun``
clause (``Handler`` or ``with Handler(...)``), a deep ``on`` clause
(``Handler``), a multi-shot one (``MultiHandler``, which may resume twice), a
shallow one (``fiber(...).resume_with``), or an ``async`` clause under
``aio.run``; its clause computes on the argument, then resumes (and may post-
process the result) or returns without resuming; it may have a ``ret`` clause.

The untraced run of the same program is the reference: its effects semantics
is checked against the reference interpreter by tests/effects/test_differential.py.
The traced value must equal it, and the gradient must match central
differences of it.

Two placements of the trace:

* **inside**: ``grad`` of the whole program, every handler inside the traced
  function.  Always right.
* **outside**: some handlers (resuming ones) are installed around the
  ``grad`` call, so their clauses run outside the tape's scope.  A clause
  there that computes on a traced argument is refused with ``KinaTypeError``
  (docs/autograd.md, "Traced values outside their trace"): the tape would not
  see the op, and the gradient would silently miss it.  The test predicts
  exactly when that happens (the clause notes a traced argument it computes
  on), and otherwise wants the right answer.
"""
from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kina_fx import Effect, Handler, aio, fiber, perform
from kina_fx import autograd as ad
from kina_fx.errors import KinaTypeError
from kina_fx.multishot import MultiHandler, ReplayDiverged

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# KINA_FX_SOAK=N: N programs per test from random seeds (as tests/effects/test_differential.py).
SOAK = int(os.environ.get("KINA_FX_SOAK", "0") or 0)
SETTINGS = settings(max_examples=SOAK or (300 if CI else 60), deadline=None, derandomize=not SOAK,
                    suppress_health_check=list(HealthCheck))

EFFECTS = {name: Effect(f"test.grad_effects.{name}") for name in "abc"}
X0 = np.array([0.3, -0.7])
H = 1e-6

# ops of the body: (v, x) -> new v
OPS = {
    "sin": lambda v, x: ad.sin(v),
    "tanh": lambda v, x: ad.tanh(v),
    "affine": lambda v, x: v * 0.9 + 0.2,
    "times_x": lambda v, x: v * x,
    "plus_x": lambda v, x: v + x,
    "square": lambda v, x: v * v * 0.5,
}
# what a clause computes from its argument a: (a, x) -> answer.  "id" and
# "const" do not compute on a.
CLAUSE = {
    "id": lambda a, x: a,
    "const": lambda a, x: np.array([0.5, -0.25]),
    "sin": lambda a, x: ad.sin(a),
    "affine": lambda a, x: a * 2.0 + 1.0,
    "times_x": lambda a, x: a * x,
}
COMPUTES = {"sin", "affine", "times_x"}
SECOND_SHOT = lambda a, x: ad.tanh(a) * 0.5     # noqa: E731  the "twice" form's other answer
POST = {"id": lambda r: r, "half": lambda r: r * 0.5, "sin": lambda r: ad.sin(r)}
RET = {"none": None, "shift": lambda r: r + 1.0}
WORLD = {"a": lambda a: a * 0.5 + 0.1, "b": lambda a: ad.tanh(a), "c": lambda a: a - 0.3}
# Outermost when handlers sit outside the trace: answers each effect with its argument.


# --- programs ---------------------------------------------------------------------

def spec_strategy(kinds, forms, posts=sorted(POST), rets=sorted(RET)):
    return st.tuples(st.sampled_from(kinds), st.sampled_from(sorted(EFFECTS)), st.sampled_from(forms),
                     st.sampled_from(sorted(CLAUSE)), st.sampled_from(posts), st.sampled_from(rets))


INNER_KINDS = ["fun", "with_fun", "on", "multi", "shallow"]
FORMS = ["resume", "resume", "abort", "twice"]


def bodies(depth):
    step = st.one_of(st.tuples(st.just("op"), st.sampled_from(sorted(OPS))),
                     st.tuples(st.just("perform"), st.sampled_from(sorted(EFFECTS))))
    if depth > 0:
        inner = st.deferred(lambda: bodies(depth - 1))
        step = st.one_of(step, st.tuples(st.just("handle"), spec_strategy(INNER_KINDS, FORMS), inner),
                         st.tuples(st.just("grad"), inner))
    return st.lists(step, min_size=1, max_size=4).map(tuple)


programs = bodies(2)
# Outside the trace: handlers whose clauses resume once (the traced call then
# finishes) and leave its result, (value, gradient), as it is; an async one
# only outermost.
outer_specs = st.lists(spec_strategy(["fun", "with_fun", "on", "multi", "shallow"], ["resume"],
                                     ["id"], ["none"]),
                       min_size=1, max_size=2)


# --- running one -----------------------------------------------------------------------

class Run:
    """Runs programs, noting the clauses that may be refused.

    ``refused``: clauses of handlers around the whole traced call that
    computed on a traced argument (each of them is refused).  ``possible``:
    clauses of handlers installed outside a nested ``grad`` (fewer of its
    levels than the perform) that computed on a traced argument, or answered
    it to a second shot or as an aborting clause's result: refused when that
    argument belongs to the nested trace; and clauses of handlers outside a
    MultiHandler that resumes twice answering a value of a nested trace: the
    second shot's replay would answer it again, after that trace finished."""

    def __init__(self):
        self.refused = []
        self.possible = []
        self.depth = 0          # nested grads entered
        self.shots = 0          # MultiHandlers resuming twice, running now

    def body(self, steps, v, x):
        for step in steps:
            if step[0] == "op":
                v = OPS[step[1]](v, x)
            elif step[0] == "perform":
                v = perform(EFFECTS[step[1]], v)
            elif step[0] == "grad":
                # v plus a tenth of the gradient of a nested body at v: a second
                # derivative for the outer trace, its performs through the
                # handlers around (inside the inner trace's scope, or not)
                self.depth += 1
                try:
                    v = v + 0.1 * ad.grad(lambda z, inner=step[1]: ad.sum(self.body(inner, z, x)))(v)
                finally:
                    self.depth -= 1
            else:
                v = self.handle(step[1], lambda v0, inner=step[2]: self.body(inner, v0, x), v, x)
        return v

    def pass_through(self):
        """A handler outside everything answering every effect with its argument
        (noting, as the handlers' clauses do, an answer a replay gives again)."""
        def clause(a):
            if self.shots and ad.is_traced(a) and self.depth > 0:
                self.possible.append("pass-through")
            return a
        return Handler(fun={effect: clause for effect in EFFECTS.values()})

    def note(self, spec, a, installed, outer=False, computes=True):
        if computes and ad.is_traced(a):
            if outer:
                self.refused.append(spec)
            elif self.depth > installed:
                self.possible.append(spec)

    def handle(self, spec, fn, v, x, outer=False):
        kind, eff, form, name, post, ret = spec
        effect, post, ret = EFFECTS[eff], POST[post], RET[ret]
        installed, shots = self.depth, self.shots

        def g(a):
            self.note(spec, a, installed, outer, name in COMPUTES or form == "abort")
            if self.shots > shots and ad.is_traced(a) and self.depth > installed:
                self.possible.append(spec)      # a recorded answer a replay gives again
            return CLAUSE[name](a, x)

        if kind == "fun":
            return Handler(fun={effect: g}, ret=ret).run(fn, v)
        if kind == "with_fun":
            with Handler(fun={effect: g}):
                r = fn(v)
            return r if ret is None else ret(r)
        if kind == "shallow":
            def shallow_clause(k, a):
                if form == "abort":
                    return g(a)
                return post(k.resume_with(g(a), handler))
            handler = Handler(on={effect: shallow_clause}, ret=ret)
            return fiber(fn).resume_with(v, handler)

        def clause(k, a):
            if form == "abort":
                return g(a)
            if form == "twice" and kind == "multi":
                self.note(spec, a, installed)
                return k.resume(g(a)) + k.resume(SECOND_SHOT(a, x))
            return post(k.resume(g(a)))
        if kind == "multi" and form == "twice":
            self.shots += 1
            try:
                return MultiHandler(on={effect: clause}, ret=ret).run(fn, v)
            finally:
                self.shots -= 1
        cls = MultiHandler if kind == "multi" else Handler
        return cls(on={effect: clause}, ret=ret).run(fn, v)

    def program(self, steps, x, asynchronous=False, world=True):
        """The whole program: the body under a handler of every effect (and,
        ``asynchronous``, under aio.run with an async clause for effect a).
        Without ``world``, the body alone (its performs go out)."""
        if not world:
            return ad.sum(self.body(steps, x, x))
        def world_clause(f):
            def clause(a):
                self.note("world", a, 0)
                return f(a)
            return clause
        world = Handler(fun={EFFECTS[n]: world_clause(f) for n, f in WORLD.items()})
        if not asynchronous:
            return ad.sum(world.run(self.body, steps, x, x))

        async def resume_a(k, a):
            self.note("aio", a, 0)
            return await k.resume(a * 0.75)
        handlers = [world, aio.handler(on={EFFECTS["a"]: resume_a})]
        return ad.sum(asyncio.run(aio.run(self.body, steps, x, x, handlers=handlers)))


def value_and_central_differences(f):
    """``f(X0)`` and the central-difference gradient of the untraced ``f`` there,
    Richardson-extrapolated from steps H and H/2 (error O(H^4): programs of
    squares and sines reach curvatures where one step's O(H^2) error exceeds
    the comparison's tolerance)."""
    def central(h):
        return np.array([(f(X0 + h * e) - f(X0 - h * e)) / (2 * h) for e in np.eye(len(X0))])
    return f(X0), (4 * central(H / 2) - central(H)) / 3


def reference(steps, asynchronous=False):
    """Value and central-difference gradient of the untraced program at X0."""
    return value_and_central_differences(
        lambda x: float(np.asarray(Run().program(steps, x, asynchronous))))


def outside(run, outer, asynchronous, inner):
    """``inner()`` under the handlers ``outer`` (outermost first) and, outside
    them, one that passes every effect's argument through (and, ``asynchronous``,
    under aio.run with an async clause for effect b).  The outer clauses' x is
    X0: outside the trace it is a constant."""
    def under(specs):
        if not specs:
            return inner()
        return run.handle(specs[0], lambda _: under(specs[1:]), None, X0, outer=True)
    if not asynchronous:
        return run.pass_through().run(under, outer)

    async def resume_b(k, a):
        run.note("aio", a, 0, outer=True)
        return await k.resume(a * 0.75)
    return asyncio.run(aio.run(under, outer, handlers=[
        run.pass_through(), aio.handler(on={EFFECTS["b"]: resume_b})]))


def assert_agrees(got, want):
    (value, grad), (want_value, want_grad) = got, want
    np.testing.assert_allclose(float(value), want_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-6)


# --- the tests ---------------------------------------------------------------------------

REFUSALS = ("outside that trace's scope", "which has finished")


def refused_as_predicted(exc, run, certain=False):
    """``exc`` is kina_fx's refusal of a value outside its trace, and the run
    predicted one."""
    assert any(r in str(exc) for r in REFUSALS), exc
    assert run.refused or (run.possible and not certain), \
        f"refused, but no clause computed on a value outside its trace: {exc}"


def check_inside(steps, asynchronous):
    run = Run()
    try:
        got = ad.value_and_grad(lambda x: run.program(steps, x, asynchronous))(X0)
    except KinaTypeError as exc:
        refused_as_predicted(exc, run)
        event("refused (nested grad)")
        return
    event("right")
    assert_agrees(got, reference(steps, asynchronous))


@SETTINGS
@given(programs)
def test_gradients_through_handlers_inside_the_trace(steps):
    check_inside(steps, asynchronous=False)


@SETTINGS
@given(programs)
def test_gradients_through_handlers_under_aio_inside_the_trace(steps):
    check_inside(steps, asynchronous=True)


@SETTINGS
@given(programs, outer_specs, st.booleans())
def test_handlers_outside_the_trace_are_right_or_refused(steps, outer, asynchronous):
    """The outer handlers' clauses run outside the tape: computing on a traced
    argument there is refused, passing it through (or ignoring it) is right."""
    run = Run()

    def traced():
        return ad.value_and_grad(lambda x: run.program(steps, x, world=False))(X0)

    try:
        got = outside(run, outer, asynchronous, traced)
    except KinaTypeError as exc:
        refused_as_predicted(exc, run)
        event("refused")
        return
    event("right")
    assert not run.refused, f"an outer clause computed on a traced value unrefused: {run.refused}"
    # The reference: the same handlers, nothing traced.
    def untraced(x):
        run = Run()
        return outside(run, outer, asynchronous, lambda: float(np.asarray(run.program(steps, x, world=False))))
    assert_agrees(got, value_and_central_differences(untraced))


# --- the seam that the generated tests found, by hand ----------------------------------------

E = EFFECTS["a"]


def _inner(z):
    return perform(E, ad.sin(z)) * z


@pytest.mark.parametrize("install", ["on", "fun", "with_fun", "multi", "aio"])
def test_a_clause_outside_grad_computing_on_a_traced_value_is_refused(install):
    """Was a silently wrong gradient: the clause's ``a * a`` ran outside the
    tape (its default unwrapped the box), so grad gave sin(x) + 0 where
    d/dx [sin(x)^2 x] = 2 sin(x) cos(x) x + sin(x)^2."""
    def square_on(k, a):
        return k.resume(a * a)

    async def square_async(k, a):
        return await k.resume(a * a)

    def call():
        return ad.grad(_inner)(0.7)
    with pytest.raises(KinaTypeError, match="outside that trace's scope"):
        if install == "on":
            Handler(on={E: square_on}).run(call)
        elif install == "fun":
            Handler(fun={E: lambda a: a * a}).run(call)
        elif install == "with_fun":
            with Handler(fun={E: lambda a: a * a}):
                call()
        elif install == "multi":
            MultiHandler(on={E: square_on}).run(call)
        else:
            asyncio.run(aio.run(call, handlers=[aio.handler(on={E: square_async})]))


def test_a_clause_outside_grad_passing_a_traced_value_through_is_right():
    x = 0.7
    assert np.isclose(Handler(fun={E: lambda a: a}).run(ad.grad(_inner), x), np.cos(x) * x + np.sin(x))
    assert np.isclose(Handler(fun={E: lambda a: 2.0}).run(ad.grad(_inner), x), 2.0)


def test_the_same_clause_inside_grad_is_right():
    x = 0.7
    f = ad.grad(lambda z: Handler(fun={E: lambda a: a * a}).run(_inner, z))
    assert np.isclose(f(x), 2 * np.sin(x) * np.cos(x) * x + np.sin(x) ** 2)


def test_an_escaped_box_of_a_finished_trace_is_a_constant():
    kept = []
    ad.grad(lambda z: Handler(fun={E: lambda a: kept.append(a) or a}).run(_inner, z))(0.7)
    assert np.isclose(float(ad.sin(kept[0])), np.sin(np.sin(0.7)))


def test_forward_mode_outside_its_scope_is_refused_too():
    with pytest.raises(KinaTypeError, match="outside that trace's scope"):
        Handler(fun={E: lambda a: a * a}).run(lambda: ad.jvp(_inner, (0.7,), (1.0,)))


def test_a_second_shot_outside_grad_answering_a_traced_value_is_refused():
    """Was a silently wrong gradient: the second shot replays the traced call
    with a new tape, and the answer (a box of the first shot's tape, finished
    by then) was taken as a constant: 0.644 (= sin x) instead of 1.180."""
    twice = MultiHandler(on={E: lambda k, a: [k.resume(a), k.resume(a)]})
    with pytest.raises(KinaTypeError, match="which has finished"):
        twice.run(lambda: ad.grad(_inner)(0.7))


def test_a_replay_answering_again_with_a_value_of_a_finished_trace_is_refused():
    """Was a silently wrong value: the second shot replays the body, whose nested
    grad performs B with its traced argument, answered by a handler outside the
    MultiHandler; the replay answered again with the first shot's box (its
    trace finished), and the nested gradient was 0 instead of 1 (2.3 instead of
    2.6 in all).  The replay now refuses: a KinaTypeError and a ReplayDiverged."""
    b = Effect("tests.grad_through_effects.b")
    pass_through = Handler(fun={E: lambda a: a, b: lambda a: a})

    def body(v):
        g = ad.grad(lambda z: perform(b, z))(v)
        return perform(E, v) + g

    def twice(x):
        return MultiHandler(on={E: lambda k, a: k.resume(a) + k.resume(a)}).run(body, x)
    for call in (lambda: twice(0.3), lambda: ad.value_and_grad(twice)(0.3)):
        with pytest.raises(KinaTypeError, match="which has finished") as info:
            pass_through.run(call)
        assert isinstance(info.value, ReplayDiverged)
    # answered by a handler inside the MultiHandler's body, B is performed again by each shot
    inside = Handler(fun={b: lambda a: a})
    twice_inside = MultiHandler(on={E: lambda k, a: k.resume(a) + k.resume(a)})
    assert np.isclose(twice_inside.run(lambda v: inside.run(body, v), 0.3), 2.6)


def test_a_finished_trace_s_value_as_the_differentiated_output_is_refused():
    """As an operand of a recorded op it was refused already; returned as the
    function's output it was silently a constant (gradient 0)."""
    kept = []
    ad.grad(lambda z: kept.append(z) or z * 1.0)(0.3)
    with pytest.raises(KinaTypeError, match="which has finished"):
        ad.grad(lambda z: kept[0] * 1.0)(0.5)
    with pytest.raises(KinaTypeError, match="which has finished"):
        ad.grad(lambda z: kept[0])(0.5)
    assert ad.grad(lambda z: kept[0].data + z)(0.5) == 1.0     # its .data is the explicit constant


def test_shots_outside_grad_answering_constants_are_each_right():
    x = 0.7
    both = MultiHandler(on={E: lambda k, a: [k.resume(2.0), k.resume(np.float64(-1.5))]})
    assert np.allclose(both.run(lambda: ad.grad(_inner)(x)), [2.0, -1.5])


def test_shots_inside_grad_are_summed_right():
    x = 0.7
    f = ad.grad(lambda z: MultiHandler(on={E: lambda k, a: k.resume(a) + k.resume(a * a)}).run(_inner, z))
    s, c = np.sin(x), np.cos(x)
    assert np.isclose(f(x), (c * x + s) + (2 * s * c * x + s * s))
