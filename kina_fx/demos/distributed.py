"""Data-parallel training of the digits MLP on 1, 2 and 4 processes (MPI), Python and compiled.

``python -m kina_fx.demos.distributed [--ranks 1 2 4] [--steps N] [--out loss.png]`` launches
``mpiexec -n N`` for each N (the same script with ``--worker``), then plots the
global loss against the step for every N and both models and prints a table of
step times and communication shares.  Each worker trains two models from the
same initialisation, as :mod:`kina_fx.demos.mlp` and :mod:`kina_fx.demos.compiled`
define them: the Python autograd MLP and the MLP whose forward pass is
MLIR-compiled code (``examples/mlp.mlir``) with gradients from the tape.

Every step is the DDP pattern (docs/distributed.md, "Replicated parameters"):
each process takes its shard of the same global batch (``dist.shard``),
differentiates its *local* loss weighted by its share of the batch
(``n_local / n_global``), sums the gradients over the processes with one
``all_reduce_tree(..., "sum")`` and applies the same Adam step, so every
process holds the same parameters.  With ``--check`` each process also runs
the single-process step on the whole batch beside it and records, after every
step, how far the data-parallel parameters are from those.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from .. import autograd as ad
from .. import distributed as dist
from . import mlp as demo_mlp

MODELS = ("python", "compiled")


def _copy(params):
    return [{k: v.copy() for k, v in layer.items()} for layer in params]


def _distance(a, b) -> float:
    """The largest absolute difference between two parameter lists."""
    return max(float(np.max(np.abs(np.asarray(x[k]) - np.asarray(y[k])))) for x, y in zip(a, b)
               for k in x)


def losses_for(models, workdir):
    """``{model: loss(params, x, y)}``; the compiled one is built by rank 0 in ``workdir``."""
    found = {}
    if "python" in models:
        found["python"] = demo_mlp.loss_fn
    if "compiled" in models:
        from . import compiled as demo_compiled
        from .. import compiled

        so = os.path.join(workdir, "mlp.so")
        if dist.rank() == 0:
            compiled.compile_mlir(compiled.example_path("mlp.mlir"), so)
        dist.barrier()
        mlp_loss = compiled.load(so, demo_compiled.DECLARATION).function("_mlir_ciface_mlp_loss", outputs=1)

        def loss(params, x, y):
            (l1, l2) = params
            return mlp_loss(np.zeros((), np.float32), x, y, l1["w"], l1["b"], l2["w"], l2["b"])
        found["compiled"] = loss
    return found


def train(loss_fn, steps=100, batch=64, hidden=128, lr=2e-3, seed=0, check=False, reduce="sum"):
    """Data-parallel training on the group in scope; the same on every process.

    Returns per-step global losses, step and communication seconds, and (with
    ``check``) the distance to the single-process parameters after each step.
    ``reduce`` is how the weighted local gradients are combined: ``"sum"`` is
    right; ``"mean"`` is the factor-of-world-size mistake (the tests show it)."""
    x_train, x_test, y_train, y_test = demo_mlp._load_digits(seed)
    rng = np.random.default_rng(seed)      # the same stream on every process: same batches
    params = demo_mlp.init_params(rng, [x_train.shape[1], hidden, 10])
    opt = demo_mlp.Adam(params, lr=lr)
    reference = _copy(params) if check else None
    ref_opt = demo_mlp.Adam(reference, lr=lr) if check else None

    def local_loss(params, x, y, share):
        return loss_fn(params, x, y) * share
    step_fn = ad.value_and_grad(local_loss)
    ref_step = ad.value_and_grad(loss_fn)
    per_epoch = x_train.shape[0] // batch           # full batches only: same size every step
    order = rng.permutation(x_train.shape[0])
    out = {"loss": [], "step_s": [], "comm_s": [], "distance": [], "ref_loss": []}
    for step in range(steps):
        if step and step % per_epoch == 0:
            order = rng.permutation(x_train.shape[0])
        idx = order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        xb, yb = x_train[idx], y_train[idx]
        xs, ys = dist.shard(xb), dist.shard(yb)
        start = time.perf_counter()
        loss, grads = step_fn(params, xs, ys, len(xs) / len(xb))
        mid = time.perf_counter()
        summed = dist.all_reduce_tree({"grads": grads, "loss": loss}, reduce)
        after = time.perf_counter()
        opt.step(params, summed["grads"])
        end = time.perf_counter()
        out["loss"].append(float(summed["loss"]))
        out["step_s"].append(end - start)
        out["comm_s"].append(after - mid)
        if check:
            ref_loss, ref_grads = ref_step(reference, xb, yb)
            ref_opt.step(reference, ref_grads)
            out["ref_loss"].append(float(ref_loss))
            out["distance"].append(_distance(params, reference))
    out["test_accuracy"] = demo_mlp.accuracy(params, x_test, y_test)
    # The replicas must hold the same parameters: compare every process's with rank 0's.
    flat = np.concatenate([np.ravel(layer[k]) for layer in params for k in sorted(layer)])
    out["replicas_identical"] = bool(np.array_equal(dist.broadcast(flat, 0), flat))
    out["params"] = flat
    return out


def worker(args) -> int:
    """One process of the job (``--worker``): trains, rank 0 writes the JSON results."""
    with dist.mpi():
        n = dist.world_size()
        losses = losses_for(args.models, args.workdir)
        results = {"ranks": n, "models": {}}
        for name in args.models:
            r = train(losses[name], steps=args.steps, batch=args.batch, seed=args.seed,
                      check=args.check, reduce=args.reduce)
            comm = dist.all_gather(np.asarray(r["comm_s"]))      # every rank's waits
            steps = dist.all_gather(np.asarray(r["step_s"]))
            r["comm_s_max_rank"] = comm.max(axis=0).tolist()
            r["step_s_max_rank"] = steps.max(axis=0).tolist()
            r["replicas_identical"] = bool(dist.all_reduce(np.int64(r["replicas_identical"]), "min"))
            if args.save_params and dist.rank() == 0:
                np.save(os.path.join(args.workdir, f"params-{name}-{n}.npy"), r["params"])
            del r["params"]
            results["models"][name] = r
        if dist.rank() == 0:
            with open(args.json, "w") as f:
                json.dump(results, f)
    return 0


def mpiexec() -> str | None:
    """The ``mpiexec`` next to this interpreter (``kina_fx[mpi]``), else the one on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else shutil.which("mpiexec")


def launch(n, models, steps, batch=64, seed=0, check=False, workdir=None, save_params=False,
           reduce="sum", timeout=1800) -> dict:
    """Run the worker under ``mpiexec -n n``; its results (rank 0's JSON)."""
    launcher = mpiexec()
    if launcher is None:
        raise RuntimeError("needs mpiexec and mpi4py: pip install 'kina_fx[mpi]'")
    with tempfile.TemporaryDirectory(prefix="kina_fx-dist-") as tmp:
        workdir = workdir or tmp
        path = os.path.join(workdir, f"results-{n}.json")
        cmd = [launcher, "-n", str(n), sys.executable, "-m", "kina_fx.demos.distributed", "--worker",
               "--json", path, "--workdir", workdir, "--steps", str(steps), "--batch", str(batch),
               "--seed", str(seed), "--reduce", reduce, "--models", *models] + \
            (["--check"] if check else []) + \
            (["--save-params"] if save_params else [])
        env = dict(os.environ, OMP_NUM_THREADS="1")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"mpiexec -n {n} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        with open(path) as f:
            return json.load(f)


def summary(results: dict) -> list:
    """Table rows: (model, N, median step ms, median communication ms, communication share)."""
    rows = []
    for n, res in sorted(results.items()):
        for name, r in res["models"].items():
            step = float(np.median(r["step_s_max_rank"][5:] or r["step_s_max_rank"]))
            comm = float(np.median(r["comm_s_max_rank"][5:] or r["comm_s_max_rank"]))
            rows.append((name, n, 1e3 * step, 1e3 * comm, comm / step if step else 0.0,
                         r["test_accuracy"]))
    return rows


def plot(results: dict, path: str) -> str:
    styles = {"python": {"linestyle": "-"}, "compiled": {"linestyle": "--"}}
    curves = {}
    for n, res in sorted(results.items()):
        for name, r in res["models"].items():
            label = f"{name} forward, {n} process{'es' if n > 1 else ''}"
            curves[label] = (r["loss"], dict(styles[name], linewidth=1))
    return demo_mlp.plot_losses(curves, path, title="data-parallel digits MLP: global loss per step",
                                xlabel="step", ylabel="global batch cross-entropy")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kina_fx.demos.distributed", description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true",
                        help="also run the single-process step beside and record the distance")
    parser.add_argument("--out", default=os.path.join("out", "distributed_mlp_loss.png"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--save-params", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reduce", default="sum", choices=("sum", "mean"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    from .. import compiled
    if "compiled" in args.models and compiled.missing_mlir_tools():
        print(f"  (compiled model skipped: needs {', '.join(compiled.missing_mlir_tools())})")
        args.models = [m for m in args.models if m != "compiled"]
    if mpiexec() is None:
        print("  skipped: needs mpiexec and mpi4py (pip install 'kina_fx[mpi]')")
        return 0
    results = {n: launch(n, args.models, args.steps, args.batch, args.seed, args.check)
               for n in args.ranks}
    path = plot(results, args.out)
    print(f"{'model':>9} {'N':>2} {'step ms':>8} {'comm ms':>8} {'comm share':>10} {'test acc':>8}")
    for name, n, step, comm, share, acc in summary(results):
        print(f"{name:>9} {n:>2} {step:8.2f} {comm:8.2f} {share:10.0%} {acc:8.2%}")
    if args.check:
        worst = max(max(r["distance"]) for res in results.values() for r in res["models"].values())
        print(f"largest distance to the single-process parameters after any step: {worst:.2e}")
    print(f"loss curves: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
