"""Every row of docs/abi.md's status tables has a test that exercises it.

``ROWS`` maps each row (identified by a piece of its first cell) to the tests
that produce it: the ``test_row_*`` functions below, which exercise every case
the row lists in one process, and tests elsewhere that go further.
``test_every_row_has_a_test`` parses both tables of docs/abi.md ("Status
codes" and "Statuses and states") and fails when a row has no entry, an
entry matches no row, or a named test does not exist: a new row needs a test.
"""
from __future__ import annotations

import ast
import gc
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from support.abi import Abi
from support.contract import (ALLOC, COPY_DEV, COPY_HOST, FIBER_CANCELLED, FIBER_DONE, FIBER_NEW,
                              FIBER_SUSPENDED, GATHER, MATMUL, REPEAT, SOFTMAX, c_perform, descriptor,
                              last_error, push_returning)

from kina_fx import Effect, Handler, gpu_ops, memref
from kina_fx.errors import Status

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "abi.md"

Ask = Effect("tables.ask")
Other = Effect("tables.other")

ROWS = {
    # "Status codes": the code column
    "0": ["test_row_success", "test_abi_exports.py::test_matmul_matches_numpy"],
    "1": ["test_row_validation", "test_abi_exports.py::test_every_memref_argument_is_validated",
          "test_abi_contract.py::test_an_output_whose_elements_are_not_distinct_by_construction_is_refused"],
    "2": ["test_row_resource", "test_abi_exports.py::test_alloc_errors",
          "test_abi_contract.py::test_alloc_whose_strides_overflow_fails_with_nothing_written_or_allocated"],
    "3": ["test_row_gpu", "test_abi_exports.py::test_cuda_requested_without_a_device_is_a_gpu_error",
          "test_abi_fake_cuda.py::test_cuda_failures_are_gpu_errors"],
    "4": ["test_row_unimplemented"],
    "5": ["test_row_internal", "hosts/c/test_c_host.py::test_failed_start_returns_internal_error_silently",
          "test_abi_contract.py::test_reentry_until_the_recursion_limit_prints_nothing"],
    "6": ["test_row_type", "test_abi_exports.py::test_alloc_rejects_element_sizes"],
    "7, 8": ["test_row_cancelled_pending_perform", "test_row_unhandled_perform"],
    # "Statuses and states": a piece of the situation column
    "a stale, freed, reused, zero or foreign handle": ["test_row_stale_handles",
                                                       "test_abi_contract.py::test_a_handle_with_a_slot_never_issued_is_not_a_fiber_handle"],
    "resuming a running": ["test_row_resume_refused",
                           "test_abi_contract.py::test_an_inner_fiber_is_running_while_its_perform_suspends_the_outer_one"],
    "`kina_get_perform_id`/`_args` of a fiber that is not suspended": ["test_row_not_suspended_or_not_done"],
    "popping a handler that is not the innermost": ["test_row_pop_not_innermost"],
    "an OS thread that does not own it": ["test_row_other_thread"],
    "NULL out-pointers": ["test_row_bad_arguments", "test_abi_contract.py::test_effect_names_are_non_empty_utf8"],
    "`cap` too small": ["test_row_cap_too_small"],
    "not an `int64_t` crossing the ABI": ["test_row_not_int64"],
    "the pending perform of a cancelled fiber": ["test_row_cancelled_pending_perform"],
    "`kina_perform` of an effect nothing handles": ["test_row_unhandled_perform"],
    "a C handler returned a status 1-8": ["test_abi_contract.py::test_a_handler_status_1_to_8_is_what_the_perform_returns"],
    "a C handler returned anything else": ["test_abi_contract.py::test_a_handler_result_outside_the_set_is_validation"],
    "a C handler returned `KINA_SUSPEND`": ["test_abi_contract.py::test_suspend_with_no_fiber_outside_is_8_naming_the_effect"],
    "the fiber failed": ["test_abi_contract.py::test_a_fiber_fails_when_python_raises_in_it_outside_any_callback"],
}


@pytest.fixture
def abi():
    return Abi()


# ---- the tables --------------------------------------------------------------------------------

def table_rows(section: str) -> list[str]:
    """The first cells of the first Markdown table under the heading ``section``."""
    text = DOC.read_text()
    start = re.search(rf"^#+ {re.escape(section)}\s*$", text, re.M)
    assert start, f"docs/abi.md has no section {section!r}"
    rows, in_table = [], False
    for line in text[start.end():].splitlines():
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set(cells[0]) <= set("-: ") or cells[0] in ("code", "situation"):
                continue
            rows.append(cells[0])
        elif in_table:
            break
    return rows


def _test_file(path: str) -> Path:
    """A test file named in ROWS: relative to tests/abi/, else to tests/."""
    here = ROOT / "tests" / "abi" / path
    return here if here.exists() else ROOT / "tests" / path


def test_every_row_has_a_test():
    rows = table_rows("Status codes") + table_rows("Statuses and states")
    assert len(rows) >= 20
    unmatched = [r for r in rows if not [k for k in ROWS if (k == r if k[0].isdigit() else k in r)]]
    assert not unmatched, f"rows of docs/abi.md without a test in ROWS: {unmatched}"
    for key in ROWS:
        hits = [r for r in rows if (key == r if key[0].isdigit() else key in r)]
        assert len(hits) == 1, f"ROWS key {key!r} matches {len(hits)} rows"
    here = {n.name for n in ast.parse(Path(__file__).read_text()).body if isinstance(n, ast.FunctionDef)}
    for key, tests in ROWS.items():
        for test in tests:
            path, _, name = test.rpartition("::")
            names = here if not path else {
                n.name for n in ast.parse(_test_file(path).read_text()).body
                if isinstance(n, ast.FunctionDef)}
            assert (name or test) in names, f"{test} (for row {key!r}) does not exist"


# ---- "Status codes" ----------------------------------------------------------------------------

def test_row_success(abi):
    a, b = np.arange(4, dtype=np.float32).reshape(2, 2), np.eye(2, dtype=np.float32)
    out = np.zeros((2, 2), np.float32)
    assert abi.call(MATMUL, out, a, b) == 0
    np.testing.assert_array_equal(out, a)


def test_row_validation(abi, monkeypatch):
    ok = np.zeros((2, 2), np.float32)
    cases = [
        ((COPY_HOST, ok, None), "null memref pointer"),
        ((COPY_HOST, ok, memref.UnrankedMemref(None, 33, [0] * 3)), "rank 33"),
        ((COPY_HOST, ok, descriptor((2, -2), (2, 1))), "negative size"),
        ((COPY_HOST, ok, descriptor((2, 2), (2, 1), aligned=0)), "null data"),
        ((COPY_HOST, ok, descriptor((1 << 62, 2), (0, 0))), "2^63 bytes"),
        ((COPY_HOST, ok, descriptor((2, 2), (2, 1), offset=-(1 << 62))), "address space"),
        ((COPY_HOST, ok, descriptor((2, 2), (2, 1), aligned=16, offset=-4)), "address 0"),
        ((COPY_HOST, ok, np.zeros((2, 3), np.float32)), "shape"),
        ((SOFTMAX, ok, ok, 2), "axis 2"),
        ((GATHER, ok, ok, np.array([0, 2], np.int64)), "gather index 2"),
        ((REPEAT, ok, ok, 0, -1), "reps"),
        ((COPY_DEV, ok, ok, 1), "device 1"),
        ((COPY_HOST, descriptor((2, 2), (0, 1), ok.ctypes.data), ok), "alias"),
    ]
    for args, text in cases:
        assert abi.call(*args) == Status.VALIDATION, args
        assert text in abi.last_error(), (text, abi.last_error())
    monkeypatch.setenv("KINA_FX_DEVICE", "quantum")
    assert abi.call(COPY_HOST, ok, ok) == Status.VALIDATION and "KINA_FX_DEVICE" in abi.last_error()


def test_row_resource(abi, monkeypatch):
    assert abi.call(ALLOC, memref.empty_descriptor((1 << 40, 1 << 20)), 4) == Status.RESOURCE
    assert "bytes" in abi.last_error()
    assert abi.call(ALLOC, memref.empty_descriptor((1 << 62, 1 << 62)), 8) == Status.RESOURCE
    assert "overflows 64 bits" in abi.last_error()
    assert abi.call(ALLOC, memref.empty_descriptor((0, 1 << 62, 4)), 8) == Status.RESOURCE
    assert "stride" in abi.last_error()

    def no_memory(*args, **kwargs):
        raise MemoryError("no memory left")
    monkeypatch.setattr(gpu_ops, "matmul", no_memory)
    ok = np.zeros((2, 2), np.float32)
    assert abi.call(MATMUL, ok, ok, ok) == Status.RESOURCE and "MemoryError" in abi.last_error()


def test_row_gpu(abi, monkeypatch):
    if gpu_ops.cupy_module() is not None:
        pytest.skip("a CUDA device is present")
    monkeypatch.setenv("KINA_FX_DEVICE", "cuda")
    ok = np.zeros((2, 2), np.float32)
    assert abi.call(COPY_HOST, ok, ok) == Status.GPU and "CuPy" in abi.last_error()


def test_row_unimplemented(abi, monkeypatch):
    def unimplemented(*args, **kwargs):
        raise NotImplementedError("softmax in base 3")
    monkeypatch.setattr(gpu_ops, "softmax", unimplemented)
    ok = np.zeros((2, 2), np.float32)
    assert abi.call(SOFTMAX, ok, ok, 0) == Status.UNIMPLEMENTED
    assert abi.last_error() == "NotImplementedError: softmax in base 3"


def test_row_internal(abi, monkeypatch):
    def bug(*args, **kwargs):
        raise KeyError("a bug")
    monkeypatch.setattr(gpu_ops, "softmax", bug)
    ok = np.zeros((2, 2), np.float32)
    assert abi.call(SOFTMAX, ok, ok, 0) == Status.INTERNAL and "KeyError" in abi.last_error()
    monkeypatch.undo()
    ffi, lib = abi.ffi, abi.lib

    def dive():
        status = lib.runtime_gpu_free_all()
        return (status, ffi.string(lib.kina_last_error()).decode()) if status else dive()
    status, message = dive()
    assert status == Status.INTERNAL
    assert message.startswith("RecursionError: maximum recursion depth exceeded (kina_fx:")


def test_row_type(abi, kina, contract_lib):
    assert abi.call(ALLOC, memref.empty_descriptor((2,)), 3) == Status.TYPE
    assert "element_size" in abi.last_error()
    ffi, lib = kina
    with Handler(fun={Ask: lambda: "not a number"}):
        assert c_perform(kina, Ask) == (Status.TYPE, -5)
    assert "str" in last_error(kina)


# ---- "Statuses and states" ---------------------------------------------------------------------

def test_row_stale_handles(kina, fiber_calls, contract_lib):
    ffi, lib = kina
    out = ffi.new("int32_t *", -1)
    f = fiber_calls.create(Ask)
    assert lib.kina_fiber_destroy(f) == 0
    g = fiber_calls.create(Ask)                                   # may reuse f's slot: f stays stale
    h = push_returning(kina, contract_lib, 0, Ask)
    for bad in (0, 0x1234, f, (3 << 56) | (1 << 32) | 1, h):
        assert lib.kina_fiber_state(bad, out) == Status.VALIDATION and out[0] == -1
        assert "stale" in last_error(kina) or "not a fiber handle" in last_error(kina), last_error(kina)
    assert lib.kina_pop_handler(h) == 0
    assert lib.kina_pop_handler(h) == Status.VALIDATION and "stale" in last_error(kina)
    # a handler left pushed on a fiber that ended turns stale
    arg = ffi.new("int32_t *", Ask.id)
    left = ffi.new("kina_fiber_t *")
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", contract_lib.ct_push_no_pop), arg, ffi.NULL, 0, left) == 0
    assert fiber_calls.resume(left[0]) == (0, FIBER_DONE)
    assert lib.kina_fiber_destroy(left[0]) == 0
    gc.collect()
    assert lib.kina_pop_handler(contract_lib.ct_left_handle) == Status.VALIDATION and "stale" in last_error(kina)
    assert lib.kina_fiber_destroy(g) == 0


def test_row_resume_refused(kina, fiber_calls):
    f = fiber_calls.create(Ask, catch=[Ask])
    assert fiber_calls.resume(f) == (0, FIBER_SUSPENDED)
    assert fiber_calls.resume(f, 1) == (0, FIBER_DONE)
    assert fiber_calls.resume(f, sentinel=-9) == (Status.VALIDATION, -9) and "done" in last_error(kina)
    g = fiber_calls.create(Ask, catch=[Ask])
    assert fiber_calls.cancel(g) == (0, FIBER_CANCELLED)
    assert fiber_calls.resume(g, sentinel=-9) == (Status.VALIDATION, -9) and "cancelled" in last_error(kina)
    for x in (f, g):
        assert kina[1].kina_fiber_destroy(x) == 0


def test_row_not_suspended_or_not_done(kina, fiber_calls):
    ffi, lib = kina
    f = fiber_calls.create(Ask, catch=[Ask])
    eid, nargs, value = ffi.new("int32_t *", -1), ffi.new("int32_t *", -1), ffi.new("int64_t *", -1)
    assert lib.kina_get_perform_id(f, eid) == Status.VALIDATION and "new" in last_error(kina)
    assert lib.kina_get_perform_args(f, ffi.NULL, 0, nargs) == Status.VALIDATION and "new" in last_error(kina)
    assert fiber_calls.resume(f) == (0, FIBER_SUSPENDED)
    assert lib.kina_fiber_result(f, value) == Status.VALIDATION and "suspended" in last_error(kina)
    assert (eid[0], nargs[0], value[0]) == (-1, -1, -1)
    assert lib.kina_fiber_destroy(f) == 0


def test_row_pop_not_innermost(kina, contract_lib):
    ffi, lib = kina
    outer = push_returning(kina, contract_lib, 0, Ask)
    inner = push_returning(kina, contract_lib, 0, Other)
    assert lib.kina_pop_handler(outer) == Status.VALIDATION and "not the innermost handler" in last_error(kina)
    assert lib.kina_pop_handler(inner) == 0 and lib.kina_pop_handler(outer) == 0


def test_row_other_thread(kina, fiber_calls, contract_lib):
    ffi, lib = kina
    f = fiber_calls.create(Ask, catch=[Ask])
    h = push_returning(kina, contract_lib, 0, Ask)
    seen = []

    def other():
        st = ffi.new("int32_t *", -1)
        seen.append((lib.kina_resume_fiber(f, 0, st), st[0], ffi.string(lib.kina_last_error()).decode()))
        seen.append((lib.kina_pop_handler(h), -1, ffi.string(lib.kina_last_error()).decode()))
    t = threading.Thread(target=other)
    t.start()
    t.join()
    for status, state, message in seen:
        assert status == Status.VALIDATION and state == -1 and "another OS thread" in message
    assert lib.kina_pop_handler(h) == 0 and lib.kina_fiber_destroy(f) == 0


def test_row_bad_arguments(kina, fiber_calls, contract_lib):
    ffi, lib = kina
    NULL = ffi.NULL
    ids = ffi.new("int32_t[1]", [Ask.id])
    fn = ffi.cast("kina_handler_fn", contract_lib.ct_returns_ctx)
    entry = ffi.cast("kina_fiber_fn", contract_lib.ct_perform_once)
    f = fiber_calls.create(Ask, catch=[Ask])
    cases = [
        (lambda: lib.kina_effect_id(b"x", NULL), "out_id"),
        (lambda: lib.kina_fiber_create(NULL, NULL, NULL, 0, ffi.new("kina_fiber_t *")), "entry"),
        (lambda: lib.kina_fiber_create(entry, NULL, NULL, 0, NULL), "out_fiber"),
        (lambda: lib.kina_fiber_state(f, NULL), "out_state"),
        (lambda: lib.kina_fiber_result(f, NULL), "out_value"),
        (lambda: lib.kina_get_perform_id(f, NULL), "out_effect"),
        (lambda: lib.kina_cancel_fiber(f, NULL), "out_state"),
        (lambda: lib.kina_push_handler(NULL, NULL, ids, 1, ffi.new("kina_handler_t *")), "fn"),
        (lambda: lib.kina_push_handler(fn, NULL, ids, 1, NULL), "out_handler"),
        (lambda: lib.kina_push_handler(fn, NULL, ids, 0, ffi.new("kina_handler_t *")), "at least one effect"),
        (lambda: lib.kina_perform(Ask.id, NULL, 0, NULL), "out_value"),
        (lambda: lib.kina_perform(Ask.id, ffi.new("int64_t[17]"), 17, ffi.new("int64_t *")), "nargs"),
        (lambda: lib.kina_perform(Ask.id, ffi.new("int64_t[1]"), -1, ffi.new("int64_t *")), "nargs"),
        (lambda: lib.kina_perform(1 << 30, NULL, 0, ffi.new("int64_t *")), "no effect with id"),
        (lambda: lib.kina_fiber_create(entry, NULL, ffi.new("int32_t[1]", [0]), 1, ffi.new("kina_fiber_t *")),
         "no effect with id"),
        (lambda: lib.kina_effect_id(b"", ffi.new("int32_t *")), "empty"),
    ]
    for call, text in cases:
        assert call() == Status.VALIDATION, text
        assert text in last_error(kina), (text, last_error(kina))
    assert fiber_calls.state(f) == FIBER_NEW
    assert lib.kina_fiber_destroy(f) == 0


def test_row_cap_too_small(kina, fiber_calls, contract_lib):
    ffi, lib = kina
    f = fiber_calls.create(Ask, catch=[Ask])
    assert fiber_calls.resume(f) == (0, FIBER_SUSPENDED)
    # ct_perform_once performs with no arguments: any capacity >= 0 holds them
    nargs = ffi.new("int32_t *", -1)
    assert lib.kina_get_perform_args(f, ffi.NULL, 0, nargs) == 0 and nargs[0] == 0
    assert lib.kina_fiber_destroy(f) == 0
    arg = ffi.new("int32_t *", Ask.id)
    three = ffi.new("kina_fiber_t *")
    catch = ffi.new("int32_t[1]", [Ask.id])
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", contract_lib.ct_perform_three), arg, catch, 1, three) == 0
    assert fiber_calls.resume(three[0]) == (0, FIBER_SUSPENDED)
    args = ffi.new("int64_t[2]", [-1, -1])
    assert lib.kina_get_perform_args(three[0], args, 2, nargs) == Status.VALIDATION
    assert nargs[0] == 3 and "3 arguments" in last_error(kina)
    assert list(args) == [-1, -1]
    assert lib.kina_fiber_destroy(three[0]) == 0


def test_row_not_int64(kina, contract_lib):
    for answer in (1.5, "x", 1 << 64):
        with Handler(fun={Ask: lambda answer=answer: answer}):
            assert c_perform(kina, Ask) == (Status.TYPE, -5)
        assert type(answer).__name__ in last_error(kina) or "int64_t" in last_error(kina)


def test_row_cancelled_pending_perform(kina, fiber_calls, contract_lib):
    f = fiber_calls.create(Ask, catch=[Ask])
    assert fiber_calls.resume(f) == (0, FIBER_SUSPENDED)
    contract_lib.ct_last_rc = -1
    assert fiber_calls.cancel(f) == (0, FIBER_CANCELLED)
    assert contract_lib.ct_last_rc == Status.CANCELLED
    assert kina[1].kina_fiber_result(f, kina[0].new("int64_t *")) == Status.VALIDATION
    assert "cancelled" in last_error(kina)
    assert kina[1].kina_fiber_destroy(f) == 0


def test_row_unhandled_perform(kina):
    assert c_perform(kina, Effect("tables.nobody")) == (Status.UNHANDLED, -5)
    assert "unhandled effect" in last_error(kina)
