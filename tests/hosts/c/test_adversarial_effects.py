"""Adversarial tests of the effects C ABI (docs/abi.md "Effects C ABI", docs/effects.md).

Three C hosts, built with gcc through ``kina-fx config`` and run with ``env -i``
(each must pass every check and print nothing on stderr):

* adversarial_effects_args.c: every bad input of every function (NULL
  out-pointers in every position, counts out of range, unknown effect ids,
  zero / random / wrong-kind / freed / reused / tampered handles, double destroy);
* adversarial_effects_lifecycle.c: cancel twice, perform after cancel, destroy
  from inside fibers, handlers left pushed, popping foreign handlers, handlers that
  misbehave, KINA_SUSPEND with no fiber, handles used from other threads;
* adversarial_effects_stress.c: 10,000-fiber churn with a flat resident set,
  deep recursion, interleaving, nesting, threads.

And in-process tests mixing Python with a C fixture (adversarial_effects_lib.c).
Failing checks here are bugs: see the comment on each.
"""
from __future__ import annotations

import gc
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.abi import build_fixture_library

from support.hosts import kina_fx_config, run_clean

from kina_fx import Effect, Handler, KinaTypeError, ValidationError
from kina_fx.ffi import effects as ffi_effects
from kina_fx.errors import Cancelled, InternalError, Status

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")

FIBER_NEW, FIBER_RUNNING, FIBER_SUSPENDED, FIBER_DONE, FIBER_FAILED, FIBER_CANCELLED = range(6)


# --- the C hosts -------------------------------------------------------------------------

def build_and_run(tmp_path, name):
    exe = tmp_path / name
    subprocess.run([GCC, "-O2", "-Wall", "-Werror", str(HERE / f"{name}.c"),
                    *kina_fx_config("--cflags", "--libs"), "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return run_clean([exe])


def assert_host_passed(result, name):
    failures = [line for line in result.stdout.splitlines() if line.startswith(("FAIL", "  ("))]
    assert result.returncode == 0 and not failures, (
        f"{name} exited {result.returncode}:\n" + "\n".join(failures) + "\n" + result.stdout[-2000:])
    assert f"{name}: " in result.stdout and "checks passed" in result.stdout
    assert result.stderr == ""


@needs_gcc
def test_bad_inputs_host(tmp_path):
    """Every documented Validation status for every bad argument and handle."""
    result = build_and_run(tmp_path, "adversarial_effects_args")
    assert_host_passed(result, "adversarial_effects_args")


@needs_gcc
def test_lifecycle_host(tmp_path):
    """Known failures (bugs), each a FAIL line of the host:

    * a fiber that performs again after kina_cancel_fiber gets CANCELLED 100
      times, then KINA_STATUS_UNHANDLED for ever and keeps running; documented:
      "cancelled again (up to 100 times), then dropped".  A fiber that ignores
      the status makes kina_cancel_fiber (and kina_fiber_destroy) hang.
    * a C handler that pushes a handler in its clause and returns leaves the
      thread's handler stack wedged: neither handler can ever be popped.
    * handles of a thread that has exited are accepted by a later thread that
      reuses its thread id: kina_fiber_state/cancel/destroy return 0 and resume
      returns 5 (greenlet's "cannot switch to a different thread") instead of 1.
    * kina_perform of the runtime's own effect "kina.suspend_to_host" (id from
      kina_effect_id; it is id 1 in a fresh process) in a catch-all fiber: with
      0, 1 or 3 arguments the resume returns 1 (ValueError: not enough values to
      unpack) without setting *out_state, and the fiber stays RUNNING for ever:
      it can be neither resumed, cancelled nor destroyed; with 2 arguments
      kina_get_perform_id returns 5 (AttributeError).
    """
    result = build_and_run(tmp_path, "adversarial_effects_lifecycle")
    assert_host_passed(result, "adversarial_effects_lifecycle")


@needs_gcc
def test_stress_host(tmp_path):
    """Known failures (bugs), each a FAIL line of the host:

    * C handlers pushed in a fiber and never popped leak (about 3 kB each: their
      handles are never freed), so the resident set grows with every such fiber;
    * forwarding (KINA_FORWARD) through more than ~500 C handlers fails with
      status 5 (RecursionError).
    """
    result = build_and_run(tmp_path, "adversarial_effects_stress")
    assert_host_passed(result, "adversarial_effects_stress")


# --- in-process: Python and the C fixture -------------------------------------------------

FIXTURE_CDEF = """
extern int32_t adv_rcs[8];
extern int64_t adv_values[8];
int32_t adv_answer(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out);
int32_t adv_suspend(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out);
int64_t adv_push_no_pop(void *arg);
int64_t adv_perform_twice(int32_t effect);
int64_t adv_perform_twice_entry(void *arg);
int64_t adv_perform_once(int32_t effect);
"""

Ask = Effect("adv.py.ask")
Get = Effect("adv.py.get")


@pytest.fixture(scope="module")
def clib(kina, tmp_path_factory):
    if GCC is None:
        pytest.skip("gcc is not installed")
    ffi, _ = kina
    out = build_fixture_library(HERE / "adversarial_effects_lib.c",
                                tmp_path_factory.mktemp("adversarial") / "libadversarial.so", GCC)
    ffi.cdef(FIXTURE_CDEF)
    return ffi.dlopen(str(out))


@pytest.fixture(autouse=True)
def nothing_on_stderr(capfd):
    yield
    assert capfd.readouterr().err == ""


def last_error(kina) -> str:
    ffi, lib = kina
    return ffi.string(lib.kina_last_error()).decode()


def handler_fn(kina, clib, name):
    ffi, _ = kina
    return ffi.cast("kina_handler_fn", getattr(clib, name))


def test_unpopped_c_handlers_are_freed_with_their_fiber(kina, clib):
    """BUG: a handler pushed in a fiber that finishes (or is destroyed) without
    popping it keeps its handle for ever: handler_handles.live() grows by one per
    fiber and the memory is never returned (see the stress host's resident set)."""
    ffi, lib = kina
    gc.collect()
    before = ffi_effects.handler_handles.live()
    f = ffi.new("kina_fiber_t *")
    state = ffi.new("int32_t *")
    eff = ffi.new("int32_t *", Ask.id)
    entry = ffi.cast("kina_fiber_fn", clib.adv_push_no_pop)
    for _ in range(200):
        assert lib.kina_fiber_create(entry, eff, ffi.NULL, 0, f) == 0
        assert lib.kina_resume_fiber(f[0], 0, state) == 0 and state[0] == FIBER_DONE
        assert lib.kina_fiber_destroy(f[0]) == 0
    gc.collect()
    assert ffi_effects.handler_handles.live() == before


def test_python_with_exit_over_a_c_handler(kina, clib):
    """A C handler pushed inside a Python ``with Handler(...)`` and not popped:
    the with exit is not the innermost pop, so it raises ValidationError and
    pops nothing; the C handler can still be popped, then the Python one."""
    from kina_fx import fibers, handlers
    ffi, lib = kina
    h = ffi.new("kina_handler_t *")
    ids = ffi.new("int32_t[1]", [Ask.id])
    py = Handler(fun={Get: lambda: 1})
    with pytest.raises(ValidationError, match="innermost"):
        with py:
            assert lib.kina_push_handler(handler_fn(kina, clib, "adv_answer"), ffi.cast("void *", 3),
                                         ids, 1, h) == 0
    assert clib.adv_perform_once(Ask.id) == 3
    assert lib.kina_pop_handler(h[0]) == 0
    assert fibers.current().stack == [py]
    handlers.pop_handler(py)
    assert fibers.current().stack == []
    assert clib.adv_perform_once(Ask.id) == -Status.UNHANDLED


def test_c_suspend_with_no_kina_fiber_outside(kina, clib):
    """KINA_SUSPEND from a C handler when no kina_fiber_create fiber is outside it
    (only a Python Handler.run fiber): the perform fails with 8, naming the effect."""
    ffi, lib = kina
    h = ffi.new("kina_handler_t *")
    ids = ffi.new("int32_t[1]", [Ask.id])

    def body():
        assert lib.kina_push_handler(handler_fn(kina, clib, "adv_suspend"), ffi.NULL, ids, 1, h) == 0
        try:
            return clib.adv_perform_once(Ask.id)
        finally:
            assert lib.kina_pop_handler(h[0]) == 0
    assert Handler(on={Get: lambda k: 0}).run(body) == -Status.UNHANDLED
    assert "adv.py.ask" in last_error(kina)
    assert clib.adv_values[0] == -77   # out_value untouched


def test_dropped_continuation_over_a_c_perform(kina, clib):
    """A Python on-clause that never resumes a continuation whose fibers hold a
    pending kina_perform: the body is aborted at once, under the handler
    (docs/effects.md, "Abort cleanup").  The C code's perform must fail with
    CANCELLED, nothing may be printed, and a later perform in the aborted body
    reaches the same handler, whose clause drops it too: CANCELLED again.

    BUG (contract gap): the unwound perform returns 5 (Internal, "bugs") rather
    than KINA_STATUS_CANCELLED (7), the status the ABI gives C code for "unwind
    and return"; C code cannot tell a runtime bug from a normal unwind."""
    result = Handler(on={Get: lambda k: 5}).run(lambda: clib.adv_perform_twice(Get.id))
    gc.collect()
    assert result == 5
    assert clib.adv_rcs[0] != 0 and clib.adv_values[0] == -77
    assert clib.adv_rcs[1] == Status.CANCELLED
    assert clib.adv_rcs[0] == Status.CANCELLED


@pytest.mark.parametrize("exc, status", [
    (RuntimeError("boom"), Status.INTERNAL),
    (ValidationError("bad"), Status.VALIDATION),
    (KinaTypeError("typ"), Status.TYPE),
    (InternalError("int"), Status.INTERNAL),
    (Cancelled("c"), Status.CANCELLED),
])
def test_discontinue_into_a_c_perform(kina, clib, exc, status):
    """k.discontinue(exc) into a C perform: the perform returns status_of(exc)
    with "Class: message" in kina_last_error, and the C code carries on."""
    r = Handler(on={Get: lambda k: k.discontinue(exc)}).run(lambda: clib.adv_perform_once(Get.id))
    assert r == -status
    assert last_error(kina) == f"{type(exc).__name__}: {exc}"
    assert clib.adv_values[0] == -77


@pytest.mark.parametrize("answer", [1.5, 1 << 63, -(1 << 63) - 1, "7", b"7", [1], object()])
def test_python_answer_that_is_not_int64(kina, clib, answer):
    """A Python handler answering a C perform with a non-int64 value: status 6,
    out_value untouched, the message names the type."""
    with Handler(fun={Get: lambda: answer}):
        assert clib.adv_perform_once(Get.id) == -Status.TYPE
    assert clib.adv_values[0] == -77
    assert "int" in last_error(kina)


@pytest.mark.parametrize("answer, expected", [(None, 0), (True, 1), ((1 << 63) - 1, (1 << 63) - 1),
                                              (-(1 << 63), -(1 << 63))])
def test_python_answer_edge_values(clib, answer, expected):
    with Handler(fun={Get: lambda: answer}):
        assert clib.adv_perform_once(Get.id) == expected


def test_dead_threads_fiber_used_by_a_new_thread(kina, clib):
    """BUG: fibers belong to their OS thread, "using its handle from another thread
    returns KINA_STATUS_VALIDATION".  A thread that starts after the owner exited
    usually gets the same thread id, and the runtime takes it for the owner:
    kina_fiber_state returns 0, kina_resume_fiber returns 5 with greenlet's
    "cannot switch to a different thread (which happens to have exited)"."""
    ffi, lib = kina
    eff = ffi.new("int32_t *", Get.id)
    made = {}

    def owner():
        f = ffi.new("kina_fiber_t *")
        st = ffi.new("int32_t *")
        catch = ffi.new("int32_t[1]", [Get.id])
        entry = ffi.cast("kina_fiber_fn", clib.adv_perform_twice_entry)
        assert lib.kina_fiber_create(entry, eff, catch, 1, f) == 0
        assert lib.kina_resume_fiber(f[0], 0, st) == 0 and st[0] == FIBER_SUSPENDED
        made["fiber"] = f[0]
        made["ident"] = threading.get_ident()

    t = threading.Thread(target=owner)
    t.start()
    t.join()
    codes = {}

    def stranger():
        st = ffi.new("int32_t *")
        codes["same_ident"] = threading.get_ident() == made["ident"]
        codes["state"] = lib.kina_fiber_state(made["fiber"], st)
        codes["resume"] = lib.kina_resume_fiber(made["fiber"], 0, st)
        codes["resume_error"] = last_error(kina)
        codes["destroy"] = lib.kina_fiber_destroy(made["fiber"])
    for _ in range(50):    # until a new thread gets the dead owner's id (glibc reuses it)
        time.sleep(0.02)
        t = threading.Thread(target=stranger)
        t.start()
        t.join()
        if codes["same_ident"]:
            break
    assert codes["resume"] == Status.VALIDATION, codes
    assert "another OS thread" in codes["resume_error"], codes
    assert codes["state"] == Status.VALIDATION, codes
    assert codes["destroy"] == Status.VALIDATION, codes


def test_kina_fiber_driven_from_python_clauses(kina, clib):
    """A kina fiber created at the root and resumed from inside a Python on-clause
    (another greenlet of the same thread): allowed, and the fiber's uncaught
    effect goes to the handlers around that resume."""
    ffi, lib = kina
    f = ffi.new("kina_fiber_t *")
    st = ffi.new("int32_t *")
    eff = ffi.new("int32_t *", Ask.id)
    catch = ffi.new("int32_t[1]", [Get.id])     # catches Get, not Ask
    entry = ffi.cast("kina_fiber_fn", clib.adv_perform_twice_entry)
    assert lib.kina_fiber_create(entry, eff, catch, 1, f) == 0

    def clause(k):
        with Handler(fun={Ask: lambda: 40}):
            rc = lib.kina_resume_fiber(f[0], 0, st)
        return k.resume(rc * 100 + st[0])
    result = Handler(on={Get: clause}).run(lambda: clib.adv_perform_once(Get.id))
    assert result == FIBER_DONE
    r = ffi.new("int64_t *")
    assert lib.kina_fiber_result(f[0], r) == 0 and r[0] == 2
    assert list(clib.adv_rcs[0:2]) == [0, 0] and clib.adv_values[1] == 40
    assert lib.kina_fiber_destroy(f[0]) == 0
