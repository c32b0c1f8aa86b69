"""kina_perform's C fast path (kina_fast_perform in kina_fx/_speedups_c/c_abi.c).

A perform from C whose handlers are C handlers (kina_push_handler) is answered
without entering Python: the compiled search calls the handlers' function
pointers itself.  Every test runs twice on the compiled implementation, with
the fast path on ("fast") and off ("slow": the cffi ``extern "Python"`` path,
kina_py_perform), and expects the same outcome: value, status,
kina_last_error text, handler calls and handler stack; and once more on the
pure-Python one, which has only the slow path.  The handlers are cffi callbacks, so they can script FORWARD
chains, SUSPEND, error statuses and re-entrant calls.
"""
from __future__ import annotations


import pytest

from kina_fx import Effect, Handler, Stepper, fibers, perform
from kina_fx import ffi as kffi
from kina_fx.ffi import effects as ffi_effects
from kina_fx.errors import Status

pytestmark = pytest.mark.integration

HANDLER_T = "int32_t(void *, int32_t, const int64_t *, int32_t, int64_t *)"
HANDLED, FORWARD, SUSPEND = 0, -1, -2
SENTINEL = -12345

E = Effect("fast.e")
F = Effect("fast.f")
OTHER = Effect("fast.other")


# The pure-Python implementation has no fast paths to compare: only "slow" runs there.
@pytest.fixture(params=[pytest.param("fast", marks=pytest.mark.only_impl("compiled")), "slow"])
def mode(request, kina):
    if request.param == "fast":
        kffi.set_fast_paths(True)
        assert kffi.set_fast_paths(True)
        yield "fast"
    else:
        was = kffi.set_fast_paths(False)
        try:
            yield "slow"
        finally:
            kffi.set_fast_paths(was)


@pytest.fixture
def clause_calls(monkeypatch):
    """How often the Python clause (CClause.__call__) ran."""
    calls = []
    original = ffi_effects.CClause.__call__

    def counting(self, *args):
        calls.append(self.effect.name)
        return original(self, *args)
    monkeypatch.setattr(ffi_effects.CClause, "__call__", counting)
    return calls


class C:
    """Helpers over the library: C handlers from Python functions, kina_perform."""

    def __init__(self, kina):
        self.ffi, self.lib = kina
        self.keep = []

    def handler(self, fn):
        """``fn(effect, args) -> (rc, out)`` as a kina_handler_fn."""
        def c_fn(ctx, effect, args, nargs, out):
            rc, value = fn(effect, [args[i] for i in range(nargs)])
            if value is not None:
                out[0] = value
            return rc
        cb = self.ffi.callback(HANDLER_T, c_fn)
        self.keep.append(cb)
        return cb

    def push(self, fn, *effects):
        h = self.ffi.new("kina_handler_t *")
        ids = self.ffi.new("int32_t[]", [e.id for e in effects])
        assert self.lib.kina_push_handler(self.handler(fn), self.ffi.NULL, ids, len(effects), h) == 0
        return h[0]

    def pop(self, handle):
        assert self.lib.kina_pop_handler(handle) == 0

    def perform(self, effect, *args, nargs=None, out=True):
        out_p = self.ffi.new("int64_t *", SENTINEL) if out else self.ffi.NULL
        args_p = self.ffi.new("int64_t[]", list(args) or [0])
        status = self.lib.kina_perform(effect if isinstance(effect, int) else effect.id, args_p,
                                       len(args) if nargs is None else nargs, out_p)
        value = out_p[0] if out else None
        return status, value

    def last_error(self):
        return self.ffi.string(self.lib.kina_last_error()).decode()


@pytest.fixture
def c(kina):
    helper = C(kina)
    yield helper
    assert fibers.current().stack == []


# --- answered in place -------------------------------------------------------------------

def test_handled_in_place(mode, c, clause_calls):
    seen = []

    def answer(effect, args):
        seen.append((effect, args))
        return HANDLED, sum(args) + 1
    h = c.push(answer, E)
    try:
        assert c.perform(E, 2, 3) == (0, 6)
        assert c.perform(E) == (0, 1)
        assert c.perform(E, *range(16)) == (0, 121)
    finally:
        c.pop(h)
    assert seen == [(E.id, [2, 3]), (E.id, []), (E.id, list(range(16)))]
    assert clause_calls == ([] if mode == "fast" else ["fast.e"] * 3)


def test_forward_chain_between_c_handlers(mode, c, clause_calls):
    log = []

    def forwarder(name):
        def fn(effect, args):
            log.append(name)
            return FORWARD, None
        return fn
    outer = c.push(lambda effect, args: (log.append("outer"), (HANDLED, 42))[1], E)
    middle = c.push(forwarder("middle"), E, F)
    inner = c.push(forwarder("inner"), E)
    try:
        assert c.perform(E, 1) == (0, 42)
        assert log == ["inner", "middle", "outer"]
    finally:
        c.pop(inner)
        c.pop(middle)
        c.pop(outer)
    assert clause_calls == ([] if mode == "fast" else ["fast.e"] * 3)


def test_forward_to_python_fun_clause(mode, c):
    log = []
    with Handler(fun={E: lambda *args: log.append(("python", args)) or 70 + len(args)}):
        h = c.push(lambda effect, args: (log.append("c"), (FORWARD, None))[1], E)
        try:
            assert c.perform(E, 5, 6) == (0, 72)
        finally:
            c.pop(h)
    assert log == ["c", ("python", (5, 6))]


def test_forward_to_nothing_is_unhandled(mode, c):
    h = c.push(lambda effect, args: (FORWARD, None), E)
    try:
        assert c.perform(E, 9) == (Status.UNHANDLED, SENTINEL)
        assert c.last_error() == "Unhandled: unhandled effect Effect('fast.e') with payload (9,)"
    finally:
        c.pop(h)


def test_forward_to_effect_default(mode, c):
    d = Effect("fast.defaulted")
    d.default = lambda *args: 1000 + sum(args)
    h = c.push(lambda effect, args: (FORWARD, None), d)
    try:
        assert c.perform(d, 1, 2) == (0, 1003)
    finally:
        c.pop(h)


def test_forward_past_python_entries_without_fun_clause(mode, c):
    with Handler(fun={F: lambda: 1}):
        outer = c.push(lambda effect, args: (HANDLED, 5), E)
        with Handler(fun={OTHER: lambda: 2}):
            inner = c.push(lambda effect, args: (FORWARD, None), E)
            try:
                assert c.perform(E) == (0, 5)
            finally:
                c.pop(inner)
        c.pop(outer)


def test_python_clause_first_takes_the_python_path(mode, c, clause_calls):
    h = c.push(lambda effect, args: (HANDLED, 1), E)
    try:
        with Handler(fun={E: lambda: 2}):
            assert c.perform(E) == (0, 2)
    finally:
        c.pop(h)
    assert clause_calls == []


# --- answers and errors converted as kina_py_perform converts them --------------------------

@pytest.mark.parametrize("answer, status, message", [
    ("text", Status.TYPE, "KinaTypeError: the answer to fast.e must be an int to cross the C ABI (int64_t), not str"),
    (1 << 64, Status.TYPE, f"KinaTypeError: the answer to fast.e {1 << 64} does not fit in int64_t"),
    (None, Status.SUCCESS, None),
    (True, Status.SUCCESS, None),
])
def test_answers_after_forward_are_converted(mode, c, answer, status, message):
    with Handler(fun={E: lambda: answer}):
        h = c.push(lambda effect, args: (FORWARD, None), E)
        try:
            got = c.perform(E)
        finally:
            c.pop(h)
    if message is None:
        assert got == (0, int(answer or 0))
    else:
        assert got == (status, SENTINEL)
        assert c.last_error() == message


def test_exception_after_forward(mode, c):
    def boom():
        raise ValueError("bad value")
    with Handler(fun={E: boom}):
        h = c.push(lambda effect, args: (FORWARD, None), E)
        try:
            assert c.perform(E) == (Status.VALIDATION, SENTINEL)
            assert c.last_error() == "ValueError: bad value"
        finally:
            c.pop(h)


@pytest.mark.parametrize("rc, status, text", [
    (Status.TYPE, Status.TYPE, "KinaTypeError: the C handler for fast.e failed with status 6"),
    (Status.RESOURCE, Status.RESOURCE, "ResourceError: the C handler for fast.e failed with status 2"),
    (Status.UNHANDLED, Status.UNHANDLED, "Unhandled: the C handler for fast.e failed with status 8"),
    (-3, Status.VALIDATION, "ValidationError: the C handler for fast.e returned -3, which is not a "
                            "handler result (KINA_HANDLED 0, KINA_FORWARD -1, KINA_SUSPEND -2 or a status 1-8)"),
    (9, Status.VALIDATION, "ValidationError: the C handler for fast.e returned 9, which is not a "
                           "handler result (KINA_HANDLED 0, KINA_FORWARD -1, KINA_SUSPEND -2 or a status 1-8)"),
])
def test_error_status_of_a_c_handler(mode, c, rc, status, text):
    calls = []
    h = c.push(lambda effect, args: (calls.append(1), (int(rc), 77))[1], E)
    try:
        assert c.perform(E, 1) == (status, SENTINEL)
        assert c.last_error() == text
    finally:
        c.pop(h)
    assert calls == [1]          # called once: the slow path does not run it again


def test_error_status_after_forward(mode, c):
    outer = c.push(lambda effect, args: (int(Status.TYPE), None), E)
    inner = c.push(lambda effect, args: (FORWARD, None), E)
    try:
        assert c.perform(E) == (Status.TYPE, SENTINEL)
        assert c.last_error() == "KinaTypeError: the C handler for fast.e failed with status 6"
    finally:
        c.pop(inner)
        c.pop(outer)


def test_invalid_arguments_report_as_before(mode, c):
    h = c.push(lambda effect, args: (HANDLED, 1), E)
    try:
        assert c.perform(E, out=False) == (Status.VALIDATION, None)
        assert c.last_error() == "ValidationError: out_value is NULL"
        assert c.perform(E, *range(17)) == (Status.VALIDATION, SENTINEL)
        assert c.last_error() == "ValidationError: nargs must be in [0, 16], got 17"
        assert c.perform(E, 1, nargs=-1) == (Status.VALIDATION, SENTINEL)
        assert c.last_error() == "ValidationError: nargs must be in [0, 16], got -1"
        assert c.perform(10 ** 6) == (Status.VALIDATION, SENTINEL)
        assert c.last_error() == "ValidationError: no effect with id or name 1000000"
        assert c.perform(0) == (Status.VALIDATION, SENTINEL)
        assert c.last_error() == "ValidationError: no effect with id or name 0"
        status = c.lib.kina_perform(E.id, c.ffi.NULL, 2, c.ffi.new("int64_t *"))
        assert status == Status.VALIDATION
        assert c.last_error() == "ValidationError: args is NULL but nargs > 0"
        assert c.lib.kina_perform(E.id, c.ffi.NULL, 0, c.ffi.new("int64_t *")) == 0
    finally:
        c.pop(h)


# --- suspending ---------------------------------------------------------------------------

def test_suspend_from_a_c_handler(mode, c):
    results = []

    def body():
        h = c.push(lambda effect, args: (SUSPEND, None), E)
        try:
            results.append(c.perform(E, 3, 4))
            results.append(c.perform(E, 5))
            results.append(c.perform(E))
            results.append(c.last_error())
        finally:
            c.pop(h)
        return 1
    s = Stepper(body, catch=[OTHER])
    assert s.step() == "suspended" and (s.effect, s.args) == (E, (3, 4))
    assert s.step(99) == "suspended" and (s.effect, s.args) == (E, (5,))
    assert s.step("not an int") == "suspended" and (s.effect, s.args) == (E, ())
    assert s.throw(ValueError("thrown")) == "done"
    assert results == [(0, 99),
                       (Status.TYPE, SENTINEL),
                       (Status.VALIDATION, SENTINEL),
                       "ValueError: thrown"]


def test_suspend_after_forward(mode, c):
    log = []

    def body():
        outer = c.push(lambda effect, args: (log.append("outer"), (SUSPEND, None))[1], E)
        inner = c.push(lambda effect, args: (log.append("inner"), (FORWARD, None))[1], E)
        try:
            return c.perform(E, 8)
        finally:
            c.pop(inner)
            c.pop(outer)
    s = Stepper(body, catch=[OTHER])
    assert s.step() == "suspended" and (s.effect, s.args) == (E, (8,))
    assert s.step(12) == "done" and s.result == (0, 12)
    assert log == ["inner", "outer"]


def test_suspend_reaches_the_fiber_outside_the_handler(mode, c):
    """A handler on an outer fiber's stack suspends that fiber, not the inner
    fiber that performed: the skip marker stays while CClause._outcome runs."""
    inner_states = []

    def inner_body():
        return c.perform(E, 1)

    def outer_body():
        h = c.push(lambda effect, args: (SUSPEND, None), E)
        try:
            inner = Stepper(inner_body, catch=[OTHER])
            inner_states.append(inner.step())
            return inner.result
        finally:
            c.pop(h)
    outer = Stepper(outer_body, catch=[OTHER])
    assert outer.step() == "suspended" and (outer.effect, outer.args) == (E, (1,))
    assert outer.step(31) == "done"
    assert inner_states == ["done"] and outer.result == (0, 31)


# --- handlers that call back into the library ----------------------------------------------

def test_handler_performs_again(mode, c):
    """A handler runs outside itself: its own kina_perform reaches the handlers further out."""
    with Handler(fun={F: lambda x: x * 10}):
        outer = c.push(lambda effect, args: (HANDLED, 100 + args[0]), E)

        def inner_fn(effect, args):
            status, value = c.perform(E, args[0] + 1)
            status_f, value_f = c.perform(F, 4)
            return HANDLED, value + value_f + status + status_f
        inner = c.push(inner_fn, E)
        try:
            assert c.perform(E, 1) == (0, 102 + 40)
        finally:
            c.pop(inner)
            c.pop(outer)


def test_handler_performs_the_effect_it_handles_with_nothing_outside(mode, c):
    def fn(effect, args):
        status, _ = c.perform(E)
        return HANDLED, status
    h = c.push(fn, E)
    try:
        assert c.perform(E) == (0, Status.UNHANDLED)
    finally:
        c.pop(h)


def test_handler_pushes_a_handler_and_leaves_it(mode, c):
    pushed = []

    def fn(effect, args):
        pushed.append(c.push(lambda effect, args: (HANDLED, 55), F))
        return HANDLED, 1
    h = c.push(fn, E)
    assert c.perform(E) == (0, 1)
    stack = fibers.current().stack
    assert len(stack) == 2 and all(type(entry) is ffi_effects.CHandler for entry in stack)
    assert c.perform(F) == (0, 55)
    c.pop(pushed[0])
    c.pop(h)


def test_handler_pops_itself_is_rejected(mode, c):
    handle = []

    def fn(effect, args):
        status = c.lib.kina_pop_handler(handle[0])
        return HANDLED, status
    handle.append(c.push(fn, E))
    try:
        assert c.perform(E) == (0, Status.VALIDATION)
    finally:
        c.pop(handle[0])


def test_many_forwarding_handlers(mode, c):
    handles = [c.push(lambda effect, args: (HANDLED, args[0] * 2), E)]
    handles += [c.push(lambda effect, args: (FORWARD, None), E) for _ in range(300)]
    try:
        assert c.perform(E, 21) == (0, 42)
    finally:
        for h in reversed(handles):
            c.pop(h)


def test_python_perform_still_uses_the_python_clause(mode, c, clause_calls):
    h = c.push(lambda effect, args: (HANDLED, args[0] + 1), E)
    try:
        assert perform(E, 1) == 2
    finally:
        c.pop(h)
    assert clause_calls == ["fast.e"]


def test_handler_pushes_itself_and_performs_again(mode, c):
    """A handler left pushed above the skip marker is found first: recursion
    through kina_perform, 60 levels deep."""
    levels = []

    def fn(effect, args):
        level = args[0]
        levels.append(level)
        if level == 60:
            return HANDLED, 0
        h = c.push(fn, E)
        try:
            status, value = c.perform(E, level + 1)
        finally:
            c.pop(h)
        return (status, None) if status else (HANDLED, value + 1)
    h = c.push(fn, E)
    try:
        assert c.perform(E, 0) == (0, 60)
    finally:
        c.pop(h)
    assert levels == list(range(61))


def test_deep_reentry_through_nested_handlers(mode, c):
    """Each handler performs again (reaching the next one out) 60 deep (the
    handlers are Python callbacks: their frames count towards the recursion limit)."""
    handles = [c.push(lambda effect, args: (HANDLED, 0), E)]

    def fn(effect, args):
        status, value = c.perform(E)
        return (status, None) if status else (HANDLED, value + 1)
    handles += [c.push(fn, E) for _ in range(60)]
    try:
        assert c.perform(E) == (0, 60)
    finally:
        for h in reversed(handles):
            c.pop(h)


# --- host fibers (kina_resume_fiber and the getters: _speedups_c/c_fibers.c) -------------------

FIBER_NEW, FIBER_RUNNING, FIBER_SUSPENDED, FIBER_DONE, FIBER_FAILED, FIBER_CANCELLED = range(6)


@pytest.fixture
def steps(monkeypatch):
    """How often the Python Stepper.step ran (the fast path steps in C)."""
    calls = []
    original = Stepper.step

    def counting(self, value=None):
        calls.append(value)
        return original(self, value)
    monkeypatch.setattr(Stepper, "step", counting)
    return calls


class Host:
    """A C host's calls on fibers whose entry functions are Python callbacks."""

    def __init__(self, c):
        self.c, self.ffi, self.lib = c, c.ffi, c.lib
        self.keep = []

    def create(self, body, catch=(E,)):
        def entry(arg):
            return body()
        cb = self.ffi.callback("int64_t(void *)", entry)
        self.keep.append(cb)
        f = self.ffi.new("kina_fiber_t *")
        ids = self.ffi.new("int32_t[]", [e.id for e in catch] or [0])
        assert self.lib.kina_fiber_create(cb, self.ffi.NULL, ids, len(catch), f) == 0
        return f[0]

    def resume(self, f, value=0):
        state = self.ffi.new("int32_t *", -1)
        return self.lib.kina_resume_fiber(f, value, state), state[0]

    def perform_id(self, f):
        out = self.ffi.new("int32_t *", -1)
        return self.lib.kina_get_perform_id(f, out), out[0]

    def perform_args(self, f, cap=16):
        out = self.ffi.new("int64_t[]", max(cap, 1))
        n = self.ffi.new("int32_t *", -1)
        status = self.lib.kina_get_perform_args(f, out, cap, n)
        return status, n[0], [out[i] for i in range(min(max(n[0], 0), cap))]

    def state(self, f):
        out = self.ffi.new("int32_t *", -1)
        return self.lib.kina_fiber_state(f, out), out[0]

    def result(self, f):
        out = self.ffi.new("int64_t *", SENTINEL)
        return self.lib.kina_fiber_result(f, out), out[0]


@pytest.fixture
def host(c):
    return Host(c)


def test_generator_fiber(mode, host, steps):
    def body():
        total = 0
        for i in range(3):
            status, value = host.c.perform(E, i, 10 * i)
            assert status == 0
            total += value
        return total
    f = host.create(body)
    assert host.state(f) == (0, FIBER_NEW)
    assert host.resume(f) == (0, FIBER_SUSPENDED)
    for i in range(3):
        assert host.state(f) == (0, FIBER_SUSPENDED)
        assert host.perform_id(f) == (0, E.id)
        assert host.perform_args(f) == (0, 2, [i, 10 * i])
        assert host.perform_args(f, cap=2) == (0, 2, [i, 10 * i])
        assert host.resume(f, 100 + i) == (0, FIBER_SUSPENDED if i < 2 else FIBER_DONE)
    assert host.result(f) == (0, 303)
    assert host.state(f) == (0, FIBER_DONE)
    assert host.perform_id(f)[0] == Status.VALIDATION
    assert host.c.last_error() == "ValidationError: the fiber is done, not suspended in a perform"
    assert host.lib.kina_fiber_destroy(f) == 0
    assert host.state(f)[0] == Status.VALIDATION and "stale" in host.c.last_error()
    # stepped in C, or by the Python Stepper
    assert len(steps) == (0 if mode == "fast" else 4)


def test_fiber_getters_report_as_before(mode, host):
    f = host.create(lambda: host.c.perform(E, 1, 2, 3)[1])
    assert host.resume(f) == (0, FIBER_SUSPENDED)
    assert host.perform_args(f, cap=2) == (Status.VALIDATION, 3, [0, 0])   # nothing written
    assert host.c.last_error() == "ValidationError: the perform has 3 arguments; out_args holds 2"
    assert host.lib.kina_get_perform_id(f, host.ffi.NULL) == Status.VALIDATION
    assert host.c.last_error() == "ValidationError: out_effect is NULL"
    assert host.lib.kina_fiber_state(f, host.ffi.NULL) == Status.VALIDATION
    assert host.result(f)[0] == Status.VALIDATION
    assert host.c.last_error() == "ValidationError: the fiber is suspended; only a finished fiber has a result"
    status = host.lib.kina_resume_fiber(f, 7, host.ffi.NULL)          # out_state may be NULL
    assert status == 0 and host.state(f) == (0, FIBER_DONE) and host.result(f) == (0, 7)
    assert host.resume(f) == (Status.VALIDATION, -1)     # refused: *out_state untouched (docs/abi.md)
    assert host.c.last_error() == "ValidationError: the fiber is done; only a new or suspended fiber can be resumed"
    assert host.lib.kina_fiber_destroy(f) == 0


def test_python_perform_in_a_host_fiber(mode, host):
    # Arguments that are not int64: kina_get_perform_args reports them.
    def body():
        return perform(E, "text", 1)
    f = host.create(body)
    assert host.resume(f) == (0, FIBER_SUSPENDED)
    assert host.perform_id(f) == (0, E.id)
    assert host.perform_args(f)[0] == Status.TYPE
    assert host.c.last_error() == ("KinaTypeError: argument 0 of fast.e must be an int to cross the "
                                   "C ABI (int64_t), not str")
    assert host.resume(f, -5) == (0, FIBER_DONE) and host.result(f) == (0, -5)
    assert host.lib.kina_fiber_destroy(f) == 0


def test_cancelled_host_fiber(mode, host):
    seen = []
    g = host.create(lambda: seen.append(host.c.perform(E, 5)) or 0)
    assert host.resume(g) == (0, FIBER_SUSPENDED)
    state = host.ffi.new("int32_t *")
    assert host.lib.kina_cancel_fiber(g, state) == 0 and state[0] == FIBER_CANCELLED
    assert seen == [(Status.CANCELLED, SENTINEL)]
    assert host.c.last_error() == "Cancelled: the fiber was cancelled"
    assert host.state(g) == (0, FIBER_CANCELLED)
    assert host.resume(g) == (Status.VALIDATION, -1)     # refused: *out_state untouched (docs/abi.md)
    assert host.c.last_error() == ("ValidationError: the fiber is cancelled; only a new or suspended "
                                   "fiber can be resumed")
    assert host.perform_id(g)[0] == Status.VALIDATION
    assert host.lib.kina_fiber_destroy(g) == 0


def test_host_fiber_suspended_by_a_c_handler_from_python(mode, host):
    # A C handler returning KINA_SUSPEND: the resumer sees the original effect.
    def body():
        h = host.c.push(lambda effect, args: (SUSPEND, None), E)
        try:
            return host.c.perform(E, 41)[1]
        finally:
            host.c.pop(h)
    f = host.create(body, catch=(OTHER,))
    assert host.resume(f) == (0, FIBER_SUSPENDED)
    assert host.perform_id(f) == (0, E.id) and host.perform_args(f) == (0, 1, [41])
    assert host.resume(f, 42) == (0, FIBER_DONE) and host.result(f) == (0, 42)
    assert host.lib.kina_fiber_destroy(f) == 0


def test_host_fiber_handles_of_another_thread(mode, host):
    import threading
    f = host.create(lambda: host.c.perform(E)[1])
    assert host.resume(f) == (0, FIBER_SUSPENDED)
    got = []

    def other():
        got.append((host.resume(f), host.c.last_error()))
        got.append((host.perform_id(f), host.c.last_error()))
        got.append((host.state(f), host.c.last_error()))
    t = threading.Thread(target=other)
    t.start()
    t.join()
    for (status, _), error in got:
        assert status == Status.VALIDATION and "another OS thread" in error
    assert host.resume(f, 3) == (0, FIBER_DONE) and host.result(f) == (0, 3)
    assert host.lib.kina_fiber_destroy(f) == 0


# --- C handlers called without the GIL (_speedups_c/nogil.c): the skip marker --------------
#
# A C handler found by kina_perform's search without the GIL runs under a
# marker that is a C record until Python code of kina_fx runs on the thread;
# then it is a real _Skip, where it would have been.  These handlers are
# Python callbacks, so they can look at the stack and call Python directly.

def test_a_c_handler_sees_its_marker_once_python_runs(mode, c):
    seen = []

    def fn(effect, args):
        stack = fibers.current().stack
        seen.append(len(stack))                  # no kina call yet: maybe a record only
        assert perform(F) == "outer f"           # Python perform: the marker is in place
        seen.append([type(e).__name__ for e in stack])
        return HANDLED, 5
    with Handler(fun={F: lambda: "outer f"}):
        h = c.push(fn, E)
        try:
            assert c.perform(E) == (0, 5)
            assert c.perform(E) == (0, 5)
        finally:
            c.pop(h)
        assert len(fibers.current().stack) == 1
    assert seen[1] == ["Handler", "CHandler", "_Skip"] and seen[3] == seen[1]


def test_python_perform_in_a_c_handler_skips_that_handler(mode, c):
    def fn(effect, args):
        try:
            perform(E)
        except Exception as exc:             # nothing outside: Unhandled, not re-entry
            return HANDLED, 100 + len(type(exc).__name__)
        return HANDLED, 0
    h = c.push(fn, E)
    try:
        assert c.perform(E) == (0, 100 + len("Unhandled"))
    finally:
        c.pop(h)


def test_a_python_handler_pushed_by_a_c_handler_comes_first(mode, c):
    # Pushed (without a kina call) above the handler's marker, then a kina_perform.
    def fn(effect, args):
        with Handler(fun={F: lambda: 7}):
            status, value = c.perform(F)
        return HANDLED, value * 10 + status
    outer = c.push(lambda effect, args: (HANDLED, 1), F)
    h = c.push(fn, E)
    try:
        assert c.perform(E) == (0, 70)
    finally:
        c.pop(h)
        c.pop(outer)


def test_a_c_handler_that_switches_fibers(mode, c):
    # The handler runs a Python handler with a control clause: its marker is
    # put in place before the switch, and the nested performs (from C, in the
    # other fiber) search without the GIL again.
    G = Effect("fast.switching")
    inner = c.push(lambda effect, args: (HANDLED, args[0] + 1), F)

    def body():
        return c.perform(F, perform(G, 2))[1]

    def fn(effect, args):
        return HANDLED, Handler(on={G: lambda k, x: k.resume(x * 10)}).run(body)
    h = c.push(fn, E)
    try:
        for _ in range(3):
            assert c.perform(E) == (0, 21)
    finally:
        c.pop(h)
        c.pop(inner)


def test_a_c_handler_of_many_effects(mode, c):
    # More effects than the search without the GIL keeps (8): found with it.
    many = [Effect(f"fast.many{i}") for i in range(12)] + [E]
    h = c.push(lambda effect, args: (HANDLED, effect), *many)
    try:
        assert c.perform(E) == (0, E.id)
        assert c.perform(many[3]) == (0, many[3].id)
    finally:
        c.pop(h)


def test_forwarding_chain_with_suspend_at_the_end(mode, c):
    log = []

    def body():
        outer = c.push(lambda effect, args: (log.append("outer"), (SUSPEND, None))[1], E)
        fwd = [c.push(lambda effect, args: (log.append("fwd"), (FORWARD, None))[1], E) for _ in range(5)]
        try:
            return c.perform(E, 3)
        finally:
            for h in reversed(fwd):
                c.pop(h)
            c.pop(outer)
    s = Stepper(body, catch=[OTHER])
    assert s.step() == "suspended" and (s.effect, s.args) == (E, (3,))
    assert s.step(9) == "done" and s.result == (0, 9)
    assert log == ["fwd"] * 5 + ["outer"]


def test_markers_of_c_handlers_on_several_threads(mode, c):
    # Each thread's C handler (a Python callback) puts its marker on the stack
    # (Python perform) while the others do the same: every marker comes off
    # its own stack.
    import threading
    errors, results = [], []
    barrier = threading.Barrier(4)

    def worker(tag):
        try:
            with Handler(fun={F: lambda: tag}):
                h = c.push(lambda effect, args: (HANDLED, perform(F) + args[0]), E)
                try:
                    barrier.wait()
                    for i in range(300):
                        assert c.perform(E, i) == (0, tag + i)
                finally:
                    c.pop(h)
                results.append(len(fibers.current().stack))
        except BaseException as exc:         # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(1000 * k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [1, 1, 1, 1]
