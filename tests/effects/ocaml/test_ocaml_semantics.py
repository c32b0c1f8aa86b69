"""The semantics the OCaml ports rely on, checked directly.

The mapping from OCaml to kina_fx these ports use: tests/support/ocaml.py.
"""
from __future__ import annotations

import gc
import threading

import pytest
from greenlet import GreenletExit

from kina_fx import ContinuationAlreadyResumed, Handler, Unhandled, fiber, perform
from support.ocaml import failwith, fresh, in_own_thread


# =============================================================================
# Semantics the ports above rely on, checked directly
# =============================================================================

def test_effect_syntax_test6_unhandled_carries_the_effect():
    E, F = fresh("es6.E"), fresh("es6.F")
    ok = {"ok1": False, "ok2": True, "ok3": False}

    def f(e, key):
        try:
            perform(e)
        except Unhandled as u:
            if u.effect is not E:
                raise
            ok[key] = not ok[key]

    f(E, "ok1")
    try:
        f(F, "ok2")
    except Unhandled:
        pass
    Handler(on={F: lambda k: failwith("assert false")}).run(f, E, "ok3")
    assert ok == {"ok1": True, "ok2": True, "ok3": True}


def test_when_test_continue_in_guard_then_again():
    # effect-syntax/when_test.ml: `effect E, k when (continue k (); false)` then
    # `effect E, k' -> continue k' ()`: the same continuation twice.
    E = fresh("when_test.E")

    def clause(k):
        k.resume(None)  # the guard
        return k.resume(None)

    with pytest.raises(ContinuationAlreadyResumed):
        Handler(on={E: clause}).run(perform, E)


@pytest.mark.parametrize("style", ["map-lambda", "map-bound-method", "sorted-key"])
def test_clause_resumes_through_a_c_function(style):
    # OCaml: `List.map (continue k) [v]` in a handler clause.
    E = fresh("cfun.E")
    finished = []

    def body():
        r = perform(E, 1) + 10
        finished.append(r)
        return r

    clauses = {
        "map-lambda": lambda k, v: list(map(lambda x: k.resume(x), [v])),
        "map-bound-method": lambda k, v: list(map(k.resume, [v])),
        "sorted-key": lambda k, v: sorted([v], key=k.resume),
    }
    r = in_own_thread(lambda: Handler(on={E: clauses[style]}).run(body))
    assert finished == [11]
    assert r == ([1] if style == "sorted-key" else [11])


def test_ret_and_exc_clauses_run_outside_their_handler():
    # OCaml: retc / exnc run after the handler's fiber is gone, so an effect they
    # perform goes to the handlers outside, never to the same handler.
    E = fresh("retexc.E")
    outer = Handler(on={E: lambda k: k.resume("outer")})
    inner_ret = Handler(on={E: lambda k: "inner (wrong)"}, ret=lambda v: perform(E))
    inner_exc = Handler(on={E: lambda k: "inner (wrong)"}, exc=lambda e: perform(E))
    assert outer.run(lambda: inner_ret.run(lambda: 1)) == "outer"
    assert outer.run(lambda: inner_exc.run(lambda: 1 / 0)) == "outer"
    # Shallow: the same for the handler given to continue_with.
    assert outer.run(lambda: fiber(lambda _: 1).resume_with(None, inner_ret)) == "outer"
    assert outer.run(lambda: fiber(lambda _: 1 / 0).resume_with(None, inner_exc)) == "outer"


def test_discontinue_with_unstarted_fiber():
    # Effect.Shallow.discontinue_with (fiber f) e h: f never runs, h's exnc sees e.
    ran = []
    k = fiber(ran.append)
    r = k.discontinue_with(KeyError("x"), Handler(exc=lambda e: ("exnc", repr(e))))
    assert r == ("exnc", "KeyError('x')") and ran == []
    with pytest.raises(ContinuationAlreadyResumed):
        k.resume_with(1, Handler())


def test_tutorial_collect_long_non_tail_chain():
    # tutorial.ml's `collect` (s ^ continue k ()) over 20_000 prints: 20_000
    # nested non-tail resumes.
    Print = fresh("tutorial_long.Print")

    def many():
        for i in range(20_000):
            perform(Print, "x" if i % 2 else "y")

    r = Handler(on={Print: lambda k, s: s + k.resume(None)}, ret=lambda _: "").run(many)
    assert r == "yx" * 10_000


def test_resumed_continuation_sees_the_resumers_handlers():
    # Deep semantics: the effects a resumed continuation does not handle itself
    # go to the handlers of whoever resumes it, not of whoever captured it.
    Y, Log = fresh("ctx.Y"), fresh("ctx.Log")

    def body():
        perform(Y, 1)
        return perform(Log, "hello")

    def capture():
        capturer = Handler(on={Log: lambda k, s: k.resume("capturer (wrong)")})
        return capturer.run(lambda: Handler(on={Y: lambda k, v: k}).run(body))

    k = capture()
    assert Handler(on={Log: lambda k, s: k.resume("resumer")}).run(k.resume, None) == "resumer"
    k = capture()
    with Handler(fun={Log: lambda s: "resumer fun"}):
        assert k.resume(None) == "resumer fun"
    k = capture()
    with pytest.raises(Unhandled):
        k.resume(None)


def test_abandoned_inverted_iterator_is_unwound():
    # The manual's `invert`: a consumer that stops early drops the continuation;
    # the producer's finally block runs (OCaml leaks it unless discontinued).
    Y = fresh("abandon.Y")
    log = []

    def producer(f):
        try:
            for i in range(5):
                f(i)
        finally:
            log.append("producer finally")

    seq = lambda: Handler(ret=lambda _: None,  # noqa: E731
                          on={Y: lambda k, v: (v, lambda: k.resume(None))}
                          ).run(producer, lambda v: perform(Y, v))
    node = seq()
    node = node[1]()
    assert node[0] == 1 and log == []
    del node
    gc.collect()
    assert log == ["producer finally"]


def test_schedulers_in_several_threads():
    # Each OS thread runs its own sched.ml-style scheduler at the same time.
    def program(n):
        Fork, Yield = fresh("threads.Fork"), fresh("threads.Yield")
        q, count = [], [0]

        def dequeue(*_):
            return q.pop(0).resume(None) if q else "done"

        def on_yield(k):
            q.append(k)
            return dequeue()

        def on_fork(k, f):
            q.append(k)
            return spawn(f)

        def spawn(f):
            return Handler(ret=dequeue, on={Yield: on_yield, Fork: on_fork}).run(f)

        def worker():
            for _ in range(n):
                count[0] += 1
                perform(Yield)

        return spawn(lambda: [perform(Fork, worker) for _ in range(3)]), count[0]

    results = [None] * 4

    def target(i):
        results[i] = program(2_000)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [("done", 6_000)] * 4


@pytest.mark.parametrize("how", ["raised-by-body", "discontinue"])
def test_greenlet_exit_escaping_a_body_propagates_like_any_base_exception(how):
    # OCaml: any exception escaping the body propagates through match_with.  In
    # kina_fx BaseExceptions skip `exc` (as KeyboardInterrupt and SystemExit do,
    # and they work) and must leave the runtime usable.
    E = fresh("gexit.E")

    def scenario():
        log = []

        def body():
            try:
                if how == "raised-by-body":
                    raise GreenletExit("from body")
                perform(E)
            finally:
                log.append("finally")

        clause = (lambda k: None) if how == "raised-by-body" else \
            (lambda k: k.discontinue(GreenletExit("thrown in")))
        try:
            Handler(on={E: clause}, exc=lambda e: log.append("exc (wrong)")).run(body)
        except BaseException as e:  # noqa: BLE001
            log.append(type(e).__name__)
        after = Handler(on={E: lambda k: k.resume(5)}).run(lambda: perform(E) + 1)
        return log, after

    assert in_own_thread(scenario) == (["finally", "GreenletExit"], 6)


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_skip_exc_and_propagate(exc_type):
    E = fresh("baseexc.E")
    log = []

    def body():
        try:
            perform(E)
        finally:
            log.append("finally")

    with pytest.raises(exc_type):
        Handler(on={E: lambda k: k.discontinue(exc_type())},
                exc=lambda e: log.append("exc (wrong)")).run(body)
    assert log == ["finally"]
    assert Handler(on={E: lambda k: k.resume(5)}).run(lambda: perform(E) + 1) == 6
