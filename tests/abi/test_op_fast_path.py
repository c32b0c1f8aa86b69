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
    copy of each) twice: the first call makes the views, the second finds them
    cached.  Returns [(status, error text, outputs)] of both."""
    out = []
    ms = [memref.from_numpy(a) for a in operands]
    for _ in range(2):
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
