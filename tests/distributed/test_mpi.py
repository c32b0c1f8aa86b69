"""The collectives under ``mpiexec -n 2`` and ``-n 4``, against single-process computations.

* values: every collective, op, root and supported dtype on integer-valued
  data (so sums and means are exact), strided inputs, 0-d and empty arrays --
  compared exactly with NumPy on the stack of every rank's input;
* generated programs (tests/distributed/dist_programs.py): chains of
  elementwise ops, rank-dependent scalings and collectives; each rank's value,
  gradient, forward tangent and Hessian-vector product against the same
  quantities of the global function computed in this process (whose gradient
  is itself checked against central differences);
* ties in max/min share the gradient equally between the tied ranks;
* the runtime ABI's exports called through libkina_fx.so on every rank, and a
  tape over memory recording them.
"""
from __future__ import annotations

import numpy as np
import pytest

import dist_programs as programs
from kina_fx import autograd as ad

pytestmark = pytest.mark.integration

SIZES = [2, 4]


#: The ways a group can move data: after the call comparison (blocking MPI calls),
#: without it (nonblocking calls polled against the timeout), and with neither
#: the comparison nor a timeout (blocking calls).
MODES = {"checked": {}, "unchecked, polled": {"DIST_TEST_CHECK": "0"},
         "unchecked, no timeout": {"DIST_TEST_CHECK": "0", "DIST_TEST_TIMEOUT": "none"}}


@pytest.mark.parametrize("n,mode", [(2, "checked"), (4, "checked"), (2, "unchecked, polled"),
                                    (4, "unchecked, polled"), (2, "unchecked, no timeout")])
def test_values_match_numpy_on_the_stacked_inputs(mpirun, n, mode):
    ranks = mpirun(n, "values", 5, env=MODES[mode]).ranks()
    for r, res in enumerate(ranks):
        assert int(res["rank"]) == r and int(res["size"]) == n
    for key, dtype, shape in programs.VALUE_SPECS:
        stack = np.stack([programs.value_input(5, key, dtype, shape, r) for r in range(n)])
        wide = np.stack([programs.value_input(5, key + "wide", dtype, (n,) + shape, r) for r in range(n)])
        for r, res in enumerate(ranks):
            for op in programs.ops_for(dtype):
                want = programs.expected_reduction(stack, op)
                for name in (f"{key}.all_reduce.{op}", f"{key}.strided.all_reduce.{op}"):
                    got = res[name]
                    assert got.dtype == np.dtype(dtype) and got.shape == shape, name
                    np.testing.assert_array_equal(got, want, err_msg=f"rank {r} {name}")
            for root in range(n):
                np.testing.assert_array_equal(res[f"{key}.broadcast.{root}"], stack[root])
            np.testing.assert_array_equal(res[f"{key}.all_gather"], stack)
            for op in ("sum", "mean") if np.dtype(dtype).kind in "fc" else ("sum",):
                got = res[f"{key}.reduce_scatter.{op}"]
                np.testing.assert_array_equal(got, programs.expected_reduction(wide, op)[r])
    for r, res in enumerate(ranks):
        total = sum(range(n))
        np.testing.assert_array_equal(res["tree.w"], np.full((2, 3), total, np.float32))
        assert res["tree.w"].dtype == np.float32
        assert float(res["tree.b0"]) == total
        np.testing.assert_array_equal(res["tree.b1"], np.arange(3) * total)
        np.testing.assert_array_equal(res["shard"], np.array_split(np.arange(10), n)[r])


def _check_programs(ranks, n, seed, count):
    for i in range(count):
        program = programs.generate(seed + i, n)
        want = programs.global_results(program)
        for r, res in enumerate(ranks):
            for k in ("value", "grad", "tangent", "hvp"):
                np.testing.assert_allclose(res[f"{i}.{k}"], want[k][r], rtol=1e-9, atol=1e-12,
                                           err_msg=f"program {seed + i} {program['steps']} rank {r} {k}")


# (Not named ``impl``: that parameter belongs to tests/support/implementations.py,
# which runs each value in the process of that implementation.)
@pytest.mark.parametrize("n,seed,runtime", [(2, 100, "compiled"), (4, 200, "compiled"),
                                            (2, 300, "pure Python")])
def test_generated_programs_differentiate_as_their_global_function(mpirun, n, seed, runtime):
    count = 12
    env = {"KINA_FX_PURE_PYTHON": "1" if runtime == "pure Python" else "0"}
    ranks = mpirun(n, "programs", seed, count, env=env).ranks()
    _check_programs(ranks, n, seed, count)


def test_the_global_reference_agrees_with_central_differences():
    """The oracle of the test above, checked itself (float64, central differences)."""
    for seed in range(100, 106):
        program = programs.generate(seed, 3)
        X = programs.stacked(program)
        grad = programs.global_results(program)["grad"]

        def total(X):
            return float(np.sum(np.asarray(programs.run_global(program, X))))
        eps = 1e-6
        numeric = np.zeros_like(X)
        for index in np.ndindex(X.shape):
            hi, lo = X.copy(), X.copy()
            hi[index] += eps
            lo[index] -= eps
            numeric[index] = (total(hi) - total(lo)) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-6, err_msg=str(program["steps"]))


def test_the_generated_programs_cover_every_collective():
    kinds = {(s[0], s[1] if len(s) > 1 and isinstance(s[1], str) else None)
             for seed in list(range(100, 112)) + list(range(200, 212))
             for s in programs.generate(seed, 2 if seed < 200 else 4)["steps"]}
    for op in ("sum", "mean", "max", "min"):
        assert ("all_reduce", op) in kinds
    for op in ("sum", "mean"):
        assert ("reduce_scatter", op) in kinds
    assert ("broadcast", None) in kinds and ("all_gather", None) in kinds


@pytest.mark.parametrize("n", SIZES)
def test_ties_share_the_gradient_equally_between_ranks(mpirun, n):
    ranks = mpirun(n, "ties").ranks()
    for op in ("max", "min"):
        reduce = ad.max if op == "max" else ad.min
        for i in range(5):
            X = np.stack([programs.tie_input(i, r) for r in range(n)])
            W = np.stack([programs.tie_weights(i, r) for r in range(n)])
            # Every rank weights the same reduced value with its own w: the global
            # function is sum(reduce(X) * sum_r w_r).
            grad = ad.grad(lambda X: ad.sum(reduce(X, 0) * W.sum(axis=0)))(X)
            tangent = ad.jvp(lambda X: reduce(X, 0), (X,), (W,))[1]
            counts = (X == reduce(X, 0)).sum(axis=0)
            assert (counts > 1).any(), "the data must hold ties"
            for r, res in enumerate(ranks):
                np.testing.assert_allclose(res[f"{op}.{i}.grad"], np.asarray(grad)[r], rtol=1e-12)
                np.testing.assert_allclose(res[f"{op}.{i}.tangent"], np.asarray(tangent), rtol=1e-12)


@pytest.mark.parametrize("n", SIZES)
def test_runtime_exports_under_mpi(mpirun, n):
    ranks = mpirun(n, "abi").ranks()
    stack = np.stack([programs.value_input(3, "abi", "float32", (3, 4), r) for r in range(n)])
    wstack = np.stack([programs.value_input(4, "abiw", "float32", (3, 4), r) / 4 for r in range(n)])
    for r, res in enumerate(ranks):
        for op in ("sum", "mean", "max", "min"):
            np.testing.assert_array_equal(res[f"all_reduce.{op}"], programs.expected_reduction(stack, op))
        for root in range(n):
            np.testing.assert_array_equal(res[f"broadcast.{root}"], stack[root])
        np.testing.assert_array_equal(res["in_place"], stack.sum(axis=0))
        assert int(res["bad_op"]) == 1 and int(res["bad_root"]) == 1 and int(res["bad_shape"]) == 1
        assert f"root {n} out of range [0, {n})" in str(res["bad_root_error"])
        np.testing.assert_array_equal(res["untouched"], np.full((3, 4), 7.0, np.float32))
        # s_r = sum(broadcast(all_reduce(x*x), root=n-1) * w_r): the global total is
        # sum(sum_r x_r**2 * sum_r w_r), so every rank's gradient is 2 x_r * sum_r w_r.
        sq = (stack.astype(np.float64) ** 2).sum(axis=0)
        np.testing.assert_allclose(float(res["tape.value"]), (sq * wstack[r]).sum(), rtol=1e-5)
        np.testing.assert_allclose(res["tape.grad"], 2 * stack[r] * wstack.sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("path", ["host", "cuda_aware"])
def test_device_arrays_on_the_cupy_stand_in(mpirun, path):
    """The CuPy code path with NumPy-backed stand-in arrays (no GPU here): results
    stay device arrays, staged ("host") or handed to MPI as they are ("cuda_aware",
    after synchronising the stream)."""
    n = 2
    ranks = mpirun(n, "cupy", path).ranks()
    stack = np.stack([programs.value_input(9, "cupy", "float32", (2, 3), r) for r in range(n)])
    for r, res in enumerate(ranks):
        np.testing.assert_array_equal(res["all_reduce"], stack.sum(axis=0))
        np.testing.assert_array_equal(res["broadcast"], stack[n - 1])
        np.testing.assert_array_equal(res["all_gather"], stack)
        np.testing.assert_array_equal(res["reduce_scatter"], stack.sum(axis=0))
        np.testing.assert_array_equal(res["grad"], 2 * stack[r] * n)
        assert (int(res["synchronized"]) > 0) == (path == "cuda_aware")
