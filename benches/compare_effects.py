"""kina_fx against aleff on the rows of docs/effects.md's comparison table that
can be measured: speed of a one-shot round trip, depth limits, abort cleanup,
continuations across threads.

    python3.12 -m venv /tmp/cmp312 && /tmp/cmp312/bin/pip install -e . aleff
    /tmp/cmp312/bin/python benches/compare_effects.py     # prints a Markdown table

Each library runs in its own process (importing aleff slows every C call of the
interpreter; see benches/bench_multishot.py), probe by probe, so that a crash
or a hang of one probe is reported rather than taken for a result.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time

DEPTHS = (100, 300, 1000, 10_000, 100_000)
RUN_LENGTHS = (100, 1000, 10_000, 100_000, 1_000_000)


# --- one adapter per library ----------------------------------------------------
# Clauses are written once as ``clause(k, *args)`` and resume with
# ``lib.resume(k, value)``; each library gets them as its own clauses, unwrapped.

class Kina:
    name = "kina_fx"

    def __init__(self):
        from kina_fx import Effect, Handler, perform
        self.Effect, self.Handler, self.perform = Effect, Handler, perform

    def effect(self, name):
        return self.Effect(name)

    def run(self, clauses, body):
        return self.Handler(on=clauses).run(body)

    def do(self, effect, *args):
        return self.perform(effect, *args)

    @staticmethod
    def resume(k, value):
        return k.resume(value)


class Aleff:
    name = "aleff"

    def __init__(self):
        import aleff
        self.aleff = aleff

    def effect(self, name):
        return self.aleff.effect(name)

    def run(self, clauses, body):
        h = self.aleff.create_handler(*clauses)
        for e, fn in clauses.items():
            h.on(e)(fn)
        return h(body)

    def do(self, effect, *args):
        return effect(*args)

    @staticmethod
    def resume(k, value):
        return k(value)


# --- probes -------------------------------------------------------------------

def round_trip_ns(lib):
    # 100 performs per handled run (aleff stops with RecursionError after a few
    # hundred in one run), 200 runs, median of 5.
    e = lib.effect("cmp.rt")

    def body():
        for i in range(100):
            lib.do(e, i)
        return None
    clauses = {e: lambda k, x: lib.resume(k, x)}
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            lib.run(clauses, body)
        times.append((time.perf_counter() - t0) / 20_000)
    return round(statistics.median(times) * 1e9)


def nested_handlers(lib, depth):
    e = lib.effect("cmp.nest")

    def level(n):
        if n == 0:
            return 0
        return lib.run({e: lambda k: lib.resume(k, None)}, lambda: level(n - 1)) + 1
    return level(depth) == depth


def performs_in_one_run(lib, count):
    e = lib.effect("cmp.count")

    def body():
        total = 0
        for _ in range(count):
            total += lib.do(e)
        return total
    return lib.run({e: lambda k: lib.resume(k, 1)}, body) == count


def abort_cleanup(lib):
    """Does the body's finally run before the clause's exception reaches the
    caller, with its effects handled?"""
    ask, log = lib.effect("cmp.ask"), lib.effect("cmp.log")
    events = []

    def body():
        try:
            lib.do(ask)
        finally:
            events.append("finally")
            try:
                lib.do(log)
                events.append("effect in cleanup handled")
            except Exception as exc:
                events.append(f"effect in cleanup: {type(exc).__name__}")

    def clause(k):
        raise ValueError

    def outer_log(k):
        return lib.resume(k, None)
    try:
        lib.run({log: outer_log}, lambda: lib.run({ask: clause}, body))
    except ValueError:
        events.append("caller sees the exception")
    import gc
    gc.collect()
    return events


def other_thread(lib):
    e = lib.effect("cmp.thread")
    box = []
    lib.run({e: lambda k: box.append(k)}, lambda: lib.do(e))
    out = []
    t = threading.Thread(target=lambda: _try(lambda: lib.resume(box[0], 1), out))
    t.start()
    t.join()
    return out[0]


def _try(fn, out):
    try:
        fn()
        out.append("resumed")
    except BaseException as exc:
        out.append(type(exc).__name__)


PROBES = (["round_trip"] + [f"depth:{d}" for d in DEPTHS] + [f"run:{n}" for n in RUN_LENGTHS]
          + ["abort", "thread"])


def probe(lib, name):
    sys.setrecursionlimit(10_000)
    if name == "round_trip":
        return round_trip_ns(lib)
    if name.startswith("depth:"):
        return nested_handlers(lib, int(name.split(":")[1]))
    if name.startswith("run:"):
        return performs_in_one_run(lib, int(name.split(":")[1]))
    if name == "abort":
        return abort_cleanup(lib)
    return other_thread(lib)


def measure(lib_name, name):
    lib = Kina() if lib_name == "kina_fx" else Aleff()
    try:
        result = probe(lib, name)
    except BaseException as exc:
        result = f"{type(exc).__name__}"
    print(json.dumps(result), flush=True)


def main():
    results = {}
    for lib in ("kina_fx", "aleff"):
        for name in PROBES:
            key = (lib, name)
            if name.startswith(("depth:", "run:")):
                kind = name.split(":")[0]
                if any(results.get((lib, p)) not in (True, None) for p in PROBES
                       if p.startswith(kind + ":") and int(p.split(":")[1]) < int(name.split(":")[1])):
                    continue                  # a smaller one failed already
            try:
                proc = subprocess.run([sys.executable, __file__, "--measure", lib, name],
                                      capture_output=True, text=True, timeout=300)
                lines = proc.stdout.strip().splitlines()
                results[key] = json.loads(lines[-1]) if lines else f"crashed (exit {proc.returncode})"
            except subprocess.TimeoutExpired:
                results[key] = "timed out (300 s)"
    print(f"Python {sys.version.split()[0]}\n")
    print("| probe | kina_fx | aleff |")
    print("|---|---|---|")

    def show(lib, kind, values):
        ok = [v for v in values if results.get((lib, f"{kind}:{v}")) is True]
        bad = [(v, results.get((lib, f"{kind}:{v}"))) for v in values
               if results.get((lib, f"{kind}:{v}")) not in (True, None)]
        text = f"{max(ok):,} ok" if ok else "none ok"
        if bad:
            text += f"; {bad[0][0]:,}: {bad[0][1]}"
        return text
    print(f"| `on` perform + resume, one-shot | {results[('kina_fx', 'round_trip')]} ns "
          f"| {results.get(('aleff', 'round_trip'))} ns |")
    print(f"| nested handlers (tried {', '.join(f'{d:,}' for d in DEPTHS)}) | "
          f"{show('kina_fx', 'depth', DEPTHS)} | {show('aleff', 'depth', DEPTHS)} |")
    print(f"| performs in one handled run (tried {', '.join(f'{n:,}' for n in RUN_LENGTHS)}) | "
          f"{show('kina_fx', 'run', RUN_LENGTHS)} | {show('aleff', 'run', RUN_LENGTHS)} |")
    print(f"| clause raises: events in order | {results[('kina_fx', 'abort')]} | {results.get(('aleff', 'abort'))} |")
    print(f"| continuation resumed from another thread | {results[('kina_fx', 'thread')]} | "
          f"{results.get(('aleff', 'thread'))} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3])
    else:
        main()
