"""Differential tests of effects: random programs run by kina_fx and by the
reference semantics (tests/support/effects_reference.py), which must agree on
the answer (or the exception's class), and on the order of the ``log``
performs of ``finally`` blocks and clauses.

kina_fx runs each program as real code: ``Handler``/``MultiHandler``/
``fiber``+``resume_with``, ``aio.handler`` with ``async def`` clauses under
``aio.run``, and through the C ABI: C handlers (``kina_push_handler``), C
frames that ``kina_perform``, and host fibers (``kina_fiber_create``) driven
with ``kina_resume_fiber``/``kina_cancel_fiber``.  On both implementations
(the impl fixture), with the same (derandomized) programs.

Example counts: ``EXAMPLES`` per test (60), ``CI_EXAMPLES`` under CI=true.
"""
from __future__ import annotations

import asyncio
import functools
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_fx import FORWARD, Effect, Handler, aio, fiber, perform
from kina_fx.errors import status_of
from kina_fx.multishot import MultiHandler
from support import effects_reference as ref
from support.effects_reference import (Arg, CFiber, CHandle, CPerform, Discontinue, Forward, Handle,
                                       Lit, Perform, Raise, Resume, ResumeWith, Seq, Spec, TryExcept,
                                       TryFinally)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
EXAMPLES, CI_EXAMPLES = 60, 600
# KINA_FX_SOAK=N: N programs per test from random seeds, new ones each run
# (the plain and CI runs draw the same programs every time).  Not in CI; what
# a soak finds goes into FOUND below.
SOAK = int(os.environ.get("KINA_FX_SOAK", "0") or 0)
settings.register_profile("effects-differential", max_examples=EXAMPLES, deadline=None,
                          derandomize=True, suppress_health_check=list(HealthCheck))
settings.register_profile("effects-differential-ci", max_examples=CI_EXAMPLES, deadline=None,
                          derandomize=True, suppress_health_check=list(HealthCheck))
settings.register_profile("effects-differential-soak", max_examples=max(SOAK, 1), deadline=None,
                          derandomize=False, suppress_health_check=list(HealthCheck))
PROFILE = settings.get_profile("effects-differential-soak" if SOAK else
                               "effects-differential-ci" if CI else "effects-differential")

ROOT = Path(__file__).resolve().parents[2]

EFFECTS = {name: Effect(f"test.diff.{name}") for name in ("a", "b", "c", "log")}
USER_EFFECTS = ("a", "b", "c")


class E1(Exception):
    pass


class E2(Exception):
    pass


class Halt(BaseException):
    pass


RAISABLE = {"E1": E1, "E2": E2, "Halt": Halt}
CATCH = {"E1": E1, "Exception": Exception, "BaseException": BaseException}
C_MODES = {"answer": 0, "forward": 1, "fail": 2}
FIBER_SUSPENDED, FIBER_DONE, FIBER_CANCELLED = 2, 3, 5

# The counts behind the report of issue 16: programs run, and how many of
# them went through each kind of construct.
STATS = {"programs": 0}


# --- kina_fx running a program -----------------------------------------------------

class Env:
    __slots__ = ("arg", "k", "own", "handlers")

    def __init__(self, arg=None, k=None, own=None, handlers=()):
        self.arg = arg
        self.k = k                  # the clause's continuation
        self.own = own              # shallow: the handler whose clause this is
        self.handlers = handlers    # shallow: the handlers of specs, for ResumeWith


class Runner:
    """Runs program ASTs with kina_fx (see the reference module for their meaning)."""

    def __init__(self, c=None):
        self.c = c                  # (ffi, lib, clib) or None: no C constructs

    def run(self, program, asynchronous=False):
        log = []
        world = {EFFECTS[name]: (lambda offset: lambda n: n + offset)(offset)
                 for name, offset in ref.WORLD.items()}
        logger = Handler(fun={EFFECTS["log"]: lambda tag: log.append(tag) or 0, **world})
        try:
            if asynchronous:
                value = asyncio.run(aio.run(self.ev, program, Env(), handlers=[logger]))
            else:
                value = logger.run(self.ev, program, Env())
            outcome = ("returned", value)
        except BaseException as exc:
            outcome = ("raised", type(exc).__name__)
        return outcome, log

    def ev(self, e, env):
        kind = type(e)
        if kind is Lit:
            return e.value
        if kind is Arg:
            return env.arg
        if kind is Forward:
            return FORWARD
        if kind is Perform:
            return perform(EFFECTS[e.effect], e.arg)
        if kind is CPerform:
            return self.c[2].diff_perform(EFFECTS[e.effect].id, e.arg)
        if kind is Raise:
            raise RAISABLE[e.name]()
        if kind is Seq:
            return tuple([self.ev(item, env) for item in e.items])
        if kind is TryFinally:
            try:
                return self.ev(e.body, env)
            finally:
                self.ev(e.final, env)
        if kind is TryExcept:
            try:
                return self.ev(e.body, env)
            except CATCH[e.catch] as exc:
                return ("caught", type(exc).__name__, self.ev(e.alt, env))
        if kind is Resume:
            return self.resume(env, self.ev(e.value, env))
        if kind is ResumeWith:
            return env.k.resume_with(self.ev(e.value, env), env.handlers[e.spec])
        if kind is Discontinue:
            # The class, not an instance: no frame here holds the exception
            # while the resumed code runs (its traceback would hold the frames
            # it goes through, and a continuation they reference would look
            # kept: docs/effects.md, "Kept is kept").
            if env.own is not None:
                return env.k.discontinue_with(RAISABLE[e.name], env.own)
            return self.discontinue(env, RAISABLE[e.name])
        if kind is Handle:
            return self.handle(e, env)
        if kind is CHandle:
            return self.c_handle(e, env)
        if kind is CFiber:
            return self.c_fiber(e, env)
        raise TypeError(f"not an expression: {e!r}")

    # Continuations: a sync one, a shallow one, or an aio AsyncContinuation
    # (used from the sync interpreter through await_only).
    @staticmethod
    def resume(env, value):
        k = env.k
        if env.own is not None:
            return k.resume_with(value, env.own)
        if isinstance(k, aio.AsyncContinuation):
            return aio.await_only(k.resume(value))
        return k.resume(value)

    @staticmethod
    def discontinue(env, exc_class):
        k = env.k
        if isinstance(k, aio.AsyncContinuation):
            return aio.await_only(k.discontinue(exc_class))
        return k.discontinue(exc_class)

    def handle(self, e, env):
        arg = env.arg

        def body(_=None):
            return self.ev(e.body, Env(arg=arg))
        if e.kind == "shallow":
            handlers = []
            handlers.extend(self.handler(spec, "shallow", handlers) for spec in e.specs)
            return fiber(body).resume_with(None, handlers[0])
        return self.handler(e.specs[0], "multi" if e.kind == "multi" else e.impl, ()).run(body)

    def handler(self, spec, impl, shallow_handlers):
        ev = self.ev
        made = []                   # the handler itself, for its shallow clauses

        def on(expr):
            if impl == "async":
                if type(expr) is Resume and type(expr.value) in (Lit, Arg):
                    async def clause(k, arg):           # the plain `return await k.resume(v)`
                        await pause()
                        return await k.resume(ev(expr.value, Env(arg=arg)))
                else:
                    async def clause(k, arg):
                        await pause()
                        return ev(expr, Env(arg=arg, k=k))
                return clause
            if impl == "shallow":
                return lambda k, arg: ev(expr, Env(arg=arg, k=k, own=made[0], handlers=shallow_handlers))
            return lambda k, arg: ev(expr, Env(arg=arg, k=k))

        def plain(expr, convert=lambda x: x):
            if impl == "async":
                async def clause(x):
                    await pause()
                    return ev(expr, Env(arg=convert(x)))
                return clause
            return lambda x: ev(expr, Env(arg=convert(x)))

        clauses = dict(on={EFFECTS[eff]: on(expr) for eff, expr in spec.on},
                       fun={EFFECTS[eff]: plain(expr) for eff, expr in spec.fun},
                       ret=None if spec.ret is None else plain(spec.ret),
                       exc=None if spec.exc is None else plain(spec.exc, lambda x: type(x).__name__))
        if impl == "multi":
            h = MultiHandler(**clauses)
        elif impl == "async":
            h = aio.handler(**clauses)
        else:
            h = Handler(**clauses)
        made.append(h)
        return h

    def c_handle(self, e, env):
        ffi, lib, clib = self.c
        ids = ffi.new("int32_t[]", [EFFECTS[x].id for x in e.effects])
        out = ffi.new("kina_handler_t *")
        assert lib.kina_push_handler(clib.diff_clause, ffi.cast("void *", C_MODES[e.mode]),
                                     ids, len(e.effects), out) == 0
        try:
            return self.ev(e.body, Env(arg=env.arg))
        finally:
            rc = lib.kina_pop_handler(out[0])
            if rc != 0:
                raise RuntimeError(f"kina_pop_handler returned {rc}")

    def c_fiber(self, e, env):
        ffi, lib, _ = self.c
        arg = env.arg

        def entry_body():
            try:
                return ref.to_int64(self.ev(e.body, Env(arg=arg)))
            except BaseException as exc:             # a C entry returns; it cannot raise
                return -int(status_of(exc))
        handle = ffi.new_handle(entry_body)
        ids = ffi.new("int32_t[]", [EFFECTS[x].id for x in e.catch])
        out = ffi.new("kina_fiber_t *")
        assert lib.kina_fiber_create(_fiber_entry(ffi), handle, ids, len(e.catch), out) == 0
        f = out[0]
        try:
            state = ffi.new("int32_t *")
            rc = lib.kina_resume_fiber(f, 0, state)
            while rc == 0 and state[0] == FIBER_SUSPENDED:
                if e.host == "answer":
                    args, nargs = ffi.new("int64_t[4]"), ffi.new("int32_t *")
                    assert lib.kina_get_perform_args(f, args, 4, nargs) == 0 and nargs[0] == 1
                    rc = lib.kina_resume_fiber(f, args[0] + 7, state)
                else:
                    rc = lib.kina_cancel_fiber(f, state)
            if rc != 0:
                raise RuntimeError(f"the host fiber failed with status {rc}")
            if state[0] == FIBER_CANCELLED:
                return ("fiber", "cancelled")
            assert state[0] == FIBER_DONE, state[0]
            result = ffi.new("int64_t *")
            assert lib.kina_fiber_result(f, result) == 0
            return ("fiber", result[0])
        finally:
            lib.kina_fiber_destroy(f)


async def pause():
    """Wait on a real future (as I/O would), one the loop completes at once."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    loop.call_soon(future.set_result, None)
    await future


_ENTRY = {}


def _fiber_entry(ffi):
    # One C entry point for every host fiber: it calls the Python body its arg names.
    if ffi not in _ENTRY:
        _ENTRY[ffi] = ffi.callback("int64_t(void *)", lambda arg: ffi.from_handle(arg)(),
                                   error=-999)
    return _ENTRY[ffi]


# --- random programs -----------------------------------------------------------------
# Strategies are built once per set of parameters (lru_cache): the grammar is
# recursive in ``depth``.  Clause code is drawn half the time from shapes that
# use the continuation (resume, twice, discontinue, after an effect, under
# try), so that every kind of handler is exercised, not only aborts.

ints = st.integers(0, 9)
tags = st.integers(0, 99)
raisable = st.sampled_from(sorted(RAISABLE))
effects = st.sampled_from(USER_EFFECTS)
effect_sets = st.sets(effects, min_size=1).map(lambda s: tuple(sorted(s)))
catches = st.sampled_from(sorted(CATCH))


@functools.lru_cache(maxsize=None)
def expressions(depth, clause=None, c=False, asynchronous=False, nspecs=1):
    """Expressions of at most ``depth`` levels; ``clause`` is the kind of handler
    whose ``on`` clause they are the code of (None: not a clause's own code)."""
    performs = st.builds(Perform, effects, ints)
    leaves = [(4, performs), (1, st.builds(Lit, ints)), (1, st.builds(Arg)),
              (1, st.builds(Perform, st.just("log"), tags)), (1, st.builds(Raise, raisable))]
    if c:
        leaves.append((2, st.builds(CPerform, effects, ints)))
    if clause is not None:
        leaves.append((3, k_uses(clause, nspecs)))
    if depth <= 0:
        return weighted(*leaves)
    inner = expressions(depth - 1, clause, c, asynchronous, nspecs)
    plain = expressions(depth - 1, None, c, asynchronous)
    logged = st.builds(lambda tag, more: Seq((Perform("log", tag),) + more), tags,
                       st.lists(inner, max_size=1).map(tuple))
    composite = [
        st.builds(Seq, st.lists(inner, min_size=2, max_size=3).map(tuple)),
        st.builds(Seq, st.lists(st.one_of(performs, inner), min_size=2, max_size=4).map(tuple)),
        st.builds(TryFinally, inner, logged),
        st.builds(TryExcept, inner, catches, inner),
        handles(depth - 1, c, asynchronous),
    ]
    if c:
        composite += [
            st.builds(CHandle, effect_sets, st.sampled_from(sorted(C_MODES)), plain),
            st.builds(CFiber, effect_sets, st.sampled_from(["answer", "cancel"]), plain),
        ]
    return weighted((2, weighted(*leaves)), (3, st.one_of(composite)))


@functools.lru_cache(maxsize=None)
def k_uses(clause, nspecs):
    """The ways an ``on`` clause uses its continuation."""
    value = st.one_of(st.builds(Lit, ints), st.builds(Arg))
    uses = [st.builds(Resume, value), st.builds(Discontinue, raisable)]
    if clause == "shallow":
        uses.append(st.builds(ResumeWith, value, st.integers(0, nspecs - 1)))
    return st.one_of(uses)


@functools.lru_cache(maxsize=None)
def clause_code(depth, clause, c, asynchronous, nspecs):
    use = k_uses(clause, nspecs)
    before = st.one_of(st.builds(Perform, st.sampled_from(sorted(ref.WORLD)), ints),
                       st.builds(Perform, st.just("log"), tags))
    shapes = weighted(
        (2, use),
        (3 if clause == "multi" else 1, st.builds(lambda a, b: Seq((a, b)), use, use)),   # twice
        (1, st.builds(lambda a, b: Seq((a, b)), before, use)),           # after an effect
        (1, st.builds(lambda a, b: Seq((a, b)), use, before)),           # not in tail position
        (1, st.builds(TryExcept, use, catches, expressions(0, None, c, asynchronous))),
        (1, st.builds(lambda a, tag: TryFinally(a, Perform("log", tag)), use, tags)),
    )
    return weighted((3, shapes), (1, expressions(depth, clause, c, asynchronous, nspecs)))


def weighted(*choices):
    """One of the strategies, chosen with the given weights (one_of would
    flatten them into one uniform choice among all their branches)."""
    return st.sampled_from([s for weight, s in choices for _ in range(weight)]).flatmap(lambda s: s)


@st.composite
def specs(draw, depth, kind, c, asynchronous, nspecs=1):
    handled = draw(st.lists(effects, unique=True, min_size=2, max_size=3))
    on, fun = [], []
    for eff in handled:
        if draw(st.integers(0, 2)):
            on.append((eff, draw(clause_code(depth, kind, c, asynchronous, nspecs))))
        else:
            fun.append((eff, draw(st.one_of(st.builds(Forward), expressions(depth, None, c, asynchronous)))))
    ret = draw(st.none() | st.just(Seq((Lit("ret"), Arg()))) | expressions(depth, None, c, asynchronous))
    exc = draw(st.none() | st.just(Seq((Lit("exc"), Arg()))))
    return Spec(on=tuple(on), fun=tuple(fun), ret=ret, exc=exc)


@st.composite
def _handles(draw, depth, c, asynchronous):
    kind = draw(st.sampled_from(["deep", "multi", "shallow"]))
    impl = "handler"
    if kind == "deep" and asynchronous:
        impl = draw(st.sampled_from(["handler", "async"]))
    nspecs = draw(st.integers(1, 2)) if kind == "shallow" else 1
    spec_list = tuple(draw(specs(depth, kind, c, asynchronous, nspecs)) for _ in range(nspecs))
    body = draw(st.one_of(expressions(depth, None, c, asynchronous), bodies(depth, c, asynchronous)))
    return Handle(kind, spec_list, body, impl)


@functools.lru_cache(maxsize=None)
def bodies(depth, c, asynchronous):
    """Several performs in a row, between other code."""
    return st.lists(st.one_of(st.builds(Perform, effects, ints), expressions(max(depth - 1, 0), None, c,
                                                                           asynchronous)),
                    min_size=2, max_size=4).map(lambda items: Seq(tuple(items)))


@functools.lru_cache(maxsize=None)
def handles(depth, c, asynchronous):
    return _handles(depth, c, asynchronous)


def programs(c=False, asynchronous=False, depth=3):
    """A handler at the top (any expression inside)."""
    return handles(depth, c, asynchronous)


# --- the tests --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def c_abi(kina, tmp_path_factory):
    """(ffi, lib, clib): libkina_fx and tests/hosts/c/differential_lib.c, loaded here."""
    from support.abi import build_fixture_library

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    ffi, lib = kina
    out = build_fixture_library(ROOT / "tests" / "hosts" / "c" / "differential_lib.c",
                                tmp_path_factory.mktemp("differential") / "libdifferential.so", gcc)
    ffi.cdef("int32_t diff_clause(void *, int32_t, const int64_t *, int32_t, int64_t *);"
             "int64_t diff_perform(int32_t, int64_t);", override=True)
    return ffi, lib, ffi.dlopen(str(out))


def agree(program, runner, asynchronous=False):
    STATS["programs"] += 1
    want = ref.run(program)
    got = runner.run(program, asynchronous)
    assert got == want, f"\nprogram: {program}\nkina_fx:   {got}\nreference: {want}"


@PROFILE
@given(programs())
def test_python_programs_agree_with_the_reference(program):
    agree(program, Runner())


@pytest.mark.integration                # gcc builds the C clauses: CI must not skip it
@PROFILE
@given(programs(c=True))
def test_programs_through_the_c_abi_agree_with_the_reference(c_abi, program):
    agree(program, Runner(c_abi))


@pytest.mark.integration
@PROFILE
@given(programs(c=True, asynchronous=True))
def test_programs_under_aio_agree_with_the_reference(c_abi, program):
    agree(program, Runner(c_abi), asynchronous=True)


# Programs the generator found kina_fx wrong on (shrunk by hypothesis or by
# hand), each fixed since: they run in every session, whatever is drawn.
FOUND = [
    # a MultiHandler fun clause declining (FORWARD) gave FORWARD to the body
    Handle("multi", (Spec(fun=(("a", Forward()), ("b", Forward()))),), Perform("a", 0)),
    # a clause raising Unhandled with k in an object under a comprehension's
    # cell: the abort came late (at collection, detached: the log lost)
    Handle("deep", (Spec(on=(("a", Resume(Arg())), ("c", Seq((Perform("a", 0), Perform("a", 0))))),
                         fun=(("b", Forward()),)),),
           TryFinally(Perform("c", 0), Seq((Perform("log", 0),)))),
    # an inner handler's abort left a cycle holding the outer clause's frame
    Handle("deep", (Spec(on=(("c", Handle("deep", (Spec(on=(("a", Resume(Arg())),
                                                              ("b", Perform("b", 0)))),),
                                          Seq((Perform("a", 0), Perform("b", 0))))),),
                         fun=(("a", Forward()), ("b", Forward()))),),
           TryFinally(Perform("c", 0), Seq((Perform("log", 0),)))),
    # the MultiHandler's record kept an exception an inner clause caught, and
    # with its traceback the inner clause's k (its body not aborted)
    *[Handle(outer, (Spec(on=(("a", Discontinue("E1")), ("b", Resume(Lit(8))))),),
             Handle(inner, (Spec(on=(("a", TryExcept(Perform("a", 9), "E1", Perform("b", 0))),)),),
                    TryFinally(Perform("a", 0), Seq((Perform("log", 8),)))))
      for outer in ("multi", "deep") for inner in ("deep", "shallow")],
    # a non-tail discontinue: its exception, caught by an inner clause, was
    # still held by kina_fx (discontinue, the driver's send), and so the inner
    # clause's frame and k
    *[Handle(outer, (Spec(on=(("a", Seq((Discontinue("E1"), Lit(0)))),)),),
             Handle("deep", (Spec(on=(("c", TryExcept(Perform("a", 9), "E1", Lit(5))),)),),
                    TryFinally(Perform("c", 0), Seq((Perform("log", 8),)))))
      for outer in ("deep", "multi")],
    # a clause whose finally raised again: the first exception, now the
    # second's __context__, held frames that referenced k, and they counted
    # as keeping it (the abort came late, detached: the log lost)
    Handle("deep", (Spec(on=(("a", TryFinally(Perform("a", 0), Seq((Perform("log", 0), Perform("a", 0))))),
                             ("b", Resume(Arg())))),),
           Seq((Perform("b", 0), Seq((Arg(), TryFinally(Perform("a", 0), Seq((Perform("log", 0),)))))))),
    # the same with the first exception raised in an inner handler's body: the
    # fiber worker that ran that body kept its outcome while idle, and so the
    # exception, its frames and k
    Handle("deep", (Spec(on=(("a", TryFinally(Handle("deep", (Spec(on=(("b", Resume(Lit(0))),),
                                                                   fun=(("a", Forward()),)),),
                                                      Perform("a", 0)),
                                               Seq((Perform("log", 0), Perform("a", 0))))),),
                         fun=(("b", Forward()),)),),
           Seq((Perform("b", 0), Seq((Perform("b", 0), TryFinally(Perform("a", 0),
                                                                  Seq((Perform("log", 0),)))))))),
    # a MultiHandler declining an effect threw the Unhandled into its body
    # from a frame that kept it while the body ran: an inner clause's k,
    # referenced by that exception's frames, looked kept (found on 3.10)
    Handle("multi", (Spec(fun=(("a", Forward()), ("b", Forward()))),),
           Handle("multi", (Spec(on=(("a", Seq((Lit(0), TryFinally(Perform("a", 0), Seq((
               Perform("log", 0), Perform("a", 0))))))),), fun=(("b", Forward()),)),),
                  TryFinally(Perform("a", 0), Seq((Perform("log", 0),))))),
    # the pure-Python driver kept the exception its exc clause got in a local:
    # its frame, alive through a later frame's f_back chain, held it, and
    # through its frames a clause's k (found on 3.12)
    Handle("deep", (Spec(on=(("a", Resume(Arg())),
                             ("b", Handle("multi", (Spec(on=(("b", Resume(Arg())),),
                                                         fun=(("a", Forward()),),
                                                         exc=Seq((Lit("exc"), Arg()))),),
                                          Perform("a", 0)))),
                         fun=(("c", Forward()),)),),
           Seq((Perform("a", 0), TryFinally(Perform("b", 0), Seq((Perform("log", 0),)))))),
    # ... and when that exc clause re-raised it: the exception's traceback
    # held the driver's frame, whose local held the exception (a cycle)
    Handle("deep", (Spec(on=(("a", Handle("multi", (Spec(on=(("a", Discontinue("E1")),
                                                               ("c", TryExcept(Resume(Arg()), "BaseException",
                                                                               Perform("b", 0)))),
                                                           fun=(("b", Forward()),)),),
                                          Seq((Perform("c", 0), Perform("a", 0))))),),
                         fun=(("b", Forward()),)),),
           TryFinally(Perform("a", 0), Seq((Perform("log", 0),)))),
]


# ... through the C ABI (C performs, host fibers) ...
FOUND_C = [
    # a C perform's exception (unhandled), kept for take_last_exception with
    # the chain it replaced: those exceptions' frames, and their callers',
    # held the clause's k, which looked kept
    Handle("deep", (Spec(on=(("b", TryFinally(Perform("a", 0), Seq((
        Perform("log", 0), TryExcept(Perform("a", 0), "BaseException",
                                     Seq((CPerform("a", 0), Perform("a", 0)))))))),),
                         fun=(("a", Forward()), ("c", Forward()))),),
           Seq((CPerform("b", 0), Perform("b", 0)))),
    # an outer abort's Unwind, held by that abort until it ends, went through
    # frames of an inner clause that hold its k: when that clause raised, its
    # k looked kept (with a host fiber as the inner body)
    Handle("multi", (Spec(on=(("b", Discontinue("E1")), ("c", Resume(Arg())), ("a", Perform("a", 0)))),),
           Handle("multi", (Spec(on=(("b", Resume(Arg())), ("c", Resume(Arg())),
                                     ("a", Seq((TryFinally(Perform("a", 0), Seq((Perform("log", 0),
                                                                                Perform("a", 0)))),
                                                Lit(0)))))),),
                  CFiber(("c",), "answer", TryFinally(Perform("a", 0), Seq((Perform("log", 0),)))))),
]


# ... and under aio.run.
FOUND_ASYNC = [
    # a MultiHandler replayed the answer to an await (a future of the first
    # run) instead of waiting on the replay's own future: ReplayDiverged
    Handle("multi", (Spec(on=(("a", Seq((Resume(Arg()), Resume(Arg())))),), fun=(("b", Forward()),)),),
           Seq((Perform("a", 0),
                Handle("deep", (Spec(fun=(("a", Forward()), ("b", Forward()))),), Perform("a", 0),
                       "async")))),
]


@pytest.mark.parametrize("program", FOUND, ids=[f"found{i}" for i in range(len(FOUND))])
def test_programs_found_before_agree_with_the_reference(program):
    agree(program, Runner())


@pytest.mark.integration
@pytest.mark.parametrize("program", FOUND_C, ids=[f"found{i}" for i in range(len(FOUND_C))])
def test_programs_found_before_agree_with_the_reference_through_the_c_abi(c_abi, program):
    agree(program, Runner(c_abi))


@pytest.mark.parametrize("program", FOUND_ASYNC, ids=[f"found{i}" for i in range(len(FOUND_ASYNC))])
def test_programs_found_before_agree_with_the_reference_under_aio(program):
    agree(program, Runner(), asynchronous=True)
