"""kina_fx.distributed on one process: the defaults, validation, the group in scope, the guard.

No MPI here (except the one MPIGroup test that initialises a singleton MPI):
the collectives' single-process answers, every refusal, which group a
collective runs on (the innermost ``scope``; the one the forward pass used,
for its backward pass), the refusal when a group handler is installed but out
of scope, the runtime exports through the C ABI, and the CuPy code path on the
NumPy-backed stand-in.
"""
from __future__ import annotations

import numpy as np
import pytest

from kina_fx import Handler, autograd as ad, collectives, perform, runtime_ops
from kina_fx import distributed as dist
from kina_fx.autograd.memory import BufferTracer
from kina_fx.errors import KinaTypeError, Status, UnimplementedError, ValidationError
from support.abi import Abi
from support.autograd import FakeDeviceArray, fake_cupy  # noqa: F401  (a fixture)


class Recording(dist.Group):
    """A pretend group of ``size`` identical processes: sums multiply by ``size``;
    it records each call, so a test sees which group a collective ran on."""

    def __init__(self, size=2, rank=0):
        self.size, self.rank, self.calls = size, rank, []

    def _all_reduce(self, x, op):
        self.calls.append(("all_reduce", op))
        return x * self.size if op == "sum" else x.copy()

    def _broadcast(self, x, root):
        self.calls.append(("broadcast", root))
        return x.copy()

    def _all_gather(self, x):
        self.calls.append(("all_gather",))
        return np.stack([x] * self.size)

    def _reduce_scatter(self, x, op):
        self.calls.append(("reduce_scatter", op))
        return x.sum(axis=0) if op == "sum" else x.mean(axis=0)

    def _barrier(self):
        self.calls.append(("barrier",))


# ---- the defaults -----------------------------------------------------------------

def test_one_process_by_default():
    assert dist.rank() == 0 and dist.world_size() == 1
    assert dist.current_group() is dist.SINGLE
    dist.barrier()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "complex64"])
def test_every_collective_is_a_copy_on_one_process(dtype):
    x = (np.arange(6).reshape(2, 3) % 5).astype(dtype)
    ops = [op for op in dist.OPS if not (op in ("max", "min") and x.dtype.kind == "c")
           and not (op == "mean" and x.dtype.kind in "iu")]
    results = [dist.all_reduce(x, op) for op in ops] + [dist.broadcast(x), dist.broadcast(x, 0)]
    for r in results:
        np.testing.assert_array_equal(r, x)
        assert r.dtype == x.dtype and not np.shares_memory(r, x)
    gathered = dist.all_gather(x)
    assert gathered.shape == (1, 2, 3) and not np.shares_memory(gathered, x)
    np.testing.assert_array_equal(gathered[0], x)
    scattered = dist.reduce_scatter(x[None], "sum")
    np.testing.assert_array_equal(scattered, x)
    assert not np.shares_memory(scattered, x)


def test_numbers_and_zero_d_arrays():
    assert dist.all_reduce(3.0) == 3.0
    assert dist.all_gather(np.float32(2)).shape == (1,)
    assert dist.all_reduce(np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("call,error,text", [
    (lambda: dist.all_reduce(np.ones(2), "prod"), ValidationError, "unknown reduction 'prod'"),
    (lambda: dist.all_reduce(np.ones(2), None), ValidationError, "unknown reduction"),
    (lambda: dist.broadcast(np.ones(2), 1), ValidationError, "root 1 out of range [0, 1)"),
    (lambda: dist.broadcast(np.ones(2), -1), ValidationError, "out of range"),
    (lambda: dist.broadcast(np.ones(2), True), KinaTypeError, "root must be an int"),
    (lambda: dist.broadcast(np.ones(2), 0.0), KinaTypeError, "root must be an int"),
    (lambda: dist.all_reduce(np.ones(2, bool)), KinaTypeError, "numbers only"),
    (lambda: dist.all_reduce(np.array(["a"])), KinaTypeError, "numbers only"),
    (lambda: dist.all_reduce(np.ones(2, np.float16)), UnimplementedError, "cast to float32"),
    (lambda: dist.all_reduce(np.ones(2, complex), "max"), KinaTypeError, "complex numbers have no max"),
    (lambda: dist.all_reduce(np.ones(2, int), "mean"), KinaTypeError, "divide by world_size()"),
    (lambda: dist.reduce_scatter(np.ones((2, 3))), ValidationError, "leading dimension of 1"),
    (lambda: dist.reduce_scatter(np.ones(())), ValidationError, "leading dimension of 1"),
    (lambda: dist.reduce_scatter(np.ones((1, 3)), "max"), ValidationError, "'sum' or 'mean'"),
    (lambda: dist.all_reduce(object()), KinaTypeError, "arrays (NumPy, CuPy) or numbers"),
    (lambda: dist.all_reduce(np.ones(2), "sum", "world"), KinaTypeError, "must be a kina_fx.collectives.Group"),
])
def test_refusals(call, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        call()


def test_tensors_are_differentiated_and_stay_tensors():
    x = np.array([1.0, -2.0, 3.0])

    def f(x):
        y = dist.all_reduce(x * x, "mean") + dist.broadcast(x)
        return ad.sum(dist.reduce_scatter(dist.all_gather(y), "sum") * dist.all_reduce(x, "max"))
    value, grad = ad.value_and_grad(f)(x)
    # one process: f = sum((x^2 + x) * x)
    assert np.isclose(value, np.sum((x * x + x) * x))
    np.testing.assert_allclose(grad, 3 * x * x + 2 * x)


# ---- which group a collective runs on -----------------------------------------------

def test_the_innermost_scope_wins_and_scopes_end():
    outer, inner = Recording(4), Recording(3)
    with dist.scope(outer) as g:
        assert g is outer and dist.world_size() == 4
        with dist.scope(inner):
            assert dist.world_size() == 3
            np.testing.assert_array_equal(dist.all_reduce(np.ones(2)), [3.0, 3.0])
        np.testing.assert_array_equal(dist.all_reduce(np.ones(2)), [4.0, 4.0])
    assert dist.world_size() == 1
    assert inner.calls == [("all_reduce", "sum")] and outer.calls == [("all_reduce", "sum")]


def test_backward_runs_on_the_group_the_forward_pass_used():
    group = Recording(2)
    with dist.scope(group):
        value, pullback = ad.vjp(lambda x: dist.all_reduce(x * 3.0), np.ones(2))
    np.testing.assert_array_equal(value, [6.0, 6.0])
    group.calls.clear()
    (ct,) = pullback(np.array([1.0, 10.0]))          # after the scope ended
    assert group.calls == [("all_reduce", "sum")]
    np.testing.assert_array_equal(ct, [6.0, 60.0])    # 3 * (sum over 2 identical processes)


def test_an_explicit_group_overrides_the_scope():
    mine, scoped = Recording(5), Recording(2)
    with dist.scope(scoped):
        np.testing.assert_array_equal(dist.all_reduce(np.ones(1), "sum", mine), [5.0])
    assert scoped.calls == [] and mine.calls == [("all_reduce", "sum")]


def test_a_handler_may_observe_the_collectives():
    seen = []
    eff = ad.effect_of("all_reduce")

    def observe(x, op, group):
        seen.append((op, group))
        return perform(eff, x, op, group)
    group = Recording(2)
    with Handler(fun={eff: observe}):
        with dist.scope(group):
            dist.all_reduce(np.ones(2), "max")
    assert seen == [("max", group)] and group.calls == [("all_reduce", "max")]


def test_a_group_out_of_scope_is_refused_not_replaced_by_one_process():
    """A handler installed outside the group's `with` that re-performs the runtime
    op's effect: its clause runs outside the group handler, which the search skips.
    Answering with the single process there would be silently wrong."""
    eff = runtime_ops.effect_of("all_reduce")
    logger = Handler(fun={eff: lambda out, x, op: perform(eff, out, x, op)})
    out = np.zeros(3, np.float32)
    with logger:
        with dist.scope(Recording(2)):
            with pytest.raises(ValidationError, match="not in scope"):
                perform(eff, out, np.ones(3, np.float32), 0)
    np.testing.assert_array_equal(out, 0.0)
    # Installed outside the logger, the group is found.
    group = Recording(2)
    with dist.scope(group), logger:
        perform(eff, out, np.ones(3, np.float32), 0)
    np.testing.assert_array_equal(out, 2.0)


def test_a_tape_over_memory_inside_the_scope_records_on_that_group():
    group = Recording(2)
    x = np.arange(3, dtype=np.float32)
    out = np.zeros(3, np.float32)
    eff = runtime_ops.effect_of("all_reduce")

    def f(x):
        tracer = BufferTracer(strict=False)
        tracer.bind(xbuf, x, np.asarray(ad.Tensor(x).data))
        tracer.start()
        try:
            perform(eff, out, xbuf, 0)
        finally:
            tracer.stop()
        return ad.sum(tracer.produced(out, "out") * 1.0)
    xbuf = x.copy()
    with dist.scope(group):
        value, grad = ad.value_and_grad(f)(x)
    assert value == 2 * x.sum()
    np.testing.assert_array_equal(grad, [2.0, 2.0, 2.0])
    assert group.calls == [("all_reduce", "sum"), ("all_reduce", "sum")]


def test_the_process_group():
    group = Recording(7)
    dist.install_process_group(group)
    try:
        assert dist.world_size() == 7
        with dist.scope(dist.SINGLE):
            assert dist.world_size() == 1
    finally:
        dist.install_process_group(None)
    assert dist.world_size() == 1
    with pytest.raises(KinaTypeError):
        dist.install_process_group("mpi")


@pytest.mark.parametrize("value", ["", "single", "none", "SINGLE"])
def test_the_environment_selects_one_process(monkeypatch, value):
    monkeypatch.setenv("KINA_FX_DISTRIBUTED", value)
    assert dist.process_group() is dist.SINGLE


def test_an_unknown_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("KINA_FX_DISTRIBUTED", "gloo")
    with pytest.raises(ValidationError, match="KINA_FX_DISTRIBUTED='gloo'"):
        dist.world_size()


def test_scope_needs_a_group():
    with pytest.raises(KinaTypeError):
        dist.scope(object())


# ---- the DDP helpers ------------------------------------------------------------------

def test_all_reduce_tree_keeps_structure_dtypes_and_gradients():
    group = Recording(3)
    tree = {"w": np.ones((2, 2), np.float32), "b": [np.arange(3.0), np.float64(2.0)]}
    with dist.scope(group):
        out = dist.all_reduce_tree(tree, "sum")
    assert out["w"].dtype == np.float32 and out["w"].shape == (2, 2)
    np.testing.assert_array_equal(out["w"], 3.0)
    np.testing.assert_array_equal(out["b"][0], np.arange(3.0) * 3)
    assert float(out["b"][1]) == 6.0
    assert group.calls == [("all_reduce", "sum")] * 2        # one per dtype
    g = ad.grad(lambda x: ad.sum(dist.all_reduce_tree({"a": x, "b": [x * 2]})["b"][0]))(np.ones(3))
    np.testing.assert_array_equal(g, [2.0, 2.0, 2.0])
    assert dist.all_reduce_tree({}) == {}


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_shard_is_array_split(size):
    x = np.arange(10)
    parts = [dist.shard(x, 0, Recording(size, r)) for r in range(size)]
    for got, want in zip(parts, np.array_split(x, size)):
        np.testing.assert_array_equal(got, want)
    y = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(dist.shard(y, 1, Recording(2, 1)), y[:, 2:])


# ---- the runtime exports, through libkina_fx.so ------------------------------------

@pytest.fixture(scope="module")
def abi():
    return Abi()


def test_the_exports_on_one_process(abi, monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for code in range(4):
        out = np.full((3, 4), np.nan, np.float32)
        assert abi.call("_mlir_ciface_runtime_all_reduce_f32", out, x, code) == Status.SUCCESS
        np.testing.assert_array_equal(out, x)
    out = np.full((3, 4), np.nan, np.float32)
    assert abi.call("_mlir_ciface_runtime_broadcast_f32", out, x, 0) == Status.SUCCESS
    np.testing.assert_array_equal(out, x)
    in_place = x.copy()
    assert abi.call("_mlir_ciface_runtime_all_reduce_f32", in_place, in_place, 1) == Status.SUCCESS
    np.testing.assert_array_equal(in_place, x)


@pytest.mark.parametrize("export,out_shape,param,text", [
    ("_mlir_ciface_runtime_all_reduce_f32", (3, 4), 4, "unknown reduction code 4"),
    ("_mlir_ciface_runtime_all_reduce_f32", (3, 4), -1, "unknown reduction code -1"),
    ("_mlir_ciface_runtime_all_reduce_f32", (4, 3), 0, "out has shape (4, 3), expected (3, 4)"),
    ("_mlir_ciface_runtime_broadcast_f32", (3, 4), 1, "root 1 out of range [0, 1)"),
    ("_mlir_ciface_runtime_broadcast_f32", (3, 4), -2, "root -2 out of range"),
    ("_mlir_ciface_runtime_broadcast_f32", (12,), 0, "out has shape (12,), expected (3, 4)"),
])
def test_bad_calls_are_status_1_and_write_nothing(abi, monkeypatch, export, out_shape, param, text):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")
    x = np.ones((3, 4), np.float32)
    out = np.full(out_shape, 7.0, np.float32)
    assert abi.call(export, out, x, param) == Status.VALIDATION
    assert text in abi.last_error()
    np.testing.assert_array_equal(out, 7.0)


def test_the_exports_perform_their_effects_on_the_group_in_scope(abi, monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")
    group = Recording(2)
    x = np.ones(3, np.float32)
    out = np.zeros(3, np.float32)
    with dist.scope(group):
        assert abi.call("_mlir_ciface_runtime_all_reduce_f32", out, x, 0) == Status.SUCCESS
        assert abi.call("_mlir_ciface_runtime_broadcast_f32", out, out, 1) == Status.SUCCESS
    assert group.calls == [("all_reduce", "sum"), ("broadcast", 1)]
    np.testing.assert_array_equal(out, 2.0)


def test_kina_reduce_codes_in_the_header_are_the_op_order():
    import re
    from pathlib import Path
    header = (Path(__file__).resolve().parents[2] / "kina_fx" / "ffi" / "c" / "kina_fx.h").read_text()
    codes = {m[0].lower(): int(m[1]) for m in re.findall(r"#define KINA_REDUCE_(\w+) (\d+)", header)}
    assert codes == {op: i for i, op in enumerate(dist.OPS)}


# ---- CuPy's code path on the NumPy-backed stand-in ---------------------------------------

def test_single_process_keeps_device_arrays_on_device(fake_cupy):
    x = np.arange(4.0).view(FakeDeviceArray)
    for result in (dist.all_reduce(x), dist.broadcast(x), dist.all_gather(x)[0],
                   dist.reduce_scatter(x[None])):
        assert isinstance(result, FakeDeviceArray)
        np.testing.assert_array_equal(result, np.arange(4.0))
    g = ad.grad(lambda x: ad.sum(dist.all_reduce(x * x)))(x)
    assert isinstance(ad.Tensor(g).data, FakeDeviceArray) or isinstance(g, FakeDeviceArray)


# ---- MPI's own group on a single process (a singleton MPI job) -------------------------

@pytest.mark.integration
def test_mpi_group_options_are_checked():
    pytest.importorskip("mpi4py")
    with pytest.raises(ValidationError, match="timeout"):
        dist.MPIGroup(timeout=-1)
    with pytest.raises(ValidationError, match="cupy"):
        dist.MPIGroup(cupy="gloo")
    with pytest.raises(KinaTypeError, match="intracommunicator"):
        dist.MPIGroup(comm="world")
    group = dist.MPIGroup(timeout=None)
    assert (group.rank, group.size, group.timeout) == (0, 1, None)
    with dist.mpi(timeout=5) as g:
        assert dist.world_size() == 1 and g.timeout == 5.0
        np.testing.assert_array_equal(dist.all_reduce(np.arange(3.0), "mean"), np.arange(3.0))
        assert dist.all_gather(np.ones(2)).shape == (1, 2)


def test_mpi_without_mpi4py_says_how_to_install_it(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(UnimplementedError, match=r"pip install 'kina_fx\[mpi\]'"):
        dist.mpi()


@pytest.mark.parametrize("value,want", [("30", 30.0), ("0.5", 0.5), ("none", None), ("0", None),
                                        ("inf", None)])
def test_the_timeout_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv("KINA_FX_DIST_TIMEOUT", value)
    assert collectives._default_timeout() == want


def test_a_bad_timeout_in_the_environment(monkeypatch):
    monkeypatch.setenv("KINA_FX_DIST_TIMEOUT", "soon")
    with pytest.raises(ValidationError, match="KINA_FX_DIST_TIMEOUT"):
        collectives._default_timeout()


def test_other_threads_see_the_process_group_not_the_scope():
    import threading

    def size_in_a_thread():
        seen = []
        thread = threading.Thread(target=lambda: seen.append(dist.world_size()))
        thread.start()
        thread.join()
        return seen[0]
    with dist.scope(Recording(3)):
        assert dist.world_size() == 3 and size_in_a_thread() == 1
    dist.install_process_group(Recording(5))
    try:
        assert size_in_a_thread() == 5
    finally:
        dist.install_process_group(None)
