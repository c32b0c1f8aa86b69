"""Train the digits MLP with its forward pass in MLIR-compiled code and gradients from the tape.

``python -m kina_fx.demos.compiled [--epochs N] [--out loss.png]``: the network,
data, initialisation and optimiser of :mod:`kina_fx.demos.mlp`, but the loss is
computed by ``examples/mlp.mlir`` compiled with mlir-opt-19 / mlir-translate-19 /
clang-19 (every tensor op in it a runtime call).  ``ad.value_and_grad`` of a
Python function that calls the compiled forward records the runtime ops the
compiled code performs, so the gradients come out of the same tape machinery
as the Python version's.  Both versions train side by side from the same
initial weights; both loss curves go on one plot.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from .. import autograd as ad
from .. import compiled
from . import mlp as demo_mlp

_RANKED = "kina_memref_descriptor_t *"
DECLARATION = f"int32_t _mlir_ciface_mlp_loss({', '.join([_RANKED] * 7)});"


def load_compiled_loss(workdir: str):
    """``loss(params, x, y)`` computed by the compiled MLIR forward."""
    so = compiled.compile_mlir(compiled.example_path("mlp.mlir"), os.path.join(workdir, "mlp.so"))
    mlp_loss = compiled.load(so, DECLARATION).function("_mlir_ciface_mlp_loss", outputs=1)

    def loss(params, x, y):
        (l1, l2) = params
        return mlp_loss(np.zeros((), np.float32), x, y, l1["w"], l1["b"], l2["w"], l2["b"])
    return loss


def train_both(loss_compiled, epochs=40, hidden=128, batch=64, lr=2e-3, seed=0, progress=True,
               clock=time.perf_counter):
    """Train the compiled-forward model and the Python one on the same batches.

    Each step is timed with ``clock`` (benches/bench_compiled_step.py passes
    the thread's CPU time: a shared machine's waits for a core do not count),
    after one untimed step of each (the first call's one-off costs)."""
    from tqdm import tqdm

    x_train, x_test, y_train, y_test = demo_mlp._load_digits(seed)
    rng = np.random.default_rng(seed)
    sizes = [x_train.shape[1], hidden, 10]
    params = {"compiled": demo_mlp.init_params(rng, sizes)}
    params["python"] = [{k: v.copy() for k, v in layer.items()} for layer in params["compiled"]]
    steps = {"compiled": ad.value_and_grad(loss_compiled), "python": ad.value_and_grad(demo_mlp.loss_fn)}
    opts = {name: demo_mlp.Adam(p, lr=lr) for name, p in params.items()}
    losses = {name: [] for name in params}
    seconds = {name: 0.0 for name in params}
    n = x_train.shape[0]
    # One untimed step of each model first, its result unused: the first
    # call pays one-off costs (the library's callbacks bound, the tapes'
    # handlers and clauses built, partly shared by the two models), which
    # the per-step times are not about.
    for name in params:
        steps[name](params[name], x_train[:batch], y_train[:batch])
    bar = tqdm(range(epochs), desc="digits MLP, compiled forward", unit="epoch",
               disable=not progress, file=sys.stdout)
    for _ in bar:
        order = rng.permutation(n)
        totals = {name: 0.0 for name in params}
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            xb, yb = x_train[idx], y_train[idx]
            for name in params:
                start = clock()
                loss, grads = steps[name](params[name], xb, yb)
                opts[name].step(params[name], grads)
                seconds[name] += clock() - start
                totals[name] += float(loss) * len(idx)
        for name in params:
            losses[name].append(totals[name] / n)
        bar.set_postfix(compiled=f"{losses['compiled'][-1]:.4f}", python=f"{losses['python'][-1]:.4f}")
    return {name: {"test_accuracy": demo_mlp.accuracy(params[name], x_test, y_test),
                   "losses": losses[name], "seconds": seconds[name]} for name in params}


def plot(results, path):
    """Both loss curves on one plot."""
    return demo_mlp.plot_losses({
        "forward in MLIR-compiled code, gradients from the tape":
            (results["compiled"]["losses"], {"marker": "o", "markersize": 3}),
        "forward in Python (kina_fx.autograd)": (results["python"]["losses"], {"linestyle": "--"}),
    }, path, title="64-128-10 MLP on sklearn digits")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kina_fx.demos.compiled", description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join("out", "compiled_mlp_loss.png"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    missing = compiled.missing_mlir_tools()
    if missing:
        print(f"  skipped: needs {', '.join(missing)} (Debian: apt-get install mlir-19-tools clang-19)")
        return 0
    with tempfile.TemporaryDirectory(prefix="kina_fx-demo-") as tmp:
        results = train_both(load_compiled_loss(tmp), epochs=args.epochs, seed=args.seed,
                             progress=not args.no_progress)
    path = plot(results, args.out)
    c, p = results["compiled"], results["python"]
    return demo_mlp.finish(
        f"digits MLP, compiled forward + tape: test accuracy {c['test_accuracy']:.2%} "
        f"({c['seconds']:.1f} s of steps); Python forward: {p['test_accuracy']:.2%} "
        f"({p['seconds']:.1f} s); loss curves: {path}", c["test_accuracy"])


if __name__ == "__main__":
    sys.exit(main())
