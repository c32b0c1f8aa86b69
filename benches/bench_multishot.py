"""Multi-shot continuations: kina_fx.multishot (replay) against aleff (frame
snapshots), the same programs timed in the same run.

    python3.12 -m venv /tmp/ms312 && /tmp/ms312/bin/pip install -e . aleff
    /tmp/ms312/bin/python benches/bench_multishot.py     # prints Markdown tables

aleff is a benchmark-only dependency (CPython >= 3.12); without it only the
kina_fx column is printed.  Each program's answer is checked against a plain
solver before it is timed; "wrong" means the library's answer differs.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time

from kina_fx import Effect, perform
from kina_fx.multishot import MultiHandler

if "--measure" in sys.argv and "aleff" in sys.argv:
    try:
        import aleff
    except ImportError:
        aleff = None
else:
    aleff = None       # never imported where kina_fx is timed (see main)

REPEATS = 5


def median_time(fn, repeats=REPEATS):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- the programs, written once against a choose/fail pair ---------------------

def queens(choose, fail, n):
    placed = []
    for row in range(n):
        col = choose(range(n))
        if any(c == col or abs(c - col) == row - r for r, c in enumerate(placed)):
            fail()
        placed.append(col)
    return tuple(placed)


def queens_plain(n, placed=()):
    if len(placed) == n:
        return [placed]
    row = len(placed)
    return [s for col in range(n)
            if not any(c == col or abs(c - col) == row - r for r, c in enumerate(placed))
            for s in queens_plain(n, placed + (col,))]


GIRLS = ("betty", "ethel", "joan", "kitty", "mary")


def liars(choose, fail):
    p = {}
    for girl in GIRLS:
        place = choose(range(1, 6))
        if place in p.values():
            fail()
        p[girl] = place
    claims = [(p["kitty"] == 2, p["betty"] == 3), (p["ethel"] == 1, p["joan"] == 2),
              (p["joan"] == 3, p["ethel"] == 5), (p["kitty"] == 2, p["mary"] == 4),
              (p["mary"] == 4, p["betty"] == 1)]
    if not all(a != b for a, b in claims):
        fail()
    return tuple(p[g] for g in GIRLS)


def _liars_brute():
    out = []
    for perm in itertools.permutations(range(1, 6)):
        it = iter(perm)

        class Reject(Exception):
            pass

        def fail():
            raise Reject
        try:
            out.append(liars(lambda xs: next(it), fail))
        except Reject:
            pass
    return out


def sorted_key(choose, fail):
    return sorted([3, 1, 2], key=lambda x: x * choose([1, -1]))


def sorted_key_plain():
    out = []
    for signs in itertools.product([1, -1], repeat=3):
        it = iter(signs)
        out.append(sorted([3, 1, 2], key=lambda x: x * next(it)))
    return out


def map_list(choose, fail):
    return list(map(lambda x: x + choose([0, 10]), [1, 2, 3]))


def map_list_plain():
    return [[1 + a, 2 + b, 3 + c] for a, b, c in itertools.product([0, 10], repeat=3)]


# Recursive variants with immutable state, returning the list of their
# solutions themselves: the style aleff's frame snapshots need (a loop's
# iterator, a list mutated in the body, a cell captured by a closure are
# shared between its shots, and so is the frame that wraps the body's value).

def queens_rec(choose, fail, n, placed=()):
    if len(placed) == n:
        return [placed]          # the list of solutions of this branch
    col = choose(range(n))
    if attacked(placed, col):
        fail()
    return queens_rec(choose, fail, n, placed + (col,))


def attacked(placed, col):
    # A plain loop in a helper: a generator expression here would capture
    # ``col`` in a cell, which aleff's shots share (each sees the last value).
    row = len(placed)
    for r, c in enumerate(placed):
        if c == col or abs(c - col) == row - r:
            return True
    return False


def liars_rec(choose, fail, girls=GIRLS, places=()):
    if len(places) < len(girls):
        place = choose(range(1, 6))
        if place in places:
            fail()
        return liars_rec(choose, fail, girls, places + (place,))
    p = dict(zip(girls, places))
    claims = [(p["kitty"] == 2, p["betty"] == 3), (p["ethel"] == 1, p["joan"] == 2),
              (p["joan"] == 3, p["ethel"] == 5), (p["kitty"] == 2, p["mary"] == 4),
              (p["mary"] == 4, p["betty"] == 1)]
    for a, b in claims:
        if a == b:
            fail()
    return [places]


PROGRAMS = [
    ("N-queens n=6, loops", lambda c, f: queens(c, f, 6), lambda: queens_plain(6), False),
    ("N-queens n=8, loops", lambda c, f: queens(c, f, 8), lambda: queens_plain(8), False),
    ("SICP 4.42 liars puzzle, loops", liars, _liars_brute, False),
    ("N-queens n=6, recursive", lambda c, f: queens_rec(c, f, 6), lambda: queens_plain(6), True),
    ("N-queens n=8, recursive", lambda c, f: queens_rec(c, f, 8), lambda: queens_plain(8), True),
    ("SICP 4.42 liars puzzle, recursive", liars_rec, _liars_brute, True),
    ("choose inside sorted(key=...)", sorted_key, sorted_key_plain, False),
    ("choose inside list(map(...))", map_list, map_list_plain, False),
]


# --- kina_fx ----------------------------------------------------------------

Choose, Fail = Effect("bench.ms.choose"), Effect("bench.ms.fail")


def kina_all(program, wrapped):
    def every(k, xs):
        out = []
        for x in xs:
            out.extend(k.resume(x))
        return out
    h = MultiHandler(on={Choose: every, Fail: lambda k: []}, ret=None if wrapped else lambda v: [v])
    return lambda: h.run(program, lambda xs: perform(Choose, xs), lambda: perform(Fail))


# --- aleff ------------------------------------------------------------------

def aleff_all(program, wrapped):
    choose, fail = aleff.effect("choose"), aleff.effect("fail")
    h = aleff.create_handler(choose, fail)

    @h.on(choose)
    def _choose(k, xs):
        out = []
        for x in xs:
            out.extend(k(x))
        return out

    @h.on(fail)
    def _fail(k):
        return []
    if wrapped:
        return lambda: h(lambda: program(choose, fail))

    def body():
        # (``lambda: [program(...)]``, the form of aleff's README, gives wrong
        # answers once fail() aborts a shot: the list display's evaluation stack
        # is shared between shots.)
        value = program(choose, fail)
        return [value]
    return lambda: h(body)


def run_one(make, program, expected, wrapped):
    try:
        fn = make(program, wrapped)
        got = fn()
    except Exception as exc:                       # report, do not stop the table
        return f"fails: {type(exc).__name__}: {str(exc)[:60]}"
    if got != expected:
        return f"wrong ({len(got)} results, expected {len(expected)})"
    return median_time(fn)


def measure(lib):
    """Time every program with one library, in this process; print one JSON line."""
    import json
    make = kina_all if lib == "kina_fx" else aleff_all
    results = {}
    for name, program, plain, wrapped in PROGRAMS:
        results[name] = run_one(make, program, plain(), wrapped)
    print(json.dumps(results))


def main():
    # Each library is timed in its own process: importing aleff registers a
    # sys.monitoring tool that slows every C call of the interpreter (len() by
    # about 50x here), which would slow kina_fx's column too.
    import json
    import subprocess
    columns = {}
    for lib in ("kina_fx", "aleff"):
        proc = subprocess.run([sys.executable, __file__, "--measure", lib],
                              capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        columns[lib] = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
    try:
        import importlib.metadata as md
        aleff_version = md.version("aleff")
    except Exception:
        aleff_version = "not installed"
    print(f"Python {sys.version.split()[0]}; aleff {aleff_version}; medians of {REPEATS} runs\n")
    print("| program | kina_fx | aleff | kina_fx / aleff |")
    print("|---|---|---|---|")
    for name, *_ in PROGRAMS:
        ours = columns["kina_fx"].get(name, "-")
        theirs = columns["aleff"].get(name, "not installed")
        fmt = lambda t: f"{t * 1e3:.2f} ms" if isinstance(t, float) else t
        ratio = f"{ours / theirs:.2f}x" if isinstance(ours, float) and isinstance(theirs, float) else "-"
        print(f"| {name} | {fmt(ours)} | {fmt(theirs)} | {ratio} |")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        if sys.argv[2] == "aleff" and aleff is None:
            print("{}")
        else:
            measure(sys.argv[2])
    else:
        main()
