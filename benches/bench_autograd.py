"""Autograd benchmarks: kina_fx tapes against PyTorch eager, HIPS autograd and NumPy.

Run: ``.venv/bin/python benches/bench_autograd.py [--rounds N] [--threads 1] [--clock cpu] [--json out.json]``

1. ``chain``: 1,000 elementwise ops on a (1,)-shaped float64 input, forward +
   backward (the ops cycle through tanh, *1.5, +0.25, sigmoid, -0.5; the result
   is summed to a scalar).  Contestants: kina_fx ``grad``, PyTorch CPU eager,
   HIPS autograd, and a minimal effect-free NumPy tape (closures in a list) as
   the floor of what a Python tape costs.  Target (issue 18): kina_fx <= 0.4x PyTorch.
2. ``mlp``: one step of a 784-256-10 ReLU MLP, batch 256, float32, softmax
   cross-entropy, forward + backward.  Contestants: kina_fx ``value_and_grad``,
   a hand-written NumPy forward/backward of the same network, PyTorch CPU.
   Target (issue 18): kina_fx <= 1.1x hand-written NumPy.
3. ``mlp_gpu`` (only when CuPy sees a CUDA device): the same step with kina_fx on
   CuPy against PyTorch CUDA (both synchronised).

All contestants of a benchmark run in the same process, interleaved round by
round, and the tables report medians (and minima) over the rounds; a target's
ratio is the median over rounds of (kina_fx time / baseline time) in the same
round, which cancels the machine's slow drifts.  The MLP's PyTorch contestant
runs in its own block after the others: PyTorch's OpenMP workers spin after each
parallel matmul and, interleaved, slow NumPy's BLAS threads several-fold.  PyTorch and HIPS
autograd are optional (``pip install -e '.[bench]'``): missing ones are skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kina_fx import autograd as ad  # noqa: E402
from kina_fx import gpu_ops  # noqa: E402

CHAIN_OPS = 1000


def _optional(name):
    try:
        return __import__(name)
    except Exception:
        return None


# --- 1. the chain ------------------------------------------------------------------


def _chain(y, tanh, sigmoid):
    for _ in range(CHAIN_OPS // 5):
        y = tanh(y)
        y = y * 1.5
        y = y + 0.25
        y = sigmoid(y)
        y = y - 0.5
    return y


def chain_contestants():
    x0 = np.array([0.3])
    out = {}

    grad_fn = ad.grad(lambda x: ad.sum(_chain(x, ad.tanh, ad.sigmoid)))
    out["kina_fx"] = lambda: grad_fn(x0)

    torch = _optional("torch")
    if torch is not None:
        def run_torch():
            x = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
            _chain(x, torch.tanh, torch.sigmoid).sum().backward()
            return x.grad.numpy()
        out["pytorch"] = run_torch

    hips = _optional("autograd")
    if hips is not None:
        import autograd.numpy as anp
        from autograd.scipy.special import expit
        hips_grad = hips.grad(lambda x: anp.sum(_chain(x, anp.tanh, expit)))
        out["hips_autograd"] = lambda: hips_grad(x0)

    out["numpy_tape"] = lambda: _minimal_tape_grad(x0)
    return out


def _minimal_tape_grad(x0):
    """The floor: a tape with no effects, no boxes of levels, no higher order."""
    from scipy.special import expit
    tape = []
    y = x0
    for _ in range(CHAIN_OPS // 5):
        t = np.tanh(y)
        tape.append(("tanh", t))
        y = t * 1.5
        tape.append(("mul", 1.5))
        y = y + 0.25
        tape.append(("add", None))
        s = expit(y)
        tape.append(("sigmoid", s))
        y = s - 0.5
        tape.append(("add", None))
    g = np.ones_like(y)
    for op, saved in reversed(tape):
        if op == "tanh":
            g = g * (1.0 - saved * saved)
        elif op == "mul":
            g = g * saved
        elif op == "sigmoid":
            g = g * (saved * (1.0 - saved))
    return g


# --- 2. the MLP step ------------------------------------------------------------


def _mlp_data(xp, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=256)
    w1 = (rng.standard_normal((784, 256)) * np.sqrt(2 / 784)).astype(np.float32)
    w2 = (rng.standard_normal((256, 10)) * np.sqrt(2 / 256)).astype(np.float32)
    b1 = np.zeros(256, np.float32)
    b2 = np.zeros(10, np.float32)
    return [xp.asarray(a) for a in (x, y, w1, b1, w2, b2)]


def _kina_loss(params, x, y):
    w1, b1, w2, b2 = params
    h = ad.relu(x @ w1 + b1)
    return ad.cross_entropy(h @ w2 + b2, y)


def numpy_mlp_step(params, x, y):
    """Hand-written forward and backward of the same network."""
    w1, b1, w2, b2 = params
    z1 = x @ w1 + b1
    h = np.maximum(z1, 0)
    z2 = h @ w2 + b2
    shifted = z2 - z2.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    s = e.sum(axis=1, keepdims=True)
    rows = np.arange(x.shape[0])
    loss = -np.mean(shifted[rows, y] - np.log(s[:, 0]))
    dz2 = e / s
    dz2[rows, y] -= 1
    dz2 /= x.shape[0]
    dw2 = h.T @ dz2
    db2 = dz2.sum(axis=0)
    dz1 = (dz2 @ w2.T) * (z1 > 0)
    dw1 = x.T @ dz1
    db1 = dz1.sum(axis=0)
    return loss, (dw1, db1, dw2, db2)


def mlp_contestants():
    x, y, w1, b1, w2, b2 = _mlp_data(np)
    params = (w1, b1, w2, b2)
    step = ad.value_and_grad(_kina_loss)
    out = {"kina_fx": lambda: step(params, x, y),
           "numpy_by_hand": lambda: numpy_mlp_step(params, x, y)}
    torch = _optional("torch")
    if torch is not None:
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        tp = [torch.from_numpy(p.copy()).requires_grad_(True) for p in params]

        def run_torch():
            for p in tp:
                p.grad = None
            h = torch.relu(tx @ tp[0] + tp[1])
            loss = torch.nn.functional.cross_entropy(h @ tp[2] + tp[3], ty)
            loss.backward()
            return loss.item()
        out["pytorch"] = run_torch
    return out


def check_mlp_agrees():
    """kina_fx's gradients equal the hand-written ones (the benchmark is fair)."""
    x, y, w1, b1, w2, b2 = _mlp_data(np)
    params = (w1, b1, w2, b2)
    loss, grads = ad.value_and_grad(_kina_loss)(params, x, y)
    loss_np, grads_np = numpy_mlp_step(params, x, y)
    assert abs(float(loss) - float(loss_np)) < 1e-4
    for g, gn in zip(grads, grads_np):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, gn, rtol=1e-3, atol=1e-5)


def mlp_gpu_contestants():
    cp = gpu_ops.cupy_module()
    if cp is None:
        return {}
    x, y, w1, b1, w2, b2 = _mlp_data(cp)
    params = (w1, b1, w2, b2)
    step = ad.value_and_grad(_kina_loss)

    def run_kina():
        loss, grads = step(params, x, y)
        cp.cuda.Device().synchronize()
        return loss
    out = {"kina_fx_cupy": run_kina}
    torch = _optional("torch")
    if torch is not None and torch.cuda.is_available():
        dev = torch.device("cuda")
        tx = torch.as_tensor(cp.asnumpy(x), device=dev)
        ty = torch.as_tensor(cp.asnumpy(y), device=dev)
        tp = [torch.as_tensor(cp.asnumpy(p), device=dev).requires_grad_(True) for p in params]

        def run_torch():
            for p in tp:
                p.grad = None
            h = torch.relu(tx @ tp[0] + tp[1])
            loss = torch.nn.functional.cross_entropy(h @ tp[2] + tp[3], ty)
            loss.backward()
            torch.cuda.synchronize()
            return loss
        out["pytorch_cuda"] = run_torch
    return out


# --- harness -----------------------------------------------------------------------


#: The clock of every measurement (``--clock``): wall time, or the process's CPU
#: time, which on a shared machine does not count the waits for a core (with
#: ``--threads 1`` every contestant computes on the calling thread).
clock = time.perf_counter


def measure(contestants, rounds, warmup=3, baseline=None):
    """Seconds per call of each contestant: all of them once per round, interleaved.

    With ``baseline``, each result also has ``ratio``: the median over rounds of
    its time divided by the baseline's time in the same round."""
    for _ in range(warmup):
        for fn in contestants.values():
            fn()
    times = {name: [] for name in contestants}
    for _ in range(rounds):
        for name, fn in contestants.items():
            t = clock()
            fn()
            times[name].append(clock() - t)
    out = {name: {"median_s": float(np.median(ts)), "min_s": float(np.min(ts)),
                  "rounds": rounds} for name, ts in times.items()}
    if baseline in times:
        base = np.asarray(times[baseline])
        for name, ts in times.items():
            out[name]["ratio"] = float(np.median(np.asarray(ts) / base))
    return out


def run(rounds=30, quick=False):
    results = {"python": platform.python_version(), "numpy": np.__version__,
               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    torch = _optional("torch")
    hips = _optional("autograd")
    results["torch"] = getattr(torch, "__version__", None)
    results["hips_autograd"] = "installed" if hips is not None else None
    check_mlp_agrees()
    n = 3 if quick else rounds
    results["chain"] = measure(chain_contestants(), n, baseline="pytorch")
    mlp = mlp_contestants()
    torch_mlp = {"pytorch": mlp.pop("pytorch")} if "pytorch" in mlp else {}
    results["mlp"] = measure(mlp, 3 if quick else 3 * rounds, baseline="numpy_by_hand")
    if torch_mlp:
        results["mlp"].update(measure(torch_mlp, 3 if quick else 3 * rounds))
    gpu = mlp_gpu_contestants()
    results["mlp_gpu"] = measure(gpu, 3 if quick else rounds) if gpu else None
    return results


def report(results):
    lines = [f"threads: {results.get('threads', 'library default')}, clock: {results.get('clock', 'wall')}", ""]
    chain = results["chain"]
    lines.append(f"chain of {CHAIN_OPS} elementwise ops, (1,) float64, forward + backward")
    lines.append("| contestant | median ms | min ms | median us/op | vs PyTorch (same round) |")
    lines.append("|---|---|---|---|---|")
    for name, r in chain.items():
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "n/a"
        lines.append(f"| {name} | {r['median_s'] * 1e3:.2f} | {r['min_s'] * 1e3:.2f} | "
                     f"{r['median_s'] / CHAIN_OPS * 1e6:.2f} | {ratio} |")
    mlp = results["mlp"]
    lines.append("")
    lines.append("MLP step 784-256-10, batch 256, float32, softmax cross-entropy, fwd + bwd")
    lines.append("| contestant | median ms | min ms | vs NumPy by hand (same round) | "
                 "ratio of medians |")
    lines.append("|---|---|---|---|---|")
    base = mlp["numpy_by_hand"]["median_s"]
    for name, r in mlp.items():
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "(own block)"
        lines.append(f"| {name} | {r['median_s'] * 1e3:.3f} | {r['min_s'] * 1e3:.3f} | "
                     f"{ratio} | {r['median_s'] / base:.2f}x |")
    if results.get("mlp_gpu"):
        gpu = results["mlp_gpu"]
        lines.append("")
        lines.append("MLP step on the GPU")
        lines.append("| contestant | median ms | min ms |")
        lines.append("|---|---|---|")
        for name, r in gpu.items():
            lines.append(f"| {name} | {r['median_s'] * 1e3:.3f} | {r['min_s'] * 1e3:.3f} |")
    else:
        lines.append("")
        lines.append("MLP step on the GPU: skipped (no CuPy/CUDA device in this run)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="3 rounds (smoke test)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or the process's CPU time (use with --threads 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="limit BLAS/OpenMP threads (NumPy via threadpoolctl, PyTorch via "
                             "set_num_threads) for every contestant; default: the libraries' own")
    args = parser.parse_args(argv)
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        from threadpoolctl import threadpool_limits
        threadpool_limits(args.threads)
        torch = _optional("torch")
        if torch is not None:
            torch.set_num_threads(args.threads)
    results = run(args.rounds, args.quick)
    results["threads"] = args.threads or "library default"
    results["clock"] = args.clock
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
