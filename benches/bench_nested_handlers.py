"""Time and memory of N really nested handlers (docs/effects.md, "Depth, stack and memory").

    python benches/bench_nested_handlers.py [--runs 3] [N ...]      # default N: 50000 100000

Each level installs one handler with an ``on`` clause (so each is a fiber of
its own) and runs the next level inside it: N levels are N handlers alive at
once, all waiting.  OCaml's ``evenodd`` (tests/effects/test_effects.py) installs a
handler on every *other* level, so evenodd at 100,000 is 50,000 handlers --
the first column of the table.  Each run is a fresh process; it reports the
wall time of building and unwinding the nest, and the growth of the resident
set size (RSS: /proc/self/statm at the deepest point minus before; and the
peak, ru_maxrss, minus the RSS before).  Medians of ``--runs`` runs, for the
compiled perform and the pure-Python one (KINA_FX_PURE_PYTHON=1).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def handlers_around_here() -> int:
    """How many control handlers enclose the running code (one fiber each)."""
    from kina_fx import fibers

    fiber, count = fibers.current(), 0
    while fiber is not None and fiber.handler is not None:
        count, fiber = count + 1, fiber.parent
    return count


def child(n: int) -> dict:
    from kina_fx import Effect, Handler

    unused = Effect("bench.nested.unused")
    deepest = []

    def nest(level):
        if level == 0:
            deepest.append(_rss_bytes())
            assert handlers_around_here() == n, "the nest is not n handlers deep"
            return 0
        return Handler(on={unused: lambda k: None}).run(nest, level - 1) + 1

    before = _rss_bytes()
    start = time.perf_counter()
    assert nest(n) == n
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "rss_growth_mb": (deepest[0] - before) / 2**20,
            "peak_growth_mb": (peak - before) / 2**20}


def run(n: int, pure: bool, runs: int) -> dict:
    env = dict(os.environ)
    env.pop("KINA_FX_PURE_PYTHON", None)
    if pure:
        env["KINA_FX_PURE_PYTHON"] = "1"
    results = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], env=env,
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[50_000, 100_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    print(f"Python {sys.version.split()[0]}, median of {args.runs} runs, one process each\n")
    print("| nested handlers | perform | time (s) | RSS growth at the deepest point (MB) | peak RSS growth (MB) |")
    print("|---:|---|---:|---:|---:|")
    for n in args.sizes:
        for pure in (False, True):
            r = run(n, pure, args.runs)
            print(f"| {n:,} | {'pure Python' if pure else 'compiled'} | {r['seconds']:.2f} | "
                  f"{r['rss_growth_mb']:.0f} | {r['peak_growth_mb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
