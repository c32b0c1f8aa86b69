"""The runtime op table: every op's export against NumPy, its primitive, errors, effects.

Each row of kina_fx.runtime_ops.RUNTIME_OPS is called through its real C
export (libkina_fx.so, in-process) on random float32 data with strided,
broadcast and offset operands, and compared with a NumPy reference computed in
float64.  Bad calls return their status with nothing written.  Every export
performs its op's effect: a Python handler sees (and may answer) it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from support.abi import LAYOUTS, Abi, runtime_op_sample, strided
from kina_fx import Handler, autograd as ad, gpu_ops, runtime_ops
from kina_fx.errors import Status, UnimplementedError
from kina_fx.runtime_ops import ALL_AXES, BY_NAME, RUNTIME_OPS

ROOT = Path(__file__).resolve().parents[2]
OK, VALIDATION, TYPE = Status.SUCCESS, Status.VALIDATION, Status.TYPE


@pytest.fixture(scope="module")
def abi():
    return Abi()


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


def test_every_row_is_exported_declared_and_differentiable():
    from kina_fx import ffi as kffi

    header = (ROOT / "kina_fx" / "ffi" / "c" / "kina_fx.h").read_text()
    for op in RUNTIME_OPS:
        assert f"int32_t {op.export}(" in header
        assert f"int32_t {op.export}(" in kffi.CDEF
        assert op.effect.name == f"kina.runtime.{op.name}"
        if op.primitive not in (runtime_ops.IDENTITY, None):
            assert op.primitive in ad.PRIMITIVES, f"{op.name}: no autograd primitive {op.primitive!r}"
    assert {op.name for op in RUNTIME_OPS} >= {
        "neg", "exp", "log", "tanh", "sigmoid", "relu", "add", "sub", "mul", "div", "pow",
        "sum", "mean", "max", "transpose", "log_softmax", "cross_entropy",
        "matmul", "gather", "softmax", "repeat_interleave"}


def test_an_op_without_a_derivative_is_refused_by_a_tape_and_a_copy_is_the_identity():
    """primitive None: differentiate refuses (a tape then fails the call) rather
    than record something; IDENTITY: the output is the input itself."""
    op = BY_NAME["exp"]
    underivable = runtime_ops.RuntimeOp("exp_nd", "_mlir_ciface_runtime_exp_nd_f32", op.output,
                                        op.inputs, (), op.kernel, op.check, None, "no derivative")
    x = np.ones(3, np.float32)
    with pytest.raises(UnimplementedError, match="exp_nd_f32 has no derivative"):
        underivable.differentiate(ad, x)
    assert BY_NAME["copy_to_host_f32"].differentiate(ad, x) is x
    assert BY_NAME["copy_to_device_f32"].differentiate(ad, x, 0) is x


def test_new_exports_follow_the_naming_pattern():
    for op in RUNTIME_OPS:
        if not op.seed:
            assert op.export == f"_mlir_ciface_runtime_{op.name}_f32"


# ---- results against NumPy --------------------------------------------------------

def _f32(rng, shape, positive=False):
    a = np.asarray(rng.standard_normal(shape))
    if positive:
        a = np.abs(a) + 0.5
    return np.asarray(a, dtype=np.float32)


def _log_softmax64(x, axis):
    x = x.astype(np.float64)
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


UNARY_REFS = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
}
BINARY_REFS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
               "pow": np.power}


def _check(got, want):
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(UNARY_REFS))
def test_unary(abi, name, layout):
    rng = np.random.default_rng(hash(name) % 1000)
    x = strided(_f32(rng, (3, 5), positive=name == "log"), layout)
    out = strided(np.zeros((3, 5), np.float32), layout)
    assert abi.call(BY_NAME[name].export, out, x) == OK, abi.last_error()
    _check(out, UNARY_REFS[name](x.astype(np.float64)))


@pytest.mark.parametrize("name", sorted(UNARY_REFS))
def test_unary_on_stepped_buffers(abi, name):
    """Every element step (1-8) of input and output, and reversed: NumPy 2.4's
    negative reads a float32 input of step 4 into an output of step 4 as if it
    were contiguous (out[i] = -x_base[i]); the runtime must not."""
    rng = np.random.default_rng(3)
    base = _f32(rng, (80,), positive=name == "log")
    for step_in in (1, 2, 3, 4, 5, 8, -1, -4):
        for step_out in (1, 2, 4, 8, -4):
            x = base[::step_in][:7]
            out = np.zeros(80, np.float32)[::step_out][:7]
            assert abi.call(BY_NAME[name].export, out, x) == OK, abi.last_error()
            _check(out, UNARY_REFS[name](x.astype(np.float64)))


def test_unary_in_place_and_rank0(abi):
    x = np.array(2.0, np.float32)
    assert abi.call(BY_NAME["exp"].export, x, x) == OK
    assert np.isclose(x, np.exp(2.0))


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)),
                                    ((2, 3, 4), (3, 1)), ((), (2, 2)), ((0, 3), (3,))])
@pytest.mark.parametrize("name", sorted(BINARY_REFS))
def test_binary_broadcasting(abi, name, shapes):
    rng = np.random.default_rng(7)
    a = _f32(rng, shapes[0], positive=name == "pow")
    b = _f32(rng, shapes[1])
    shape = np.broadcast_shapes(*shapes)
    out = np.full(shape, np.nan, np.float32)
    assert abi.call(BY_NAME[name].export, out, a, b) == OK, abi.last_error()
    _check(out, BINARY_REFS[name](a.astype(np.float64), b.astype(np.float64)))


def test_binary_stride0_broadcast_operand(abi):
    b = np.lib.stride_tricks.as_strided(np.array([1.5], np.float32), (3, 4), (0, 0))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.zeros((3, 4), np.float32)
    assert abi.call(BY_NAME["mul"].export, out, a, b) == OK
    _check(out, a * 1.5)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axis", [ALL_AXES, 0, 1, -1, -3])
@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_reductions(abi, name, axis, keepdims):
    rng = np.random.default_rng(3)
    x = strided(_f32(rng, (2, 3, 4)), "transposed")
    ax = None if axis == ALL_AXES else axis
    want = getattr(np, name)(x.astype(np.float64), axis=ax, keepdims=bool(keepdims))
    out = np.full(want.shape, np.nan, np.float32)
    assert abi.call(BY_NAME[name].export, out, x, axis, keepdims) == OK, abi.last_error()
    _check(out, want)


def test_sum_of_an_empty_axis_is_zero_and_mean_max_refuse(abi):
    x = np.zeros((0, 3), np.float32)
    out = np.full((3,), 7, np.float32)
    assert abi.call(BY_NAME["sum"].export, out, x, 0, 0) == OK
    assert (out == 0).all()
    for name in ("mean", "max"):
        out[...] = 7
        assert abi.call(BY_NAME[name].export, out, x, 0, 0) == VALIDATION
        assert "empty" in abi.last_error()
        assert (out == 7).all()


@pytest.mark.parametrize("perm", [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0)])
def test_transpose(abi, perm):
    x = _f32(np.random.default_rng(1), (2, 3, 4))
    out = np.zeros(tuple(x.shape[p] for p in perm), np.float32)
    assert abi.call(BY_NAME["transpose"].export, out, x, np.array(perm, np.int64)) == OK
    assert (out == x.transpose(perm)).all()


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_log_softmax(abi, axis):
    x = _f32(np.random.default_rng(2), (4, 5)) * 10
    out = np.zeros_like(x)
    assert abi.call(BY_NAME["log_softmax"].export, out, x, axis) == OK
    np.testing.assert_allclose(out, _log_softmax64(x, axis), rtol=1e-5, atol=1e-5)


def test_cross_entropy(abi):
    rng = np.random.default_rng(4)
    logits = _f32(rng, (6, 5)) * 3
    labels = rng.integers(0, 5, 6).astype(np.int64)
    out = np.zeros((), np.float32)
    assert abi.call(BY_NAME["cross_entropy"].export, out, logits, labels) == OK
    want = -_log_softmax64(logits, -1)[np.arange(6), labels].mean()
    np.testing.assert_allclose(out, want, rtol=1e-5)


# ---- errors: status, message, nothing written ---------------------------------------

BAD_CALLS = [
    ("add", lambda: (np.zeros((3, 4), np.float32), np.ones((3, 4), np.float32), np.ones((2,), np.float32)), "broadcast"),
    ("add", lambda: (np.zeros((3, 5), np.float32), np.ones((3, 4), np.float32), np.ones((4,), np.float32)), "shape"),
    ("exp", lambda: (np.zeros((3,), np.float32), np.ones((4,), np.float32)), "shape"),
    ("sum", lambda: (np.zeros((), np.float32), np.ones((3,), np.float32), 1, 0), "axis 1"),
    ("sum", lambda: (np.zeros((), np.float32), np.ones((3,), np.float32), ALL_AXES, 2), "keepdims"),
    ("max", lambda: (np.zeros((3,), np.float32), np.ones((3,), np.float32), ALL_AXES, 0), "shape"),
    ("transpose", lambda: (np.zeros((3, 2), np.float32), np.ones((2, 3), np.float32), np.array([0, 0], np.int64)), "permutation"),
    ("transpose", lambda: (np.zeros((3, 2), np.float32), np.ones((2, 3), np.float32), np.array([1, 0, 2], np.int64)), "perm"),
    ("log_softmax", lambda: (np.zeros((3,), np.float32), np.ones((3,), np.float32), 2), "axis 2"),
    ("cross_entropy", lambda: (np.zeros((), np.float32), np.ones((2, 3), np.float32), np.array([0, 3], np.int64)), "label 3"),
    ("cross_entropy", lambda: (np.zeros((), np.float32), np.ones((2, 3), np.float32), np.array([0, -1], np.int64)), "label -1"),
    ("cross_entropy", lambda: (np.zeros((), np.float32), np.ones((2, 3), np.float32), np.array([0], np.int64)), "labels of shape"),
    ("cross_entropy", lambda: (np.zeros((), np.float32), np.ones((0, 3), np.float32), np.zeros((0,), np.int64)), "empty batch"),
    ("cross_entropy", lambda: (np.zeros((1,), np.float32), np.ones((2, 3), np.float32), np.array([0, 1], np.int64)), "shape"),
]


@pytest.mark.parametrize("name,make,message", BAD_CALLS)
def test_bad_calls_return_validation_and_write_nothing(abi, name, make, message):
    args = make()
    out = args[0]
    out[...] = 42
    assert abi.call(BY_NAME[name].export, *args) == VALIDATION
    assert message in abi.last_error()
    assert (out == 42).all()


def test_null_and_rank_errors(abi):
    x = np.ones((2,), np.float32)
    assert abi.call(BY_NAME["exp"].export, None, x) == VALIDATION
    assert "null" in abi.last_error()
    assert abi.call(BY_NAME["add"].export, x, x, None) == VALIDATION


# ---- every export performs its op's effect -------------------------------------------

def test_an_export_performs_its_effect_and_a_handler_can_answer(abi):
    a, b = np.ones((2, 2), np.float32), np.full((2, 2), 3.0, np.float32)
    out = np.zeros((2, 2), np.float32)
    seen = []

    def count(out_, a_, b_):
        seen.append((out_.shape, a_.shape, b_.shape))
        return runtime_ops.effect_of("matmul").default(out_, a_, b_)   # compute as usual

    with Handler(fun={runtime_ops.effect_of("matmul"): count}):
        assert abi.call(BY_NAME["matmul"].export, out, a, b) == OK
    assert seen == [((2, 2), (2, 2), (2, 2))]
    assert (out == 6).all()

    def refuse(*args):
        raise ValueError("not today")
    with Handler(fun={runtime_ops.effect_of("exp"): refuse}):
        assert abi.call(BY_NAME["exp"].export, out, a) == VALIDATION   # a ValueError
    assert "not today" in abi.last_error()


def test_effect_of_unknown_name():
    with pytest.raises(ValueError, match="no runtime op"):
        runtime_ops.effect_of("frobnicate")


@pytest.mark.parametrize("op", [op for op in RUNTIME_OPS if op.primitive not in (runtime_ops.IDENTITY, None)],
                         ids=lambda op: op.name)
def test_each_row_computes_what_its_autograd_primitive_computes(op):
    """The op table is checked against autograd's registry: the runtime kernel
    (what an untaped call computes) and the primitive (what a tape computes)
    agree on every row's sample."""
    rng = np.random.default_rng(len(op.name))
    inputs, params = runtime_op_sample(op, rng)
    out = np.zeros(op.check(*inputs, *params), op.output.dtype)
    op.kernel(out, *inputs, *params)
    np.testing.assert_allclose(out, np.asarray(op.differentiate(ad, *inputs, *params)),
                               rtol=1e-6, atol=1e-7)
    assert ad.PRIMITIVES[op.primitive].effect is not op.effect     # two effects: arrays vs buffers


def test_all_axes_is_int32_min():
    assert gpu_ops.ALL_AXES == runtime_ops.ALL_AXES == -(2 ** 31)


@pytest.mark.integration
def test_a_c_handler_cannot_take_a_runtime_ops_effect(abi, tmp_path):
    """The payload is arrays, not int64 values: a C handler pushed for a runtime
    op's effect is never called; the export returns 6 and writes nothing."""
    import cffi

    from support.abi import build_fixture_library

    src = tmp_path / "answer.c"
    src.write_text('#include "kina_fx.h"\n'
                   "int32_t answer(void *ctx, int32_t e, const int64_t *a, int32_t n, int64_t *out)\n"
                   "{ (void)ctx; (void)e; (void)a; (void)n; *out = 0; return 0; }\n")
    so = build_fixture_library(src, tmp_path / "answer.so")
    c = cffi.FFI()
    c.cdef("int32_t answer(void *, int32_t, const int64_t *, int32_t, int64_t *);")
    fixture = c.dlopen(str(so))
    fn = abi.ffi.cast("kina_handler_fn", c.cast("void *", c.addressof(fixture, "answer")))
    ids = abi.ffi.new("int32_t[1]", [runtime_ops.effect_of("exp").id])
    handle = abi.ffi.new("kina_handler_t *")
    assert abi.lib.kina_push_handler(fn, abi.ffi.NULL, ids, 1, handle) == OK
    try:
        x, y = np.ones(3, np.float32), np.zeros(3, np.float32)
        assert abi.call(BY_NAME["exp"].export, y, x) == TYPE
        assert "must be an int to cross the C ABI" in abi.last_error()
        assert (y == 0).all()
    finally:
        assert abi.lib.kina_pop_handler(handle[0]) == OK


# Operands large enough for the kernels' own paths at their real thresholds
# (row blocks on two threads, a bias row tiled into wide rows, reductions in
# blocks or as one call): through the exports, NumPy's values bit for bit.
LARGE = [(100000, 3), (16385, 4), (300, 1000)]


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setenv("KINA_FX_THREADS", "2")


@pytest.mark.parametrize("shape", LARGE)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_large_binary_ops_with_a_bias_row_are_numpys(abi, two_threads, name, shape):
    rng = np.random.default_rng(11)
    ufunc = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[name]
    x = _f32(rng, shape)
    bias = _f32(rng, (1, shape[1]), positive=True)
    for a, b in ((x, bias), (bias, x)):
        expected = ufunc(a, b)
        out = np.full(expected.shape, np.nan, np.float32)
        assert abi.call(BY_NAME[name].export, out, a, b) == OK, abi.last_error()
        np.testing.assert_array_equal(out, expected)
        spaced = np.full((shape[0], 2 * shape[1]), np.nan, np.float32)[:, ::2]    # a strided out
        assert abi.call(BY_NAME[name].export, spaced, a, b) == OK, abi.last_error()
        np.testing.assert_array_equal(spaced, expected)
    inplace = x.copy()
    assert abi.call(BY_NAME[name].export, inplace, inplace, bias[0]) == OK, abi.last_error()
    np.testing.assert_array_equal(inplace, ufunc(x, bias[0]))


@pytest.mark.parametrize("shape", LARGE)
@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_large_reductions_are_numpys(abi, two_threads, name, shape):
    rng = np.random.default_rng(12)
    for x in (_f32(rng, shape), np.asfortranarray(_f32(rng, shape))):
        for axis in (0, 1):
            for keepdims in (0, 1):
                expected = getattr(np, name)(x, axis=axis, keepdims=bool(keepdims))
                out = np.full(expected.shape, np.nan, np.float32)
                assert abi.call(BY_NAME[name].export, out, x, axis, keepdims) == OK, abi.last_error()
                np.testing.assert_array_equal(out, expected)
