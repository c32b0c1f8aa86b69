"""The effects C ABI driven in-process: Python and C handlers on one handler stack.

C code (tests/hosts/c/mixed_lib.c, built with gcc against libkina_fx.so) and
Python code perform effects on the same fibers, in both directions and nested.
"""
from __future__ import annotations

import gc
import shutil
import threading
from pathlib import Path

import pytest
from support.abi import build_fixture_library

from kina_fx import Effect, Handler, KinaTypeError, ValidationError, perform
from kina_fx.ffi import effects as ffi_effects
from kina_fx.errors import Status

pytestmark = pytest.mark.integration
HERE = Path(__file__).parents[1] / "hosts" / "c"
GCC = shutil.which("gcc")

MIXED_CDEF = """
typedef int64_t (*py_callback)(int64_t);
int64_t c_perform_plus_one(void *arg);
int64_t c_two_performs(int32_t effect, int64_t base);
int32_t c_answer_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out);
int32_t c_forward_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out);
int64_t c_push_and_call(int32_t effect, int64_t *answer, py_callback cb, int64_t arg);
int64_t c_entry_calls_python(void *cb);
"""

FIBER_NEW, FIBER_RUNNING, FIBER_SUSPENDED, FIBER_DONE, FIBER_FAILED, FIBER_CANCELLED = range(6)

Get = Effect("abi.get")
Ask = Effect("abi.ask")
Yield = Effect("abi.yield")


@pytest.fixture(scope="module")
def clib(kina, tmp_path_factory):
    if GCC is None:
        pytest.skip("gcc is not installed")
    ffi, _ = kina
    out = build_fixture_library(HERE / "mixed_lib.c", tmp_path_factory.mktemp("mixed") / "libmixed.so", GCC)
    ffi.cdef(MIXED_CDEF)
    return ffi.dlopen(str(out))


def effect_id_ptr(ffi, effect):
    return ffi.new("int32_t *", effect.id)


# --- Python handlers answering C performs --------------------------------------------

def test_python_on_handler_handles_c_perform_across_c_frames(kina, clib):
    ffi, _ = kina
    arg = effect_id_ptr(ffi, Get)
    h = Handler(on={Get: lambda k: k.resume(41)})
    assert h.run(lambda: clib.c_perform_plus_one(arg)) == 42


def test_python_fun_handler_handles_c_perform(kina, clib):
    ffi, _ = kina
    with Handler(fun={Get: lambda: 9}):
        assert clib.c_perform_plus_one(effect_id_ptr(ffi, Get)) == 10


def test_c_locals_survive_python_handler_suspensions(clib):
    seen = []

    def clause(k, x):
        seen.append(x)
        return k.resume(x * 2)
    assert Handler(on={Yield: clause}).run(lambda: clib.c_two_performs(Yield.id, 100)) == 200 * 1000 + 202
    assert seen == [100, 101]


def test_unhandled_c_perform_returns_status(kina, clib):
    ffi, _ = kina
    assert clib.c_perform_plus_one(effect_id_ptr(ffi, Effect("abi.nobody"))) == -int(Status.UNHANDLED)


# --- C handlers answering Python performs ----------------------------------------------

def test_c_handler_pushed_below_python_code(kina, clib):
    ffi, _ = kina
    answer = ffi.new("int64_t *", 1000)

    @ffi.callback("int64_t(int64_t)")
    def python_body(x):
        return perform(Ask, x) + perform(Ask, 5)
    assert clib.c_push_and_call(Ask.id, answer, python_body, 3) == 1003 + 1005
    # popped again: the root handler stack is empty
    from kina_fx import fibers
    assert fibers.current().stack == []


def test_mixed_nested_python_and_c_handlers(kina, clib):
    """Python on-handler outside, C handler in the middle, Python code inside
    performing both effects: one answered in place by C, one suspending
    through the C frames to the Python handler and resumed."""
    ffi, _ = kina
    answer = ffi.new("int64_t *", 50)
    log = []

    @ffi.callback("int64_t(int64_t)")
    def inner(x):
        a = perform(Ask)            # C handler, in place
        g = perform(Get)            # Python handler outside the C frames
        log.append((a, g))
        return a + g + x

    def outer_clause(k):
        log.append("outer")
        return k.resume(7)
    result = Handler(on={Get: outer_clause}).run(lambda: clib.c_push_and_call(Ask.id, answer, inner, 1))
    assert result == 50 + 7 + 1
    assert log == ["outer", (50, 7)]


@pytest.fixture
def c_handlers(kina, clib):
    """The fixture library's C handlers as kina_handler_fn pointers."""
    ffi, _ = kina
    return {"forward": ffi.cast("kina_handler_fn", clib.c_forward_handler),
            "answer": ffi.cast("kina_handler_fn", clib.c_answer_handler)}


def test_c_handler_forward_reaches_python_handler(kina, c_handlers):
    ffi, lib = kina
    count = ffi.new("int64_t *", 0)
    h = ffi.new("kina_handler_t *")
    ids = ffi.new("int32_t[1]", [Ask.id])

    def body():
        assert lib.kina_push_handler(c_handlers["forward"], count, ids, 1, h) == 0
        try:
            return perform(Ask)
        finally:
            assert lib.kina_pop_handler(h[0]) == 0
    assert Handler(fun={Ask: lambda: 77}).run(body) == 77
    assert count[0] == 1


def test_python_perform_with_non_int_args_to_c_handler_is_type_error(kina, c_handlers):
    ffi, lib = kina
    answer = ffi.new("int64_t *", 1)
    h = ffi.new("kina_handler_t *")
    ids = ffi.new("int32_t[1]", [Ask.id])
    assert lib.kina_push_handler(c_handlers["answer"], answer, ids, 1, h) == 0
    try:
        with pytest.raises(KinaTypeError):
            perform(Ask, 1.5)
        with pytest.raises(KinaTypeError):
            perform(Ask, 1 << 70)
        assert perform(Ask, 2) == 3
    finally:
        assert lib.kina_pop_handler(h[0]) == 0


# --- host fibers driven from Python through the exports ----------------------------------

def test_fiber_with_c_entry_driven_through_exports(kina, clib):
    ffi, lib = kina
    f = ffi.new("kina_fiber_t *")
    state = ffi.new("int32_t *")
    eid = ffi.new("int32_t *")
    catch = ffi.new("int32_t[1]", [Get.id])
    arg = effect_id_ptr(ffi, Get)
    entry = ffi.cast("kina_fiber_fn", clib.c_perform_plus_one)
    assert lib.kina_fiber_create(entry, arg, catch, 1, f) == 0
    assert lib.kina_resume_fiber(f[0], 0, state) == 0 and state[0] == FIBER_SUSPENDED
    assert lib.kina_get_perform_id(f[0], eid) == 0 and eid[0] == Get.id
    assert lib.kina_resume_fiber(f[0], 99, state) == 0 and state[0] == FIBER_DONE
    result = ffi.new("int64_t *")
    assert lib.kina_fiber_result(f[0], result) == 0 and result[0] == 100
    assert lib.kina_fiber_destroy(f[0]) == 0
    assert lib.kina_fiber_state(f[0], state) == Status.VALIDATION


def test_python_code_in_cancelled_fiber_runs_finally(kina, clib):
    ffi, lib = kina
    log = []

    def body(x):
        try:
            perform(Yield, x)
            log.append("resumed")
        finally:
            log.append("finally")
        return 0

    def onerror(exc_type, exc, tb):
        log.append(exc_type.__name__)
        return -int(Status.CANCELLED)
    cb = ffi.callback("int64_t(int64_t)", body, onerror=onerror)
    f = ffi.new("kina_fiber_t *")
    state = ffi.new("int32_t *")
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", clib.c_entry_calls_python), ffi.cast("void *", cb),
                                 ffi.NULL, 0, f) == 0
    assert lib.kina_resume_fiber(f[0], 0, state) == 0 and state[0] == FIBER_SUSPENDED
    assert lib.kina_cancel_fiber(f[0], state) == 0 and state[0] == FIBER_CANCELLED
    assert log == ["finally", "Cancelled"]
    assert lib.kina_fiber_destroy(f[0]) == 0


def test_fiber_handle_from_another_thread_is_rejected(kina, clib):
    ffi, lib = kina
    f = ffi.new("kina_fiber_t *")
    arg = effect_id_ptr(ffi, Get)
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", clib.c_perform_plus_one), arg, ffi.NULL, 0, f) == 0
    codes = []

    def other():
        st = ffi.new("int32_t *")
        codes.append(lib.kina_resume_fiber(f[0], 0, st))
        codes.append(ffi.string(lib.kina_last_error()).decode())
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert codes[0] == Status.VALIDATION and "thread" in codes[1]
    state = ffi.new("int32_t *")
    assert lib.kina_resume_fiber(f[0], 0, state) == 0 and state[0] == FIBER_SUSPENDED
    assert lib.kina_fiber_destroy(f[0]) == 0


def test_handles_do_not_leak(kina, clib):
    ffi, lib = kina
    before = (ffi_effects.fiber_handles.live(), ffi_effects.handler_handles.live())
    f = ffi.new("kina_fiber_t *")
    state = ffi.new("int32_t *")
    arg = effect_id_ptr(ffi, Get)
    entry = ffi.cast("kina_fiber_fn", clib.c_perform_plus_one)
    for _ in range(2000):
        assert lib.kina_fiber_create(entry, arg, ffi.NULL, 0, f) == 0
        assert lib.kina_resume_fiber(f[0], 0, state) == 0
        assert lib.kina_fiber_destroy(f[0]) == 0
    gc.collect()
    assert (ffi_effects.fiber_handles.live(), ffi_effects.handler_handles.live()) == before
    assert len(ffi_effects.fiber_handles._slots) < before[0] + 10


def test_handle_table_rejects_stale_foreign_and_wrong_kind():
    table = ffi_effects.HandleTable(3, "thing")
    a = table.add("a")
    assert table.get(a) == "a"
    table.remove(a)
    with pytest.raises(ValidationError, match="stale"):
        table.get(a)
    b = table.add("b")                  # reuses the slot with a new generation
    assert b != a and table.get(b) == "b"
    for bad in (0, -1, a, b ^ (1 << 56), (3 << 56) | 99):
        with pytest.raises(ValidationError):
            table.get(bad)
