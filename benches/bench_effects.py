"""Effects runtime benchmarks: each result is a ratio against a baseline timed in the same run.

    python benches/bench_effects.py            # prints a Markdown table

Baselines: a plain Python call, a raw greenlet switch round trip driven from
Python, and creating plus finishing a raw greenlet.  Medians of several repeats
(the machine is noisy); benches/callgrind_perform.py counts instructions.
"""
from __future__ import annotations

import statistics
import sys
import time

from greenlet import getcurrent, greenlet

from kina_fx import Effect, Handler, perform

N = 20000
REPEATS = 7


def per_op(fn, n=N, repeats=REPEATS):
    """Median seconds per operation of ``fn(n)``, which performs n operations."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


# --- baselines --------------------------------------------------------------

def plain_call(n):
    def f(x):
        return x
    for i in range(n):
        f(i)


def raw_switch_round_trip(n):
    main = getcurrent()

    def child():
        while True:
            main.switch()
    g = greenlet(child)
    for _ in range(n):
        g.switch()


def raw_greenlet_create_finish(n):
    def body():
        return 1
    for _ in range(n):
        greenlet(body).switch()


# --- kina_fx ----------------------------------------------------------------

E = Effect("bench.e")
OTHER = [Effect(f"bench.other{i}") for i in range(8)]


def fun_perform(n):
    with Handler(fun={E: lambda x: x}):
        for i in range(n):
            perform(E, i)


def on_perform_resume(n):
    """The tail pattern: the clause resumes in tail position."""
    def body():
        for i in range(n):
            perform(E, i)
    Handler(on={E: lambda k, x: k.resume(x)}).run(body)


def on_generator(n):
    """The generator pattern: the clause returns k; a loop outside resumes it."""
    def body():
        for i in range(n):
            perform(E, i)
    step = Handler(on={E: lambda k, x: k}).run(body)
    while step is not None:
        step = step.resume(None)


def handler_run_trivial(n):
    h = Handler(on={E: lambda k, x: k.resume(x)})

    def body():
        return 1
    for _ in range(n):
        h.run(body)


def abort_run(n):
    # A clause that returns without resuming: the body's cleanup runs before
    # run() returns (docs/effects.md, "Abort cleanup").
    h = Handler(on={E: lambda k, x: x})

    def body():
        try:
            perform(E, 1)
        finally:
            pass
    for _ in range(n):
        h.run(body)


def forwarding(levels):
    def bench(n):
        def body():
            for i in range(n):
                perform(E, i)
        with Handler(fun={E: lambda x: x}):
            fn = body
            for eff in OTHER[:levels]:
                fn = (lambda inner, eff: lambda: Handler(fun={eff: lambda *a: None}).run(inner))(fn, eff)
            fn()
    return bench


def main():
    call = per_op(plain_call, N * 10)
    switch = per_op(raw_switch_round_trip)
    create = per_op(raw_greenlet_create_finish, N // 4)
    rows = []
    fun = per_op(fun_perform)
    rows.append(("`fun` perform vs plain call", fun, call, 2.0))
    on = per_op(on_perform_resume)
    rows.append(("`on` tail pattern (`return k.resume(x)`) vs raw greenlet round trip", on, switch, 1.3))
    gen = per_op(on_generator)
    rows.append(("`on` generator pattern (clause returns k) vs raw greenlet round trip", gen, switch, 1.5))
    run = per_op(handler_run_trivial, N // 4)
    rows.append(("`Handler.run` of a trivial body vs greenlet create+finish", run, create, None))
    abort = per_op(abort_run, N // 4)
    rows.append(("`Handler.run` of a body whose clause aborts it vs greenlet create+finish",
                 abort, create, None))
    base_fwd = per_op(forwarding(0))
    fwd = {lv: per_op(forwarding(lv)) for lv in (1, 2, 4, 8)}
    print(f"Python {sys.version.split()[0]}; medians of {REPEATS} runs\n")
    print("| benchmark | kina_fx | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    for name, ours, base, target in rows:
        tgt = f"<= {target}x" if target else "-"
        ok = "" if target is None else (" (met)" if ours / base <= target else " (missed)")
        print(f"| {name} | {ours*1e9:.0f} ns | {base*1e9:.0f} ns | {ours/base:.2f}x | {tgt}{ok} |")
    print()
    print("| forwarding through N non-matching handlers | per perform | extra per level |")
    print("|---|---|---|")
    print(f"| 0 | {base_fwd*1e9:.0f} ns | - |")
    for lv, t in fwd.items():
        print(f"| {lv} | {t*1e9:.0f} ns | {(t-base_fwd)/lv*1e9:.0f} ns |")


if __name__ == "__main__":
    main()
