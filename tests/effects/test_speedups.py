"""The compiled implementation (kina_fx._speedups, kina_fx/_speedups_c/*.c)
against its reference, the Python code of kina_fx/handlers.py and fibers.py.

Every test here runs on both implementations (the ``impl`` fixture,
tests/support/implementations.py); those about the compiled one's own
machinery (its selection, its tail check, its imports) only there.  The
search edge cases below are the ones a transcription gets wrong first.
"""
import gc
import os
import re
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from kina_fx import Continuation, Effect, Handler, Unhandled, fiber, fibers, handlers, tailcalls

_speedups = fibers.speedups
ROOT = Path(__file__).resolve().parents[2]
compiled_only = pytest.mark.only_impl("compiled")

E = Effect("speedups.e")
F = Effect("speedups.f")
G = Effect("speedups.g")


@pytest.fixture
def perform():
    return handlers.perform


def stack():
    return fibers.current().stack


# --- selection ----------------------------------------------------------------------

@compiled_only
def test_compiled_implementation_is_in_use():
    # An optional extension that silently failed to build (or no longer fits
    # the Python code) would otherwise pass the whole suite in pure Python:
    # the impl fixture fails the compiled half when it is missing.
    import kina_fx
    from kina_fx.ffi import effects as ffi_effects
    assert _speedups is not None
    assert handlers.perform is _speedups.perform is kina_fx.perform
    assert handlers.perform.__name__ == "perform" and "Unhandled" in handlers.perform.__doc__
    assert handlers._switch_into is _speedups.switch_into
    assert handlers._drive is _speedups.drive
    assert handlers._returns_straight_to_driver is _speedups.returns_straight_to_driver
    # Continuation gets the compiled resume (as its own method: ContinuationData's
    # __init_subclass__) and finalizer (inherited) before the reference's.
    resume = vars(handlers.Continuation)["resume"]
    assert type(resume).__name__ == "method_descriptor" and resume.__objclass__ is handlers.Continuation
    assert handlers.Continuation.__del__ is _speedups.ContinuationData.__del__
    # The C core owns the fields of the protocol's types (fibers.data_type).
    for cls in (fibers.Fiber, fibers.ThreadState, fibers.Chain, handlers.Handler, handlers._Skip,
                handlers._TailResume, handlers.Stepper, ffi_effects.CClause):
        assert cls.__base__.__module__ == "kina_fx._speedups", cls
    assert handlers.Continuation.__mro__[2] is _speedups.ContinuationData


@compiled_only
def test_each_continuation_class_gets_the_compiled_resume_as_its_own():
    class Sub(Continuation):
        __slots__ = ()

    class Own(Continuation):
        __slots__ = ()

        def resume(self, value=None):
            return ("own", value)
    assert vars(Sub)["resume"].__objclass__ is Sub
    assert Own(None, None).resume(1) == ("own", 1)
    assert Continuation[int, str].__origin__ is Continuation      # typing.Generic still ran


@pytest.mark.only_impl("python")
def test_pure_python_reference_is_in_use():
    import kina_fx
    assert fibers.speedups is None
    assert handlers.perform is handlers._perform_py is kina_fx.perform
    assert handlers._switch_into is fibers.switch_into
    assert handlers._drive is handlers._drive_py
    assert handlers._returns_straight_to_driver is handlers._returns_straight_to_driver_py
    assert handlers.Continuation.resume is handlers._ContinuationReference.resume
    assert handlers.Continuation.__del__ is handlers._ContinuationReference.__del__
    assert fibers.Fiber.__base__.__module__ == "kina_fx.fibers"


def test_data_types_declare_the_fields_of_the_c_core(impl):
    # Both layouts of each type have the same fields: what fibers.data_type
    # checks at import (a mismatch warns), here for every C type.
    code = ("import warnings; warnings.simplefilter('error'); "
            "import kina_fx.ffi.effects, kina_fx.handlers as h; print(h.perform is h._perform_py)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(impl == "python")


def _first_call_in_a_new_process(prelude):
    # The C core imports its Python collaborators at its first call: run
    # ``prelude`` in a fresh interpreter, then make that first call.
    code = (f"import kina_fx\nfrom kina_fx import handlers\n{prelude}\n"
            "try:\n    handlers.perform(handlers.Effect('first'))\n"
            "except BaseException as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@compiled_only
def test_the_c_core_refuses_a_collaborator_still_being_imported():
    got = _first_call_in_a_new_process("handlers.__spec__._initializing = True")
    assert got == ("ImportError kina_fx._speedups was called while kina_fx.handlers was still "
                   "being imported (an import cycle)")


@compiled_only
@pytest.mark.parametrize("prelude, reason", [
    ("class Skip(handlers.Handler): pass\nhandlers._Skip = Skip",
     "_Skip must derive from kina_fx._speedups.SkipData"),
    ("class Sub(handlers.Handler):\n    fun = property(lambda self: {})\nhandlers.Handler = Sub",
     "Handler.fun shadows the field of that name"),
    ("del handlers._suspend_perform", "has no attribute '_suspend_perform'"),
    ("handlers._drive_on_fresh_stack = 3", "_drive_on_fresh_stack is not callable"),
])
def test_the_c_core_refuses_collaborators_that_do_not_fit(prelude, reason):
    got = _first_call_in_a_new_process(prelude)
    assert got.startswith("ImportError kina_fx._speedups does not fit this kina_fx (") and reason in got, got
    assert got.endswith("rebuild it (pip install -e .) or set KINA_FX_PURE_PYTHON=1"), got


def _fallback_rows_of_the_docs():
    text = (ROOT / "docs" / "effects.md").read_text()
    table = text.split("### What the C core hands to Python", 1)[1].split("\n\n|", 1)[1]
    rows = [line for line in ("|" + table).splitlines() if line.startswith("|")][2:]
    return {row.split("|")[1].strip() for row in rows}


def _fallbacks_named_in_the_c_files():
    named = {}
    for path in sorted((ROOT / "kina_fx" / "_speedups_c").glob("*.c")):
        for comment in re.findall(r"/\*(.*?)\*/", path.read_text(), re.S):
            comment = re.sub(r"\s*\n\s*\*?\s*", " ", comment)
            if "fallback:" in comment:
                for name in re.findall(r'"([^"]+)"', comment.split("fallback:", 1)[1]):
                    named.setdefault(name, []).append(path.name)
    return named


def test_every_fallback_of_the_c_core_is_in_the_docs_table_and_back():
    # docs/effects.md, "What the C core hands to Python": the one list.
    rows, named = _fallback_rows_of_the_docs(), _fallbacks_named_in_the_c_files()
    assert rows and set(named) == rows, (sorted(rows - set(named)), sorted(set(named) - rows))


@compiled_only
def test_tail_check_agrees_with_python_on_the_effects_suites():
    # Every tail-resume check of the effects suites answered by the compiled
    # check and by tailcalls.returns_straight_to over the same driver frames
    # (tests/support/tail_crosscheck.py, turned on by KINA_FX_TAIL_CROSSCHECK).
    # Without the variables of tests/support/implementations.py: run in the
    # child pytest process of a KINA_FX_PURE_PYTHON=1 session, this one would
    # otherwise empty that child's report file and take its selection.
    env = {name: value for name, value in os.environ.items() if not name.startswith("KINA_FX_TEST_")}
    env.update(KINA_FX_TAIL_CROSSCHECK="1", KINA_FX_TEST_IMPL="compiled")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/effects/test_effects.py", "tests/effects/ocaml"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 mismatches" in proc.stdout and " 0 tail checks" not in proc.stdout, proc.stdout[-2000:]


# --- the search ---------------------------------------------------------------------

def test_fun_clause_in_place_with_any_number_of_arguments(perform):
    with Handler(fun={E: lambda *a: ("e",) + a}):
        assert perform(E) == ("e",)
        assert perform(E, 1) == ("e", 1)
        assert perform(E, *range(20)) == ("e",) + tuple(range(20))
    assert stack() == []


def test_innermost_handler_wins_and_others_are_forwarded(perform):
    with Handler(fun={E: lambda: "outer", F: lambda: "outer f"}):
        with Handler(fun={G: lambda: "g"}):
            with Handler(fun={E: lambda: "inner"}):
                assert perform(E) == "inner"
                assert perform(F) == "outer f"
                assert perform(G) == "g"


def test_clause_runs_outside_its_handler(perform):
    # Re-performing the same effect in a clause reaches the next handler out
    # (the skip marker), and the marker is gone afterwards.
    seen = []

    def inner(x):
        seen.append(len(stack()))
        assert stack()[-1].__class__ is handlers._Skip
        return perform(E, x + 1) * 10

    with Handler(fun={E: lambda x: x + 100}):
        with Handler(fun={E: inner}):
            n = len(stack())
            assert perform(E, 1) == 1020
            assert len(stack()) == n
    assert seen == [3]


def test_skip_markers_chain_through_nested_clauses(perform):
    # Clause of the innermost handler performs F, whose clause (outer) performs
    # E: the search must skip both handlers whose clauses are running.
    with Handler(fun={E: lambda: "outermost"}):
        with Handler(fun={F: lambda: perform(E)}):
            with Handler(fun={E: lambda: perform(F)}):
                assert perform(E) == "outermost"


def test_marker_of_a_control_handler_fun_clause_skips_to_the_parent(perform):
    # A fun clause of a fiber's control handler (index -1): performing from
    # it continues at the parent fiber, past that handler.
    def body():
        return perform(F)
    h = Handler(on={G: lambda k: k.resume(None)}, fun={F: lambda: ("inner", perform(F))})
    with Handler(fun={F: lambda: "outer"}):
        assert h.run(body) == ("inner", "outer")


def test_on_clause_through_the_compiled_search(perform):
    def body():
        return perform(E, 2) + perform(E, 3)
    assert Handler(on={E: lambda k, x: k.resume(x * 10)}).run(body) == 50
    # shallow
    k = fiber(lambda v: perform(E, v))
    got = k.resume_with(5, Handler(on={E: lambda k2, x: ("suspended", x, k2)}))
    assert got[:2] == ("suspended", 5)
    assert got[2].resume_with(7, Handler(ret=lambda r: ("ret", r))) == ("ret", 7)


def test_exceptions_from_clauses_propagate_and_pop_the_marker(perform):
    def boom(x):
        raise KeyError(x)
    with Handler(fun={E: boom}):
        n = len(stack())
        for _ in range(3):
            with pytest.raises(KeyError) as info:
                perform(E, "x")
            assert info.value.args == ("x",)
            assert len(stack()) == n
    with Handler(fun={E: lambda: sys.exit(3)}):
        with pytest.raises(SystemExit):
            perform(E)
        assert len(stack()) == 1


def test_pop_failure_in_finally_chains_the_clause_exception(perform):
    # The clause empties the stack and raises: the pop of the finally block
    # fails, with the clause's exception as __context__ (as in Python).
    def clause():
        stack().clear()
        raise ValueError("from the clause")
    h = Handler(fun={E: clause})
    handlers.push_handler(h)
    with pytest.raises(IndexError) as info:
        perform(E)
    assert isinstance(info.value.__context__, ValueError)
    assert stack() == []


def test_forward_declines_to_the_next_handler_out(perform):
    from kina_fx import FORWARD
    seen = []

    def ctl_body():
        return perform(E, 1)
    # declined by in-place entries, then by a control handler's fun clause
    ctl = Handler(on={G: lambda k: k.resume(None)},
                  fun={E: lambda x: seen.append(("ctl", x)) or FORWARD})
    with Handler(fun={E: lambda x: ("outer", x)}):
        with Handler(fun={E: lambda x: seen.append(("middle", x)) or FORWARD}):
            assert ctl.run(lambda: (perform(E, 1), len(stack()))) == (("outer", 1), 0)
            assert perform(E, 2) == ("outer", 2)
        assert len(stack()) == 1
    assert seen == [("ctl", 1), ("middle", 1), ("middle", 2)]
    with Handler(fun={E: lambda x: FORWARD}):
        with pytest.raises(Unhandled):
            perform(E, 3)
        assert len(stack()) == 1
        eff = Effect("speedups.forward.default")
        eff.default = lambda: "default"
        try:
            with Handler(fun={eff: lambda: FORWARD}):
                assert perform(eff) == "default"
        finally:
            eff.default = None


def test_marker_below_a_handler_left_by_the_clause_is_removed_by_identity(perform):
    left = Handler(fun={F: lambda: "left"})

    def clause():
        handlers.push_handler(left)          # and never popped (a C handler may)
        return "done"
    with Handler(fun={E: clause}):
        assert perform(E) == "done"
        assert stack()[-1] is left and len(stack()) == 2
        assert not any(m.__class__ is handlers._Skip for m in stack())
        handlers.pop_handler(left)

    def clause_removing_its_marker():
        stack().pop()                        # takes its own marker off
        return "gone"
    with Handler(fun={E: clause_removing_its_marker}):
        assert perform(E) == "gone"
        assert len(stack()) == 1             # nothing else was removed


def test_default_and_unhandled(perform):
    eff = Effect("speedups.default")
    eff.default = lambda *a: ("default", a)
    try:
        assert perform(eff, 1, 2) == ("default", (1, 2))
        with Handler(fun={eff: lambda *a: "handled"}):
            assert perform(eff) == "handled"
    finally:
        eff.default = None
    with pytest.raises(Unhandled) as info:
        perform(eff, 1, "two")
    assert info.value.effect is eff and info.value.payload == (1, "two")
    with pytest.raises(Unhandled) as info:
        perform(eff)
    assert info.value.payload == ()
    # raised inside an except block: implicit chaining, as a Python raise
    try:
        raise KeyError("outer")
    except KeyError:
        with pytest.raises(Unhandled) as info:
            perform(eff)
    assert isinstance(info.value.__context__, KeyError)


def test_unhandled_inside_a_clause_skips_the_clause_handler(perform):
    with Handler(fun={E: lambda: perform(E)}):
        with pytest.raises(Unhandled):
            perform(E)
        assert len(stack()) == 1


def test_bad_calls(perform):
    with pytest.raises(TypeError):
        perform()
    with pytest.raises(TypeError):
        perform(E, x=1)
    with pytest.raises(TypeError, match="needs an Effect"):
        perform(object())

    class Fake:
        default = staticmethod(lambda: "fake default")
    with pytest.raises(TypeError, match="needs an Effect"):
        perform(Fake())
    with Handler(fun={E: lambda: "handled"}):   # only an unhandled perform checks
        with pytest.raises(TypeError, match="needs an Effect"):
            perform(Fake())


def test_handler_subclasses_and_unusual_clause_tables(perform):
    class Clauses:                           # not a dict: only .get is used
        def get(self, effect):
            return (lambda: "via get") if effect is E else None

    class Sub(Handler):
        __slots__ = ("extra",)

    class Prop(Handler):                     # shadows the slot: a normal lookup
        __slots__ = ()

        @property
        def fun(self):
            return {F: lambda: "via property"}

    s = Sub(fun={G: lambda: "sub"})
    with s:
        assert perform(G) == "sub"
        s.fun = Clauses()
        assert perform(E) == "via get"
        with pytest.raises(Unhandled):
            perform(F)
    p = Prop.__new__(Prop)
    p.on, p.ret, p.exc = {}, None, None
    fibers.current().stack.append(p)
    try:
        assert perform(F) == "via property"
    finally:
        fibers.current().stack.pop()


def test_none_clause_is_no_clause(perform):
    h = Handler(fun={E: lambda: "outer"})
    inner = Handler(fun={E: lambda: "inner"})
    inner.fun[E] = None
    with h, inner:
        assert perform(E) == "outer"


def test_a_marker_kept_by_a_clause_keeps_its_fields(perform):
    kept = []
    with Handler(fun={E: lambda: kept.append(stack()[-1])}):
        perform(E)
        perform(E)
    assert kept[0] is not kept[1]
    for m in kept:
        assert m.__class__ is handlers._Skip
        assert m.fiber is fibers.current() and m.index == 0


def test_effect_call_and_c_abi_entry_use_the_selected_perform():
    with Handler(fun={E: lambda x: x * 2}):
        assert E(21) == 42
        assert handlers.suspend_to_host is not None


# --- tail resumes through the compiled frame -------------------------------------------

def _named_perform_clause():
    def perform(k):       # a fun clause named like the builtin: the tail walk accepts
        if isinstance(k, Continuation):     # the link through the (invisible) C frame
            return k.resume("resumed")
        return "handled by the clause's own handler"
    return perform


def test_tail_resume_from_a_fun_clause_keeps_the_marker(perform):
    # The on clause of A hands k to F's fun clause, which resumes it in tail
    # position.  The resumed body performs F: it must skip F's handler, whose
    # clause is still running (Python: the resume nests inside the clause).
    A = Effect("speedups.a")
    fun_f = _named_perform_clause()

    def body():
        v = perform(A)
        try:
            return v, perform(F, None)
        except Unhandled:
            return v, "skipped"

    def on_a(k):
        return perform(F, k)

    with Handler(fun={F: fun_f}):
        assert Handler(on={A: on_a}).run(body) == ("resumed", "skipped")
        assert len(stack()) == 1


# --- threads ---------------------------------------------------------------------------

def test_threads_each_see_their_own_handlers(perform):
    errors = []
    barrier = threading.Barrier(4)

    def worker(tag):
        try:
            with Handler(fun={E: lambda: tag}):
                barrier.wait()
                for _ in range(2000):
                    assert perform(E) == tag
            with pytest.raises(Unhandled):
                perform(E)
        except BaseException as exc:         # pragma: no cover - reported below
            errors.append(exc)

    for rounds in range(3):                  # new threads: new thread states
        threads = [threading.Thread(target=worker, args=(f"t{rounds}.{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    with pytest.raises(Unhandled):
        perform(E)


# --- references --------------------------------------------------------------------------

def test_no_reference_leaks(perform):
    arg = object()
    clause = lambda a: a                     # noqa: E731
    h = Handler(fun={E: clause})
    boom = Handler(fun={F: lambda a: 1 / 0})
    dflt = Effect("speedups.leak.default")
    dflt.default = lambda a: a
    me = fibers.current()

    def k_body():
        for _ in range(200):
            perform(G, arg)
    ctl = Handler(on={G: lambda k, a: k.resume(a)})

    def run():
        with h:
            for _ in range(2000):
                perform(E, arg)
        with boom:
            for _ in range(200):
                try:
                    perform(F, arg)
                except ZeroDivisionError:
                    pass
        for _ in range(200):
            perform(dflt, arg)
            try:
                perform(Effect("speedups.leak.none"), arg)
            except Unhandled:
                pass
        ctl.run(k_body)

    objects = (arg, clause, h, boom, E, F, G, dflt, me, ctl)
    run()
    gc.collect()
    before = [sys.getrefcount(o) for o in objects]
    run()
    gc.collect()
    assert [sys.getrefcount(o) for o in objects] == before


def test_memory_stays_flat_over_100k_performs(perform):
    h = Handler(fun={E: lambda x: x})

    def run(n):
        with h:
            for i in range(n):
                perform(E, i)
            for i in range(n // 10):
                try:
                    perform(F, i)
                except Unhandled:
                    pass

    run(1000)
    gc.collect()
    n_objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        snap = tracemalloc.take_snapshot()
        run(100_000)
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap, "filename")
                    if s.size_diff > 0)
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown
    assert len(gc.get_objects()) - n_objects < 100


@compiled_only
def test_compiled_tail_check_matches_and_does_not_leak():
    A = Effect("speedups.tail")
    seen = []
    driver_frames = []

    def helper(k, x):
        return k.resume(x)                   # a tail call: straight to the driver

    def clause(k, x):
        frame = sys._getframe(0)
        check = _speedups.returns_straight_to_driver
        seen.append((check(frame), tailcalls.returns_straight_to(frame, _speedups.drives_from)))
        driver_frames.append(frame.f_back)   # the frame that called the driver loop (Handler.run)
        seen.append(_speedups.drives_from(frame.f_back))
        check(frame)
        objs = (frame, frame.f_code, frame.f_back, frame.f_back.f_code)
        before = [sys.getrefcount(o) for o in objs]
        for _ in range(10000):
            check(frame)
            check(None)
        seen.append([sys.getrefcount(o) for o in objs] == before)
        return helper(k, x)

    def body():
        return handlers.perform(A, 5) + 1

    assert Handler(on={A: clause}).run(body) == 6
    assert seen == [(False, False), True, True]
    driving = _speedups.drives_from(driver_frames[0])
    gc.collect()                             # the clause's frame referred to itself
    refs = sys.getrefcount(driver_frames[0])
    assert (driving, refs) == (False, 2)     # the loop let go of its caller's frame
    with pytest.raises(TypeError):
        _speedups.returns_straight_to_driver(42)


def test_a_stack_that_is_not_a_list(perform):
    class Stack(list):                       # not an exact list: the generic paths
        pass
    me = fibers.current()
    saved = me.stack
    me.stack = Stack(saved)
    try:
        with Handler(fun={E: lambda: len(stack())}):
            with Handler(fun={F: lambda: perform(E)}):
                assert perform(F) == len(saved) + 4
            assert type(stack()) is Stack and len(stack()) == len(saved) + 1
    finally:
        me.stack = saved


# --- the compiled round trip (suspend, switch_into, resume, the driver loop) ----------

def test_tail_resumes_stay_tail_resumes_once_the_call_is_specialized(monkeypatch):
    # Python 3.11 runs a specialized call of a C function (the compiled resume)
    # in the PRECALL before its CALL: the frame stops there, still in a tail
    # call.  A resume wrongly taken for a non-tail one would nest, and every
    # 300 frames hop to a fresh helper fiber.
    made = []
    new_fiber = fibers.new_fiber
    monkeypatch.setattr(fibers, "new_fiber", lambda *a, **kw: made.append(a) or new_fiber(*a, **kw))

    def body():
        for i in range(3000):
            handlers.perform(E, i)
        return "done"
    assert Handler(on={E: lambda k, x: k.resume(x)}).run(body) == "done"
    assert len(made) == 1                    # the body's own fiber, nothing else


def test_nested_resumes_hop_to_a_fresh_stack_at_least_every_half_hop_depth(monkeypatch):
    # Each nested (non-tail) resume adds a clause frame and a driver loop to
    # the stack: the C loop, which has no frame, counts as one, as the
    # reference's _drive_py frame does.  Counted less, the C stack that every
    # greenlet switch copies grew twice as deep between hops.
    made = []
    new_fiber = fibers.new_fiber
    monkeypatch.setattr(fibers, "new_fiber", lambda *a, **kw: made.append(a) or new_fiber(*a, **kw))
    n = 3000

    def body():
        for i in range(n):
            handlers.perform(E, i)
        return 0
    assert Handler(on={E: lambda k, x: k.resume(x) + 1}).run(body) == n
    assert len(made) - 1 >= n // (handlers._HOP_DEPTH // 2), len(made)   # - the body's own fiber


def test_resume_cases_the_compiled_method_hands_to_the_python_one():
    assert Handler(on={E: lambda k, x: k.resume(value=x + 1)}).run(lambda: handlers.perform(E, 1)) == 2

    def twice(k, x):
        r = k.resume(x)                      # not a tail resume: nests
        with pytest.raises(handlers.ContinuationAlreadyResumed):
            k.resume(0)
        return ("nested", r)
    assert Handler(on={E: twice}).run(lambda: handlers.perform(E, 3)) == ("nested", 3)
    k = fiber(lambda v: ("ran", v))
    with pytest.raises(TypeError):
        k.resume(1)                          # shallow: takes resume_with
    assert not k.resumed
    assert k.resume_with(5, Handler()) == ("ran", 5)

    class Sub(Continuation):
        __slots__ = ()
    got = []
    Handler(on={E: lambda k, x: got.append(k) or k.resume(x)}).run(lambda: handlers.perform(E, 0))
    assert got[0].resumed
    sub = Sub(None, None)
    with pytest.raises(handlers.ContinuationAlreadyResumed):
        sub.resume(1)


def test_dropped_continuations_still_unwind_and_discontinue_still_raises():
    log = []

    def body():
        try:
            handlers.perform(E, 1)
        except ValueError as exc:
            log.append(("caught", str(exc)))
        try:
            handlers.perform(E, 2)
        finally:
            log.append("finally")
    clauses = iter([lambda k, x: k.discontinue(ValueError("boom")), lambda k, x: "dropped"])
    assert Handler(on={E: lambda k, x: next(clauses)(k, x)}).run(body) == "dropped"
    gc.collect()
    assert log == [("caught", "boom"), "finally"]
