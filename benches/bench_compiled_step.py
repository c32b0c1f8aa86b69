"""One training step (loss and gradients) of a 784-256-10 MLP, three ways, same run, at several batch sizes.

    OMP_NUM_THREADS=1 .venv/bin/python benches/bench_compiled_step.py \\
        [--batches 16,64,256] [--rounds 60] [--runs 3] [--clock cpu|wall] [--demo-epochs 3] [--json OUT]

1. compiled + tape: ``ad.value_and_grad`` of a Python function that calls
   ``_mlir_ciface_mlp_loss`` (kina_fx/examples/mlp.mlir compiled with
   mlir-opt-19 / mlir-translate-19 / clang-19; every tensor op a runtime call),
   the tape recording the runtime ops the compiled code performs;
2. Python autograd: the same network written with kina_fx.autograd;
3. NumPy by hand: forward and hand-written backward (the baseline).

The three agree on the loss and the gradients before anything is timed.
They are interleaved round by round; a run's figure is each contestant's
median over its rounds, and the ratio is median / median of NumPy by hand
in the same run.  ``--runs`` repeats the whole measurement (each run's
ratios are printed).  ``--clock cpu`` (the default) times with the calling
thread's CPU time (``time.thread_time``): on a shared machine a step that
waits for a core does not count the wait (the steps are single-threaded
under OMP_NUM_THREADS=1; kina_fx's kernel threads only start on arrays of
2^18+ elements, none here); ``--clock wall`` uses ``time.perf_counter``.

``--demo-epochs N`` also trains the demo (kina_fx/demos/compiled.py: digits,
64-128-10, batch 64) for N epochs and reports its compiled section's seconds
against its Python section's (both timed per step with ``--clock``,
interleaved per batch).

Issue 18's targets: compiled + tape <= 1.2x NumPy by hand at batch 16, 64
and 256; the demo's compiled section no slower than its Python one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kina_fx import autograd as ad  # noqa: E402
from kina_fx import compiled  # noqa: E402


def numpy_step(x, y, w1, b1, w2, b2):
    n = x.shape[0]
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(n), y]).mean()
    dz = p
    dz[np.arange(n), y] -= 1
    dz /= n
    gw2, gb2 = h.T @ dz, dz.sum(0)
    dh = dz @ w2.T
    dh[pre <= 0] = 0
    return loss, (x.T @ dh, dh.sum(0), gw2, gb2)


def python_loss(w1, b1, w2, b2, x, y):
    return ad.cross_entropy(ad.relu(x @ w1 + b1) @ w2 + b2, y)


def problem(batch, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    w1 = (rng.standard_normal((784, 256)) * 0.05).astype(np.float32)
    b1 = np.zeros(256, np.float32)
    w2 = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
    b2 = np.zeros(10, np.float32)
    return x, y, w1, b1, w2, b2


def contestants(mlp_loss, batch):
    x, y, w1, b1, w2, b2 = problem(batch)

    def compiled_loss(w1, b1, w2, b2, x, y):
        return mlp_loss(np.zeros((), np.float32), x, y, w1, b1, w2, b2)

    compiled_step = ad.value_and_grad(compiled_loss, argnums=(0, 1, 2, 3))
    python_step = ad.value_and_grad(python_loss, argnums=(0, 1, 2, 3))
    steps = {
        "compiled + tape": lambda: compiled_step(w1, b1, w2, b2, x, y),
        "Python autograd": lambda: python_step(w1, b1, w2, b2, x, y),
        "NumPy by hand": lambda: numpy_step(x, y, w1, b1, w2, b2),
    }
    reference = steps["NumPy by hand"]()
    for name in ("compiled + tape", "Python autograd"):
        loss, grads = steps[name]()
        assert np.isclose(float(loss), reference[0], rtol=1e-4), name
        for g, r in zip(grads, reference[1]):
            np.testing.assert_allclose(np.asarray(g), r, rtol=2e-3, atol=1e-5)
    return steps


def measure(steps, rounds, clock):
    times = {name: [] for name in steps}
    for fn in steps.values():        # warm up: caches, pools, the glibc heap's thresholds
        for _ in range(3):
            fn()
    for _ in range(rounds):
        for name, fn in steps.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    base = statistics.median(times["NumPy by hand"])
    return {name: {"median_us": statistics.median(t) / 1e3, "min_us": min(t) / 1e3,
                   "ratio": statistics.median(t) / base} for name, t in times.items()}


def demo_seconds(epochs, clock):
    from kina_fx.demos import compiled as demo_compiled

    with tempfile.TemporaryDirectory() as tmp:
        loss = demo_compiled.load_compiled_loss(tmp)
        results = demo_compiled.train_both(loss, epochs=epochs, progress=False, clock=clock)
    return {name: r["seconds"] for name, r in results.items()}


def _spread(values) -> str:
    return f"**{statistics.median(values):.2f}x** [{min(values):.2f}, {max(values):.2f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--demo-epochs", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    missing = compiled.missing_mlir_tools()
    if missing:
        print(f"skipped: needs {missing}")
        return 0
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    batches = [int(b) for b in args.batches.split(",")]
    results = {"clock": args.clock, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        from kina_fx.demos import compiled as demo_compiled

        so = compiled.compile_mlir(compiled.example_path("mlp.mlir"), str(Path(tmp) / "mlp.so"))
        mlp_loss = compiled.load(so, demo_compiled.DECLARATION).function("_mlir_ciface_mlp_loss", outputs=1)
        steps = {b: contestants(mlp_loss, b) for b in batches}
        for run in range(args.runs):
            for b in batches:
                results["runs"].setdefault(b, []).append(measure(steps[b], args.rounds, clock))
    print(f"one step, 784-256-10, {args.clock} time, medians of {args.rounds} interleaved rounds per run")
    print("| batch | run | compiled + tape | Python autograd | NumPy by hand | compiled / NumPy | Python / NumPy |")
    print("|---|---|---|---|---|---|---|")
    for b, runs in results["runs"].items():
        for i, r in enumerate(runs):
            c, p, n = r["compiled + tape"], r["Python autograd"], r["NumPy by hand"]
            print(f"| {b} | {i + 1} | {c['median_us'] / 1e3:.3f} ms | {p['median_us'] / 1e3:.3f} ms | "
                  f"{n['median_us'] / 1e3:.3f} ms | **{c['ratio']:.2f}x** | {p['ratio']:.2f}x |")
    if args.runs > 1:
        print(f"\nover {args.runs} runs: median [min, max] of the runs' ratios")
        print("| batch | compiled / NumPy | Python / NumPy |")
        print("|---|---|---|")
        for b, runs in results["runs"].items():
            print(f"| {b} | {_spread([r['compiled + tape']['ratio'] for r in runs])} | "
                  f"{_spread([r['Python autograd']['ratio'] for r in runs])} |")
    if args.demo_epochs:
        seconds = demo_seconds(args.demo_epochs, time.thread_time if args.clock == "cpu" else time.perf_counter)
        results["demo_seconds"] = seconds
        print(f"\ndemo ({args.demo_epochs} epochs, {args.clock} time of the steps): compiled section "
              f"{seconds['compiled']:.2f} s, Python section {seconds['python']:.2f} s: "
              f"**{seconds['compiled'] / seconds['python']:.2f}x**")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
