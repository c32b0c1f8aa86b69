"""kina_fx.distributed: collective latency by message size, and the data-parallel MLP step.

    .venv/bin/python benches/bench_distributed.py [--ranks 2 4] [--rounds R] [--steps S] [--json OUT]

1. ``all_reduce`` of float32 messages from 4 B to 4 MB under ``mpiexec -n N``:
   mpi4py's blocking ``Allreduce`` (the baseline: what a hand-written MPI program
   pays) against ``dist.all_reduce`` with the default group (checked calls,
   polled with a timeout), without the check (``check=False``), and without
   the check or the timeout (``timeout=None``: blocking MPI calls).  The
   variants are interleaved round by round; medians in microseconds and ratios
   to the baseline, as rank 0 measures them after a barrier.
2. The data-parallel digits MLP step (kina_fx/demos/distributed.py) on 1, 2 and
   4 processes, Python and compiled forward: median step time and the share of
   it spent in the gradient all-reduce (the slowest rank's, every step), over
   ``--runs`` launches.

These machines have 2 cores shared with other jobs: 4 processes oversubscribe
them, and what the communication share measures there is mostly waiting for
the slowest process.  docs/distributed.md reads the figures and projects them
to a cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = (1, 256, 9610, 65536, 1048576)      # float32 elements; 9610 = the MLP's parameters


def collectives_worker(rounds):
    from mpi4py import MPI

    from kina_fx import distributed as dist

    comm = MPI.COMM_WORLD
    groups = {"checked (default)": dist.MPIGroup(), "check=False": dist.MPIGroup(check=False),
              "check=False, timeout=None": dist.MPIGroup(check=False, timeout=None)}
    results = {}
    for size in SIZES:
        x = np.ones(size, np.float32)
        y = np.empty_like(x)
        reps = max(5, min(200, 2_000_000 // (size * 4 + 1000)))
        variants = {"mpi4py Allreduce": lambda: comm.Allreduce(x, y)}
        for name, group in groups.items():
            variants[name] = lambda group=group: dist.all_reduce(x, "sum", group)
        times = {name: [] for name in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[name].append((time.perf_counter() - start) / reps * 1e6)
        results[size] = {name: statistics.median(t) for name, t in times.items()}
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "allreduce_us": results}))


def launch_collectives(n, rounds):
    from kina_fx.demos.distributed import mpiexec

    cmd = [mpiexec(), "-n", str(n), sys.executable, __file__, "--worker", "--rounds", str(rounds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        collectives_worker(args.rounds)
        return 0
    from kina_fx import compiled
    from kina_fx.demos import distributed as demo

    if demo.mpiexec() is None:
        print("skipped: needs mpiexec and mpi4py (pip install 'kina_fx[mpi]')")
        return 0
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}; {os.cpu_count()} CPUs")
    report = {"collectives": {}, "steps": {}}
    for n in args.ranks:
        res = launch_collectives(n, args.rounds)["allreduce_us"]
        report["collectives"][n] = res
        print(f"\nall_reduce, {n} processes: median microseconds (ratio to mpi4py Allreduce)")
        names = list(next(iter(res.values())))
        print(f"{'float32 elements':>16} " + " ".join(f"{name:>26}" for name in names))
        for size, row in res.items():
            base = row["mpi4py Allreduce"]
            print(f"{int(size):>16} " + " ".join(f"{row[k]:>17.1f} ({row[k] / base:4.2f}x)" for k in names))
    models = list(demo.MODELS) if not compiled.missing_mlir_tools() else ["python"]
    runs = {n: [demo.launch(n, models, args.steps) for _ in range(args.runs)] for n in (1, 2, 4)}
    print(f"\ndata-parallel MLP step (64-128-10, global batch 64, {args.steps} steps, {args.runs} runs; "
          "median over steps after the first 5, then median [min-max] over runs)")
    print(f"{'model':>9} {'N':>2} {'step ms':>22} {'all-reduce ms':>22} {'share':>6}")
    for model in models:
        for n, launches in runs.items():
            rows = [row for launch in launches for row in demo.summary({n: launch}) if row[0] == model]
            step = [r[2] for r in rows]
            comm = [r[3] for r in rows]
            share = statistics.median(r[4] for r in rows)
            report["steps"].setdefault(model, {})[n] = {"step_ms": step, "comm_ms": comm, "share": share}
            print(f"{model:>9} {n:>2} {statistics.median(step):8.2f} [{min(step):5.2f}-{max(step):6.2f}] "
                  f"{statistics.median(comm):8.2f} [{min(comm):5.2f}-{max(comm):6.2f}] {share:6.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
