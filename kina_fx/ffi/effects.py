"""The Python side of the effects C ABI (kina_push_handler, kina_resume_fiber, ...).

Like :mod:`kina_fx.ffi`, this module only translates: C handles become
:class:`~kina_fx.handlers.Stepper` fibers and :class:`~kina_fx.handlers.Handler`
entries of the one handler stack, C function pointers become clauses, and
exceptions become status codes (``kina_fx.ffi`` attaches every ``kina_py_*``
function here with the same error translation as the memref exports).

Values crossing the boundary are ``int64_t`` (pointers travel as integers):
Python ``int``/``bool`` and ``None`` (as 0) convert, anything else is a
:class:`~kina_fx.errors.KinaTypeError` (status 6).

Handles are opaque ``uint64_t``: ``kind << 56 | generation << 32 | slot + 1``.
A handle whose kind, slot or generation does not match a live object is a
:class:`~kina_fx.errors.ValidationError` (status 1), so stale, foreign and
freed handles can never reach freed memory.
"""
from __future__ import annotations

import threading
import weakref

from .. import fibers, handlers
from ..errors import KinaTypeError, Status, ValidationError, exception_for
from ..fibers import data_type
from ..handlers import Effect, Handler, Stepper

# The compiled implementation, or None (fibers.py chooses).  It has C fast
# paths for the effects exports (docs/abi.md, "Fast paths"); they read the
# classes and functions below marked as theirs.
_speedups = fibers.speedups

_ffi = None   # the embedded module's ffi, set by attach()

MAX_ARGS = 16                 # KINA_MAX_ARGS in kina_fx.h
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# What a kina_handler_fn returns besides a status in [1, LAST_STATUS] (kina_fx.h).
HANDLED, FORWARD, SUSPEND = 0, -1, -2
LAST_STATUS = max(Status)

# kina_fiber_state values (kina_fx.h KINA_FIBER_*), from Stepper.state.
FIBER_STATES = {Stepper.NEW: 0, Stepper.RUNNING: 1, Stepper.SUSPENDED: 2,
                Stepper.DONE: 3, Stepper.FAILED: 4, Stepper.CANCELLED: 5}

FIBER_KIND, HANDLER_KIND = 1, 2


class _SlotRef(weakref.ref):
    """A weak reference that knows its slot in a HandleTable."""

    __slots__ = ("slot",)


class HandleTable:
    """Generation-tagged handles for one kind of object.

    With ``weak=True`` the table holds weak references: a handle stays valid
    while something else keeps the object alive (a C handler, while it is on a
    handler stack) and turns stale when the object is collected (a handler left
    pushed on a fiber that ended), so forgotten handles cannot leak.
    """

    def __init__(self, kind: int, what: str, weak: bool = False):
        self.kind = kind
        self.what = what
        self.weak = weak
        self._slots = []          # [generation, object or weakref or None]
        self._free = []
        self._collected = []      # slots whose weakly held object died
        self._lock = threading.Lock()
        self._mirror = None       # the C fast paths' view of these handles (mirror_to)

    def mirror_to(self, mirror) -> None:
        """Keep ``mirror`` (``note(handle, obj)``, ``forget(handle)``,
        ``forget_all()``: the C fast paths' view) up to date with every live
        handle from now on; None stops."""
        with self._lock:
            self._mirror = mirror
            if mirror is not None:
                mirror.forget_all()
                for index, (generation, obj) in enumerate(self._slots):
                    if obj is not None:
                        mirror.note(self._handle(index, generation), obj)

    def add(self, obj) -> int:
        if self.weak:
            obj = _SlotRef(obj, self._on_collect)
        with self._lock:
            while self._collected:
                index = self._collected.pop()
                self._slots[index][1] = None
                self._free.append(index)
            if self._free:
                index = self._free.pop()
                slot = self._slots[index]
                slot[0] = (slot[0] % 0xFFFFFF) + 1
                slot[1] = obj
            else:
                index = len(self._slots)
                if index >= 0xFFFFFFFE:
                    raise ValidationError(f"too many live {self.what} handles")
                slot = [1, obj]
                self._slots.append(slot)
            if self.weak:
                obj.slot = index
            handle = self._handle(index, slot[0])
            if self._mirror is not None:
                self._mirror.note(handle, obj)
            return handle

    def _handle(self, index: int, generation: int) -> int:
        return (self.kind << 56) | (generation << 32) | (index + 1)

    def _on_collect(self, ref) -> None:
        # Runs wherever the collector runs: only record it (list.append is
        # atomic); add() reclaims the slot.
        if self._slots[ref.slot][1] is ref:
            self._collected.append(ref.slot)

    def _locate(self, handle: int):
        kind, generation, index = handle >> 56, (handle >> 32) & 0xFFFFFF, (handle & 0xFFFFFFFF) - 1
        if handle <= 0 or kind != self.kind:
            raise ValidationError(f"{handle:#x} is not a {self.what} handle")
        if not 0 <= index < len(self._slots):
            raise ValidationError(f"{handle:#x} is not a {self.what} handle (no such slot)")
        slot = self._slots[index]
        obj = slot[1]
        if self.weak and obj is not None:
            obj = obj()
        if slot[0] != generation or obj is None:
            raise ValidationError(f"{self.what} handle {handle:#x} is stale (freed, reused, "
                                  "or its fiber ended)")
        return index, slot, obj

    def get(self, handle: int):
        return self._locate(handle)[2]

    def remove(self, handle: int) -> None:
        with self._lock:
            index, slot, _ = self._locate(handle)
            if self._mirror is not None:
                self._mirror.forget(handle)
            slot[1] = None
            self._free.append(index)

    def live(self) -> int:
        return sum(1 for _, obj in self._slots
                   if obj is not None and (not self.weak or obj() is not None))


fiber_handles = HandleTable(FIBER_KIND, "fiber")
handler_handles = HandleTable(HANDLER_KIND, "handler", weak=True)
if _speedups is not None:       # the fast paths find host fibers by handle
    fiber_handles.mirror_to(_speedups.fiber_handle_mirror)


# ---- conversions ------------------------------------------------------------------

def to_int64(value, what: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int):
        raise KinaTypeError(f"{what} must be an int to cross the C ABI (int64_t), not {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise KinaTypeError(f"{what} {value} does not fit in int64_t")
    return int(value)


def _args_from_c(args, nargs) -> tuple:
    if nargs == 0:
        return ()
    if nargs < 0 or nargs > MAX_ARGS:
        raise ValidationError(f"nargs must be in [0, {MAX_ARGS}], got {nargs}")
    if not args:
        raise ValidationError("args is NULL but nargs > 0")
    return tuple(args[0:nargs])


def _effect(effect_id: int) -> Effect:
    return Effect.lookup(int(effect_id))


def _require(ptr, name: str) -> None:
    if not ptr:                     # a NULL cdata pointer is falsy
        raise ValidationError(f"{name} is NULL")


# ---- C handlers ---------------------------------------------------------------------

class CHandler(Handler, data_type("CHandlerData", ("thread", "__weakref__"), base=Handler.__base__)):
    """A handler pushed by ``kina_push_handler``: each of its effects calls the
    C function ``fn(ctx, effect, args, nargs, &out)`` in place.

    With the compiled implementation, its C core also records what it calls
    (``describe_c_handler``), so that ``kina_perform`` from C finds and calls
    it without the GIL; its effects are fixed when it is made.  (A class the
    C fast paths read.)"""

    __slots__ = ()

    def __init__(self, fn, ctx, effects):
        clauses = {e: CClause(fn, ctx, e) for e in effects}
        super().__init__(fun=clauses)
        self.thread = handlers.thread_token()
        if _speedups is not None and clauses:
            some = next(iter(clauses.values()))
            _speedups.describe_c_handler(self, some.fn_address, some.ctx_address,
                                         tuple(e.id for e in clauses))


class CClause(data_type("CClauseData", ("fn", "ctx", "effect", "effect_id", "fn_address",
                                        "ctx_address", "_buffers"))):
    """The ``fun`` clause of a :class:`CHandler` for one effect: calling it
    calls the C handler ``fn(ctx, effect.id, args, nargs, &out)`` in place.

    It is a class (not a closure) so that the compiled ``kina_perform`` fast
    path (``kina_fast_perform`` in kina_fx/_speedups_c/c_abi.c) can recognise
    it and call the C function itself, without entering Python: it reads
    ``fn_address``, ``ctx_address`` and ``effect_id``, and calls
    :meth:`_outcome` for what it does not answer in C (``KINA_SUSPEND``,
    error statuses), so both paths behave the same.
    """

    __slots__ = ()

    def __init__(self, fn, ctx, effect):
        self.fn = fn
        self.ctx = ctx
        self.effect = effect
        self.effect_id = effect.id
        self.fn_address = int(_ffi.cast("uintptr_t", fn))
        self.ctx_address = int(_ffi.cast("uintptr_t", ctx))
        self._buffers = []   # idle (args, out) pairs: one allocation per nesting level, not per call

    def __call__(self, *args):
        n = len(args)
        if n > MAX_ARGS:
            raise ValidationError(f"a C handler takes at most {MAX_ARGS} arguments, got {n}")
        buffers = self._buffers
        buf, out = buffers.pop() if buffers else (_ffi.new("int64_t[]", MAX_ARGS), _ffi.new("int64_t *"))
        try:
            for i, a in enumerate(args):
                buf[i] = a if type(a) is int and INT64_MIN <= a <= INT64_MAX else \
                    to_int64(a, f"argument {i} of {self.effect.name}")
            rc = self.fn(self.ctx, self.effect_id, buf, n, out)
            answer = out[0]
        finally:
            buffers.append((buf, out))
        if rc == HANDLED:
            return answer
        if rc == FORWARD:        # decline: perform goes on with the next handler out
            return handlers.FORWARD
        return self._outcome(rc, answer, args)

    def _outcome(self, rc, answer, args):
        """The clause's result for the C handler's return code ``rc``.  Called
        inside the clause (the skip marker still pushed), also by the fast path."""
        if rc == HANDLED:
            return answer
        if rc == FORWARD:
            return handlers.FORWARD
        if rc == SUSPEND:
            return handlers.suspend_to_host(self.effect, *args)
        if not 0 < rc <= LAST_STATUS:
            raise ValidationError(
                f"the C handler for {self.effect.name} returned {rc}, which is not a handler "
                f"result (KINA_HANDLED 0, KINA_FORWARD -1, KINA_SUSPEND -2 or a status 1-{LAST_STATUS})")
        raise exception_for(rc, f"the C handler for {self.effect.name} failed with status {rc}")

    def __repr__(self):
        return f"<CClause {self.effect.name} fn={self.fn_address:#x} ctx={self.ctx_address:#x}>"


# ---- the callbacks (KINA_EFFECT_EXPORTS of kina_effects.c) --------------------------

def kina_py_effect_id(name, out_id):
    _require(name, "name")
    _require(out_id, "out_id")
    raw = _ffi.string(name)
    if not raw:
        raise ValidationError("name is empty: an effect name has at least one character")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"name is not UTF-8: {exc}") from None
    out_id[0] = Effect(text).id
    return 0


def kina_py_perform(effect, args, nargs, out_value):
    if not out_value:
        raise ValidationError("out_value is NULL")
    eff = _effect(effect)
    value = handlers.perform(eff, *(args[0:nargs] if 0 < nargs <= MAX_ARGS and args
                                    else _args_from_c(args, nargs)))
    out_value[0] = value if type(value) is int and INT64_MIN <= value <= INT64_MAX else \
        to_int64(value, f"the answer to {eff.name}")
    return 0


def kina_py_push_handler(fn, ctx, effects, neffects, out_handler):
    _require(fn, "fn")
    _require(out_handler, "out_handler")
    if neffects <= 0 or not effects:
        raise ValidationError("kina_push_handler needs at least one effect id")
    handler = CHandler(fn, ctx, [_effect(effects[i]) for i in range(neffects)])
    handlers.push_handler(handler)
    out_handler[0] = handler_handles.add(handler)
    return 0


def kina_py_pop_handler(handle):
    handler = handler_handles.get(handle)
    handlers.check_owner(handler, "handler")
    handlers.pop_handler(handler)
    handler_handles.remove(handle)
    return 0


def kina_py_fiber_create(entry, arg, catch_effects, ncatch, out_fiber):
    _require(entry, "entry")
    _require(out_fiber, "out_fiber")
    if ncatch < 0 or (ncatch and not catch_effects):
        raise ValidationError("catch_effects is NULL but ncatch > 0")
    catch = None if ncatch == 0 else [_effect(catch_effects[i]) for i in range(ncatch)]
    stepper = Stepper(_run_entry, entry, arg, catch=catch)
    out_fiber[0] = fiber_handles.add(stepper)
    return 0


def _run_entry(entry, arg):
    return int(entry(arg))


def _fiber(handle) -> Stepper:
    stepper = fiber_handles.get(handle)
    handlers.check_owner(stepper)
    return stepper


def _report(stepper, out_state) -> int:
    if out_state:
        out_state[0] = FIBER_STATES[stepper.state]
    if stepper.state == Stepper.FAILED:
        raise stepper.error    # its status and message reach the host
    return 0


# A RUNNING fiber is one whose kina_resume_fiber has not returned: the caller
# itself, one of its resumers, or a fiber whose perform suspended a fiber
# further out (it runs on when that one is resumed).
_RUNNING = ("the fiber is running: its kina_resume_fiber has not returned (it is the caller "
            "or a resumer of the caller, or its perform suspended a fiber further out: "
            "resume that one)")


def kina_py_resume_fiber(handle, value, out_state):
    stepper = _fiber(handle)
    # A refused call leaves *out_state untouched, as every failed call leaves its outputs.
    if stepper.state == Stepper.RUNNING:
        raise ValidationError(f"{_RUNNING}; it cannot be resumed")
    if stepper.state not in (Stepper.NEW, Stepper.SUSPENDED):
        raise ValidationError(f"the fiber is {stepper.state}; only a new or suspended fiber can be resumed")
    try:
        stepper.step(int(value))
    finally:
        if out_state and stepper.state != Stepper.RUNNING:
            out_state[0] = FIBER_STATES[stepper.state]
    return _report(stepper, out_state)


def kina_py_get_perform_id(handle, out_effect):
    _require(out_effect, "out_effect")
    stepper = _fiber(handle)
    if stepper.state != Stepper.SUSPENDED:
        raise ValidationError(f"the fiber is {stepper.state}, not suspended in a perform")
    out_effect[0] = stepper.effect.id
    return 0


def kina_py_get_perform_args(handle, out_args, cap, out_nargs):
    _require(out_nargs, "out_nargs")
    stepper = _fiber(handle)
    if stepper.state != Stepper.SUSPENDED:
        raise ValidationError(f"the fiber is {stepper.state}, not suspended in a perform")
    args = [to_int64(a, f"argument {i} of {stepper.effect.name}") for i, a in enumerate(stepper.args)]
    out_nargs[0] = len(args)
    if len(args) > cap or (args and not out_args):
        raise ValidationError(f"the perform has {len(args)} arguments; out_args holds {cap}")
    for i, a in enumerate(args):
        out_args[i] = a
    return 0


def kina_py_fiber_state(handle, out_state):
    _require(out_state, "out_state")
    out_state[0] = FIBER_STATES[_fiber(handle).state]
    return 0


def kina_py_fiber_result(handle, out_value):
    _require(out_value, "out_value")
    stepper = _fiber(handle)
    if stepper.state != Stepper.DONE:
        raise ValidationError(f"the fiber is {stepper.state}; only a finished fiber has a result")
    out_value[0] = to_int64(stepper.result, "the fiber's result")
    return 0


def kina_py_cancel_fiber(handle, out_state):
    _require(out_state, "out_state")
    stepper = _fiber(handle)
    if stepper.state == Stepper.RUNNING:
        raise ValidationError(f"{_RUNNING}; it cannot be cancelled")
    if stepper.state in (Stepper.NEW, Stepper.SUSPENDED):
        stepper.cancel()
    out_state[0] = FIBER_STATES[stepper.state]
    return 0


def kina_py_fiber_destroy(handle):
    stepper = _fiber(handle)
    if stepper.state == Stepper.RUNNING:
        raise ValidationError(f"{_RUNNING}; destroy it after it suspends or finishes")
    if stepper.state in (Stepper.NEW, Stepper.SUSPENDED):
        stepper.cancel()
    fiber_handles.remove(handle)
    return 0


CALLBACKS = {name: fn for name, fn in globals().items() if name.startswith("kina_py_")}


# ---- the compiled kina_perform fast path (kina_fast_perform in _speedups_c/c_abi.c) ----------

_onerror = None  # kina_fx.ffi's error hook, set by attach()


def _answer_to_int64(effect, value) -> int:
    """kina_py_perform's conversion of a perform's answer, for the fast path."""
    return to_int64(value, f"the answer to {effect.name}")


def _report_error(exc) -> int:
    """The status of an exception raised in the fast path, with kina_last_error
    set: what cffi's onerror hook does for kina_py_perform."""
    return _onerror(type(exc), exc, exc.__traceback__)


def attach(ffi, onerror) -> dict:
    """Remember the embedded module's ffi and kina_fx.ffi's error hook
    (``onerror(exc_type, exc, traceback) -> status``, the one cffi calls for
    these callbacks); return the callbacks to attach."""
    global _ffi, _onerror
    _ffi = ffi
    _onerror = onerror
    return CALLBACKS
