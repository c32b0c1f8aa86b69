"""The tape ABI's decisions for calls that would otherwise give a silently wrong
gradient or a surprising status (docs/autograd-abi.md: "Buffers a tape already
knows", "Nested tapes", "Limits", "Errors"), through
the real exports, in-process: watch of a produced buffer, constant of a watched
or produced one, constants in nested tapes, failed calls changing nothing,
rank-0 sigmoid, tapes left recording on a fiber or thread that ended.

Gradients are checked against float64 closed forms.
"""
from __future__ import annotations

import gc
import threading
import tracemalloc

import numpy as np
import pytest

from support.abi import Abi
from support.tapes import F32, LENIENT, OK, STRICT, VALIDATION, Tape, free_leftovers, op_status
from kina_fx import gpu_ops


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


@pytest.fixture(scope="module")
def abi():
    return Abi()


@pytest.fixture(autouse=True)
def no_leftover_tapes():
    yield
    free_leftovers()


ONES3 = np.ones(3, np.float32)


def _grad(t, watched):
    g = np.full_like(watched, np.nan)
    assert t.call("grad", watched, g) == OK, t.abi.last_error()
    return g


# ---- watch of a buffer a recorded op produced ---------------------------------------

def test_watch_of_a_produced_buffer_is_refused_and_changes_nothing(abi):
    """Watching y = exp(x) would make y a new leaf and cut every path through it
    from x: d(y*y)/dx would silently be 0.  It is refused; the tape goes on as if
    the call had not been made."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    t = Tape(abi)
    assert t.call("watch", x, F32) == OK
    t.op("exp", y, x)
    assert t.call("watch", y, F32) == VALIDATION
    assert "produced by a recorded runtime op" in abi.last_error()
    t.op("mul", z, y, y)
    t.end()
    assert t.call("backward", z, ONES3) == OK
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(_grad(t, x), 2 * np.exp(2 * x64), rtol=1e-6)
    assert t.call("grad", y, np.zeros_like(y)) == VALIDATION     # y was never watched
    t.free()


def test_watch_of_a_produced_buffer_the_host_overwrote_is_new_data(abi):
    """Once the host wrote new values into y, y no longer holds what the tape
    computed: watching it is watching new data (and x no longer reaches z)."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    t = Tape(abi)
    assert t.call("watch", x, F32) == OK
    t.op("exp", y, x)
    y[...] = [2.0, 3.0, 4.0]
    assert t.call("watch", y, F32) == OK, abi.last_error()
    t.op("mul", z, y, y)
    t.end()
    assert t.call("backward", z, ONES3) == OK
    np.testing.assert_allclose(_grad(t, y), [4.0, 6.0, 8.0])
    np.testing.assert_array_equal(_grad(t, x), 0.0)
    t.free()


def test_watch_of_a_constant_is_refused(abi):
    """A constant already read as data would lose the uses before the watch:
    the gradient would miss them.  Declared constant or taken as one by a
    lenient tape, it cannot be watched while it holds those values."""
    for flags, declare in ((STRICT, True), (LENIENT, False)):
        c = np.array([1.0, 2.0, 3.0], np.float32)
        w = np.array([0.5, 0.5, 0.5], np.float32)
        y = np.zeros_like(c)
        t = Tape(abi, flags)
        assert t.call("watch", w, F32) == OK
        if declare:
            assert t.call("constant", c, F32) == OK
        t.op("mul", y, c, w)
        assert t.call("watch", c, F32) == VALIDATION
        assert "constant" in abi.last_error()
        t.free()


# ---- constant of a watched or produced buffer ------------------------------------------

def test_constant_of_a_watched_buffer_is_refused(abi):
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y = np.zeros_like(x)
    t = Tape(abi)
    assert t.call("watch", x, F32) == OK
    assert t.call("constant", x, F32) == VALIDATION
    assert "watched" in abi.last_error()
    t.op("exp", y, x)
    t.end()
    assert t.call("backward", y, ONES3) == OK
    np.testing.assert_allclose(_grad(t, x), np.exp(x.astype(np.float64)), rtol=1e-6)
    t.free()


def test_constant_of_a_produced_buffer_is_refused(abi):
    """constant(y) for y = exp(x) would make later reads of y data: d(y*y)/dx
    would silently be 0."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    t = Tape(abi)
    assert t.call("watch", x, F32) == OK
    t.op("exp", y, x)
    assert t.call("constant", y, F32) == VALIDATION
    assert "produced by a recorded runtime op" in abi.last_error()
    t.op("mul", z, y, y)
    t.end()
    assert t.call("backward", z, ONES3) == OK
    np.testing.assert_allclose(_grad(t, x), 2 * np.exp(2 * x.astype(np.float64)), rtol=1e-6)
    t.free()


def test_constant_again_and_constant_of_overwritten_buffers_are_accepted(abi):
    x = np.array([0.5, -0.25, 1.0], np.float32)
    c = np.array([1.0, 2.0, 3.0], np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    t = Tape(abi)
    assert t.call("watch", x, F32) == OK
    assert t.call("constant", c, F32) == OK
    assert t.call("constant", c, F32) == OK              # declaring again: documented
    t.op("exp", y, x)
    y[...] = 7.0                                       # new data in a produced buffer
    assert t.call("constant", y, F32) == OK, abi.last_error()
    t.op("mul", z, y, x)
    t.end()
    assert t.call("backward", z, ONES3) == OK
    np.testing.assert_allclose(_grad(t, x), 7.0)
    t.free()


def test_constant_in_a_nested_tape_of_a_buffer_the_outer_tape_watches(abi):
    """The inner tape does not differentiate it, but the outer one still does:
    an inner constant of an outer tensor is that tensor, not a copy of its
    values (which would make d/dx through the inner ops silently 0)."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    outer = Tape(abi)
    assert outer.call("watch", x, F32) == OK
    inner = Tape(abi)
    assert inner.call("constant", x, F32) == OK
    inner.op("exp", y, x)
    inner.end()
    inner.free()
    outer.op("mul", z, y, y)
    outer.end()
    assert outer.call("backward", z, ONES3) == OK
    np.testing.assert_allclose(_grad(outer, x), 2 * np.exp(2 * x.astype(np.float64)), rtol=1e-6)
    outer.free()


def test_watch_in_a_nested_tape_of_a_buffer_the_outer_tape_produced(abi):
    """For the inner tape, y = exp(x) recorded by the outer one is an input:
    watching it is allowed, and the outer tape sees the inner gradient as a
    function of x (second order through the nesting)."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y, z, g, s = (np.zeros_like(x) for _ in range(4))
    outer = Tape(abi)
    assert outer.call("watch", x, F32) == OK
    outer.op("exp", y, x)
    inner = Tape(abi)
    assert inner.call("watch", y, F32) == OK, abi.last_error()
    inner.op("mul", z, y, y)
    inner.end()
    assert inner.call("backward", z, ONES3) == OK
    assert inner.call("grad", y, g) == OK                  # g = 2y, recorded by outer
    inner.free()
    outer.op("mul", s, g, y)                               # s = 2 exp(2x)
    outer.end()
    assert outer.call("backward", s, ONES3) == OK
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(g, 2 * np.exp(x64), rtol=1e-6)
    np.testing.assert_allclose(_grad(outer, x), 4 * np.exp(2 * x64), rtol=1e-6)
    outer.free()


def test_a_sibling_watching_what_an_ended_nested_tape_produced_leaves_its_gradient_right(abi):
    """t1 (nested in outer) records y = exp(x) and ends; t2, nested in outer too,
    watches y.  t1's backward from y must still give exp(x): t2's watch boxes
    the value anew instead of taking over t1's result (which made it 0)."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)
    outer = Tape(abi)
    t1 = Tape(abi)
    assert t1.call("watch", x, F32) == OK
    t1.op("exp", y, x)
    t1.end()
    t2 = Tape(abi)
    assert t2.call("watch", y, F32) == OK, abi.last_error()
    t2.op("mul", z, y, y)
    assert t1.call("backward", y, ONES3) == OK, abi.last_error()
    np.testing.assert_allclose(_grad(t1, x), np.exp(x.astype(np.float64)), rtol=1e-6)
    t2.end()
    assert t2.call("backward", z, ONES3) == OK, abi.last_error()
    np.testing.assert_allclose(_grad(t2, y), 2 * y, rtol=1e-6)
    for t in (t1, t2, outer):
        t.free()


def test_backward_of_a_nested_tape_after_its_parent_ended_under_a_recording_grandparent(abi):
    """inner (in middle, in outer) records y = x * x; middle ends; inner's
    backward then runs under outer, which records it: middle's values are
    constants to outer, and the gradient is 2x (it was refused as values that
    escaped their trace)."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y = np.zeros_like(x)
    outer = Tape(abi)
    middle = Tape(abi)
    assert middle.call("watch", x, F32) == OK
    inner = Tape(abi)
    assert inner.call("watch", x, F32) == OK
    inner.op("mul", y, x, x)
    inner.end()
    middle.end()
    assert inner.call("backward", y, ONES3) == OK, abi.last_error()
    np.testing.assert_allclose(_grad(inner, x), 2 * x, rtol=1e-6)
    for t in (inner, middle, outer):
        t.free()


# ---- a failed call changes nothing -------------------------------------------------------

def test_a_refused_op_leaves_a_lenient_tape_as_it_was(abi):
    """add(o, u, c) is refused (c was overwritten): u, read first, must not
    stay behind as a constant, or a later write of u (never read by a
    successful call) would make neg(o, u) fail as 'overwritten'."""
    c = np.ones(3, np.float32)
    u = np.full(3, 2.0, np.float32)
    o = np.zeros(3, np.float32)
    t = Tape(abi, LENIENT)
    assert t.call("constant", c, F32) == OK
    c[0] = 5.0
    assert op_status(abi, "add", o, u, c) == VALIDATION
    assert "overwritten" in abi.last_error()
    np.testing.assert_array_equal(o, 0.0)
    u[0] = 7.0
    assert op_status(abi, "neg", o, u) == OK, abi.last_error()
    np.testing.assert_array_equal(o, [-7.0, -2.0, -2.0])
    t.free()


def test_a_refused_op_of_a_lenient_tape_lets_no_buffer_into_a_strict_one_nested_inside(abi):
    c = np.ones(3, np.float32)
    u = np.full(3, 2.0, np.float32)
    o = np.zeros(3, np.float32)
    outer = Tape(abi, LENIENT)
    assert outer.call("constant", c, F32) == OK
    c[0] = 5.0
    assert op_status(abi, "add", o, u, c) == VALIDATION
    inner = Tape(abi, STRICT)
    assert op_status(abi, "neg", o, u) == VALIDATION        # u is unknown to both tapes
    assert "was not produced by a recorded runtime op" in abi.last_error()
    inner.free()
    outer.free()


def test_a_refused_op_under_a_lenient_tape_when_the_primitive_fails(abi):
    """The failure may come after the inputs were read (here matmul's shapes are
    fine for the check but the second input was overwritten): nothing of the
    call stays behind."""
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    o = np.zeros((2, 2), np.float32)
    t = Tape(abi, LENIENT)
    assert t.call("constant", b, F32) == OK
    b[0, 0] = 2.0
    assert op_status(abi, "matmul", o, a, b) == VALIDATION
    a[0, 0] = 3.0
    assert t.call("watch", a, F32) == OK, abi.last_error()   # a was never known
    t.free()


# ---- sigmoid at rank 0 -----------------------------------------------------------------

# SciPy is one of CI's packages (the demo extra): its expit must not go untested there.
@pytest.fixture(params=[pytest.param("expit", marks=pytest.mark.integration), "fallback"])
def sigmoid_kernel(request, monkeypatch):
    """The runtime's sigmoid kernel: SciPy's expit, or the tanh formula without SciPy."""
    if request.param == "fallback":
        monkeypatch.setitem(gpu_ops._expit_cache, np, None)
    elif gpu_ops._expit(np) is None:
        pytest.skip("SciPy is not installed")
    return request.param


def test_sigmoid_of_rank_0_buffers_under_a_tape(abi, sigmoid_kernel):
    x = np.array(0.3, np.float32)
    out = np.zeros((), np.float32)
    want = 1 / (1 + np.exp(-0.3))
    assert op_status(abi, "sigmoid", out, x) == OK
    np.testing.assert_allclose(out, want, rtol=1e-6)
    for flags in (STRICT, LENIENT):
        out[...] = 0
        t = Tape(abi, flags)
        assert t.call("watch", x, F32) == OK
        assert op_status(abi, "sigmoid", out, x) == OK, abi.last_error()
        t.end()
        assert t.call("backward", out, np.ones((), np.float32)) == OK, abi.last_error()
        g = np.zeros((), np.float32)
        assert t.call("grad", x, g) == OK
        np.testing.assert_allclose(out, want, rtol=1e-6)
        np.testing.assert_allclose(g, want * (1 - want), rtol=1e-5)
        t.free()


def test_sigmoid_kernel_at_rank_0_without_out(sigmoid_kernel):
    r = gpu_ops.sigmoid(np.array(-0.5, np.float32))
    np.testing.assert_allclose(r, 1 / (1 + np.exp(0.5)), rtol=1e-6)
    assert np.asarray(r).dtype == np.float32


# ---- tapes left recording on a fiber or thread that ended -----------------------------------

def _run_on_a_host_fiber(abi, body):
    """Run ``body()`` as the entry of a kina_fiber_create fiber, to its end."""
    ffi, lib = abi.ffi, abi.lib
    nothing = ffi.new("int32_t *")
    assert lib.kina_effect_id(b"tests.tape_abi.never_performed", nothing) == OK
    entry = ffi.callback("int64_t(void *)", lambda _arg: body() or 0)
    fiber, state = ffi.new("kina_fiber_t *"), ffi.new("int32_t *")
    assert lib.kina_fiber_create(ffi.cast("kina_fiber_fn", entry), ffi.NULL, nothing, 1, fiber) == OK
    assert lib.kina_resume_fiber(fiber[0], 0, state) == OK, abi.last_error()
    assert state[0] == 3, state[0]                               # KINA_FIBER_DONE
    assert lib.kina_fiber_destroy(fiber[0]) == OK


def test_a_tape_left_recording_on_an_ended_fiber_is_stale_and_freeable(abi):
    x = np.ones(4, np.float32)
    tapes = []

    def body():
        t = Tape(abi)
        assert t.call("watch", x, F32) == OK
        tapes.append(t)
    _run_on_a_host_fiber(abi, body)
    (t,) = tapes
    for call, args in (("watch", (x, F32)), ("constant", (x, F32)),
                       ("backward", (x, np.ones(4, np.float32))), ("grad", (x, np.zeros(4, np.float32)))):
        assert t.call(call, *args) == VALIDATION
        assert "stale" in abi.last_error() and "fiber" in abi.last_error()
    assert abi.lib.kina_tape_end(t.handle) == VALIDATION and "stale" in abi.last_error()
    t.free()
    assert abi.lib.kina_tape_free(t.handle) == VALIDATION and "stale" in abi.last_error()
    # and the root fiber records as before
    y = np.zeros_like(x)
    root = Tape(abi)
    assert root.call("watch", x, F32) == OK
    root.op("exp", y, x)
    root.free()


def test_tapes_left_recording_on_ended_fibers_release_their_memory(abi):
    """50 fibers each leave a tape watching 1 MiB: the copies are released when
    each fiber ends, before the handles are freed."""
    buf = np.ones(1 << 18, np.float32)
    tapes = []

    def body():
        t = Tape(abi)
        assert t.call("watch", buf, F32) == OK
        tapes.append(t)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            _run_on_a_host_fiber(abi, body)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 8 << 20, f"{grown / 1e6:.1f} MB still held by 50 tapes of ended fibers"
    for t in tapes:
        t.free()


def test_a_tape_ended_on_its_fiber_still_gives_gradients_after_the_fiber_ended(abi):
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y = np.zeros_like(x)
    tapes = []

    def body():
        t = Tape(abi)
        assert t.call("watch", x, F32) == OK
        t.op("exp", y, x)
        t.end()
        tapes.append(t)
    _run_on_a_host_fiber(abi, body)
    (t,) = tapes
    assert t.call("backward", y, ONES3) == OK, abi.last_error()
    np.testing.assert_allclose(_grad(t, x), np.exp(x.astype(np.float64)), rtol=1e-6)
    t.free()


def test_a_tape_left_recording_on_a_thread_that_exited_is_stale_and_freeable(abi):
    x = np.ones(4, np.float32)
    tapes = []
    th = threading.Thread(target=lambda: tapes.append(Tape(abi)))
    th.start()
    th.join()
    del th
    gc.collect()
    (t,) = tapes
    assert t.call("watch", x, F32) == VALIDATION and "stale" in abi.last_error()
    t.free()            # from another thread: the tape's own is gone


def test_an_outer_tape_differentiates_what_a_tape_left_on_an_ended_fiber_produced(abi):
    """outer watches x; a host fiber begins a tape nested in it, which computes
    y = exp(x) and is left recording when the fiber ends (stale).  outer
    recorded exp at its level: its backward from y gives exp(x) (it gave 0:
    y's entry held the stale tape's result, which outer took for a constant)."""
    x = np.array([0.5, -0.25, 1.0], np.float32)
    y = np.zeros_like(x)
    outer = Tape(abi)
    assert outer.call("watch", x, F32) == OK
    tapes = []

    def body():
        t = Tape(abi)
        assert t.call("watch", x, F32) == OK
        t.op("exp", y, x)
        tapes.append(t)
    _run_on_a_host_fiber(abi, body)
    outer.end()
    assert outer.call("backward", y, ONES3) == OK, abi.last_error()
    np.testing.assert_allclose(_grad(outer, x), np.exp(x.astype(np.float64)), rtol=1e-6)
    tapes[0].free()
    outer.free()
