"""The C fast path of the runtime op exports (kina_fx/_speedups_c/op_calls.c) against their cffi path.

A runtime op export called with descriptors whose views are cached runs in C
up to the op's effect (the fast path); otherwise, and with the fast path
unbound, the cffi callback does everything (the reference).  Here the same
generated calls -- valid and invalid -- run on both, with the same buffers,
and must give the same statuses, kina_last_error texts, outputs (bit for bit)
and exceptions, including inside a tape and under a Python handler of the op's
effect.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kina_fx import ffi as kffi
from kina_fx import handlers, memref
from kina_fx.ffi import ops as ffi_ops
from kina_fx.runtime_ops import effect_of

from support.abi import Abi

pytestmark = pytest.mark.only_impl("compiled")     # the pure-Python one has no fast path

SETTINGS = dict(deadline=None, max_examples=30, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def abi():
    return Abi()


class Paths:
    """Switch the fast path off and on (on again at the end)."""

    def off(self):
        kffi.set_fast_paths(False)

    def on(self):
        kffi.set_fast_paths(True)


@pytest.fixture
def paths():
    p = Paths()
    yield p
    p.on()


def run(abi, name, operands, params=()):
    """Call export ``name`` on memrefs over ``operands`` (outputs first, a fresh
    copy of each) three times: the first call makes the views, the second
    finds them cached (and admits their shapes for the direct call, where
    the op has one), the third may make the direct call.  Returns [(status,
    error text, outputs)] of each."""
    out = []
    ms = [memref.from_numpy(a) for a in operands]
    for _ in range(3):
        for m, a in zip(ms, operands):
            m.array[...] = a
        status = getattr(abi.lib, name)(*[abi.ptr(m) for m in ms], *params)
        out.append((status, abi.last_error() if status else "", ms[0].array.copy()))
    return out


def same(a, b):
    assert a[0] == b[0] and a[1] == b[1], (a[:2], b[:2])
    np.testing.assert_array_equal(a[2], b[2])


CASES = {
    "matmul": ("_mlir_ciface_runtime_gpu_matmul_f32", lambda r: [np.zeros((3, 4), np.float32),
                                                               r.standard_normal((3, 5)).astype(np.float32),
                                                               r.standard_normal((5, 4)).astype(np.float32)], ()),
    "matmul_bad_shapes": ("_mlir_ciface_runtime_gpu_matmul_f32", lambda r: [np.zeros((3, 4), np.float32),
                                                                          np.ones((3, 5), np.float32),
                                                                          np.ones((4, 4), np.float32)], ()),
    "add_bias": ("_mlir_ciface_runtime_add_f32", lambda r: [np.zeros((6, 3), np.float32),
                                                           r.standard_normal((6, 3)).astype(np.float32),
                                                           r.standard_normal(3).astype(np.float32)], ()),
    "add_bad_out": ("_mlir_ciface_runtime_add_f32", lambda r: [np.zeros((6, 4), np.float32),
                                                              np.ones((6, 3), np.float32),
                                                              np.ones(3, np.float32)], ()),
    "softmax": ("_mlir_ciface_runtime_gpu_softmax_f32", lambda r: [np.zeros((4, 7), np.float32),
                                                                  r.standard_normal((4, 7)).astype(np.float32)],
                (1,)),
    "softmax_bad_axis": ("_mlir_ciface_runtime_gpu_softmax_f32", lambda r: [np.zeros((4, 7), np.float32),
                                                                           np.ones((4, 7), np.float32)], (5,)),
    "sum_keepdims": ("_mlir_ciface_runtime_sum_f32", lambda r: [np.zeros((4, 1), np.float32),
                                                               r.standard_normal((4, 7)).astype(np.float32)],
                     (1, 1)),
    "sum_bad_keepdims": ("_mlir_ciface_runtime_sum_f32", lambda r: [np.zeros((4,), np.float32),
                                                                   np.ones((4, 7), np.float32)], (1, 3)),
    "gather": ("_mlir_ciface_runtime_gpu_gather_f32", lambda r: [np.zeros((3, 2), np.float32),
                                                                r.standard_normal((5, 2)).astype(np.float32),
                                                                np.array([4, 0, 2], np.int64)], ()),
    "gather_out_of_range": ("_mlir_ciface_runtime_gpu_gather_f32", lambda r: [np.zeros((3, 2), np.float32),
                                                                             np.ones((5, 2), np.float32),
                                                                             np.array([4, 9, 2], np.int64)], ()),
    "cross_entropy": ("_mlir_ciface_runtime_cross_entropy_f32", lambda r: [np.zeros((), np.float32),
                                                                          r.standard_normal((6, 4)).astype(np.float32),
                                                                          np.array([0, 3, 1, 1, 2, 0], np.int64)], ()),
    "cross_entropy_bad_label": ("_mlir_ciface_runtime_cross_entropy_f32",
                                lambda r: [np.zeros((), np.float32), np.ones((2, 4), np.float32),
                                           np.array([0, 4], np.int64)], ()),
    "relu": ("_mlir_ciface_runtime_relu_f32", lambda r: [np.zeros((5,), np.float32),
                                                        r.standard_normal(5).astype(np.float32)], ()),
    "exp": ("_mlir_ciface_runtime_exp_f32", lambda r: [np.zeros((3, 4), np.float32),
                                                      (r.standard_normal((3, 4)) * 60).astype(np.float32)], ()),
    "log_of_negatives": ("_mlir_ciface_runtime_log_f32", lambda r: [np.zeros(6, np.float32),
                                                                   r.standard_normal(6).astype(np.float32)], ()),
    "tanh_rank0": ("_mlir_ciface_runtime_tanh_f32", lambda r: [np.zeros((), np.float32),
                                                              np.array(r.standard_normal(), np.float32)], ()),
    "sub_broadcast": ("_mlir_ciface_runtime_sub_f32", lambda r: [np.zeros((2, 3, 4), np.float32),
                                                                r.standard_normal((3, 1)).astype(np.float32),
                                                                r.standard_normal((2, 1, 4)).astype(np.float32)], ()),
    "mul": ("_mlir_ciface_runtime_mul_f32", lambda r: [np.zeros(5, np.float32),
                                                      r.standard_normal(5).astype(np.float32),
                                                      r.standard_normal(5).astype(np.float32)], ()),
    "div_by_zero": ("_mlir_ciface_runtime_div_f32", lambda r: [np.zeros(4, np.float32),
                                                              r.standard_normal(4).astype(np.float32),
                                                              np.array([0, 1, -0.0, 2], np.float32)], ()),
    "pow": ("_mlir_ciface_runtime_pow_f32", lambda r: [np.zeros((2, 2), np.float32),
                                                      r.standard_normal((2, 2)).astype(np.float32),
                                                      np.array([0.5, 2], np.float32)], ()),
    "sub_bad_out": ("_mlir_ciface_runtime_sub_f32", lambda r: [np.zeros(3, np.float32), np.ones(4, np.float32),
                                                              np.ones(4, np.float32)], ()),
    "matmul_vector": ("_mlir_ciface_runtime_gpu_matmul_f32", lambda r: [np.zeros(4, np.float32),
                                                                       r.standard_normal(3).astype(np.float32),
                                                                       r.standard_normal((3, 4)).astype(np.float32)], ()),
    "matmul_dot": ("_mlir_ciface_runtime_gpu_matmul_f32", lambda r: [np.zeros((), np.float32),
                                                                    r.standard_normal(3).astype(np.float32),
                                                                    r.standard_normal(3).astype(np.float32)], ()),
    "matmul_empty": ("_mlir_ciface_runtime_gpu_matmul_f32", lambda r: [np.ones((2, 3), np.float32),
                                                                      np.zeros((2, 0), np.float32),
                                                                      np.zeros((0, 3), np.float32)], ()),
    "matmul_batched": ("_mlir_ciface_runtime_gpu_matmul_f32", lambda r: [np.zeros((2, 3, 4), np.float32),
                                                                        r.standard_normal((2, 3, 5)).astype(np.float32),
                                                                        r.standard_normal((5, 4)).astype(np.float32)], ()),
    "copy_to_device": ("_mlir_ciface_runtime_copy_to_device_f32", lambda r: [np.zeros((2, 3), np.float32),
                                                                            r.standard_normal((2, 3)).astype(np.float32)],
                       (1,)),
}


@settings(**SETTINGS)
@given(case=st.sampled_from(sorted(CASES)), seed=st.integers(0, 2**16))
def test_fast_and_cffi_paths_agree(abi, paths, case, seed):
    name, make, params = CASES[case]
    operands = make(np.random.default_rng(seed))
    memref.clear_caches()
    paths.off()
    reference = run(abi, name, operands, params)
    memref.clear_caches()
    paths.on()
    fast = run(abi, name, operands, params)
    for r in reference[1:] + fast:
        same(reference[0], r)
    if reference[0][0]:        # a refused call wrote nothing
        np.testing.assert_array_equal(reference[0][2], operands[0])


def test_the_fast_path_is_taken_once_views_are_cached(abi, paths):
    # The cffi path runs the op's Python callback (kina_fx/ffi/ops.py); the
    # fast path goes from C straight to the effect: a clause sees which.
    name, make, _ = CASES["matmul"]
    ms = [memref.from_numpy(a) for a in make(np.random.default_rng(0))]
    through_the_callback = []

    def clause(out, a, b):
        frame, files = sys._getframe(1), set()
        while frame is not None:
            files.add(frame.f_code.co_filename)
            frame = frame.f_back
        through_the_callback.append(str(Path(ffi_ops.__file__)) in files)
        return handlers.FORWARD
    paths.on()
    memref.clear_caches()
    for _ in range(2):                       # the second call finds the views cached
        with handlers.Handler(fun={effect_of("matmul"): clause}):
            assert getattr(abi.lib, name)(*[abi.ptr(m) for m in ms]) == 0
    assert through_the_callback == [True, False]


def test_a_python_handler_of_the_effect_answers_on_the_fast_path(abi, paths):
    name, make, params = CASES["matmul"]
    operands = make(np.random.default_rng(1))
    seen = []

    def clause(out, a, b):
        seen.append((out.shape, a.shape, b.shape))
        out[...] = 7
    ms = [memref.from_numpy(a) for a in operands]
    for _ in range(2):                       # the second call finds the views cached
        with handlers.Handler(fun={effect_of("matmul"): clause}):
            assert getattr(abi.lib, name)(*[abi.ptr(m) for m in ms]) == 0
    assert seen == [((3, 4), (3, 5), (5, 4))] * 2
    assert (ms[0].array == 7).all()


def test_an_exception_of_a_handler_is_its_status_on_both_paths(abi, paths):
    from kina_fx.errors import ResourceError

    name, make, _ = CASES["relu"]
    ms = [memref.from_numpy(a) for a in make(np.random.default_rng(2))]

    def clause(out, x):
        raise ResourceError("out of tokens")
    results = []
    for setup in (paths.off, paths.on):
        setup()
        memref.clear_caches()
        for _ in range(2):
            with handlers.Handler(fun={effect_of("relu"): clause}):
                status = getattr(abi.lib, name)(*[abi.ptr(m) for m in ms])
            results.append((status, abi.last_error()))
    assert len(set(results)) == 1 and results[0][0] != 0
    assert "ResourceError: out of tokens" in results[0][1]


def test_another_backend_declines_the_fast_path(abi, paths, monkeypatch):
    name, make, params = CASES["relu"]
    operands = make(np.random.default_rng(3))
    ms = [memref.from_numpy(a) for a in operands]
    for m in ms:
        getattr(abi.lib, name)(*[abi.ptr(m) for m in ms])
    monkeypatch.setenv("KINA_FX_DEVICE", "nonsense")
    status = getattr(abi.lib, name)(*[abi.ptr(m) for m in ms])
    assert status != 0 and "KINA_FX_DEVICE must be cpu, cuda or auto" in abi.last_error()


# ---- the direct call (op_calls.c: the ops with RuntimeOp.direct) -------------------------------

def python_functions_called(call):
    """The (file, function) of every function of kina_fx's Python code run while ``call()`` runs."""
    seen = []
    package = str(Path(ffi_ops.__file__).parents[1])

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            seen.append((Path(frame.f_code.co_filename).name, frame.f_code.co_name))
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def forget_admitted_shapes():
    """Empty every op's memo of admitted shapes (ffi.ops.FAST_ROWS)."""
    for row in ffi_ops.FAST_ROWS:
        if row is not None and row[2] is not None:
            row[2][3].clear()


def admitted_call(abi, paths, case="matmul", seed=0, calls=3):
    """``(call, memrefs)``: ``call()`` calls the export of ``CASES[case]`` on
    fresh memrefs, with the fast path on, after ``calls`` calls from cold
    caches (three: views made, shapes admitted, the first direct call)."""
    name, make, params = CASES[case]
    ms = [memref.from_numpy(a) for a in make(np.random.default_rng(seed))]
    fn, args = getattr(abi.lib, name), [abi.ptr(m) for m in ms] + list(params)
    paths.on()
    memref.clear_caches()
    forget_admitted_shapes()        # an earlier test may have admitted these shapes
    for _ in range(calls):
        fn(*args)
    return (lambda: fn(*args)), ms


def test_admitted_shapes_take_the_direct_call_with_no_python_frame(abi, paths):
    # The first call makes the views, the second runs the effect's default
    # and admits the shapes; from the third on, NumPy is called from C.
    call, ms = admitted_call(abi, paths, calls=0)
    calls = [python_functions_called(call) for _ in range(4)]
    assert any(f == "gpu_ops.py" for f, _ in calls[1])          # the default ran
    assert calls[2] == calls[3] == []
    np.testing.assert_array_equal(ms[0].array, ms[1].array @ ms[2].array)


@pytest.mark.parametrize("case", ["matmul_dot", "matmul_empty", "tanh_rank0", "add_bad_out"])
def test_shapes_a_kernel_treats_apart_are_never_admitted(abi, paths, case):
    call, _ = admitted_call(abi, paths, case)
    assert python_functions_called(call)


def test_a_handler_installed_after_admission_still_answers(abi, paths):
    call, ms = admitted_call(abi, paths, seed=1)
    seen = []

    def clause(out, a, b):
        seen.append(out.shape)
        out[...] = 7
    with handlers.Handler(fun={effect_of("matmul"): clause}):
        assert call() == 0
    assert seen == [(3, 4)] and (ms[0].array == 7).all()
    assert call() == 0                                       # and direct again after
    np.testing.assert_array_equal(ms[0].array, ms[1].array @ ms[2].array)


def test_a_handler_in_an_outer_fiber_still_answers(abi, paths):
    from kina_fx import fiber

    call, ms = admitted_call(abi, paths, seed=2)
    seen = []

    def clause(out, a, b):
        seen.append("outer")
        out[...] = -1
    with handlers.Handler(fun={effect_of("matmul"): clause}):
        assert fiber(lambda _: call()).resume_with(None, handlers.Handler(on={})) == 0
    assert seen == ["outer"] and (ms[0].array == -1).all()


def test_a_replaced_default_is_what_runs(abi, paths, monkeypatch):
    call, ms = admitted_call(abi, paths, seed=3)

    def default(out, a, b):
        out[...] = 3
    monkeypatch.setattr(effect_of("matmul"), "default", default)
    assert call() == 0
    assert (ms[0].array == 3).all()


def test_a_tape_records_admitted_shapes(abi, paths):
    # A tape handles the op's effect: the call is recorded, not made directly.
    ffi, lib = abi.ffi, abi.lib
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 3)).astype(np.float32)
    b = rng.standard_normal((3, 3)).astype(np.float32)
    ma, mb, mo = (memref.from_numpy(x) for x in (a, b, np.zeros((3, 3), np.float32)))
    paths.on()
    memref.clear_caches()
    for _ in range(3):
        assert lib._mlir_ciface_runtime_gpu_matmul_f32(abi.ptr(mo), abi.ptr(ma), abi.ptr(mb)) == 0
    tape = ffi.new("kina_tape_t *")
    assert lib.kina_tape_begin(0, tape) == 0
    assert lib.kina_tape_watch(tape[0], abi.ptr(ma), 1) == 0, abi.last_error()
    assert lib.kina_tape_watch(tape[0], abi.ptr(mb), 1) == 0, abi.last_error()
    assert lib._mlir_ciface_runtime_gpu_matmul_f32(abi.ptr(mo), abi.ptr(ma), abi.ptr(mb)) == 0
    assert lib.kina_tape_end(tape[0]) == 0
    seed = memref.from_numpy(np.ones((3, 3), np.float32))
    assert lib.kina_tape_backward(tape[0], abi.ptr(mo), abi.ptr(seed)) == 0, abi.last_error()
    g = memref.from_numpy(np.zeros((3, 3), np.float32))
    assert lib.kina_tape_grad(tape[0], abi.ptr(ma), abi.ptr(g)) == 0, abi.last_error()
    np.testing.assert_allclose(g.array, np.ones((3, 3), np.float32) @ b.T, rtol=1e-6)
    assert lib.kina_tape_free(tape[0]) == 0


def test_overlapping_operands_on_the_direct_call_read_before_writing(abi, paths):
    rng = np.random.default_rng(5)
    buf = rng.standard_normal((3, 3)).astype(np.float32)
    b = rng.standard_normal((3, 3)).astype(np.float32)
    m, mb = memref.from_numpy(buf), memref.from_numpy(b)
    paths.on()
    memref.clear_caches()
    expected = buf.astype(np.float64)
    for _ in range(4):                       # out is a: the third and fourth calls are direct
        assert abi.lib._mlir_ciface_runtime_gpu_matmul_f32(abi.ptr(m), abi.ptr(m), abi.ptr(mb)) == 0
        expected = expected @ b
        np.testing.assert_allclose(m.array, expected, rtol=1e-4)


def test_the_direct_call_prints_no_floating_point_warning(abi, paths, recwarn):
    import warnings

    name, make, _ = CASES["log_of_negatives"]
    ms = [memref.from_numpy(a) for a in make(np.random.default_rng(6))]
    paths.on()
    memref.clear_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            for _ in range(4):
                assert getattr(abi.lib, name)(*[abi.ptr(m) for m in ms]) == 0
            assert np.geterr()["invalid"] == "raise"          # the caller's state, restored
    assert np.isnan(ms[0].array[ms[1].array < 0]).all()


def test_the_last_direct_call_is_remembered_per_op_and_forgotten_with_the_views(abi, paths):
    # Calls alternate between two outputs (different descriptors), values change
    # between calls, and the view caches are dropped midway: every result is
    # still the product of what the buffers hold at that call.
    rng = np.random.default_rng(7)
    a, b = (memref.from_numpy(rng.standard_normal((2, 2)).astype(np.float32)) for _ in range(2))
    outs = [memref.from_numpy(np.zeros((2, 2), np.float32)) for _ in range(2)]
    paths.on()
    memref.clear_caches()
    for i in range(12):
        if i == 6:
            memref.clear_caches()
            assert not ffi_ops.FAST_LAST_DIRECT
        a.array[...] = rng.standard_normal((2, 2))
        out = outs[i % 2 if i < 8 else 0]
        assert abi.lib._mlir_ciface_runtime_gpu_matmul_f32(abi.ptr(out), abi.ptr(a), abi.ptr(b)) == 0
        np.testing.assert_allclose(out.array, a.array @ b.array, rtol=1e-6)
    assert ffi_ops.FAST_LAST_DIRECT          # the last calls were direct, and remembered


# Generated calls of the ops with a direct call: shapes that broadcast, that do
# not, batched and vector matmuls, sizes 0 and rank 0, out aliasing an input
# and values that overflow; each call made four times (views made, shapes
# admitted, then direct twice) on both paths, bit for bit.
DIRECT_OPS = {op.name: op for op in ffi_ops.RUNTIME_OPS if op.direct is not None}


@st.composite
def direct_calls(draw):
    name = draw(st.sampled_from(sorted(DIRECT_OPS)))
    op = DIRECT_OPS[name]
    dims = st.integers(0, 3)
    if name == "matmul":
        a = draw(st.lists(dims, min_size=1, max_size=3))
        b = draw(st.lists(dims, min_size=1, max_size=3))
        if draw(st.booleans()):                          # usually inner dimensions that agree
            b[-2 if len(b) >= 2 else 0] = a[-1]
        shapes = [tuple(a), tuple(b)]
    else:
        shapes = [tuple(draw(st.lists(dims, max_size=3))) for _ in op.inputs]
    try:
        out_shape = tuple(op.check(*[np.empty(s, np.float32) for s in shapes]))
    except Exception:
        out_shape = tuple(draw(st.lists(dims, max_size=3)))   # an invalid call, refused alike
    if draw(st.booleans()):
        out_shape = tuple(draw(st.lists(dims, max_size=3)))   # perhaps the wrong out
    alias = draw(st.booleans()) and shapes[0] == out_shape
    scale = draw(st.sampled_from([1.0, 1e3, 1e30]))
    return name, out_shape, shapes, alias, scale, draw(st.integers(0, 2**16))


def call_direct_op(abi, name, out_shape, shapes, alias, scale, seed):
    """Statuses, error texts and outputs of four calls of the export."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(rng.standard_normal(s) * scale, dtype=np.float32) for s in shapes]
    out = memref.from_numpy(np.full(out_shape, 0.5, np.float32))
    ins = [out if alias and k == 0 else memref.from_numpy(a) for k, a in enumerate(arrays)]
    fn = getattr(abi.lib, DIRECT_OPS[name].export)
    results = []
    for _ in range(4):
        for m, a in zip(ins, arrays):
            m.array[...] = a
        status = fn(abi.ptr(out), *[abi.ptr(m) for m in ins])
        results.append((status, abi.last_error() if status else "", out.array.copy()))
    return results


@settings(**{**SETTINGS, "max_examples": 60})
@given(call=direct_calls())
def test_generated_calls_agree_on_the_direct_and_the_cffi_paths(abi, paths, call):
    memref.clear_caches()
    paths.off()
    reference = call_direct_op(abi, *call)
    memref.clear_caches()
    paths.on()
    fast = call_direct_op(abi, *call)
    for r, f in zip(reference, fast):
        same(r, f)


@pytest.mark.integration                # gcc builds the C handler: CI must not skip it
def test_a_c_handler_pushed_after_admission_still_sees_the_call(abi, paths, tmp_path):
    # A C handler of a runtime op's effect is in scope (docs/abi.md: the
    # export then returns the type status and writes nothing), so the direct
    # call must not stand in for the default, admitted shapes or not.
    import cffi

    from kina_fx.errors import Status
    from support.abi import build_fixture_library

    src = tmp_path / "answer.c"
    src.write_text('#include "kina_fx.h"\n'
                   "int32_t answer(void *ctx, int32_t e, const int64_t *a, int32_t n, int64_t *out)\n"
                   "{ (void)ctx; (void)e; (void)a; (void)n; *out = 0; return 0; }\n")
    c = cffi.FFI()
    c.cdef("int32_t answer(void *, int32_t, const int64_t *, int32_t, int64_t *);")
    fixture = c.dlopen(str(build_fixture_library(src, tmp_path / "answer.so")))
    fn = abi.ffi.cast("kina_handler_fn", c.cast("void *", c.addressof(fixture, "answer")))
    call, ms = admitted_call(abi, paths, "exp", calls=4)
    before = ms[0].array.copy()
    ids = abi.ffi.new("int32_t[1]", [effect_of("exp").id])
    handle = abi.ffi.new("kina_handler_t *")
    assert abi.lib.kina_push_handler(fn, abi.ffi.NULL, ids, 1, handle) == Status.SUCCESS
    try:
        ms[0].array[...] = -1
        assert call() == Status.TYPE
        assert "must be an int to cross the C ABI" in abi.last_error()
        assert (ms[0].array == -1).all()
    finally:
        assert abi.lib.kina_pop_handler(handle[0]) == Status.SUCCESS
    assert call() == Status.SUCCESS                     # direct again once it is popped
    np.testing.assert_array_equal(ms[0].array, before)
