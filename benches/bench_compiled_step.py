"""One training step (loss and gradients) of a 784-256-10 MLP at batch 256, three ways, same run.

    .venv/bin/python benches/bench_compiled_step.py [--rounds N] [--batch B] [--json OUT]

1. compiled + tape: ``ad.value_and_grad`` of a Python function that calls
   ``_mlir_ciface_mlp_loss`` (kina_fx/examples/mlp.mlir compiled with
   mlir-opt-19 / mlir-translate-19 / clang-19; every tensor op a runtime call),
   the tape recording the runtime ops the compiled code performs;
2. Python autograd: the same network written with kina_fx.autograd;
3. NumPy by hand: forward and hand-written backward (the baseline).

The three are interleaved round by round (the machine is noisy); medians and
minima per step, and ratios to NumPy by hand.  Issue target: compiled + tape
<= 1.3x NumPy by hand.
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    missing = compiled.missing_mlir_tools()
    if missing:
        print(f"skipped: needs {missing}")
        return 0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, args.batch).astype(np.int64)
    w1 = (rng.standard_normal((784, 256)) * 0.05).astype(np.float32)
    b1 = np.zeros(256, np.float32)
    w2 = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
    b2 = np.zeros(10, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        from kina_fx.demos import compiled as demo_compiled

        so = compiled.compile_mlir(compiled.example_path("mlp.mlir"), str(Path(tmp) / "mlp.so"))
        mlp_loss = compiled.load(so, demo_compiled.DECLARATION).function("_mlir_ciface_mlp_loss", outputs=1)

        def compiled_loss(w1, b1, w2, b2, x, y):
            return mlp_loss(np.zeros((), np.float32), x, y, w1, b1, w2, b2)

        steps = {
            "compiled + tape": lambda: ad.value_and_grad(compiled_loss, argnums=(0, 1, 2, 3))(w1, b1, w2, b2, x, y),
            "Python autograd": lambda: ad.value_and_grad(python_loss, argnums=(0, 1, 2, 3))(w1, b1, w2, b2, x, y),
            "NumPy by hand": lambda: numpy_step(x, y, w1, b1, w2, b2),
        }
        # the three agree before anything is timed
        reference = steps["NumPy by hand"]()
        for name in ("compiled + tape", "Python autograd"):
            loss, grads = steps[name]()
            assert np.isclose(float(loss), reference[0], rtol=1e-4), name
            for g, r in zip(grads, reference[1]):
                np.testing.assert_allclose(np.asarray(g), r, rtol=2e-3, atol=1e-5)
        times = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, fn in steps.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["NumPy by hand"])
    results = {name: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                      "ratio_median": statistics.median(t) / base} for name, t in times.items()}
    print(f"| one step, 784-{w1.shape[1]}-10, batch {args.batch} | median | min | vs NumPy by hand (medians) |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['median_ms']:.2f} ms | {r['min_ms']:.2f} ms | {r['ratio_median']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
