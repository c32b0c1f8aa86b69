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
from support.abi import Abi
from support.contract import (ALLOC, COPY_DEV, COPY_HOST, FIBER_CANCELLED, FIBER_DONE, FIBER_FAILED,
                              FIBER_NEW, FIBER_RUNNING, FIBER_SUSPENDED, GATHER, MATMUL, REPEAT, SOFTMAX,
                              Fibers, c_perform, descriptor, last_error, push_returning, softmax_ref)

from kina_fx import Effect, gpu_ops, memref, perform
from kina_fx.ffi import effects as ffi_effects
from kina_fx.errors import (Cancelled, GpuError, InternalError, KinaTypeError, ResourceError,
                            Status, UnimplementedError, Unhandled, ValidationError,
                            exception_for, status_of)

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
GCC = shutil.which("gcc")

Ask = Effect("contract.ask")
Other = Effect("contract.other")


@pytest.fixture
def abi():
    return Abi()


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

@pytest.mark.parametrize("rc", range(1, 9))
def test_a_handler_status_1_to_8_is_what_the_perform_returns(kina, contract_lib, rc):
    h = push_returning(kina, contract_lib, rc, Ask)
    try:
        assert c_perform(kina, Ask) == (rc, -5)
        assert last_error(kina).endswith(f"the C handler for {Ask.name} failed with status {rc}")
        assert last_error(kina).startswith(type(exception_for(rc, "")).__name__ + ": ")
    finally:
        assert kina[1].kina_pop_handler(h) == 0


def test_an_unhandled_inner_perform_propagates_as_8(kina, contract_lib):
    """rc = kina_perform(...); if (rc) return rc; -- the idiom works for 8 too."""
    h = push_returning(kina, contract_lib, int(Status.UNHANDLED), Ask)
    try:
        with pytest.raises(Unhandled, match="failed with status 8"):
            perform(Ask)
    finally:
        assert kina[1].kina_pop_handler(h) == 0


@pytest.mark.parametrize("rc", [9, 100, (1 << 31) - 1, -3, -100, -(1 << 31)])
def test_a_handler_result_outside_the_set_is_validation(kina, contract_lib, rc):
    h = push_returning(kina, contract_lib, rc, Ask)
    try:
        assert c_perform(kina, Ask) == (Status.VALIDATION, -5)
        assert f"returned {rc}, which is not a handler result" in last_error(kina)
        with pytest.raises(ValidationError, match="not a handler result"):
            perform(Ask)
    finally:
        assert kina[1].kina_pop_handler(h) == 0


def test_suspend_with_no_fiber_outside_is_8_naming_the_effect(kina, contract_lib):
    h = push_returning(kina, contract_lib, -2, Ask)      # KINA_SUSPEND
    try:
        assert c_perform(kina, Ask) == (Status.UNHANDLED, -5)
        text = last_error(kina)
        assert text.startswith("Unhandled: no fiber to suspend for contract.ask")
        assert "kina.suspend_to_host" not in text
        with pytest.raises(Unhandled, match="no fiber to suspend") as info:
            perform(Ask, 3)
        assert info.value.effect is Ask and info.value.payload == (3,)
    finally:
        assert kina[1].kina_pop_handler(h) == 0


# ---- alloc ------------------------------------------------------------------------------------


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

def test_cancel_with_a_null_out_state_is_refused_and_cancels_nothing(kina, fiber_calls):
    ffi, lib = kina
    f = fiber_calls.create(Ask, catch=[Ask])
    assert lib.kina_cancel_fiber(f, ffi.NULL) == Status.VALIDATION
    assert "out_state" in last_error(kina)
    assert fiber_calls.state(f) == FIBER_NEW
    assert fiber_calls.resume(f) == (0, FIBER_SUSPENDED)
    assert lib.kina_cancel_fiber(f, ffi.NULL) == Status.VALIDATION
    assert fiber_calls.state(f) == FIBER_SUSPENDED
    assert lib.kina_fiber_destroy(f) == 0


# ---- the re-entry limit prints nothing -----------------------------------------------------------

def interpreters() -> list[str]:
    extra = [p for p in os.environ.get("KINA_FX_TEST_PYTHONS", "").split(os.pathsep) if p]
    return [sys.executable, *extra]


@pytest.mark.skipif(GCC is None, reason="gcc is not installed")
@pytest.mark.parametrize("python", interpreters())
def test_reentry_until_the_recursion_limit_prints_nothing(tmp_path, python):
    """A RecursionError at the entry of a cffi callback used to make cffi print
    two tracebacks (its onerror hook failed at the same depth): Python 3.12+."""
    result = subprocess.run([python, str(HERE / "reentry_check.py"), str(tmp_path), "12"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reentry ok" in result.stdout
    assert result.stderr == ""


# ==== decided corners (docs/abi.md, "Decided corners") ==========================================

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
    """The CUDA path's rule (kina_fx.gpu_ops.apart_from), checked with NumPy arrays."""
    from kina_fx.gpu_ops import apart_from
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

def test_a_refused_resume_leaves_out_state_untouched(kina, fiber_calls):
    f = fiber_calls.create(Ask, catch=[Other])
    assert fiber_calls.resume(f) == (0, FIBER_DONE)    # Ask is not caught: the entry returns -8
    out = kina[0].new("int64_t *")
    assert kina[1].kina_fiber_result(f, out) == 0 and out[0] == -Status.UNHANDLED
    assert fiber_calls.resume(f, sentinel=-99) == (Status.VALIDATION, -99)
    assert "done" in last_error(kina)
    assert kina[1].kina_fiber_destroy(f) == 0
    assert fiber_calls.resume(f, sentinel=-99) == (Status.VALIDATION, -99)
    assert "stale" in last_error(kina)


@pytest.mark.parametrize("how", ["done", "cancelled", "failed"])
def test_cancelling_a_fiber_that_has_ended_is_0_and_changes_nothing(kina, fiber_calls, contract_lib, how):
    ffi, lib = kina
    if how == "failed":
        f = failed_fiber(kina, contract_lib)
    else:
        f = fiber_calls.create(Ask, catch=[Ask])
        assert fiber_calls.resume(f) == (0, FIBER_SUSPENDED)
        if how == "done":
            assert fiber_calls.resume(f, 5) == (0, FIBER_DONE)
        else:
            assert fiber_calls.cancel(f) == (0, FIBER_CANCELLED)
    state = fiber_calls.state(f)
    assert fiber_calls.cancel(f) == (0, state)
    assert fiber_calls.cancel(f) == (0, state)
    assert fiber_calls.state(f) == state
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


def test_an_inner_fiber_is_running_while_its_perform_suspends_the_outer_one(kina, contract_lib):
    """The outer fiber resumed an inner one whose perform suspended the outer
    fiber: the inner one is RUNNING (its kina_resume_fiber has not returned)."""
    ffi, lib = kina
    contract_lib.ct_inner_catch = Ask.id
    contract_lib.ct_outer_effect = Other.id
    f = ffi.new("kina_fiber_t *")
    catch = ffi.new("int32_t[1]", [Other.id])
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", contract_lib.ct_outer_entry), ffi.NULL, catch, 1, f) == 0
    fibers = Fibers(kina, contract_lib)
    assert fibers.resume(f[0]) == (0, FIBER_SUSPENDED)
    inner = contract_lib.ct_inner
    assert fibers.state(inner) == FIBER_RUNNING
    for call in (lambda: fibers.resume(inner, sentinel=-9), lambda: fibers.cancel(inner, sentinel=-9)):
        assert call() == (Status.VALIDATION, -9)
        assert "kina_resume_fiber has not returned" in last_error(kina)
        assert "resume that one" in last_error(kina)
    assert lib.kina_fiber_destroy(inner) == Status.VALIDATION
    assert fibers.resume(f[0], 41) == (0, FIBER_DONE)
    out = ffi.new("int64_t *")
    assert lib.kina_fiber_result(f[0], out) == 0 and out[0] == 41
    assert contract_lib.ct_inner_resume_rc == 0 and contract_lib.ct_inner_state == FIBER_DONE
    assert lib.kina_fiber_destroy(f[0]) == 0


def failed_fiber(kina, contract_lib):
    """A fiber whose Python side raised: a signal handler that raises while it runs."""
    import signal
    ffi, lib = kina
    clib_raise = contract_lib.ct_raise_signal

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


def test_a_fiber_fails_when_python_raises_in_it_outside_any_callback(kina, contract_lib):
    ffi, lib = kina
    f = failed_fiber(kina, contract_lib)
    st = ffi.new("int32_t *", -1)
    assert lib.kina_fiber_state(f, st) == 0 and st[0] == FIBER_FAILED
    assert Fibers(kina, contract_lib).resume(f, sentinel=-9) == (Status.VALIDATION, -9)
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
