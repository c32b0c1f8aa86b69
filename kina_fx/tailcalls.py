"""Which resumes are tail resumes: bytecode analysis for :mod:`kina_fx.handlers`.

A resume is a *tail* resume when every frame between it and the driver loop
hands the resume's result straight back: each frame is stopped at a call that
is directly followed by RETURN_VALUE, outside any try/with block, and that call
is visibly a call of the next frame's function (the callee loaded by name right
before the arguments is ``resume``/... for the first frame, and the next
frame's function after that).  The last condition rejects C functions in
between (``next(map(lambda: k.resume(v), ...))``), which the frame chain cannot
show.  Everything is computed once per code object; when in doubt the answer
is "not a tail call", which is always correct (the resume nests).

kina_fx/_speedups_c/tail.c has a compiled copy of :func:`returns_straight_to`
that uses :func:`tail_calls` and :func:`names_function` from here; its driver
frames are those its compiled driver loop was called from.
"""
from __future__ import annotations

import dis

MAX_TAIL_FRAMES = 16
# (discontinue_taking: handlers' discontinue for a caller that holds the
# exception only in a list, multishot's first shot.)
RESUME_NAMES = frozenset({"resume", "discontinue", "resume_with", "discontinue_with",
                          "discontinue_taking"})
_CALL_OPS = frozenset({"CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_KW"})
_NAME_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_CLASSDEREF"})
_ATTR_LOADS = frozenset({"LOAD_METHOD", "LOAD_ATTR"})
_NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200   # generator, coroutine, iterable coroutine, async gen
tail_calls_by_code: dict = {}


def _callee(insts, index):
    """(name, is_plain_name) of the callable the call at insts[index] calls, or None."""
    call = insts[index]
    nargs = call.arg or 0
    j = index
    while j > 0 and insts[j - 1].opname in ("PRECALL", "KW_NAMES"):
        j -= 1
    produced = 0
    while produced < nargs:
        j -= 1
        inst = insts[j] if j >= 0 else None
        if inst is None or inst.is_jump_target or "JUMP" in inst.opname or inst.opname == "FOR_ITER":
            return None
        try:
            produced += dis.stack_effect(inst.opcode, inst.arg if inst.opcode >= dis.HAVE_ARGUMENT else None)
        except ValueError:
            return None
    if produced != nargs or j == 0:
        return None
    load = insts[j - 1]
    if load.opname in _NAME_LOADS:
        return (load.argval, True)
    if load.opname in _ATTR_LOADS:
        return (load.argval, False)
    return None


def tail_calls(code) -> dict:
    """{f_lasti value at a tail call: the callee (name, is_plain_name)} for ``code``."""
    # Keyed by id(): hashing a code object hashes its whole bytecode.  The entry
    # keeps the code object alive so that its id cannot be reused meanwhile.
    entry = tail_calls_by_code.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    calls = {}
    if not code.co_flags & _NOT_PLAIN:
        bytecode = dis.Bytecode(code)
        guarded = [(e.start, e.end) for e in getattr(bytecode, "exception_entries", ())]
        insts = list(bytecode)
        for index, (call, nxt) in enumerate(zip(insts, insts[1:])):
            if (call.opname in _CALL_OPS and nxt.opname == "RETURN_VALUE"
                    and not any(s <= call.offset < e for s, e in guarded)):
                callee = _callee(insts, index)
                if callee is not None:
                    # Python 3.11 makes a specialized call of a C function (the
                    # compiled Continuation.resume) in the PRECALL right before
                    # the CALL: a frame stopped there is in this very call.
                    start = call.offset
                    if index and insts[index - 1].opname == "PRECALL":
                        start = insts[index - 1].offset
                    for offset in range(start, nxt.offset, 2):
                        calls[offset] = callee
    if len(tail_calls_by_code) > 4096:     # code compiled at run time (exec, eval)
        tail_calls_by_code.clear()
    tail_calls_by_code[id(code)] = (code, calls)
    return calls


def returns_straight_to(frame, is_driver) -> bool:
    """True when ``frame`` (the caller of a resume method) returns the resume's
    result unchanged, through tail calls only, to a frame for which
    ``is_driver(frame)`` is true: a driver loop's."""
    callee_code = None                  # code of the frame the current one calls
    for _ in range(MAX_TAIL_FRAMES):
        if frame is None:
            return False
        if is_driver(frame):
            return True
        code = frame.f_code
        callee = tail_calls(code).get(frame.f_lasti)
        if callee is None:
            return False
        name, plain = callee
        if callee_code is None:
            if name not in RESUME_NAMES:
                return False
        elif name != callee_code.co_name and not (plain and names_function(frame, name, callee_code)):
            return False
        callee_code = code
        frame = frame.f_back
    return False


def names_function(frame, name, code) -> bool:
    # For a helper called through a differently named variable (a lambda):
    # does ``name`` in ``frame`` hold the function whose code is ``code``?
    scope = frame.f_locals if name in frame.f_code.co_varnames or name in frame.f_code.co_freevars \
        or name in frame.f_code.co_cellvars else frame.f_globals
    fn = scope.get(name)
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None) is code
