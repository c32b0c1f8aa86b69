"""Generated SPMD programs over the collectives, and what they mean as one global function.

A program is a chain of steps applied to each rank's value ``v`` (elementwise
functions, rank-dependent scalings, and every collective), ending in the rank's
scalar ``out_r = sum(v * w_r)``.  :func:`run_rank` runs it on one rank with
``kina_fx.distributed``; :func:`run_global` computes every rank's output at
once in one process, from the stack ``X`` of every rank's input (row ``r`` is
rank ``r``'s), with ordinary autograd ops and no collective:

* ``all_reduce(op)``: the reduction over the rank axis, broadcast back to every row;
* ``broadcast(root)``: row ``root`` on every row;
* ``all_gather``: every row holds the whole stack;
* ``reduce_scatter(op)``: row ``s`` is the reduction over ranks of their row ``s``.

The SPMD derivative (docs/distributed.md) is the derivative of this global
function: rank ``r``'s gradient is row ``r`` of the gradient of the sum of
every rank's output.  Shared by tests/distributed/dist_worker.py (under
mpiexec) and the tests (the reference, in the pytest process).
"""
from __future__ import annotations

import numpy as np

from kina_fx import autograd as ad
from kina_fx import distributed as dist

UNARY = ("tanh", "sin", "square")
REDUCE = {"sum": ad.sum, "mean": ad.mean, "max": ad.max, "min": ad.min}


def generate(seed: int, n: int) -> dict:
    """A random program for ``n`` ranks (a dict of plain values: the same on every rank)."""
    rng = np.random.default_rng(seed)
    shape = (n, 2) if rng.random() < 0.4 else tuple(int(s) for s in rng.integers(1, 4, rng.integers(0, 3)))
    start = shape
    steps = []
    for _ in range(int(rng.integers(2, 7))):
        kinds = ["unary", "scale", "all_reduce", "all_reduce", "broadcast"]
        if len(shape) < 3:
            kinds.append("all_gather")
        if len(shape) >= 1 and shape[0] == n:
            kinds += ["reduce_scatter", "reduce_scatter"]
        kind = str(rng.choice(kinds))
        if kind == "unary":
            steps.append(("unary", str(rng.choice(UNARY))))
        elif kind == "scale":
            steps.append(("scale", [float(c) for c in rng.uniform(0.5, 2.0, n)]))
        elif kind == "all_reduce":
            steps.append(("all_reduce", str(rng.choice(list(REDUCE)))))
        elif kind == "broadcast":
            steps.append(("broadcast", int(rng.integers(0, n))))
        elif kind == "all_gather":
            steps.append(("all_gather",))
            shape = (n,) + shape
        else:
            steps.append(("reduce_scatter", str(rng.choice(["sum", "mean"]))))
            shape = shape[1:]
    weights = rng.standard_normal((n,) + shape)
    return {"seed": seed, "n": n, "start": start, "steps": steps, "weights": weights}


def inputs(program: dict, rank: int, what: str = "x") -> np.ndarray:
    """Rank ``rank``'s input (``"x"``) or tangent (``"t"``), float64."""
    salt = {"x": 0, "t": 1}[what]
    rng = np.random.default_rng([program["seed"], rank, salt])
    return rng.standard_normal(program["start"])


def stacked(program: dict, what: str = "x") -> np.ndarray:
    return np.stack([inputs(program, r, what) for r in range(program["n"])])


def _unary(name, v):
    return v * v if name == "square" else getattr(ad, name)(v)


def run_rank(program: dict, x, rank: int):
    """Rank ``rank``'s output, computed with the collectives of the group in scope."""
    v = x
    for step in program["steps"]:
        kind = step[0]
        if kind == "unary":
            v = _unary(step[1], v)
        elif kind == "scale":
            v = v * step[1][rank]
        elif kind == "all_reduce":
            v = dist.all_reduce(v, step[1])
        elif kind == "broadcast":
            v = dist.broadcast(v, step[1])
        elif kind == "all_gather":
            v = dist.all_gather(v)
        else:
            v = dist.reduce_scatter(v, step[1])
    return ad.sum(v * program["weights"][rank])


def run_global(program: dict, X):
    """Every rank's output (shape ``(n,)``) from the stack of their inputs, in one process."""
    n = program["n"]
    V = X
    for step in program["steps"]:
        kind = step[0]
        shape = tuple(V.shape)
        if kind == "unary":
            V = _unary(step[1], V)
        elif kind == "scale":
            V = V * np.reshape(step[1], (n,) + (1,) * (len(shape) - 1))
        elif kind == "all_reduce":
            V = ad.broadcast_to(REDUCE[step[1]](V, 0, True), shape)
        elif kind == "broadcast":
            V = ad.broadcast_to(V[step[1]:step[1] + 1], shape)
        elif kind == "all_gather":
            V = ad.broadcast_to(ad.reshape(V, (1,) + shape), (n,) + shape)
        else:
            V = REDUCE[step[1]](V, 0)
    weighted = V * program["weights"]
    axes = tuple(range(1, len(program["weights"].shape)))
    return ad.sum(weighted, axes) if axes else weighted


def rank_results(program: dict, rank: int) -> dict:
    """What a rank computes: value, gradient, forward tangent, Hessian-vector product."""
    x, t = inputs(program, rank, "x"), inputs(program, rank, "t")

    def f(x):
        return run_rank(program, x, rank)

    value, grad = ad.value_and_grad(f)(x)
    _, tangent = ad.jvp(f, (x,), (t,))
    _, hvp = ad.jvp(ad.grad(f), (x,), (t,))
    return {"value": np.asarray(value), "grad": np.asarray(grad), "tangent": np.asarray(tangent),
            "hvp": np.asarray(hvp)}


def global_results(program: dict) -> dict:
    """The same quantities for every rank at once (row r: rank r's), in one process."""
    X, T = stacked(program, "x"), stacked(program, "t")

    def total(X):
        return ad.sum(run_global(program, X))

    values = np.asarray(run_global(program, X))
    grad = np.asarray(ad.grad(total)(X))
    _, tangents = ad.jvp(lambda X: run_global(program, X), (X,), (T,))
    _, hvp = ad.jvp(ad.grad(total), (X,), (T,))
    return {"value": values, "grad": grad, "tangent": np.asarray(tangents), "hvp": np.asarray(hvp)}


# ---- exact values: integer-valued data, every dtype the collectives take -----------

#: (key, dtype, per-rank shape) of the value checks.
VALUE_SPECS = (
    ("f32", "float32", (3, 4)),
    ("f64", "float64", (5,)),
    ("i32", "int32", (2, 3)),
    ("i64", "int64", ()),
    ("u8", "uint8", (4,)),
    ("c128", "complex128", (3,)),
    ("empty", "float32", (0, 3)),
)


def value_input(seed: int, key: str, dtype: str, shape: tuple, rank: int) -> np.ndarray:
    """Rank ``rank``'s integer-valued input: sums and means of these are exact."""
    rng = np.random.default_rng([seed, rank, sum(map(ord, key))])
    lo = 0 if np.dtype(dtype).kind == "u" else -8
    values = rng.integers(lo, 9, shape)
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.integers(-8, 9, shape)
    return np.asarray(values).astype(dtype)


def ops_for(dtype: str) -> tuple:
    kind = np.dtype(dtype).kind
    return {"f": ("sum", "mean", "max", "min"), "c": ("sum", "mean")}.get(kind, ("sum", "max", "min"))


def strided(x: np.ndarray) -> np.ndarray:
    """The same values through a non-contiguous view (a reversed, doubled buffer)."""
    if x.ndim == 0 or x.size == 0:
        return x
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = x[..., ::-1]
    return wide[..., -2::-2]


def expected_reduction(stack: np.ndarray, op: str) -> np.ndarray:
    if op == "mean":
        return (stack.sum(axis=0) / len(stack)).astype(stack.dtype)
    return {"sum": np.sum, "max": np.max, "min": np.min}[op](stack, axis=0).astype(stack.dtype)


# ---- ties between ranks for max/min --------------------------------------------------

def tie_input(i: int, rank: int) -> np.ndarray:
    return np.random.default_rng([i, rank, 7]).integers(0, 3, (4, 3)).astype(np.float64)


def tie_weights(i: int, rank: int) -> np.ndarray:
    return np.random.default_rng([i, rank, 8]).standard_normal((4, 3))
