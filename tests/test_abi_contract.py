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
"""

Ask = Effect("contract.ask")
Other = Effect("contract.other")


@pytest.fixture(scope="module")
def clib(kina, tmp_path_factory):
    if GCC is None:
        pytest.skip("gcc is not installed")
    ffi, _ = kina
    out = build_fixture_library(HERE / "hosts" / "c" / "contract_lib.c",
                                tmp_path_factory.mktemp("contract") / "libcontract.so", GCC)
    ffi.cdef(CONTRACT_CDEF)
    return ffi.dlopen(str(out))


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
