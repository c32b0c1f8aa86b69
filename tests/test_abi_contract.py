"""The ABI contract where the code and docs/abi.md once disagreed, and the
corners docs/abi.md decides ("Decided corners"): each test pins one line.

In-process against the real libkina_fx.so, with a C fixture
(tests/hosts/c/contract_lib.c) for entry functions and handlers.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from abi_helpers import Abi, build_fixture_library

from kina_fx import Effect, Handler, Stepper, gpu_ops, memref, perform
from kina_fx import ffi_effects
from kina_fx.errors import (Cancelled, GpuError, InternalError, KinaTypeError, ResourceError,
                            Status, UnimplementedError, Unhandled, ValidationError,
                            exception_for, status_of)

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
GCC = shutil.which("gcc")

FIBER_NEW, FIBER_RUNNING, FIBER_SUSPENDED, FIBER_DONE, FIBER_FAILED, FIBER_CANCELLED = range(6)

CONTRACT_CDEF = """
int32_t ct_returns_ctx(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out);
int64_t ct_perform_once(void *arg);
int64_t ct_outer_entry(void *arg);
int32_t ct_recursion(int32_t effect);
extern int32_t ct_inner_catch, ct_outer_effect;
extern kina_fiber_t ct_inner;
extern int32_t ct_inner_state, ct_inner_resume_rc;
extern int64_t ct_levels;
int64_t ct_raise_signal(void *arg);
extern int32_t ct_last_rc;
int64_t ct_push_no_pop(void *arg);
int64_t ct_perform_three(void *arg);
extern kina_handler_t ct_left_handle;
"""

Ask = Effect("contract.ask")
Other = Effect("contract.other")


_contract_lib = []


@pytest.fixture
def clib(kina, tmp_path_factory):
    """The fixture library, built once per session (also for test_abi_status_tables.py)."""
    if GCC is None:
        pytest.skip("gcc is not installed")
    if not _contract_lib:
        ffi, _ = kina
        out = build_fixture_library(HERE / "hosts" / "c" / "contract_lib.c",
                                    tmp_path_factory.mktemp("contract") / "libcontract.so", GCC)
        ffi.cdef(CONTRACT_CDEF)
        _contract_lib.append(ffi.dlopen(str(out)))
    return _contract_lib[0]


@pytest.fixture
def abi():
    return Abi()


def last_error(kina) -> str:
    ffi, lib = kina
    return ffi.string(lib.kina_last_error()).decode()


class Fibers:
    """kina_fiber_* calls from Python with out-parameters made here."""

    def __init__(self, kina, clib):
        self.ffi, self.lib, self.clib = kina[0], kina[1], clib
        self.keep = []

    def create(self, effect, catch=()):
        arg = self.ffi.new("int32_t *", effect.id)
        ids = self.ffi.new("int32_t[]", [e.id for e in catch] or [0])
        out = self.ffi.new("kina_fiber_t *")
        self.keep += [arg, ids]
        entry = self.ffi.cast("kina_fiber_fn", self.clib.ct_perform_once)
        assert self.lib.kina_fiber_create(entry, arg, ids, len(catch), out) == 0
        return out[0]

    def state(self, fiber):
        out = self.ffi.new("int32_t *", -1)
        assert self.lib.kina_fiber_state(fiber, out) == 0
        return out[0]

    def resume(self, fiber, value=0, sentinel=-1):
        out = self.ffi.new("int32_t *", sentinel)
        return self.lib.kina_resume_fiber(fiber, value, out), out[0]

    def cancel(self, fiber, sentinel=-1):
        out = self.ffi.new("int32_t *", sentinel)
        return self.lib.kina_cancel_fiber(fiber, out), out[0]


@pytest.fixture
def fib(kina, clib):
    return Fibers(kina, clib)


# ---- status codes: one class each ----------------------------------------------------------

@pytest.mark.parametrize("status, cls", [
    (Status.VALIDATION, ValidationError), (Status.RESOURCE, ResourceError), (Status.GPU, GpuError),
    (Status.UNIMPLEMENTED, UnimplementedError), (Status.INTERNAL, InternalError),
    (Status.TYPE, KinaTypeError), (Status.CANCELLED, Cancelled), (Status.UNHANDLED, Unhandled)])
def test_exception_for_every_status_and_back(status, cls):
    exc = exception_for(int(status), "from C")
    assert type(exc) is cls and status_of(exc) == status and str(exc) == "from C"


@pytest.mark.parametrize("status", [0, 9, -1, 1 << 31])
def test_exception_for_a_code_outside_the_set_is_internal(status):
    exc = exception_for(status, "from C")
    assert type(exc) is InternalError and f"status {status}" in str(exc)


def test_unhandled_from_c_names_no_effect_and_pickles():
    import pickle
    exc = exception_for(Status.UNHANDLED, "the C handler for x failed with status 8")
    assert exc.effect is None and exc.payload == ()
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is Unhandled and str(again) == str(exc)
    plain = pickle.loads(pickle.dumps(Unhandled(Ask, (1, 2))))
    assert plain.effect is Ask and plain.payload == (1, 2) and "contract.ask" in str(plain)


# ---- C handler results ------------------------------------------------------------------------

def push_returning(kina, clib, rc, effect=Ask):
    ffi, lib = kina
    h = ffi.new("kina_handler_t *")
    ids = ffi.new("int32_t[1]", [effect.id])
    fn = ffi.cast("kina_handler_fn", clib.ct_returns_ctx)
    assert lib.kina_push_handler(fn, ffi.cast("void *", rc), ids, 1, h) == 0
    return h[0]


def c_perform(kina, effect=Ask):
    ffi, lib = kina
    out = ffi.new("int64_t *", -5)
    return lib.kina_perform(effect.id, ffi.NULL, 0, out), out[0]


@pytest.mark.parametrize("rc", range(1, 9))
def test_a_handler_status_1_to_8_is_what_the_perform_returns(kina, clib, rc):
    h = push_returning(kina, clib, rc)
    try:
        assert c_perform(kina) == (rc, -5)
        assert last_error(kina).endswith(f"the C handler for {Ask.name} failed with status {rc}")
        assert last_error(kina).startswith(type(exception_for(rc, "")).__name__ + ": ")
    finally:
        assert kina[1].kina_pop_handler(h) == 0


def test_an_unhandled_inner_perform_propagates_as_8(kina, clib):
    """rc = kina_perform(...); if (rc) return rc; -- the idiom works for 8 too."""
    h = push_returning(kina, clib, int(Status.UNHANDLED))
    try:
        with pytest.raises(Unhandled, match="failed with status 8"):
            perform(Ask)
    finally:
        assert kina[1].kina_pop_handler(h) == 0


@pytest.mark.parametrize("rc", [9, 100, (1 << 31) - 1, -3, -100, -(1 << 31)])
def test_a_handler_result_outside_the_set_is_validation(kina, clib, rc):
    h = push_returning(kina, clib, rc)
    try:
        assert c_perform(kina) == (Status.VALIDATION, -5)
        assert f"returned {rc}, which is not a handler result" in last_error(kina)
        with pytest.raises(ValidationError, match="not a handler result"):
            perform(Ask)
    finally:
        assert kina[1].kina_pop_handler(h) == 0


def test_suspend_with_no_fiber_outside_is_8_naming_the_effect(kina, clib):
    h = push_returning(kina, clib, -2)      # KINA_SUSPEND
    try:
        assert c_perform(kina) == (Status.UNHANDLED, -5)
        text = last_error(kina)
        assert text.startswith("Unhandled: no fiber to suspend for contract.ask")
        assert "kina.suspend_to_host" not in text
        with pytest.raises(Unhandled, match="no fiber to suspend") as info:
            perform(Ask, 3)
        assert info.value.effect is Ask and info.value.payload == (3,)
    finally:
        assert kina[1].kina_pop_handler(h) == 0


# ---- alloc ------------------------------------------------------------------------------------

ALLOC = "_mlir_ciface_runtime_gpu_alloc_unranked"


@pytest.mark.parametrize("sizes, element_size", [
    ((0, 4, 1 << 62), 4), ((0, 1 << 61), 4), ((0, 2, 1 << 61), 4), ((0, 3, 1 << 62), 2),
    ((0, 1 << 31, 1 << 31, 4), 8)])
def test_alloc_whose_strides_overflow_fails_with_nothing_written_or_allocated(abi, sizes, element_size):
    m = memref.empty_descriptor(sizes)
    before = bytes(memref.ffi.buffer(m.words))
    live = gpu_ops.allocations()
    assert abi.call(ALLOC, m, element_size) == Status.RESOURCE
    assert "overflows 64 bits" in abi.last_error()
    assert bytes(memref.ffi.buffer(m.words)) == before
    assert gpu_ops.allocations() == live


@pytest.mark.parametrize("sizes, element_size", [
    ((0,), 4), ((0, 4, 1 << 40), 4), ((3, 0), 8), ((0, 1 << 60), 4), ((1 << 60, 0), 2)])
def test_alloc_of_zero_elements_gets_a_distinct_buffer_and_row_major_strides(abi, sizes, element_size):
    first, second = memref.empty_descriptor(sizes), memref.empty_descriptor(sizes)
    assert abi.call(ALLOC, first, element_size) == 0, abi.last_error()
    assert abi.call(ALLOC, second, element_size) == 0, abi.last_error()
    a, b = first.descriptor(), second.descriptor()
    assert a.aligned and b.aligned and a.aligned != b.aligned
    assert a.aligned % memref.ALIGNMENT == 0 and a.offset == 0
    expected = [int(np.prod([max(n, 1) for n in sizes[i + 1:]], dtype=object)) for i in range(len(sizes))]
    assert list(a.strides) == expected
    assert abi.call("runtime_gpu_free_all") == 0


def test_alloc_checks_in_parameter_order(abi):
    """The descriptor first (rank 33: 1), then element_size (6), then the byte count (2)."""
    bad_rank = memref.UnrankedMemref(None, 33, [0] * 3)
    assert abi.call(ALLOC, bad_rank, 3) == Status.VALIDATION and "rank 33" in abi.last_error()
    assert abi.call(ALLOC, memref.empty_descriptor((2, -1)), 3) == Status.VALIDATION
    assert abi.call(ALLOC, memref.empty_descriptor((1 << 62, 4)), 3) == Status.TYPE
    assert abi.call(ALLOC, memref.empty_descriptor((1 << 62, 4)), 4) == Status.RESOURCE


# ---- handles ----------------------------------------------------------------------------------

@pytest.mark.parametrize("slot", [0xFFFFFFFF, 0x7FFFFFFF, 1 << 20])
def test_a_handle_with_a_slot_never_issued_is_not_a_fiber_handle(kina, slot):
    ffi, lib = kina
    handle = (ffi_effects.FIBER_KIND << 56) | (1 << 32) | slot
    out = ffi.new("int32_t *", -1)
    assert lib.kina_fiber_state(handle, out) == Status.VALIDATION and out[0] == -1
    assert "not a fiber handle" in last_error(kina)


# ---- cancel -------------------------------------------------------------------------------------

def test_cancel_with_a_null_out_state_is_refused_and_cancels_nothing(kina, fib):
    ffi, lib = kina
    f = fib.create(Ask, catch=[Ask])
    assert lib.kina_cancel_fiber(f, ffi.NULL) == Status.VALIDATION
    assert "out_state" in last_error(kina)
    assert fib.state(f) == FIBER_NEW
    assert fib.resume(f) == (0, FIBER_SUSPENDED)
    assert lib.kina_cancel_fiber(f, ffi.NULL) == Status.VALIDATION
    assert fib.state(f) == FIBER_SUSPENDED
    assert lib.kina_fiber_destroy(f) == 0


# ---- the re-entry limit prints nothing -----------------------------------------------------------

def interpreters() -> list[str]:
    extra = [p for p in os.environ.get("KINA_FX_TEST_PYTHONS", "").split(os.pathsep) if p]
    return [sys.executable, *extra]


@pytest.mark.skipif(GCC is None, reason="gcc is not installed")
@pytest.mark.parametrize("python", interpreters())
@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_reentry_until_the_recursion_limit_prints_nothing(tmp_path, python, pure):
    """A RecursionError at the entry of a cffi callback used to make cffi print
    two tracebacks (its onerror hook failed at the same depth): Python 3.12+."""
    env = dict(os.environ, KINA_FX_PURE_PYTHON="1" if pure else "0")
    result = subprocess.run([python, str(HERE / "reentry_check.py"), str(tmp_path), "12"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reentry ok" in result.stdout
    assert result.stderr == ""


# ==== decided corners (docs/abi.md, "Decided corners") ==========================================

COPY_HOST = "_mlir_ciface_runtime_copy_to_host_f32"
COPY_DEV = "_mlir_ciface_runtime_copy_to_device_f32"
MATMUL = "_mlir_ciface_runtime_gpu_matmul_f32"
GATHER = "_mlir_ciface_runtime_gpu_gather_f32"
SOFTMAX = "_mlir_ciface_runtime_gpu_softmax_f32"
REPEAT = "_mlir_ciface_runtime_gpu_repeat_interleave_f32"


def descriptor(sizes, strides, aligned=0x1000, offset=0):
    """A raw memref descriptor (no storage behind it unless ``aligned`` points to some)."""
    return memref.UnrankedMemref(None, len(sizes), [aligned, aligned, offset, *sizes, *strides])


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---- overlapping operands: memmove semantics ---------------------------------------------------

def overlapping(buffer_len, out_slice, in_slice, out_shape, in_shape, rng):
    buf = rng.standard_normal(buffer_len).astype(np.float32)
    out = buf[out_slice].reshape(out_shape) if out_shape else buf[out_slice]
    x = buf[in_slice].reshape(in_shape) if in_shape else buf[in_slice]
    return buf, out, x


@pytest.mark.parametrize("out_slice, in_slice", [
    (slice(1, 13), slice(0, 12)), (slice(0, 12), slice(1, 13)), (slice(0, 12), slice(0, 12)),
    (slice(11, None, -1), slice(0, 12)), (slice(0, 24, 2), slice(2, 26, 2)), (slice(3, 15), slice(0, 24, 2))])
def test_an_overlapping_copy_is_a_copy_of_the_source(abi, out_slice, in_slice):
    rng = np.random.default_rng(1)
    buf, dst, src = overlapping(32, out_slice, in_slice, None, None, rng)
    expected = src.copy()
    assert abi.call(COPY_HOST, dst, src) == 0
    np.testing.assert_array_equal(dst, expected)
    buf, dst, src = overlapping(32, out_slice, in_slice, None, None, rng)
    expected = src.copy()
    assert abi.call(COPY_DEV, dst, src, 0) == 0
    np.testing.assert_array_equal(dst, expected)


def test_an_overlapping_transposed_copy(abi):
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    expected = a.T.copy()
    assert abi.call(COPY_HOST, a, a.T) == 0
    np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("shift", [-4, -2, 0, 2, 4])
def test_gather_and_repeat_read_inputs_before_writing_overlapping_outputs(abi, shift):
    rng = np.random.default_rng(2)
    buf = rng.standard_normal(40).astype(np.float32)
    values = buf[8:20].reshape(6, 2)
    out = buf[8 + shift:20 + shift].reshape(6, 2)
    idx = np.array([5, 0, 3, 3, 1, 2], np.int64)
    expected = values[idx].copy()
    assert abi.call(GATHER, out, values, idx) == 0
    np.testing.assert_array_equal(out, expected)
    buf = rng.standard_normal(40).astype(np.float32)
    x = buf[10:16]
    out = buf[10 + shift:22 + shift]
    expected = np.repeat(x, 2)
    assert abi.call(REPEAT, out, x, 0, 2) == 0
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("shift", [-3, 0, 3])
def test_softmax_and_matmul_with_overlapping_outputs(abi, shift):
    rng = np.random.default_rng(3)
    buf = rng.standard_normal(40).astype(np.float32)
    x = buf[10:22].reshape(3, 4)
    out = buf[10 + shift:22 + shift].reshape(3, 4)
    expected = softmax_ref(x.astype(np.float64), 1)
    assert abi.call(SOFTMAX, out, x, 1) == 0
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    buf = rng.standard_normal(40).astype(np.float32)
    a = buf[10:14].reshape(2, 2)
    b = buf[14:18].reshape(2, 2)
    out = buf[12 + shift:16 + shift].reshape(2, 2)
    expected = a.astype(np.float64) @ b
    assert abi.call(MATMUL, out, a, b) == 0
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_inputs_that_may_share_memory_with_an_output_are_copied_first():
    """The CUDA path's rule (kina_fx.ffi.apart_from), checked with NumPy arrays."""
    from kina_fx.ffi import apart_from
    buf = np.arange(10.0)
    out, x, far = buf[2:6], buf[4:8], np.arange(4.0)
    copied = apart_from([out], x, np)
    assert copied is not x and not np.may_share_memory(copied, buf)
    np.testing.assert_array_equal(copied, x)
    assert apart_from([out], far, np) is far
    assert apart_from([buf[:0]], x, np) is x


# ---- outputs that alias themselves -------------------------------------------------------------

@pytest.mark.parametrize("sizes, strides", [
    ((2, 2), (1, 1)), ((3, 2), (2, 3)), ((2, 3), (0, 1)), ((4, 2, 2), (2, 1, 2)), ((2, 2), (-1, 1))])
def test_an_output_whose_elements_are_not_distinct_by_construction_is_refused(abi, sizes, strides):
    store = np.zeros(64, np.float32)
    base = store.__array_interface__["data"][0] + 16 * 4
    out = descriptor(sizes, strides, base)
    x = np.ones(sizes, np.float32)
    assert abi.call(SOFTMAX, out, x, 0) == Status.VALIDATION
    assert "alias" in abi.last_error()
    assert not store.any()


@pytest.mark.parametrize("sizes, strides", [
    ((2, 3), (3, 1)), ((2, 3), (1, 2)), ((2, 3), (-3, -1)), ((2, 3), (8, 2)), ((2, 1, 3), (3, 99, 1)),
    ((1, 1), (0, 0))])
def test_outputs_with_distinct_elements_are_accepted(abi, sizes, strides):
    store = np.zeros(64, np.float32)
    base = store.__array_interface__["data"][0] + 24 * 4
    out = descriptor(sizes, strides, base)
    x = np.arange(np.prod(sizes), dtype=np.float32).reshape(sizes)
    assert abi.call(COPY_HOST, out, x) == 0, abi.last_error()
    view = memref.numpy_view(out.descriptor(), np.float32)
    np.testing.assert_array_equal(view, x)
    assert store.sum() == x.sum()          # nothing else written


# ---- offsets, empty memrefs, huge broadcast inputs ----------------------------------------------

def test_negative_and_large_offsets_are_honoured(abi):
    data = np.arange(6, dtype=np.float32)
    out = np.zeros(6, np.float32)
    for offset in (-3, 7, -(1 << 20)):
        m = memref.from_numpy(data, offset_elements=offset)
        assert m.descriptor().offset == offset
        assert abi.call(COPY_HOST, out, m) == 0
        np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("offset", [-(1 << 62), (1 << 62), (1 << 63) - 1])
def test_an_offset_that_leaves_the_address_space_is_1(abi, offset):
    out = np.zeros(4, np.float32)
    assert abi.call(COPY_HOST, out, descriptor((4,), (1,), 0x10000, offset)) == Status.VALIDATION
    assert "address space" in abi.last_error()
    assert not out.any()


HUGE_EMPTY = (0, 1 << 40, 1 << 40)


def test_empty_memrefs_with_huge_other_sizes_give_empty_results(abi):
    z = lambda: descriptor(HUGE_EMPTY, (0, 0, 0))          # noqa: E731
    assert abi.call(COPY_HOST, z(), z()) == 0, abi.last_error()
    assert abi.call(COPY_DEV, z(), z(), 0) == 0, abi.last_error()
    assert abi.call(SOFTMAX, z(), z(), 2) == 0, abi.last_error()
    assert abi.call(REPEAT, z(), z(), 1, 1) == 0, abi.last_error()
    assert abi.call(GATHER, z(), z(), descriptor((0,), (1,))) == 0, abi.last_error()
    assert abi.call(GATHER, descriptor((4, 0, 1 << 62), (0, 0, 0)), descriptor((9, 0, 1 << 62), (0, 0, 0)),
                    np.array([1, 2, 3, 8], np.int64)) == 0, abi.last_error()
    b = descriptor((1 << 40, 3), (0, 0), np.ones(1, np.float32).__array_interface__["data"][0])
    assert abi.call(MATMUL, descriptor((0, 3), (3, 1)), descriptor((0, 1 << 40), (0, 0)), b) == 0
    # ... and their shapes are still checked
    assert abi.call(COPY_HOST, z(), descriptor((0, 1 << 40, 1 << 41), (0, 0, 0))) == Status.VALIDATION
    assert "shape" in abi.last_error()
    assert abi.call(SOFTMAX, z(), z(), 3) == Status.VALIDATION
    assert abi.call(GATHER, z(), z(), np.array([0], np.int64)) == Status.VALIDATION


def test_a_zero_inner_dimension_gives_zeros(abi):
    out = np.full((2, 3), 7, np.float32)
    assert abi.call(MATMUL, out, np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)) == 0
    assert not out.any()


def test_a_broadcast_input_is_limited_by_its_byte_count(abi):
    one = np.array([4.5], np.float32)
    address = one.__array_interface__["data"][0]
    ok = descriptor((1 << 60, 1), (0, 0), address)            # 2^62 bytes: accepted
    out = np.zeros((2, 1), np.float32)
    assert abi.call(GATHER, out, ok, np.array([5, (1 << 60) - 1], np.int64)) == 0, abi.last_error()
    np.testing.assert_array_equal(out, [[4.5], [4.5]])
    too_big = descriptor((1 << 62,), (0,), address)            # 2^64 bytes
    assert abi.call(GATHER, np.zeros(1, np.float32), descriptor((1 << 62, 1), (0, 0), address),
                    np.array([0], np.int64)) == Status.VALIDATION
    assert "more than 2^63 bytes" in abi.last_error()
    assert abi.call(SOFTMAX, np.zeros(1, np.float32), too_big, 0) == Status.VALIDATION


# ---- check order --------------------------------------------------------------------------------

def test_the_first_failing_check_in_parameter_order_decides(abi, monkeypatch):
    bad_rank = memref.UnrankedMemref(None, 33, [0] * 3)
    ok = np.zeros(3, np.float32)
    # dst before src before device
    assert abi.call(COPY_DEV, bad_rank, None, 7) == Status.VALIDATION
    assert abi.last_error().startswith("ValidationError: dst: rank 33")
    assert abi.call(COPY_DEV, ok, None, 7) == Status.VALIDATION
    assert abi.last_error().startswith("ValidationError: src: null")
    assert abi.call(COPY_DEV, ok, np.zeros(4, np.float32), 7) == Status.VALIDATION
    assert "device 7" in abi.last_error()
    # each argument on its own before relations between them
    assert abi.call(REPEAT, np.zeros(5, np.float32), ok, 3, -1) == Status.VALIDATION
    assert "reps" in abi.last_error()
    # the environment first of all
    monkeypatch.setenv("KINA_FX_DEVICE", "tpu")
    assert abi.call(ALLOC, bad_rank, 3) == Status.VALIDATION and "KINA_FX_DEVICE" in abi.last_error()
    assert abi.call(COPY_DEV, bad_rank, None, 7) == Status.VALIDATION and "KINA_FX_DEVICE" in abi.last_error()


# ---- fibers -------------------------------------------------------------------------------------

def test_a_refused_resume_leaves_out_state_untouched(kina, fib):
    f = fib.create(Ask, catch=[Other])
    assert fib.resume(f) == (0, FIBER_DONE)    # Ask is not caught: the entry returns -8
    out = kina[0].new("int64_t *")
    assert kina[1].kina_fiber_result(f, out) == 0 and out[0] == -Status.UNHANDLED
    assert fib.resume(f, sentinel=-99) == (Status.VALIDATION, -99)
    assert "done" in last_error(kina)
    assert kina[1].kina_fiber_destroy(f) == 0
    assert fib.resume(f, sentinel=-99) == (Status.VALIDATION, -99)
    assert "stale" in last_error(kina)


@pytest.mark.parametrize("how", ["done", "cancelled", "failed"])
def test_cancelling_a_fiber_that_has_ended_is_0_and_changes_nothing(kina, fib, clib, how):
    ffi, lib = kina
    if how == "failed":
        f = failed_fiber(kina, clib)
    else:
        f = fib.create(Ask, catch=[Ask])
        assert fib.resume(f) == (0, FIBER_SUSPENDED)
        if how == "done":
            assert fib.resume(f, 5) == (0, FIBER_DONE)
        else:
            assert fib.cancel(f) == (0, FIBER_CANCELLED)
    state = fib.state(f)
    assert fib.cancel(f) == (0, state)
    assert fib.cancel(f) == (0, state)
    assert fib.state(f) == state
    if how == "done":
        out = ffi.new("int64_t *")
        assert lib.kina_fiber_result(f, out) == 0 and out[0] == 5
    assert lib.kina_fiber_destroy(f) == 0


def test_effect_names_are_non_empty_utf8(kina):
    ffi, lib = kina
    out = ffi.new("int32_t *", -1)
    assert lib.kina_effect_id(b"", out) == Status.VALIDATION and out[0] == -1
    assert "empty" in last_error(kina)
    assert lib.kina_effect_id(b"\xff\xfe", out) == Status.VALIDATION and out[0] == -1
    assert "UTF-8" in last_error(kina)
    assert lib.kina_effect_id("contract.é".encode(), out) == 0 and out[0] == Effect("contract.é").id


def test_an_inner_fiber_is_running_while_its_perform_suspends_the_outer_one(kina, clib):
    """The outer fiber resumed an inner one whose perform suspended the outer
    fiber: the inner one is RUNNING (its kina_resume_fiber has not returned)."""
    ffi, lib = kina
    clib.ct_inner_catch = Ask.id
    clib.ct_outer_effect = Other.id
    f = ffi.new("kina_fiber_t *")
    catch = ffi.new("int32_t[1]", [Other.id])
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", clib.ct_outer_entry), ffi.NULL, catch, 1, f) == 0
    fibers = Fibers(kina, clib)
    assert fibers.resume(f[0]) == (0, FIBER_SUSPENDED)
    inner = clib.ct_inner
    assert fibers.state(inner) == FIBER_RUNNING
    for call in (lambda: fibers.resume(inner, sentinel=-9), lambda: fibers.cancel(inner, sentinel=-9)):
        assert call() == (Status.VALIDATION, -9)
        assert "kina_resume_fiber has not returned" in last_error(kina)
        assert "resume that one" in last_error(kina)
    assert lib.kina_fiber_destroy(inner) == Status.VALIDATION
    assert fibers.resume(f[0], 41) == (0, FIBER_DONE)
    out = ffi.new("int64_t *")
    assert lib.kina_fiber_result(f[0], out) == 0 and out[0] == 41
    assert clib.ct_inner_resume_rc == 0 and clib.ct_inner_state == FIBER_DONE
    assert lib.kina_fiber_destroy(f[0]) == 0


def failed_fiber(kina, clib):
    """A fiber whose Python side raised: a signal handler that raises while it runs."""
    import signal
    ffi, lib = kina
    clib_raise = clib.ct_raise_signal

    def handler(signum, frame):
        raise ValueError("raised by a signal handler inside the fiber")
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        arg = ffi.new("int *", int(signal.SIGUSR1))
        f = ffi.new("kina_fiber_t *")
        assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", clib_raise), arg, ffi.NULL, 0, f) == 0
        state = ffi.new("int32_t *", -1)
        assert lib.kina_resume_fiber(f[0], 0, state) == Status.VALIDATION
        assert state[0] == FIBER_FAILED
        assert last_error(kina) == "ValueError: raised by a signal handler inside the fiber"
    finally:
        signal.signal(signal.SIGUSR1, previous)
    return f[0]


def test_a_fiber_fails_when_python_raises_in_it_outside_any_callback(kina, clib):
    ffi, lib = kina
    f = failed_fiber(kina, clib)
    st = ffi.new("int32_t *", -1)
    assert lib.kina_fiber_state(f, st) == 0 and st[0] == FIBER_FAILED
    assert Fibers(kina, clib).resume(f, sentinel=-9) == (Status.VALIDATION, -9)
    assert "failed" in last_error(kina)
    assert lib.kina_fiber_result(f, ffi.new("int64_t *")) == Status.VALIDATION
    assert lib.kina_fiber_destroy(f) == 0


def test_a_fresh_threads_last_error_is_an_empty_string(kina):
    ffi, lib = kina
    seen = []

    def fresh():
        p = lib.kina_last_error()
        seen.append((p != ffi.NULL, ffi.string(p)))
    t = threading.Thread(target=fresh)
    t.start()
    t.join()
    assert seen == [(True, b"")]
