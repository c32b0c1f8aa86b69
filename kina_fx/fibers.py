"""Stackful one-shot fibers on greenlets, and the per-fiber handler stack.

A :class:`Fiber` is the unit the effects runtime suspends and resumes.  It runs
one job (a function call) on a greenlet and owns the *handler stack* of that
job: the list of in-place handlers (``with Handler(fun=...)``, C handlers from
the C ABI) pushed while it runs, plus the one control handler it was started
under (``Fiber.handler``).  Fibers form a chain through ``Fiber.parent``: the
fiber that is waiting for this one.  Walking ``current()`` -> ``parent`` ->
... visits every handler in scope, innermost first; that walk is the only
definition of "the handler stack" in kina_fx (Python and C share it).

How this module keeps its promises (see docs/effects.md for the semantics):

* **Bounded C stack.**  A greenlet's C stack starts wherever it is first
  switched into.  New fibers are therefore started by a per-thread
  *trampoline* greenlet that sits near the top of the stack, never on top of
  the caller's stack, so nesting 100,000 handlers does not grow the C stack.
* **Pooling.**  Creating a greenlet costs two memory system calls; finished
  fibers return their greenlet to a per-thread pool of idle *workers*.
* **Collectable continuations.**  greenlet does not traverse suspended frames
  for the cycle collector, so nothing on a suspended stack may refer to the
  fiber that owns it.  Messages between fibers travel through a per-thread
  mailbox rather than as ``switch()`` arguments, and no frame of this module
  keeps a fiber in a local across a switch.  A fiber that nothing refers to
  any more is unwound by greenlet (``GreenletExit``: finally blocks and
  ``with`` exits run).
* **Threads.**  Every OS thread has its own root fiber, trampoline, pool and
  mailbox; a fiber can only be resumed from the thread that created it.
"""
from __future__ import annotations

import threading

from greenlet import GreenletExit, getcurrent, greenlet

from .errors import InternalError, WrongThread

__all__ = ["Fiber", "Chain", "current", "new_fiber", "switch_into", "post", "suspend",
           "RETURNED", "RAISED"]

# Kinds of message a fiber sends to the fiber that resumed it when it stops.
# The effects layer adds its own kinds (a "performed" message); this module only
# produces these two, when a fiber's job ends.
RETURNED = "returned"
RAISED = "raised"


class Fiber:
    """One job on a greenlet, with its handler stack.

    Attributes:
        stack: in-place handler entries pushed on this fiber, innermost last.
        handler: the control handler this fiber runs under (None for a root
            fiber, or for a shallow fiber between two ``resume_with`` calls).
        shallow: True when ``handler`` was installed by ``resume_with``.
        parent: the fiber waiting for this one while it runs; None while the
            fiber is suspended (or for a thread's root fiber).
        thread: ``threading.get_ident()`` of the owning OS thread.
        job: ``(fn, args)`` until the fiber starts, then None.
        glet: the greenlet running the job (None until started).
    """

    __slots__ = ("stack", "handler", "shallow", "parent", "thread", "job", "glet",
                 "resume_after", "__weakref__")

    def __init__(self, job=None, handler=None, shallow=False):
        self.stack = []
        self.handler = handler
        self.shallow = shallow
        self.parent = None
        self.thread = threading.get_ident()
        self.job = job
        self.glet = None
        self.resume_after = None  # only for a fiber being unwound by greenlet

    @property
    def started(self) -> bool:
        return self.job is None

    def __repr__(self):
        state = "running" if self is _tls.current else (
            "new" if self.job is not None else "suspended")
        return f"<Fiber {state} handler={self.handler!r} at {id(self):#x}>"


class _ThreadState(threading.local):
    """Everything per OS thread: the running fiber, the mailbox, trampoline, pool."""

    def __init__(self):
        root = Fiber()
        root.glet = getcurrent()
        self.current = root          # the fiber whose code is running now
        self.mail = None             # the message in flight between two fibers
        self.outbox = None           # (base, message) posted before suspend()
        self.pool = []               # idle worker greenlets
        self.to_start = None         # (worker, requester) for the trampoline
        self.trampoline = None


_tls = _ThreadState()


def current() -> Fiber:
    """The fiber running now on this thread (the thread's root fiber outside any)."""
    return _tls.current


def new_fiber(fn, args=(), handler=None, shallow=False) -> Fiber:
    """A fiber that will run ``fn(*args)`` when first switched into.

    With ``args=None`` it runs ``fn(value)``, ``value`` being what the first
    resume sends (OCaml's ``Effect.Shallow.fiber``).
    """
    return Fiber((fn, args), handler, shallow)


# --- switching --------------------------------------------------------------
#
# Two primitives move control between fibers:
#   switch_into(chain, send): the running fiber resumes a suspended chain
#       (chain.base.parent becomes the running fiber) and waits for a message
#       addressed to it.  ``chain`` is consumed: resuming is one-shot.
#   post(base, message) then suspend(): the running fiber, the top of a chain
#       ending at ``base``, detaches that chain, sends ``message`` to base's
#       resumer and waits to be resumed.  The two steps are separate so that the
#       caller can drop its own references to ``base`` (and to the continuation
#       inside ``message``) before its frame is suspended.
# ``send`` is (False, value) to resume with a value, (True, exc) to raise exc at
# the suspension point; switch_into returns the message, suspend the send pair.


class Chain:
    """A suspended chain of fibers ``top -> ... -> base``, resumable once."""

    __slots__ = ("top", "base")

    def __init__(self, top: Fiber, base: Fiber):
        self.top = top
        self.base = base

    @property
    def consumed(self) -> bool:
        return self.top is None


def switch_into(chain: Chain, send):
    """Resume ``chain`` from the running fiber; return the message sent back to us."""
    st = _tls
    me = st.current
    top = chain.top
    if top is None:
        raise InternalError("switch_into: chain already consumed")
    if top.thread != me.thread:
        raise WrongThread(
            "a fiber can only be resumed from the OS thread that created it "
            f"(fiber thread {top.thread}, this thread {me.thread})")
    base = chain.base
    chain.top = chain.base = None
    base.parent = me
    st.mail = send
    st.current = top
    glet = _take_worker(st) if top.job is not None else top.glet
    top.glet = glet
    del me, top, base, chain
    return _switch(glet)


def post(base: Fiber, message) -> None:
    """First half of suspending: address ``message`` to the resumer of ``base``."""
    _tls.outbox = (base, message)


def suspend():
    """Second half: detach the running chain and deliver the posted message."""
    st = _tls
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
    # The only object this suspended frame keeps is ``glet`` (the target).
    try:
        glet.switch()
    except GreenletExit:
        # greenlet is unwinding this fiber because nothing refers to it any
        # more.  Unwind on a detached stand-in fiber, so that effects performed
        # by finally blocks cannot reach the handlers of unrelated fibers.
        st = _tls
        stand_in = Fiber()
        stand_in.glet = getcurrent()
        stand_in.resume_after = st.current
        st.current = stand_in
        raise
    st = _tls
    mail = st.mail
    st.mail = None
    return mail


# --- workers, pool and trampoline ------------------------------------------

# Idle workers kept per thread.  More would pin memory after a deep nesting
# unwinds (each idle greenlet keeps a small saved stack); fewer costs greenlet
# creations in programs that run many handlers side by side.
POOL_LIMIT = 256


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
    st = _tls
    while True:
        glet, requester = st.to_start
        st.to_start = None
        glet.switch(requester)   # the worker switches straight back to requester
        del glet, requester      # suspended here until the next start request


def _worker_loop(requester):
    requester.switch()           # started; now wait for the first job
    del requester
    st = _tls
    while True:
        try:
            message = _run_job(st)
        except GreenletExit:
            # Our fiber was dropped while suspended and greenlet unwound it.
            st.current = st.current.resume_after
            return None
        if not _deliver_and_idle(st, message):
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
    except GreenletExit:
        raise
    except BaseException as exc:  # the resumer decides what a failure means
        return (RAISED, exc)


def _deliver_and_idle(st, message) -> bool:
    """Send a finished fiber's last message to its resumer and go idle.

    Returns True when the worker was handed a new job, False when it must end.
    """
    finished = st.current
    resumer = finished.parent
    finished.parent = None
    finished.glet = None
    st.mail = (message[0], finished.handler, message[1])
    st.current = resumer
    target = resumer.glet
    del finished, resumer, message
    if len(st.pool) >= POOL_LIMIT:
        # Not pooled: end this greenlet; greenlet hands control to its parent.
        getcurrent().parent = target
        return False
    st.pool.append(getcurrent())
    try:
        target.switch()
    except GreenletExit:         # the idle pool is being torn down
        return False
    return True


def check_owner(fiber: Fiber) -> None:
    """Raise WrongThread unless the running OS thread owns ``fiber``."""
    if fiber.thread != threading.get_ident():
        raise WrongThread(
            f"this fiber belongs to OS thread {fiber.thread}; "
            f"it cannot be used from thread {threading.get_ident()}")
