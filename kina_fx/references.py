"""Which references to an object die with an exception's traceback.

The eager abort (handlers._abort_unless_kept, docs/effects.md "Abort cleanup")
aborts a continuation that its clause dropped, unless something still
references it.  When the clause raised, the frames of the exception's
traceback (the clause's own, its helpers') still reference it, but die with
the traceback: those references, and those of objects that only such frames
hold, do not count.  Nor, on CPython 3.10 under a trace function, do the
copies of a frame's locals that the interpreter keeps in its ``f_locals``
dict (:func:`copied_into_frame_locals`).
"""
from __future__ import annotations

import gc
import inspect
import sys
import types

__all__ = ["copied_into_frame_locals", "dying_with_traceback"]

# How many objects deep, from the frames, references are looked for.
LEVELS = 8

# Frames of the traceback are visited themselves; code and modules are never
# held by a traceback alone, and a reference from an exception keeps the object.
_NOT_HOLDERS = (types.FrameType, types.CodeType, types.ModuleType, BaseException)

_CO_OPTIMIZED = inspect.CO_OPTIMIZED        # a function's code: fast locals


def dying_with_traceback(obj, exc, released=frozenset()) -> int:
    """How many references to ``obj`` die with ``exc``'s traceback (0 if
    ``exc`` is None): those of its frames (a clause's argument), and those of
    objects that only such frames and such objects hold (a bound
    ``k.resume`` handed to a helper, a wrapper made for the clause such as
    aio's AsyncContinuation or multishot's MultiContinuation, a closure cell).
    An object counts once every reference to it is accounted for; the
    exception itself never does (``raise Stop(k)`` keeps k).  ``released``:
    the ids of exceptions whose tracebacks their holder drops once done (the
    abort signals in flight), whose frames die too, whoever holds them."""
    if exc is None:
        return 0
    count = 0
    level = _frames_dying_with(exc, released)
    held = {}                       # id -> [object, references from the frames and dying holders]
    scanned = set()
    for _ in range(LEVELS):
        for holder in level:
            for ref in gc.get_referents(holder):
                if ref is obj:
                    count += 1
                elif not isinstance(ref, _NOT_HOLDERS):
                    held.setdefault(id(ref), [ref, 0])[1] += 1
        holder = ref = None         # the loops' last values: not references to count
        level = []
        for key, entry in held.items():
            # - the entry, - getrefcount's argument: what is left must all be accounted for
            if key not in scanned and sys.getrefcount(entry[0]) - 2 == entry[1]:
                scanned.add(key)
                level.append(entry[0])
        if not level:
            break
    return count


def _frames_dying_with(exc, released=frozenset()) -> list:
    """The frames of ``exc``'s traceback, and those of the exceptions of its
    chain (``__cause__``, ``__context__``: an exception raised in a
    ``finally`` or ``except`` block holds the one it replaced) that nothing
    but that chain and those frames holds: their tracebacks die with
    ``exc``'s; and those of the chain's ``released`` exceptions (see
    :func:`dying_with_traceback`).  An exception of the chain held elsewhere
    too (a clause that kept it) keeps its frames, and what they reference."""
    frames, seen = [], set()

    def add_frames(e):
        tb = e.__traceback__
        while tb is not None:
            if id(tb.tb_frame) not in seen:
                seen.add(id(tb.tb_frame))
                frames.append(tb.tb_frame)
            tb = tb.tb_next

    add_frames(exc)
    candidates = [exc]              # the chain, each exception once, exc first
    i = 0
    while i < len(candidates) <= LEVELS:
        for linked in (candidates[i].__cause__, candidates[i].__context__):
            if linked is not None and all(linked is not c for c in candidates):
                candidates.append(linked)
        i += 1
    linked = None
    dying = [candidates.pop(0)]
    changed = True
    while changed and candidates:
        changed = False
        for i in range(len(candidates)):
            holders = _references_among(candidates[i], dying, frames)
            # - the candidates' entry, - getrefcount's argument
            if id(candidates[i]) in released or sys.getrefcount(candidates[i]) - 2 == holders:
                dying.append(candidates.pop(i))
                add_frames(dying[-1])
                changed = True
                break
    return frames


def _references_among(exc, exceptions, frames) -> int:
    """How many references to ``exc`` the ``__cause__`` and ``__context__`` of
    ``exceptions`` and the ``frames`` hold (``exc`` itself: one more, the
    argument, which the caller counts with getrefcount's)."""
    count = 0
    for e in exceptions:
        count += (e.__cause__ is exc) + (e.__context__ is exc)
    for frame in frames:
        for ref in gc.get_referents(frame):
            if ref is exc:
                count += 1
    return count


def copied_into_frame_locals(obj) -> int:
    """How many references to ``obj`` are the copies that the frames of this
    thread's stack hold in their ``f_locals`` dicts (0 but on CPython 3.10
    with a Python trace function set).

    Before each call of a trace function (``sys.settrace``: debuggers,
    hypothesis's explain phase), CPython 3.10 copies the frame's fast locals
    into a dict that the frame keeps, and a copy outlives its variable until
    the next event.  Such a copy duplicates a variable of the frame (which
    still counts) or one that is gone: it keeps nothing.  Reading each frame's
    ``f_locals`` brings its dict up to date (a deleted variable leaves it), so
    the count is of copies of live variables only.  3.11 no longer makes these
    copies for trace functions.  Call it before taking the reference count:
    it may add copies.
    """
    if sys.version_info >= (3, 11) or sys.gettrace() is None:
        return 0
    count = 0
    frame = sys._getframe(1)
    while frame is not None:
        # Only a function's frame copies: a module's or class body's f_locals
        # is its namespace itself, whose references keep.
        if frame.f_code.co_flags & _CO_OPTIMIZED:
            count += sum(1 for value in frame.f_locals.values() if value is obj)
        frame = frame.f_back
    return count
