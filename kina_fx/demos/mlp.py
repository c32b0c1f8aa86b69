"""Train a small MLP on scikit-learn's bundled handwritten digits with kina_fx autograd.

``python -m kina_fx.demos.mlp [--epochs N] [--out loss.png]``: 8x8 digit images
(1,797 of them, shipped inside scikit-learn: no download), a 64-128-10 ReLU
network, softmax cross-entropy, Adam, minibatches of 64.  Gradients come from
:func:`kina_fx.autograd.value_and_grad`; arrays live on the backend
``KINA_FX_DEVICE`` selects (NumPy, or CuPy on a GPU).  Prints the test accuracy
and writes a loss-curve PNG.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .. import autograd as ad
from .. import gpu_ops


def _load_digits(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)


def init_params(rng, sizes, xp=np):
    """He-initialised weights and zero biases for a ReLU MLP with layer ``sizes``."""
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params.append({"w": xp.asarray(w.astype(np.float32)),
                       "b": xp.zeros(fan_out, dtype=np.float32)})
    return params


def forward(params, x):
    """Logits of the MLP: ReLU hidden layers, linear output."""
    h = x
    for layer in params[:-1]:
        h = ad.relu(h @ layer["w"] + layer["b"])
    return h @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    return ad.cross_entropy(forward(params, x), y)


class Adam:
    """Adam on a list of {name: array} layers (plain array updates, no tracing)."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = [{k: v * 0 for k, v in layer.items()} for layer in params]
        self.v = [{k: v * 0 for k, v in layer.items()} for layer in params]

    def step(self, params, grads):
        self.t += 1
        c1 = 1 - self.b1 ** self.t
        c2 = 1 - self.b2 ** self.t
        for layer, g_layer, m_layer, v_layer in zip(params, grads, self.m, self.v):
            for k in layer:
                g = g_layer[k]
                m_layer[k] = self.b1 * m_layer[k] + (1 - self.b1) * g
                v_layer[k] = self.b2 * v_layer[k] + (1 - self.b2) * g * g
                xp = gpu_ops.array_module(g)
                layer[k] = layer[k] - self.lr * (m_layer[k] / c1) / (
                    xp.sqrt(v_layer[k] / c2) + self.eps)


def accuracy(params, x, y):
    logits = ad.Tensor(forward(params, x)).data
    xp = gpu_ops.array_module(logits)
    return float((xp.argmax(logits, axis=-1) == y).mean())


def train(epochs=40, hidden=128, batch=64, lr=2e-3, seed=0, progress=True):
    """Train and return ``{"test_accuracy", "train_accuracy", "losses", "seconds"}``."""
    from tqdm import tqdm
    xp = gpu_ops.backend()
    x_train, x_test, y_train, y_test = _load_digits(seed)
    x_train, x_test = xp.asarray(x_train), xp.asarray(x_test)
    y_train, y_test = xp.asarray(y_train), xp.asarray(y_test)
    rng = np.random.default_rng(seed)
    params = init_params(rng, [x_train.shape[1], hidden, 10], xp)
    opt = Adam(params, lr=lr)
    step = ad.value_and_grad(loss_fn)
    n = x_train.shape[0]
    losses = []
    start = time.perf_counter()
    bar = tqdm(range(epochs), desc="digits MLP", unit="epoch", disable=not progress,
               file=sys.stdout)
    for _ in bar:
        order = xp.asarray(rng.permutation(n))
        total = 0.0
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            loss, grads = step(params, x_train[idx], y_train[idx])
            opt.step(params, grads)
            total += float(loss) * idx.shape[0]
        losses.append(total / n)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    seconds = time.perf_counter() - start
    return {"test_accuracy": accuracy(params, x_test, y_test),
            "train_accuracy": accuracy(params, x_train, y_train),
            "losses": losses, "seconds": seconds, "backend": xp.__name__}


def plot_losses(losses, path, title="kina_fx autograd: 64-128-10 MLP on sklearn digits",
                xlabel="epoch", ylabel="mean training cross-entropy"):
    """Loss curves on one log-scale plot, written to ``path`` (PNG).

    ``losses``: a list of per-epoch losses, or ``{label: (losses, plot style)}``
    for several curves with a legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = losses if isinstance(losses, dict) else {None: (losses, {"marker": "o", "markersize": 3})}
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (values, style) in curves.items():
        ax.plot(range(1, len(values) + 1), values, label=label, **style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if isinstance(losses, dict):
        ax.legend(fontsize=8)
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def finish(summary: str, test_accuracy: float) -> int:
    """Print a digits demo's summary line; its exit status: 0 when the test
    accuracy reaches 95%, else 1."""
    print(summary)
    return 0 if test_accuracy >= 0.95 else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kina_fx.demos.mlp", description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join("out", "autograd_mlp_loss.png"),
                        help="where to write the loss-curve PNG")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    result = train(args.epochs, args.hidden, args.batch, args.lr, args.seed,
                   progress=not args.no_progress)
    path = plot_losses(result["losses"], args.out)
    return finish(f"digits MLP ({result['backend']}): test accuracy {result['test_accuracy']:.2%}, "
                  f"train accuracy {result['train_accuracy']:.2%}, "
                  f"{args.epochs} epochs in {result['seconds']:.1f} s; loss curve: {path}",
                  result["test_accuracy"])


if __name__ == "__main__":
    sys.exit(main())
