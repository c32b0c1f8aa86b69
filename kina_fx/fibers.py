"""Stackful one-shot fibers on greenlets, and the per-fiber handler stack.

A :class:`Fiber` is the unit the effects runtime suspends and resumes.  It runs
one job (a function call) on a greenlet and owns the *handler stack* of that
job: the list of in-place handlers (``with Handler(fun=...)``, C handlers from
the C ABI) pushed while it runs, plus the one control handler it was started
under (``Fiber.handler``).  Fibers form a chain through ``Fiber.parent``: the
fiber that is waiting for this one.  Walking ``current()`` -> ``parent`` ->
... visits every handler in scope, innermost first; that walk is the only
definition of "the handler stack" in kina_fx (Python and C share it).

How this module keeps its promises (docs/effects.md has the semantics):

* **Bounded C stack.**  A greenlet's C stack starts wherever it is first
  switched into.  New fibers are therefore started by a per-thread
  *trampoline* greenlet that sits near the top of the stack, never on top of
  the caller's stack, so nesting 100,000 handlers does not grow the C stack.
* **Pooling.**  Creating a greenlet costs two memory system calls; finished
  fibers return their greenlet to a per-thread pool of idle *workers*.
* **Unwinding dropped chains.**  When a suspended :class:`Chain` is collected
  without being resumed, :func:`unwind` throws :class:`Unwind` into each of
  its fibers, innermost first, so ``finally`` blocks and ``with`` exits run;
  the workers then return to the pool.  Messages between fibers travel through
  a per-thread mailbox rather than as ``switch()`` arguments, so a suspended
  frame never holds the continuation that refers to it.
* **Threads.**  Every OS thread has its own root fiber, trampoline, pool and
  mailbox; a fiber can only be resumed from the thread that created it.
"""
from __future__ import annotations

import contextvars
import itertools
import os
import sys
import threading
import types
import warnings
import weakref
from typing import Any, Callable, Optional, Tuple

from greenlet import GreenletExit, getcurrent, greenlet

from .errors import InternalError, Status, WrongThread

__all__ = ["Fiber", "Chain", "Unwind", "current", "new_fiber", "switch_into", "switch_into_step",
           "post", "suspend", "unwind", "check_owner", "thread_token", "data_type", "speedups",
           "RETURNED", "RAISED"]

# Kinds of message a fiber sends to the fiber that resumed it when it stops.
# The effects layer adds its own kind (an effect was performed); this module
# only produces these two, when a fiber's job ends.
RETURNED = "returned"
RAISED = "raised"

# Idle workers kept per thread.  More would pin memory after a deep nesting
# unwinds (each idle greenlet keeps a small saved stack); fewer would cost
# greenlet creations in programs that keep many handlers alive side by side.
POOL_LIMIT = 256


# --- the implementation in use ---------------------------------------------------
#
# kina_fx._speedups (kina_fx/_speedups_c/) is the compiled implementation of
# the hot paths of this module, handlers.py and ffi/effects.py, as _json is of
# json; the Python code is the reference.  It is chosen here, once, for the
# whole process: each of those modules takes the compiled function or class
# where ``speedups`` is not None.  KINA_FX_PURE_PYTHON=1 selects the
# pure-Python reference (so does a build without a C compiler).
#
# The fields of the protocol's types (Fiber, ThreadState, Chain here; Handler,
# Continuation, Stepper... in handlers.py) are then owned by the C core: its
# C code reads and writes them as struct fields, never a Python class's
# layout.  The classes below derive from data_type(...) and add methods only,
# so the same Python code runs on either layout.


def _load_speedups():
    if os.environ.get("KINA_FX_PURE_PYTHON") == "1":
        return None
    try:
        from . import _speedups
    except ImportError:              # not built (no compiler at install time)
        return None
    return _speedups


#: kina_fx._speedups when the compiled implementation is in use, else None.
speedups = _load_speedups()


def data_type(name: str, fields: tuple, base: type = object) -> type:
    """The fields of one of the protocol's types, as a class to derive from.

    The C core's type ``name`` when kina_fx._speedups is in use (and declares
    exactly these fields, ``"__weakref__"`` meaning weak references), else a
    plain class with ``__slots__ = fields`` deriving from ``base``.
    """
    if speedups is not None:
        core = getattr(speedups, name, None)
        if core is not None and _core_fields(core) == (set(fields), "__weakref__" in fields) \
                and issubclass(core, base):
            return core
        warnings.warn(f"kina_fx._speedups.{name} does not fit this kina_fx (a stale build?); "
                      "using a Python class", RuntimeWarning, stacklevel=2)
    return type(name, (base,), {"__slots__": fields, "__module__": __name__})


def _core_fields(core) -> tuple:
    names = {n for n, v in vars(core).items()
             if isinstance(v, (types.MemberDescriptorType, types.GetSetDescriptorType))
             and n not in ("__weakref__", "__dict__")}
    weak = core.__weakrefoffset__ != core.__base__.__weakrefoffset__
    return (names | {"__weakref__"} if weak else names), weak


class Unwind(GreenletExit):
    """Thrown into the fibers of a dropped continuation to run their cleanup.

    A ``BaseException`` (``except Exception`` does not stop it); reaching C
    code through a kina_* call it becomes KINA_STATUS_CANCELLED: unwind and return.
    """

    status = Status.CANCELLED


class Fiber(data_type("FiberData", ("stack", "handler", "shallow", "parent", "thread", "job", "glet",
                                   "unwinder", "__weakref__"))):
    """One job on a greenlet, with its handler stack.

    Attributes:
        stack: in-place handler entries pushed on this fiber, innermost last.
        handler: the control handler this fiber runs under (None for a root
            fiber, or for a shallow fiber between two ``resume_with`` calls).
        shallow: True when ``handler`` was installed by ``resume_with``.
        parent: the fiber waiting for this one while it runs; None while the
            fiber is suspended (or for a thread's root fiber).
        thread: the owning thread's serial number (``thread_token()``; unlike
            ``threading.get_ident()`` it is never reused by a later thread).
        job: ``(fn, args)`` until the fiber starts, then None.
        glet: the worker greenlet running the job (None before and after).
        unwinder: while the fiber is being unwound, the fiber to return to.
    """

    __slots__ = ()

    def __init__(self, job: Optional[Tuple[Callable[..., Any], Optional[Tuple[Any, ...]]]] = None,
                 handler: Any = None, shallow: bool = False, thread: Optional[int] = None) -> None:
        self.stack = []
        self.handler = handler
        self.shallow = shallow
        self.parent = None
        self.thread = local.state.serial if thread is None else thread
        self.job = job
        self.glet = None
        self.unwinder = None

    def __repr__(self) -> str:
        state = ("running" if self is local.state.current else
                 "new" if self.job is not None else
                 "finished" if self.glet is None else "suspended")
        return f"<Fiber {state} handler={self.handler!r} at {id(self):#x}>"


class Chain(data_type("ChainData", ("top", "base"))):
    """A suspended chain of fibers ``top -> ... -> base``, resumable once."""

    __slots__ = ()

    def __init__(self, top: Optional[Fiber], base: Optional[Fiber]) -> None:
        self.top = top
        self.base = base


class ThreadState(data_type("ThreadStateData", ("serial", "current", "mail", "outbox", "pool",
                                               "to_start", "trampoline", "dropped", "__weakref__"))):
    """Everything per OS thread: the running fiber, the mailbox, trampoline, pool."""

    __slots__ = ()

    def __init__(self) -> None:
        self.serial = next(_serials)  # this thread's token (fibers record it)
        root = Fiber(thread=self.serial)
        root.glet = getcurrent()
        self.current = root          # the fiber whose code is running now
        self.mail = None             # the message in flight between two fibers
        self.outbox = None           # (base, message) posted before suspend()
        self.pool = []               # idle worker greenlets
        self.to_start = None         # (worker, requester) for the trampoline
        self.trampoline = None
        self.dropped = []            # chains dropped by other threads, to unwind here


# Every live thread's state by serial, so that a chain dropped on one thread
# can be handed to the thread that owns it (see unwind()).
_states = weakref.WeakValueDictionary()
_serials = itertools.count(1)


class _Local(threading.local):
    def __init__(self):
        self.state = ThreadState()
        _states[self.state.serial] = self.state


# ``local.state`` is this thread's ThreadState.  Hot paths read it once and then
# use plain slot accesses: a threading.local attribute costs several times more.
local = _Local()


def current() -> Fiber:
    """The fiber running now on this thread (the thread's root fiber outside any)."""
    return local.state.current


def new_fiber(fn: Callable[..., Any], args: Optional[Tuple[Any, ...]] = (), handler: Any = None,
              shallow: bool = False) -> Fiber:
    """A fiber that will run ``fn(*args)`` when first switched into.

    With ``args=None`` it runs ``fn(value)``, ``value`` being what the first
    resume sends (OCaml's ``Effect.Shallow.fiber``).
    """
    return Fiber((fn, args), handler, shallow)


def thread_token() -> int:
    """The running thread's serial number: what ``Fiber.thread`` records."""
    return local.state.serial


def check_owner(owned: Any, what: str = "fiber") -> None:
    """Raise WrongThread unless the running OS thread owns ``owned`` (anything
    with a ``thread`` token: a fiber, a Stepper, a C handler)."""
    serial = local.state.serial
    if owned.thread != serial:
        raise WrongThread(
            f"this {what} belongs to another OS thread (kina thread #{owned.thread}; "
            f"this is #{serial}), which alone can use it")


# --- switching --------------------------------------------------------------
#
# Two primitives move control between fibers:
#   switch_into(chain, send): the running fiber resumes a suspended chain
#       (chain.base.parent becomes the running fiber) and waits for a message
#       addressed to it.  ``chain`` is consumed: resuming is one-shot.
#   post(base, message) then suspend(): the running fiber, the top of a chain
#       ending at ``base``, detaches that chain, sends ``message`` to base's
#       resumer and waits to be resumed.  The two steps are separate so that the
#       caller can drop its own reference to the continuation inside
#       ``message`` before its frame is suspended.
# ``send`` is (False, value) to resume with a value, (True, exc) to raise exc at
# the suspension point; switch_into returns the message, suspend the send pair.


def switch_into(chain: Chain, send: Tuple[bool, Any]) -> Any:
    """Resume ``chain`` from the running fiber; return the message sent back to us."""
    step = [chain, send]
    del chain, send
    return switch_into_step(step)


def switch_into_step(step: list) -> Any:
    """``switch_into(chain, send)`` for ``step = [chain, send]``, which it empties.

    The driver loop's form: on Python 3.10 a caller's value stack keeps the
    arguments of a call until it returns, so ``send`` passed as an argument
    (an exception thrown into the body, whose traceback holds the frames it
    goes through) would stay referenced while the resumed code runs."""
    chain, send = step.pop(0), step.pop()
    st = local.state
    if st.dropped:
        _unwind_dropped(st)
    me = st.current
    top = chain.top
    if top is None:
        raise InternalError("switch_into: chain already consumed")
    if top.thread != me.thread:
        check_owner(top)
    base = chain.base
    chain.top = chain.base = None
    base.parent = me
    st.mail = send
    st.current = top
    if top.job is not None:
        # A new fiber runs in a copy of its starter's context (like an asyncio
        # task): context variables set inside it do not leak out.
        glet = top.glet = _take_worker(st)
        glet.gr_context = contextvars.copy_context()
    else:
        glet = top.glet
    del me, top, base, chain, send          # the mail is the only reference the switch needs
    return _switch(glet)


def post(base: Fiber, message: Any) -> None:
    """First half of suspending: address ``message`` to the resumer of ``base``."""
    local.state.outbox = (base, message)


def suspend() -> Any:
    """Second half: detach the running chain and deliver the posted message."""
    st = local.state
    base, st.mail = st.outbox
    st.outbox = None
    resumer = base.parent
    base.parent = None
    st.current = resumer
    glet = resumer.glet
    del base, resumer
    return _switch(glet)


def _switch(glet):
    # Switch to ``glet``; return the mailbox content once someone switches back.
    try:
        glet.switch()
    except GreenletExit as exc:
        if not isinstance(exc, Unwind):
            # greenlet itself is killing this greenlet (its thread is gone, or
            # an unforeseen reference cycle was collected): unwind detached.
            _begin_unwind_here(local.state)
        raise
    st = local.state
    mail = st.mail
    st.mail = None
    return mail


# --- unwinding ----------------------------------------------------------------


def unwind(chain: Chain) -> None:
    """Run the cleanup of a dropped, never-resumed chain, innermost fiber first.

    Each suspended fiber gets :class:`Unwind` raised at its suspension point,
    detached from every handler outside it.  Exceptions its cleanup raises are
    reported through ``sys.unraisablehook``, as for ``__del__``.

    This may run at any allocation (the cycle collector frees dropped
    continuations), even halfway through a switch of this module, so it saves
    and restores every piece of thread state a switch uses.  A chain of
    another thread cannot be entered from here: it is queued for its own
    thread, which unwinds it at its next switch_into.  A thread that has
    exited cannot run its chains' cleanup at all.
    """
    fiber, base = chain.top, chain.base
    chain.top = chain.base = None
    if fiber is None:
        return
    if fiber.thread != local.state.serial:
        owner = _states.get(fiber.thread)
        if owner is not None:        # its thread unwinds it at its next switch
            owner.dropped.append(Chain(fiber, base))
        return
    st = local.state
    saved = (st.current, st.mail, st.outbox, st.to_start)
    unwinder = Fiber()               # stands for whoever is running this code
    unwinder.glet = getcurrent()
    try:
        while fiber is not None:
            outer = None if fiber is base else fiber.parent
            if fiber.job is None and fiber.glet is not None and not fiber.glet.dead:
                fiber.parent = None
                fiber.unwinder = unwinder
                st.current = fiber
                glet = fiber.glet
                glet.throw(Unwind("the fiber is unwound: its continuation was dropped"))
                del glet
            fiber.job = None
            fiber = outer
    finally:
        st.current, st.mail, st.outbox, st.to_start = saved


def _unwind_dropped(st):
    while st.dropped:
        unwind(st.dropped.pop())


def _begin_unwind_here(st):
    me = Fiber()
    me.glet = getcurrent()
    me.unwinder = st.current
    st.current = me


# --- workers, pool and trampoline ------------------------------------------


def _take_worker(st) -> greenlet:
    if st.pool:
        return st.pool.pop()
    if st.trampoline is None or st.trampoline.dead:
        st.trampoline = greenlet(_trampoline_loop)
    glet = greenlet(_worker_loop, parent=st.trampoline)
    # The trampoline starts the worker, so the worker's C stack begins where the
    # trampoline's does (near the top of the thread's stack), not on top of a
    # caller that may be 100,000 handlers deep.
    st.to_start = (glet, getcurrent())
    st.trampoline.switch()
    return glet


def _trampoline_loop():
    st = local.state
    while True:
        glet, requester = st.to_start
        st.to_start = None
        glet.switch(requester)   # the worker switches straight back to requester
        del glet, requester      # suspended here until the next start request


def _worker_loop(requester):
    requester.switch()           # started; now wait for the first job
    del requester
    st = local.state
    while True:
        # In a box that _deliver_and_idle empties: an idle worker must not
        # hold its last job's outcome (an exception holds the frames it went
        # through, and what they reference: a dropped continuation would look
        # kept, docs/effects.md "Abort cleanup").
        if not _deliver_and_idle(st, [_run_job(st)]):
            return None


def _run_job(st):
    me = st.current
    fn, args = me.job
    me.job = None
    del me
    send = st.mail
    st.mail = None
    try:
        if send[0]:
            raise send[1]        # discontinued before it started
        if args is None:         # Effect.Shallow.fiber: fn receives the start value
            return (RETURNED, fn(send[1]))
        return (RETURNED, fn(*args))
    except Unwind as exc:
        if st.current.unwinder is None:
            # Raised at a perform by a driver aborting an abandoned continuation
            # (handlers._abort_unless_kept), not by unwind(): this fiber is attached, and
            # its resumer waits for the outcome like any other.
            return (RAISED, exc)
        return None
    except BaseException as exc:  # the resumer decides what a failure means
        if isinstance(exc, GreenletExit) and st.current.unwinder is not None:
            # greenlet itself is killing this worker (see _switch): let it die,
            # back on the killer.  A GreenletExit the job raised is just a result.
            st.current = st.current.unwinder
            raise
        return (RAISED, exc)


def _deliver_and_idle(st, box) -> bool:
    """Send a finished fiber's last message (the item of ``box``, which this
    empties) to its resumer and go idle.

    Returns True when the worker was handed a new job, False when it must end.
    """
    message = box.pop()
    finished = st.current
    finished.glet = None
    if finished.unwinder is not None:
        # Unwound (or killed by greenlet): go back to whoever unwound us.
        if message is not None and message[0] is RAISED:
            exc = message[1]
            sys.unraisablehook(_unraisable_args()(
                (type(exc), exc, exc.__traceback__,
                 "Exception ignored while unwinding a dropped continuation", finished)))
            del exc
        resumer = finished.unwinder
        finished.unwinder = None
        st.mail = None
    else:
        resumer = finished.parent
        finished.parent = None
        st.mail = (message[0], finished.handler, message[1])
    st.current = resumer
    target = resumer.glet
    del finished, resumer, message
    st.pool.append(getcurrent())
    if len(st.pool) > POOL_LIMIT:
        # Trim the oldest idle worker: greenlet kills it right here (it ends in
        # _deliver_and_idle below) and switches back.  Letting *this* worker end
        # instead would need re-parenting it, and long parent chains of dead
        # greenlets are freed recursively by greenlet (a C stack overflow).
        del st.pool[0]
    try:
        target.switch()
    except GreenletExit:         # the idle pool is being torn down
        return False
    return True


def _unraisable_args():
    """sys.UnraisableHookArgs, which the default sys.unraisablehook insists on
    (and which sys does not name): the type of what an exception in a
    ``__del__`` gives the hook, found once."""
    global _UnraisableHookArgs
    if _UnraisableHookArgs is None:
        found = []
        hook = sys.unraisablehook

        class Probe:
            def __del__(self):
                raise _ProbeError

        def catch(args):
            if args.exc_type is _ProbeError:
                found.append(type(args))
            else:                       # another thread's, meanwhile: pass it on
                hook(args)
        sys.unraisablehook = catch
        try:
            Probe()
        finally:
            sys.unraisablehook = hook
        _UnraisableHookArgs = found[0]
    return _UnraisableHookArgs


class _ProbeError(Exception):
    pass


_UnraisableHookArgs = None
