"""One rank of a distributed test: ``mpiexec -n N python dist_worker.py CASE OUTDIR [ARGS...]``.

Each case runs inside ``with dist.mpi(...)`` and saves what this rank computed
to ``OUTDIR/CASE.<rank>.npz``; the test (tests/distributed/test_mpi.py and
friends) compares every rank's file with the single-process computation.
The fault cases misbehave on purpose (tests/distributed/test_faults.py).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))     # tests/, for support.*

import dist_programs as programs  # noqa: E402
from kina_fx import autograd as ad  # noqa: E402
from kina_fx import distributed as dist  # noqa: E402


def save(out, case, results):
    np.savez(Path(out) / f"{case}.{dist.rank()}.npz", **{k: np.asarray(v) for k, v in results.items()})


# ---- values -------------------------------------------------------------------

def case_values(out, seed="0"):
    r, n = dist.rank(), dist.world_size()
    results = {"rank": r, "size": n}
    for key, dtype, shape in programs.VALUE_SPECS:
        x = programs.value_input(int(seed), key, dtype, shape, r)
        for op in programs.ops_for(dtype):
            results[f"{key}.all_reduce.{op}"] = dist.all_reduce(x, op)
            results[f"{key}.strided.all_reduce.{op}"] = dist.all_reduce(programs.strided(x), op)
        for root in range(n):
            results[f"{key}.broadcast.{root}"] = dist.broadcast(x, root)
        results[f"{key}.all_gather"] = dist.all_gather(x)
        wide = programs.value_input(int(seed), key + "wide", dtype, (n,) + shape, r)
        for op in ("sum", "mean") if np.dtype(dtype).kind in "fc" else ("sum",):
            results[f"{key}.reduce_scatter.{op}"] = dist.reduce_scatter(wide, op)
    dist.barrier()
    tree = {"w": np.full((2, 3), r, np.float32), "b": [np.float64(r), np.arange(3) * r]}
    reduced = dist.all_reduce_tree(tree, "sum")
    results["tree.w"], results["tree.b0"], results["tree.b1"] = reduced["w"], reduced["b"][0], reduced["b"][1]
    results["shard"] = dist.shard(np.arange(10))
    save(out, "values", results)


# ---- generated programs: values and derivatives ------------------------------------

def case_programs(out, seed="0", count="10"):
    n = dist.world_size()
    results = {}
    for i in range(int(count)):
        program = programs.generate(int(seed) + i, n)
        for k, v in programs.rank_results(program, dist.rank()).items():
            results[f"{i}.{k}"] = v
    save(out, "programs", results)


def case_ties(out):
    """max/min with ties between ranks: integer data in [0, 3)."""
    r = dist.rank()
    results = {}
    for op in ("max", "min"):
        for i in range(5):
            x = programs.tie_input(i, r)
            w = programs.tie_weights(i, r)
            results[f"{op}.{i}.grad"] = ad.grad(lambda x: ad.sum(dist.all_reduce(x, op) * w))(x)
            results[f"{op}.{i}.tangent"] = ad.jvp(lambda x: dist.all_reduce(x, op), (x,), (w,))[1]
    save(out, "ties", results)


# ---- the runtime ABI's collectives, called through libkina_fx.so ------------------

def case_abi(out):
    from support.abi import Abi
    from kina_fx.errors import Status

    abi = Abi()
    r, n = dist.rank(), dist.world_size()
    results = {}
    x = programs.value_input(3, "abi", "float32", (3, 4), r)
    for code, op in enumerate(dist.OPS):
        o = np.full((3, 4), np.nan, np.float32)
        assert abi.call("_mlir_ciface_runtime_all_reduce_f32", o, x, code) == Status.SUCCESS, abi.last_error()
        results[f"all_reduce.{op}"] = o
    for root in range(n):
        o = np.full((3, 4), np.nan, np.float32)
        assert abi.call("_mlir_ciface_runtime_broadcast_f32", o, x, root) == Status.SUCCESS, abi.last_error()
        results[f"broadcast.{root}"] = o
    inplace = x.copy()
    assert abi.call("_mlir_ciface_runtime_all_reduce_f32", inplace, inplace, 0) == Status.SUCCESS
    results["in_place"] = inplace
    # Refused on every rank alike, nothing written, and the group still works after.
    o = np.full((3, 4), 7.0, np.float32)
    results["bad_op"] = abi.call("_mlir_ciface_runtime_all_reduce_f32", o, x, 9)
    results["bad_root"] = abi.call("_mlir_ciface_runtime_broadcast_f32", o, x, n)
    results["bad_root_error"] = np.array(abi.last_error())
    results["bad_shape"] = abi.call("_mlir_ciface_runtime_all_reduce_f32", np.zeros(3, np.float32), x, 0)
    results["untouched"] = o
    # A tape over memory (the tape ABI, kina_tape_*) records the collectives.
    from kina_fx.runtime_ops import ALL_AXES, BY_NAME

    def ok(status):
        assert status == Status.SUCCESS, abi.last_error()

    F32 = 1                                              # KINA_DTYPE_F32
    w = programs.value_input(4, "abiw", "float32", (3, 4), r) / 4
    handle = abi.ffi.new("kina_tape_t *")
    ok(abi.lib.kina_tape_begin(0, handle))
    tape = handle[0]
    ok(abi.call("kina_tape_watch", tape, x, F32))
    ok(abi.call("kina_tape_constant", tape, w, F32))
    sq, red, b, prod = (np.empty((3, 4), np.float32) for _ in range(4))
    s = np.empty((), np.float32)
    for name, *args in (("mul", sq, x, x), ("all_reduce", red, sq, 0), ("broadcast", b, red, n - 1),
                        ("mul", prod, b, w), ("sum", s, prod, ALL_AXES, 0)):
        ok(abi.call(BY_NAME[name].export, *args))
    ok(abi.lib.kina_tape_end(tape))
    ok(abi.call("kina_tape_backward", tape, s, np.ones((), np.float32)))
    g = np.empty_like(x)
    ok(abi.call("kina_tape_grad", tape, x, g))
    ok(abi.lib.kina_tape_free(tape))
    results["tape.value"], results["tape.grad"] = s, g
    save(out, "abi", results)


# ---- CuPy's code paths on the NumPy-backed stand-in (tests/support/autograd.py) -----

def case_cupy(out, path):
    """With ``cupy=path`` ("host": staged through host memory; "cuda_aware": the
    array handed to MPI as it is), device arrays come back as device arrays.
    The stand-in is NumPy memory, so this checks kina_fx's glue, not a GPU."""
    import types

    from kina_fx import gpu_ops
    from support.autograd import FakeCupy, FakeDeviceArray

    fake = FakeCupy()
    synchronized = []
    fake.__dict__["cuda"] = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(
        synchronize=lambda: synchronized.append(1)))
    gpu_ops._cupy = fake
    results = {}
    with dist.mpi(cupy=path, timeout=60):
        r, n = dist.rank(), dist.world_size()
        x = programs.value_input(9, "cupy", "float32", (2, 3), r).view(FakeDeviceArray)
        values = {"all_reduce": dist.all_reduce(x, "sum"), "broadcast": dist.broadcast(x, n - 1),
                  "all_gather": dist.all_gather(x),
                  "reduce_scatter": dist.reduce_scatter(np.stack([x] * n).view(FakeDeviceArray), "sum"),
                  "grad": ad.grad(lambda x: ad.sum(dist.all_reduce(x * x, "sum")))(x)}
        for k, v in values.items():
            assert isinstance(v, FakeDeviceArray), (k, type(v))
            results[k] = np.asarray(v)
        results["synchronized"] = len(synchronized)
        save(out, "cupy", results)


# ---- faults ------------------------------------------------------------------------

def _stay_away(seconds):
    """A rank that never comes, for a bounded time: mpiexec normally ends it
    once the others end, but whether it does is the launcher's business, not
    kina_fx's, so the job ends by itself even where the launcher does not."""
    time.sleep(seconds)
    os._exit(0)


def case_fault(out, mode, victim="1"):
    """Rank ``victim`` misbehaves in the middle of the second step."""
    r = dist.rank()
    x = np.ones(4)
    dist.all_reduce(x)
    sys.stdout.write(f"rank {r} finished step 1\n")
    sys.stdout.flush()
    if r == int(victim):
        if mode == "raise":
            raise RuntimeError("rank failed on purpose in step 2")
        if mode == "exit":
            os._exit(0)
        if mode == "sys_exit":
            sys.exit(0)
        if mode == "kill":
            os.kill(os.getpid(), 9)
        if mode == "hang":
            _stay_away(60)
        if mode == "other_collective":
            dist.broadcast(x, 0)
        if mode == "other_shape":
            dist.all_reduce(np.ones(5))
    dist.all_reduce(x)
    sys.stdout.write(f"rank {r} finished step 2\n")


def case_timeout_caught(out):
    """Rank 1 never comes; rank 0 sees CommunicationError (status 2), then the group is unusable."""
    from kina_fx.errors import CommunicationError, Status

    if dist.rank() == 1:
        _stay_away(4 * float(os.environ["DIST_TEST_TIMEOUT"]))
    try:
        dist.all_reduce(np.ones(3))
    except CommunicationError as exc:
        sys.stdout.write(f"rank 0 caught status {int(exc.status)}: {exc}\n")
        assert exc.status == Status.RESOURCE
    try:
        dist.barrier()
    except CommunicationError as exc:
        sys.stdout.write(f"rank 0 then: {exc}\n")
    sys.stdout.flush()
    os._exit(0)


def main(argv):
    case, out, *args = argv
    if case == "cupy":                  # installs its own group, with the CuPy option
        return case_cupy(out, *args)
    timeout = os.environ.get("DIST_TEST_TIMEOUT", "60")
    abort = os.environ.get("DIST_TEST_ABORT", "1") == "1"
    check = os.environ.get("DIST_TEST_CHECK", "1") == "1"
    with dist.mpi(timeout=None if timeout == "none" else float(timeout), check=check,
                  abort_on_error=abort):
        globals()["case_" + case](out, *args)


if __name__ == "__main__":
    main(sys.argv[1:])
