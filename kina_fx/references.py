"""Which references to an object die with an exception's traceback.

The eager abort (handlers._abort_unless_kept, docs/effects.md "Abort cleanup")
aborts a continuation that its clause dropped, unless something still
references it.  When the clause raised, the frames of the exception's
traceback (the clause's own, its helpers') still reference it, but die with
the traceback: those references, and those of objects that only such frames
hold, do not count.
"""
from __future__ import annotations

import gc
import sys
import types

__all__ = ["dying_with_traceback"]

# How many objects deep, from the frames, references are looked for.
LEVELS = 8

# Frames of the traceback are visited themselves; code and modules are never
# held by a traceback alone, and a reference from an exception keeps the object.
_NOT_HOLDERS = (types.FrameType, types.CodeType, types.ModuleType, BaseException)


def dying_with_traceback(obj, exc) -> int:
    """How many references to ``obj`` die with ``exc``'s traceback (0 if
    ``exc`` is None): those of its frames (a clause's argument), and those of
    objects that only such frames and such objects hold (a bound
    ``k.resume`` handed to a helper, a wrapper made for the clause such as
    aio's AsyncContinuation or multishot's MultiContinuation, a closure cell).
    An object counts once every reference to it is accounted for; the
    exception itself never does (``raise Stop(k)`` keeps k)."""
    if exc is None:
        return 0
    count = 0
    level = []
    tb = exc.__traceback__
    while tb is not None:
        level.append(tb.tb_frame)
        tb = tb.tb_next
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
