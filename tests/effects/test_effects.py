"""The effects runtime's rules, one test (or a few) per rule of docs/effects.md."""
import contextvars
import gc
import threading
import warnings

import pytest

from kina_fx import (ContinuationAlreadyResumed, Effect, Handler, Unhandled, WrongThread,
                     fiber, perform)
from kina_fx import fibers

Get = Effect("test.get")
Put = Effect("test.put")
Yield = Effect("test.yield")
Ask = Effect("test.ask")
Log = Effect("test.log")


def state(body, init):
    """A deep state handler; returns (result, final state)."""
    cell = [init]

    def put(k, v):
        cell[0] = v
        return k.resume(None)
    h = Handler(on={Get: lambda k: k.resume(cell[0]), Put: put},
                ret=lambda v: (v, cell[0]))
    return h.run(body)


# --- effects ------------------------------------------------------------------

def test_effects_are_interned_with_stable_small_ids():
    a = Effect("test.interned")
    assert Effect("test.interned") is a
    assert a.id > 0 and Effect.lookup(a.id) is a and Effect.lookup("test.interned") is a
    assert Effect("test.interned.other").id != a.id
    with pytest.raises(ValueError):
        Effect.lookup(10**9)
    with pytest.raises(ValueError):
        Effect("")


# --- deep handlers --------------------------------------------------------------

def test_state_handler_threads_state_through_performs():
    def body():
        for i in range(10):
            perform(Put, perform(Get) + i)
        return "done"
    assert state(body, 100) == ("done", 100 + sum(range(10)))


def test_return_clause_sees_body_value_and_default_is_identity():
    assert Handler(on={Get: lambda k: k.resume(1)}).run(lambda: 7) == 7
    assert Handler(on={Get: lambda k: k.resume(1)}, ret=lambda v: v * 2).run(lambda: 7) == 14


def test_clause_result_is_result_of_run_when_not_resumed():
    def body():
        perform(Yield, 1)
        raise AssertionError("never resumed")
    assert Handler(on={Yield: lambda k, v: ("stopped at", v)}).run(body) == ("stopped at", 1)


def test_generator_and_nontail_resume_values():
    def body():
        return perform(Yield, 1) + perform(Yield, 2)

    def clause(k, v):
        r = k.resume(v * 10)
        return ("wrapped", v, r)
    out = Handler(on={Yield: clause}, ret=lambda v: ("ret", v)).run(body)
    assert out == ("wrapped", 1, ("wrapped", 2, ("ret", 30)))


def test_unhandled_raised_at_perform_site_with_payload():
    def body():
        try:
            perform(Ask, 1, "two")
        except Unhandled as e:
            return ("caught in body", e.effect, e.payload)
    assert body() == ("caught in body", Ask, (1, "two"))
    # also from inside a fiber whose handler does not name the effect
    assert Handler(on={Get: lambda k: k.resume(0)}).run(body) == ("caught in body", Ask, (1, "two"))


def test_unhandled_passes_through_exception_clauses_innermost_first():
    order = []

    def mk(name):
        def exc(e):
            order.append(name)
            raise e
        return Handler(on={Get: lambda k: k.resume(0)}, exc=exc)
    with pytest.raises(Unhandled):
        mk("outer").run(lambda: mk("inner").run(lambda: perform(Ask)))
    assert order == ["inner", "outer"]


def test_exc_clause_sees_body_exceptions_not_clause_exceptions():
    caught = []
    h = Handler(on={Yield: lambda k, v: 1 / 0}, exc=lambda e: caught.append(e) or "exc")
    assert h.run(lambda: (_ for _ in ()).throw(KeyError("body"))) == "exc"
    assert isinstance(caught[0], KeyError)
    with pytest.raises(ZeroDivisionError):
        h.run(lambda: perform(Yield, 0))
    assert len(caught) == 1


def test_discontinue_raises_at_perform_site_and_body_may_catch():
    def body():
        try:
            perform(Yield, 1)
        except KeyError as e:
            return "body caught " + e.args[0]
    assert Handler(on={Yield: lambda k, v: k.discontinue(KeyError("boom"))}).run(body) == "body caught boom"
    # uncaught: the exc clause sees it
    h = Handler(on={Yield: lambda k, v: k.discontinue(KeyError)}, exc=lambda e: type(e).__name__)
    assert h.run(lambda: perform(Yield, 1)) == "KeyError"


# --- clauses run outside their own handler ----------------------------------------

def test_on_clause_runs_outside_its_handler():
    inner = Handler(on={Get: lambda k: k.resume(perform(Get) + 1)})
    outer = Handler(on={Get: lambda k: k.resume(100)})
    assert outer.run(lambda: inner.run(lambda: perform(Get))) == 101


def test_fun_clause_runs_outside_its_handler_and_reaches_outer():
    with Handler(fun={Get: lambda: 1}):
        with Handler(fun={Get: lambda: perform(Get) + 10}):
            with Handler(fun={Get: lambda: perform(Get) + 100}):
                assert perform(Get) == 111


def test_fun_clause_of_run_handler_runs_outside_it():
    h = Handler(fun={Get: lambda: perform(Get) * 2}, on={Yield: lambda k, v: k.resume(v)})
    outer = Handler(on={Get: lambda k: k.resume(21)})
    assert outer.run(lambda: h.run(lambda: perform(Get))) == 42


def test_fun_clause_without_outer_handler_is_unhandled_not_recursive():
    with Handler(fun={Get: lambda: perform(Get)}):
        with pytest.raises(Unhandled):
            perform(Get)


def test_fun_clause_exception_propagates_from_perform_site():
    with Handler(fun={Get: lambda: {}["missing"]}):
        with pytest.raises(KeyError):
            perform(Get)
        # the handler is still installed and usable afterwards
        with pytest.raises(KeyError):
            perform(Get)


def test_effect_default_answers_when_nothing_handles():
    eff = Effect("test.with_default")
    eff.default = lambda x: x + 1
    try:
        assert perform(eff, 1) == 2
        with Handler(fun={eff: lambda x: perform(eff, x) * 10}):
            assert perform(eff, 1) == 20
    finally:
        eff.default = None
    with pytest.raises(Unhandled):
        perform(eff, 1)


# --- forwarding -----------------------------------------------------------------

def test_forwarding_and_deep_reinstall_of_inner_handlers():
    log = []

    def body():
        a = perform(Get)           # forwarded through the Log handler to the state handler
        perform(Log, "after get")  # the Log handler must still be installed after resume
        perform(Put, a + 1)
        perform(Log, "after put")
        return perform(Get)

    def logger():
        return Handler(on={Log: lambda k, m: (log.append(m), k.resume(None))[1]}).run(body)
    assert state(logger, 1) == (2, 2)
    assert log == ["after get", "after put"]


def test_handler_stack_shared_between_with_and_run():
    def body():
        with Handler(fun={Ask: lambda: "inner fun"}):
            return perform(Ask), perform(Get)
    assert state(body, 5) == (("inner fun", 5), 5)


def test_with_only_accepts_fun_clauses_and_pops_in_order():
    with pytest.raises(ValueError):
        with Handler(on={Get: lambda k: k.resume(1)}):
            pass
    a, b = Handler(fun={Get: lambda: 1}), Handler(fun={Get: lambda: 2})
    a.__enter__()
    b.__enter__()
    with pytest.raises(ValueError):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    assert fibers.current().stack == []


# --- one-shot continuations -----------------------------------------------------

def test_second_resume_raises_and_leaves_fiber_intact():
    saved = []

    def clause(k, v):
        saved.append(k)
        return k.resume(v + 1)
    h = Handler(on={Yield: clause})
    assert h.run(lambda: perform(Yield, 1) + perform(Yield, 10)) == 13
    for k in saved:
        with pytest.raises(ContinuationAlreadyResumed):
            k.resume(0)
        with pytest.raises(ContinuationAlreadyResumed):
            k.discontinue(ValueError())


def test_double_resume_inside_clause_leaves_first_resume_result():
    def clause(k, v):
        first = k.resume(v)
        with pytest.raises(ContinuationAlreadyResumed):
            k.resume(v)
        return first
    assert Handler(on={Yield: clause}).run(lambda: perform(Yield, 5) * 2) == 10


def test_stored_continuation_resumed_later_outside_clause():
    box = []
    h = Handler(on={Yield: lambda k, v: box.append(k) or "suspended"})
    assert h.run(lambda: perform(Yield, 0) + 1) == "suspended"
    assert box[0].resume(41) == 42


def test_dropped_continuation_is_unwound_without_warnings(capfd):
    events = []

    class Ctx:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            events.append("with exit")

    def body():
        with Ctx():
            try:
                perform(Yield, 0)
            finally:
                events.append("finally")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Handler(on={Yield: lambda k, v: "dropped"}).run(body) == "dropped"
        gc.collect()
    assert events == ["finally", "with exit"]
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_dropped_continuation_of_nested_fibers_unwinds_all():
    events = []

    def inner():
        try:
            perform(Yield, 0)
        finally:
            events.append("inner")

    def middle():
        try:
            return Handler(on={Get: lambda k: k.resume(0)}).run(inner)
        finally:
            events.append("middle")
    assert Handler(on={Yield: lambda k, v: "dropped"}).run(middle) == "dropped"
    gc.collect()
    assert events == ["inner", "middle"]


# --- shallow handlers -------------------------------------------------------------

def test_shallow_generator_drives_one_effect_at_a_time():
    def producer(start):
        for i in range(start, start + 3):
            perform(Yield, i)
        return "end"
    got = []
    k = fiber(producer)
    step = Handler(on={Yield: lambda k2, v: ("yielded", v, k2)}, ret=lambda v: ("done", v))
    r = k.resume_with(10, step)
    while r[0] == "yielded":
        got.append(r[1])
        r = r[2].resume_with(None, step)
    assert got == [10, 11, 12] and r == ("done", "end")


def test_shallow_handler_is_not_reinstalled():
    def body(_):
        perform(Yield, 1)
        perform(Yield, 2)     # no shallow handler any more: falls to the outer one
        return "end"

    def first(k, v):
        return ("first", v, k)
    r = fiber(body).resume_with(None, Handler(on={Yield: first}))
    assert r[:2] == ("first", 1)
    outer = Handler(on={Yield: lambda k, v: k.resume(None)})
    # resuming with a handler that does not handle Yield forwards it outward
    assert outer.run(lambda: r[2].resume_with(None, Handler(on={Get: lambda k: k.resume(0)}))) == "end"


def test_shallow_misuse_and_discontinue_with():
    k = fiber(lambda v: v)
    with pytest.raises(TypeError):
        k.resume(1)
    h = Handler(on={Yield: lambda k, v: v}, exc=lambda e: ("exc", type(e).__name__))
    assert k.discontinue_with(KeyError(), h) == ("exc", "KeyError")
    with pytest.raises(ContinuationAlreadyResumed):
        k.resume_with(1, h)


# --- threads ------------------------------------------------------------------------

def test_resume_from_other_thread_raises_wrong_thread():
    box = []
    Handler(on={Yield: lambda k, v: box.append(k)}).run(lambda: perform(Yield, 0))
    errors = []

    def other():
        try:
            box[0].resume(1)
        except WrongThread as e:
            errors.append(e)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1
    # the continuation is intact and still usable here
    assert box[0].resume(1) == 1


def test_threads_run_their_own_fibers_concurrently():
    results = {}
    barrier = threading.Barrier(4)

    def worker(n):
        barrier.wait()

        def body():
            total = 0
            for i in range(2000):
                total += perform(Get)
                perform(Put, i)
            return total
        results[n] = state(body, n)
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(4):
        assert results[n] == (n + sum(range(1999)), 1999)


# --- contextvars ----------------------------------------------------------------------

def test_fiber_runs_in_a_copy_of_the_starting_context():
    var = contextvars.ContextVar("kina_test_var", default="unset")
    var.set("outer")

    def body():
        seen = var.get()
        var.set("inner")
        perform(Yield, 0)
        return seen, var.get()
    assert Handler(on={Yield: lambda k, v: k.resume(None)}).run(body) == ("outer", "inner")
    assert var.get() == "outer"


# --- depth and long runs ----------------------------------------------------------

E = Effect("test.evenodd")


def even(n):
    if n == 0:
        return True
    return Handler(on={E: lambda k: None}).run(odd, n - 1)


def odd(n):
    if n == 0:
        return False
    return even(n - 1)


@pytest.mark.slow
def test_evenodd_100000_nested_handlers():
    assert even(100_000) is True
    assert odd(20_001) is True


@pytest.mark.slow
def test_evenodd_with_handlers_without_control_clauses():
    """run() of a handler with no 'on' clause is in place, yet must nest 100,000 deep."""
    def ev(n):
        return True if n == 0 else Handler(exc=lambda e: e).run(od, n - 1)

    def od(n):
        return False if n == 0 else ev(n - 1)
    assert ev(100_000) is True


def test_tail_resumes_run_in_constant_stack():
    def body():
        for _ in range(20_000):
            perform(Get)
        return "ok"
    assert state(body, 0) == ("ok", 0)


def test_scheduler_tail_resumes_through_helpers():
    """OCaml's sched.ml shape: clauses enqueue k and ``return dequeue()``."""
    from collections import deque
    q = deque()
    out = []

    def dequeue():
        if q:
            return q.popleft().resume(None)
        return None

    def yield_clause(k, _):
        q.append(k)
        return dequeue()

    def fork_clause(k, f):
        q.append(k)
        return spawn(f)

    def spawn(f):
        return Handler(on={Yield: yield_clause, Fork: fork_clause}, ret=lambda v: dequeue()).run(f)

    def task(name, n):
        def run():
            for i in range(n):
                out.append((name, i))
                perform(Yield, None)
        return run

    def main():
        perform(Fork, task("a", 5000))
        perform(Fork, task("b", 5000))
    spawn(main)
    assert len(out) == 10000
    assert out[:4] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert [x for x in out if x[0] == "b"] == [("b", i) for i in range(5000)]


Fork = Effect("test.fork")


def test_deep_non_tail_resumes_complete():
    """Non-tail resumes nest like OCaml's (memory, not a RecursionError)."""
    def clause(k):
        v = k.resume(1)
        return v + 0                      # not a tail resume: the clause waits
    h = Handler(on={Get: clause})

    def body():
        return sum(perform(Get) for _ in range(20_000))
    assert h.run(body) == 20_000


def test_runaway_recursion_inside_a_fiber_is_a_recursion_error():
    def runaway(n):
        return runaway(n + 1) + 1
    h = Handler(on={Get: lambda k: k.resume(0)})
    with pytest.raises(RecursionError):
        h.run(runaway, 0)
    assert h.run(lambda: perform(Get) + 1) == 1


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow
def test_million_performs_keep_memory_flat():
    def body(n):
        for _ in range(n):
            perform(Put, perform(Get) + 1)
        return "ok"
    state(lambda: body(50_000), 0)
    gc.collect()
    before = _rss_mb()
    assert state(lambda: body(500_000), 0) == ("ok", 500_000)   # 1,000,000 performs
    gc.collect()
    assert _rss_mb() - before < 20


@pytest.mark.slow
def test_hundred_thousand_abandoned_fibers_keep_memory_flat():
    unwound = [0]

    def body():
        try:
            perform(Yield, 0)
        finally:
            unwound[0] += 1
    h = Handler(on={Yield: lambda k, v: None})
    for _ in range(5_000):
        h.run(body)
    gc.collect()
    before = _rss_mb()
    for _ in range(100_000):
        h.run(body)
    gc.collect()
    assert unwound[0] == 105_000
    assert _rss_mb() - before < 20


def test_continuation_dropped_on_another_thread_is_unwound_by_its_own():
    events = []
    box = []

    def body():
        try:
            perform(Yield, 0)
        finally:
            events.append(threading.get_ident())
    assert Handler(on={Yield: lambda k, v: box.append(k)}).run(body) is None
    t = threading.Thread(target=box.clear)      # the last reference dies there
    t.start()
    t.join()
    assert events == []                          # not runnable on that thread
    Handler(on={Get: lambda k: k.resume(0)}).run(lambda: perform(Get))   # next switch here
    assert events == [threading.get_ident()]


def test_perform_of_a_non_effect_is_a_type_error():
    with pytest.raises(TypeError):
        perform("not an effect")


def test_fun_clause_returning_forward_declines_without_recursion():
    from kina_fx import FORWARD
    seen = []
    with Handler(fun={Ask: lambda: "outer"}):
        with Handler(fun={Ask: lambda: seen.append("middle") or FORWARD}):
            assert perform(Ask) == "outer"
        handlers_ = [Handler(fun={Ask: lambda: FORWARD}) for _ in range(5000)]
        for h in handlers_:
            h.__enter__()
        try:
            assert perform(Ask) == "outer"        # 5,000 declines, no RecursionError
        finally:
            for h in reversed(handlers_):
                h.__exit__(None, None, None)
    assert seen == ["middle"]
    with Handler(fun={Ask: lambda: FORWARD}):
        with pytest.raises(Unhandled):
            perform(Ask)


def test_stepper_handler_has_a_repr():
    from kina_fx import Stepper
    assert "Handler" in repr(Stepper(lambda: 1)._handler)
    assert "test.yield" in repr(Stepper(lambda: 1, catch=[Yield])._handler)


# --- eager abort cleanup ------------------------------------------------------------

def test_abort_cleanup_runs_before_the_clause_exception_reaches_the_caller():
    events = []

    def body():
        try:
            perform(Ask)
        finally:
            events.append("finally")
            perform(Log, "cleanup")      # handled by the handler outside, as in the body

    def raising(k):
        raise ValueError("clause")
    logger = Handler(on={Log: lambda k, m: (events.append(("log", m)), k.resume(None))[1]})

    def caller():
        with pytest.raises(ValueError):
            Handler(on={Ask: raising}).run(body)
        events.append("caller sees ValueError")
    logger.run(caller)
    assert events == ["finally", ("log", "cleanup"), "caller sees ValueError"]


def test_abort_cleanup_runs_before_the_clause_result_and_under_the_same_handler():
    events = []

    class Resource:
        def __enter__(self):
            events.append("open")

        def __exit__(self, *exc):
            events.append(("close", exc[0].__name__))
            events.append(("logged by the same handler", perform(Log, "closing")))

    def body():
        with Resource():
            perform(Ask)
            events.append("never")
    h = Handler(on={Ask: lambda k: "early exit", Log: lambda k, m: k.resume(m.upper())})
    assert h.run(body) == "early exit"
    assert events == ["open", ("close", "Unwind"), ("logged by the same handler", "CLOSING")]


def test_a_kept_continuation_is_not_aborted():
    events = []
    queue = []

    def body():
        try:
            return perform(Ask) + 1
        finally:
            events.append("finally")
    assert Handler(on={Ask: lambda k: queue.append(k) or "suspended"}).run(body) == "suspended"
    assert events == []
    assert queue.pop().resume(41) == 42 and events == ["finally"]


def test_abort_unwinds_nested_handlers_innermost_first_with_their_clauses():
    events = []
    inner = Handler(on={Log: lambda k, m: (events.append(("inner log", m)), k.resume(None))[1]})

    def innermost():
        try:
            perform(Ask)
        finally:
            events.append("innermost finally")
            perform(Log, "from innermost")    # the inner handler is still installed

    def middle():
        try:
            return inner.run(innermost)
        finally:
            events.append("middle finally")
    assert Handler(on={Ask: lambda k: "aborted"}).run(middle) == "aborted"
    assert events == ["innermost finally", ("inner log", "from innermost"), "middle finally"]


def test_cleanup_exception_wins_with_the_clause_exception_as_context():
    def body():
        try:
            perform(Ask)
        finally:
            raise KeyError("cleanup")

    def raising(k):
        raise ValueError("clause")
    with pytest.raises(KeyError) as info:
        Handler(on={Ask: raising}).run(body)
    assert isinstance(info.value.__context__, ValueError)
    # a clause that returns: the cleanup's exception replaces the result
    with pytest.raises(KeyError):
        Handler(on={Ask: lambda k: "result"}).run(body)


def test_the_aborted_body_sees_unwind_which_exc_clauses_do_not_catch():
    seen = []
    inner = Handler(exc=lambda e: seen.append(("exc clause", e)) or "swallowed",
                    on={Log: lambda k, m: k.resume(None)})

    def body():
        try:
            perform(Ask)
        except BaseException as e:
            seen.append(type(e))
            raise
    assert Handler(on={Ask: lambda k: "out"}).run(lambda: inner.run(body)) == "out"
    assert seen == [fibers.Unwind]


def test_a_body_that_swallows_the_abort_has_its_value_discarded():
    rets = []

    def body():
        try:
            perform(Ask)
        except BaseException:
            return "swallowed"
    h = Handler(on={Ask: lambda k: "clause result"}, ret=lambda v: rets.append(v) or v)
    assert h.run(body) == "clause result"
    assert rets == ["swallowed"]      # ret saw it; the handler's result is the clause's


def test_shallow_abort_runs_the_cleanup_under_the_same_handler():
    events = []

    def body(_):
        try:
            perform(Ask)
        finally:
            events.append(("cleanup got", perform(Log, "x")))
    h = Handler(on={Ask: lambda k: "stopped", Log: lambda k, m: k.resume_with(m * 2, h)})
    assert fiber(body).resume_with(None, h) == "stopped"
    assert events == [("cleanup got", "xx")]


def test_continuation_referenced_by_the_clause_exception_is_kept():
    events = []

    class Carrier(Exception):
        pass

    def body():
        try:
            return perform(Ask)
        finally:
            events.append("finally")

    def raising(k):
        raise Carrier(k)
    with pytest.raises(Carrier) as info:
        Handler(on={Ask: raising}).run(body)
    assert events == []                       # the exception holds k: kept
    assert info.value.args[0].resume(7) == 7 and events == ["finally"]


def test_bound_resume_passed_to_a_helper_that_raises_is_not_a_keeper():
    events = []
    kept = []

    def body():
        try:
            return perform(Ask)
        finally:
            events.append("finally")

    def helper(resume, keep):
        if keep:
            kept.append(resume)
        raise ValueError

    for keep in (False, True):
        with pytest.raises(ValueError):
            Handler(on={Ask: lambda k: helper(k.resume, keep)}).run(body)
        events.append(("caller", keep))
    assert events == ["finally", ("caller", False), ("caller", True)]
    assert kept[0](5) == 5 and events[-1] == "finally"     # the kept one still resumes
