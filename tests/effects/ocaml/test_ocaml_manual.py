"""Ports of the examples of the OCaml manual's chapter "Effect handlers"
(``manual/src/refman/extensions/effects.etex``).

The mapping from OCaml to kina_fx these ports use: tests/support/ocaml.py.
"""
from __future__ import annotations

import gc
import sys

import pytest

from kina_fx import ContinuationAlreadyResumed, Handler, Unhandled, fiber, perform
from support.ocaml import Failure, Out, failwith, fresh, in_own_thread, reraise


# =============================================================================
# The OCaml manual, chapter "Effect handlers"
# =============================================================================

def test_manual_basics_xchg():
    Xchg = fresh("manual.Xchg")

    def comp1():
        return perform(Xchg, 0) + perform(Xchg, 1)

    assert Handler(on={Xchg: lambda k, n: k.resume(n + 1)}).run(comp1) == 3


def test_manual_concurrency_run_both():
    Xchg = fresh("manual.Xchg2")

    def comp1():
        return perform(Xchg, 0) + perform(Xchg, 1)

    def comp2():
        return perform(Xchg, 21) * perform(Xchg, 21)

    # status = ("Complete", v) | ("Suspended", msg, cont)
    def step(f):
        return lambda: Handler(ret=lambda v: ("Complete", v), exc=reraise,
                               on={Xchg: lambda cont, msg: ("Suspended", msg, cont)}).run(f)

    def run_both(a, b):
        while True:
            sa, sb = a(), b()
            if sa[0] == "Complete" and sb[0] == "Complete":
                return sa[1], sb[1]
            if sa[0] == "Suspended" and sb[0] == "Suspended":
                (_, m1, k1), (_, m2, k2) = sa, sb
                a = (lambda k1=k1, m2=m2: k1.resume(m2))
                b = (lambda k2=k2, m1=m1: k2.resume(m1))
                continue
            failwith("Improper synchronization")

    assert run_both(step(comp1), step(comp2)) == (42, 0)


class _ManualThreads:
    """The manual's round-robin scheduler with fork/yield/xchg (and the fixed
    dequeue that discontinues a blocked exchanger)."""

    class ImproperSynchronization(Exception):
        pass

    def __init__(self, out):
        self.out = out
        self.Fork = fresh("manual.Fork")
        self.Yield = fresh("manual.Yield")
        self.Xchg = fresh("manual.Xchg3")

    def fork(self, f):
        perform(self.Fork, f)

    def yield_(self):
        perform(self.Yield)

    def xchg(self, v):
        return perform(self.Xchg, v)

    def run(self, main):
        exchanger = [None]
        run_q = []

        def enqueue(k, v):
            run_q.append(lambda: k.resume(v))

        def dequeue(*_):
            if not run_q:
                if exchanger[0] is not None:
                    _n, k = exchanger[0]
                    exchanger[0] = None
                    return k.discontinue(self.ImproperSynchronization())
                return None
            return run_q.pop(0)()

        def exnc(e):
            self.out.line(type(e).__name__)
            return dequeue()

        def on_yield(k):
            enqueue(k, None)
            return dequeue()

        def on_fork(k, f):
            enqueue(k, None)
            return spawn(f)

        def on_xchg(k, n):
            if exchanger[0] is not None:
                n2, k2 = exchanger[0]
                exchanger[0] = None
                enqueue(k2, n)
                return k.resume(n2)
            exchanger[0] = (n, k)
            return dequeue()

        def spawn(f):
            return Handler(ret=dequeue, exc=exnc,
                           on={self.Yield: on_yield, self.Fork: on_fork,
                               self.Xchg: on_xchg}).run(f)

        return spawn(main)


def test_manual_user_level_threads():
    out = Out()
    th = _ManualThreads(out)

    def t1():
        out.line("[t1] Sending 0")
        v = th.xchg(0)
        out.line(f"[t1] received {v}")

    def t2():
        out.line("[t2] Sending 1")
        v = th.xchg(1)
        out.line(f"[t2] received {v}")

    th.run(lambda: (th.fork(t1), th.fork(t2)))
    assert out.text == ("[t1] Sending 0\n[t2] Sending 1\n"
                        "[t2] received 0\n[t1] received 1\n")


def test_manual_discontinue_blocked_exchanger_runs_finally():
    out = Out()
    th = _ManualThreads(out)

    def leaky_task():
        def task():
            out.line("open secret.txt")
            try:
                out.line(f"write {th.xchg(0)}")
            finally:
                out.line("close secret.txt")
        th.fork(task)

    th.run(leaky_task)
    assert out.text == "open secret.txt\nclose secret.txt\nImproperSynchronization\n"


def test_manual_leaky_scheduler_cleanup_that_performs():
    # The manual's first scheduler "can leak resources": a blocked exchanger is
    # never resumed.  In kina_fx the dropped continuation is aborted instead, so
    # the task's cleanup runs; here the cleanup performs the scheduler's Yield.
    # Per docs/effects.md ("Abort cleanup") the abort runs under the handler
    # whose clause dropped it, so that perform is handled by the scheduler like
    # any other, and the runtime stays usable.
    def scenario():
        Yield, Xchg = fresh("leaky.Yield"), fresh("leaky.Xchg")
        log, unraisable = [], []
        run_q = []

        def dequeue(*_):
            return run_q.pop(0)() if run_q else None

        def on_yield(k):
            run_q.append(lambda: k.resume(None))
            return dequeue()

        def on_xchg(k, n):
            return dequeue()  # no partner will ever come: k is dropped

        def task():
            try:
                perform(Xchg, 0)
            finally:
                try:
                    perform(Yield)
                except Unhandled:
                    log.append("cleanup: Yield unhandled while unwinding")
                else:
                    log.append("cleanup: Yield handled by the scheduler")

        old_hook = sys.unraisablehook
        sys.unraisablehook = lambda u: unraisable.append(repr(u.exc_value))
        try:
            Handler(ret=dequeue, on={Yield: on_yield, Xchg: on_xchg}).run(task)
            gc.collect()
        finally:
            sys.unraisablehook = old_hook
        after = Handler(on={Yield: lambda k: k.resume(5)}).run(lambda: perform(Yield))
        return log, unraisable, after

    assert in_own_thread(scenario) == (["cleanup: Yield handled by the scheduler"], [], 5)


def test_manual_leaky_scheduler_garbage_collected_at_any_allocation():
    # The manual's leaky scheduler leaves a blocked continuation in its data
    # structures; that garbage is cyclic, so the cycle collector frees it at an
    # arbitrary allocation.  Whatever the collector's timing (swept through
    # gc thresholds, each try in a fresh thread so the worker pool is empty),
    # an unrelated handler must run normally and the cleanup must run once.
    E, W = fresh("gcleak.E"), fresh("gcleak.W")

    def scenario(threshold):
        log = []

        def leak_a_blocked_task():
            blocked = []

            def task():
                try:
                    perform(W)
                finally:
                    log.append("unwound")

            h = Handler(on={W: lambda k: blocked.append(k)})
            blocked.append(h)  # cycle: blocked -> h -> clause -> blocked
            h.run(task)

        old = gc.get_threshold()
        gc.collect(1)  # young generations only: cheap, and resets the counters
        gc.set_threshold(threshold, 1000, 1000)
        try:
            leak_a_blocked_task()
            r = Handler(on={E: lambda k: k.resume(1)}).run(lambda: perform(E) + 1)
        except Exception as e:  # noqa: BLE001 - reported below
            r = repr(e)
        finally:
            gc.set_threshold(*old)
        gc.collect(1)
        return r, log

    bad = {}
    for threshold in range(1, 120):
        r, log = in_own_thread(scenario, threshold)
        if r != 2 or log != ["unwound"]:
            bad[threshold] = (r, log)
    assert bad == {}


def test_manual_control_inversion():
    def invert(iter_):
        Y = fresh("manual.invert.Yield")
        return lambda: Handler(ret=lambda _: None, exc=reraise,
                               on={Y: lambda k, v: (v, lambda: k.resume(None))}
                               ).run(iter_, lambda v: perform(Y, v))

    def to_dispenser(s):
        state = [s]

        def nxt():
            node = state[0]()
            if node is None:
                state[0] = lambda: None
                return None
            v, state[0] = node
            return v
        return nxt

    def lst_iter(f):
        for x in [1, 2, 3]:
            f(x)

    nxt = to_dispenser(invert(lst_iter))
    assert [nxt(), nxt(), nxt(), nxt()] == [1, 2, 3, None]

    def str_iter(f):
        for ch in "OCaml":
            f(ch)

    nxt = to_dispenser(invert(str_iter))
    assert [nxt() for _ in range(6)] == ["O", "C", "a", "m", "l", None]


def test_manual_nesting_and_unhandled():
    E = fresh("manual.E")
    F = fresh("manual.F")

    def foo():
        return perform(F)

    def bar():
        return Handler(on={E: lambda k: failwith("impossible")}).run(foo)

    def baz():
        return Handler(on={F: lambda k: k.resume("Hello, world!")}).run(bar)

    assert baz() == "Hello, world!"
    try:
        bar()
        r = None
    except Unhandled as u:
        assert u.effect is F
        r = "Saw Effect.Unhandled exception"
    assert r == "Saw Effect.Unhandled exception"


def test_manual_linear_continuations():
    Xchg = fresh("manual.Xchg4")
    with pytest.raises(ContinuationAlreadyResumed):
        Handler(on={Xchg: lambda k, n: k.resume(21) + k.resume(21)}).run(perform, Xchg, 0)


def test_manual_shallow_protocol():
    Send = fresh("manual.Send")
    Recv = fresh("manual.Recv")

    def run(comp):
        def loop_send(k, v):
            return k.resume_with(v, Handler(
                ret=lambda x: x, exc=reraise,
                on={Send: lambda k, n: loop_recv(n, k, None),
                    Recv: lambda k: failwith("protocol violation")}))

        def loop_recv(n, k, v):
            return k.resume_with(v, Handler(
                ret=lambda x: x, exc=reraise,
                on={Recv: lambda k: loop_send(k, n),
                    Send: lambda k, v: failwith("protocol violation")}))

        return loop_send(fiber(lambda _: comp()), None)

    out = Out()

    def good():
        out.line("Send 42")
        perform(Send, 42)
        out.line(f"Recv: {perform(Recv)}")
        out.line("Send 43")
        perform(Send, 43)
        out.line(f"Recv: {perform(Recv)}")

    run(good)
    assert out.text == "Send 42\nRecv: 42\nSend 43\nRecv: 43\n"

    out = Out()

    def bad():
        out.line("Send 0")
        perform(Send, 0)
        out.line("Send 1")
        perform(Send, 1)

    with pytest.raises(Failure, match="protocol violation"):
        run(bad)
    assert out.text == "Send 0\nSend 1\n"
