"""Autograd tapes over memory: runtime ops recorded by the buffers they touch.

Compiled code (MLIR, C) does not hand kina_fx Tensors; it calls the runtime's
exports on memrefs.  Each export performs its op's effect
(:mod:`kina_fx.runtime_ops`) with NumPy/CuPy views of the caller's buffers.  A
:class:`BufferTracer` is a handler of those effects: it maps each buffer to the
:class:`kina_fx.autograd.Tensor` it holds, computes the op with autograd's
primitive (so whatever autograd trace is live -- a ``grad``, a ``jvp``, a
:class:`~kina_fx.autograd.Tape` -- records it), writes the value into the
output buffer, and remembers that the output buffer now holds the result.

**Identity.**  A buffer is identified by its memref: the address of its first
element (``aligned + offset * itemsize``), its sizes, its strides and its
element type (:func:`buffer_key`; the stride of a length-1 dimension does not
count).  Two memrefs that differ in any of these (a subview, a reshaped alias)
are different tensors to a tape.

**Copies and overwrites.**  The tracer keeps the value of every buffer it
knows (autograd keeps what backward needs), so the host may reuse memory.  A
buffer that no longer holds the recorded value when a recorded op reads it, or
when backward starts from it, raises :class:`TapeError`: the host (or MLIR code
outside the runtime) wrote it after it was recorded, and using the recorded
value would differentiate something other than what ran.

**Strict mode** (the default): a floating input the tracer cannot account for
-- not produced by a recorded op, not watched, not declared constant -- raises
:class:`TapeError`.  Ops that compiled code performs itself (``linalg`` or
``scf`` loops) are invisible to a tape; strict mode turns such a gap into an
error instead of a gradient that silently treats the buffer as a constant.
Lenient mode treats unknown buffers as constants.  Integer inputs (labels,
indices, permutations) are never differentiable and are always constants.

:class:`MemoryTape` is a tracer with its own autograd tape: the object behind
the ``kina_tape_*`` C functions (:mod:`kina_fx.ffi.tapes`).  Tapes nest: a
tracer begun while another records on the same fiber looks up buffers it does
not know in the outer one, and registers what it produces there too, so a
backward pass recorded by an outer tape gives higher-order derivatives.
"""
from __future__ import annotations

import weakref

import numpy as np

from .. import autograd as ad
from .. import fibers, memref
from ..errors import KinaTypeError, ValidationError
from ..gpu_ops import array_module, copy_into
from ..handlers import Effect, Handler, perform
from ..runtime_ops import IDENTITY, RUNTIME_OPS, as_given
from .primitives import PRIMITIVES
from .tape import as_input, compiled_recording, seen_by

__all__ = ["TapeError", "BufferTracer", "MemoryTape", "buffer_key", "current_tracer"]


class TapeError(ValidationError):
    """A tape cannot vouch for a buffer: unknown in strict mode, or overwritten after recording."""


#: Answered by the innermost live tracer of the running fiber (None outside any).
CURRENT_TRACER = Effect("kina.tape.current")
CURRENT_TRACER.default = lambda: None


def current_tracer() -> "BufferTracer | None":
    """The innermost :class:`BufferTracer` recording on the running fiber, or None."""
    return perform(CURRENT_TRACER)


def buffer_key(array) -> tuple:
    """The identity of the tensor a buffer holds: (data address, shape, strides in elements, dtype)."""
    return memref.identity(array)


_identity = memref.identity


def describe(array) -> str:
    """A buffer as messages name it."""
    address, shape, strides, dtype = buffer_key(array)
    return f"buffer at {address:#x} (shape {list(shape)}, strides {list(strides)}, {np.dtype(dtype).name})"


def _raw(value):
    """The array under every level of Tensor wrapping."""
    return value.data if value.__class__ is ad.Tensor else value


_SAME_SIZE_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

#: memcmp of two C-contiguous buffers (kina_fx._speedups; NotImplemented for
#: others), or None: the NumPy comparison below is the reference.
_same_bytes = getattr(fibers.speedups, "same_bytes", None)


def _unchanged(current, recorded) -> bool:
    """Whether ``current`` holds exactly the recorded values, bit for bit.

    Bitwise (not ``==``): NaNs compare equal to themselves and a rewritten
    ``-0.0`` counts as a change, and it is one pass over memory, not several.
    """
    if current.shape != recorded.shape:
        return False
    if current.dtype == recorded.dtype and _same_bytes is not None:
        same = _same_bytes(current, recorded)
        if same is not NotImplemented:
            return same
    if current.dtype == recorded.dtype and current.dtype.itemsize in _SAME_SIZE_UINT:
        uint = _SAME_SIZE_UINT[current.dtype.itemsize]
        return bool((current.view(uint) == recorded.view(uint)).all())
    xp = array_module(current)
    return bool(xp.array_equal(current, recorded, equal_nan=current.dtype.kind == "f"))


class _Entry:
    """What a tracer knows of one buffer: the Tensor it holds and the values it must still hold."""

    __slots__ = ("tensor", "value", "kind")

    def __init__(self, tensor, value, kind):
        self.tensor = tensor     # a Tensor (watched or produced), or an array (constant)
        self.value = value       # the recorded values, for the overwrite check
        self.kind = kind         # "watched", "constant", "produced" or "given"


class BufferTracer:
    """A handler of the runtime ops' effects that computes them with autograd (module docstring).

    ``start()`` pushes it on the running fiber's handler stack and ``stop()``
    pops it (it must then be the innermost handler).
    """

    def __init__(self, strict: bool = True):
        self.strict = strict
        self.table: dict = {}
        self.parent: BufferTracer | None = None
        self.recording = False
        self._handler = None      # (Handler, _Slot) while recording

    def __repr__(self):
        state = "recording" if self.recording else "stopped"
        return f"<{type(self).__name__} {state}, {len(self.table)} buffers{', strict' if self.strict else ''}>"

    # -- recording --
    def start(self) -> None:
        if self.recording:
            raise ValidationError(f"{self!r} is already recording")
        self.parent = current_tracer()
        handler, slot = _handlers.pop() if _handlers else _new_handler()
        slot.tracer = self
        try:
            handler.__enter__()
        except BaseException:
            slot.tracer = None
            raise
        self._handler = (handler, slot)
        self.recording = True

    def stop(self) -> None:
        if not self.recording:
            raise ValidationError(f"{self!r} is not recording")
        handler, slot = self._handler
        try:
            handler.__exit__(None, None, None)
        except ValidationError:
            # The stack's own message spells out every clause of the handler.
            raise ValidationError(f"{self!r} is not the innermost handler of this fiber: "
                                  "end the tapes (pop the handlers) begun after it first, on the "
                                  "fiber that began it") from None
        slot.tracer = None
        self._handler = None
        self.recording = False
        if len(_handlers) < 16:
            _handlers.append((handler, slot))

    def lookup(self, key):
        tracer = self
        while tracer is not None:
            entry = tracer.table.get(key)
            if entry is not None:
                return entry
            tracer = tracer.parent
        return None

    def read(self, array, what: str, differentiable: bool = True, pending: dict | None = None):
        """The Tensor (or constant array) ``array`` holds, checked against what was recorded.

        ``what`` names the operand in messages.  A lenient tape takes an unknown
        buffer for a constant, copied now: into ``pending`` when given (the
        caller adds it to the table once the whole call succeeded: a failed
        call changes nothing), else into the table."""
        key = _identity(array)
        entry = self.table.get(key)
        if entry is None and self.parent is not None:
            entry = self.parent.lookup(key)
        if entry is None and pending is not None:
            entry = pending.get(key)
        if entry is None:
            if self.strict and differentiable:
                raise TapeError(
                    f"{what}: {describe(array)} was not produced by a recorded runtime op, "
                    "watched, or declared constant; code that computes a buffer itself "
                    "(MLIR loops rather than runtime calls) is invisible to the tape "
                    "(strict mode: declare it constant, watch it, or use a lenient tape)")
            value = array_module(array).array(array, copy=True)
            (self.table if pending is None else pending)[key] = _Entry(value, value, "constant")
            return value
        # The key says shape and type: a recorded value has the buffer's.
        same = NotImplemented if _same_bytes is None else _same_bytes(array, entry.value)
        if not (same if same is not NotImplemented else _unchanged(array, entry.value)):
            raise TapeError(f"{what}: {describe(array)} was overwritten after the tape "
                            "recorded it; its recorded value would give a wrong gradient")
        tensor = entry.tensor
        if tensor.__class__ is ad.Tensor and not ad.is_traced(tensor):
            # written by a nested tape that has ended (or went stale), from
            # values no running trace follows: a constant here
            return tensor.data
        return tensor

    def record(self, out, tensor, kind: str = "produced") -> None:
        """Write ``tensor``'s value into ``out`` and remember that ``out`` holds ``tensor``."""
        value = _raw(tensor)
        if value.__class__ is not np.ndarray:
            value = array_module(out).asarray(value)
        if value.dtype != out.dtype or value.shape != out.shape:
            out[...] = value
            value = array_module(out).array(out, copy=True)
        else:
            copy_into(out, value)
        entry = _Entry(tensor, value, kind)
        key = _identity(out)
        tracer = self
        while tracer is not None:
            tracer.table[key] = entry
            tracer = tracer.parent

    def declare_constant(self, array, key=None) -> None:
        """Record ``array``'s buffer as an input this tracer does not differentiate.

        Its values are copied now, unless an outer tracer knows the buffer by
        these very values: then it is the outer tracer's Tensor, which this
        tracer does not differentiate but the outer one still does (a copy
        would cut the outer gradient's paths through this tracer's ops).
        ``key``: its :func:`buffer_key`, when the caller has it."""
        if key is None:
            key = _identity(array)
        outer = self.parent.lookup(key) if self.parent is not None else None
        if outer is not None and _unchanged(array, outer.value):
            self.table[key] = _Entry(outer.tensor, outer.value, "constant")
            return
        value = array_module(array).array(array, copy=True)
        self.table[key] = _Entry(value, value, "constant")

    def bind(self, array, tensor, value, key=None) -> None:
        """Record that ``array``'s buffer holds ``tensor`` (a Python caller's traced
        argument), whose values are ``value`` (not ``array`` itself: the
        overwrite check compares the buffer with it)."""
        self.table[_identity(array) if key is None else key] = _Entry(tensor, value, "given")

    def produced(self, array, what: str, key=None):
        """The Tensor a recorded op wrote into ``array``'s buffer.

        TapeError if no recorded op wrote it (strict mode; lenient: the array
        itself, a constant) or it was overwritten since."""
        entry = self.table.get(_identity(array) if key is None else key)
        if entry is None or entry.kind != "produced":
            if self.strict:
                raise TapeError(f"{what} ({describe(array)}) was not written by a recorded "
                                "runtime op, so its gradient is unknown (strict mode)")
            return array
        if not _unchanged(array, entry.value):
            raise TapeError(f"{what} ({describe(array)}) was overwritten after the recorded "
                            "op wrote it")
        return entry.tensor

    def apply(self, op, out, args):
        """Answer runtime op ``op``'s effect: compute it with autograd, record the output."""
        n, operands, all_differentiable = _plan(op)
        arrays, params = args[:n], args[n:]
        op.check_output(out, *arrays, *params)
        # Unknown buffers a call may take for constants wait in ``pending``
        # until it succeeded; a strict tape whose inputs are all floating
        # refuses unknown buffers instead, and needs none.
        pending = None if self.strict and all_differentiable else {}
        read = self.read
        if n == 2:                              # the binary ops, matmul: no loop
            (what_a, diff_a), (what_b, diff_b) = operands
            tensors = (read(arrays[0], what_a, diff_a, pending), read(arrays[1], what_b, diff_b, pending))
        else:
            tensors = [read(a, what, differentiable, pending)
                       for a, (what, differentiable) in zip(arrays, operands)]
        self.record(out, op.differentiate(ad, *tensors, *params))
        if pending:
            for key, entry in pending.items():      # the call succeeded: its lenient constants are
                self.table.setdefault(key, entry)   # known now (unless the output overwrote one)
        return out


_plans: dict = {}


def _plan(op):
    """``(inputs, ((name in messages, differentiable), ...), all differentiable)`` of a
    runtime op, made once: the tracer answers every call of it."""
    plan = _plans.get(op.name)
    if plan is None or plan[0] is not op:
        operands = tuple((f"{op.name} input {o.name!r}", o.differentiable) for o in op.inputs)
        plan = _plans[op.name] = (op, (len(op.inputs), operands, all(d for _, d in operands)))
    return plan[1]


class _Slot:
    """What a pooled handler's clauses read: the tracer now using it."""

    __slots__ = ("tracer",)

    def __init__(self):
        self.tracer = None


# Handlers of stopped tracers, reused: building one (a clause per runtime op)
# costs more than a small compiled function's whole call.
_handlers: list = []


def _new_handler():
    slot = _Slot()

    def clause_for(op):
        def clause(out, *args):
            return slot.tracer.apply(op, out, args)
        return _compiled_clause(op, slot, clause) or clause
    fun = {op.effect: clause_for(op) for op in RUNTIME_OPS}
    fun[CURRENT_TRACER] = lambda: slot.tracer
    return Handler(fun=fun), slot


_FLOATING = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _compiled_clause(op, slot, clause):
    """``clause`` (the reference: ``slot.tracer.apply``) wrapped in its compiled
    form, which records the common case of an op itself
    (``kina_fx/_speedups_c/tape_calls.c`` says which), or None (pure Python,
    or an op it does not cover).

    Two kinds of op are covered.  An op with a direct NumPy function whose
    primitive records an elementwise or binary node: the clause computes
    ``direct(*values)`` on the shapes ``calls_direct`` admits.  An op without
    one (neg, sigmoid, gather, cross_entropy), whose primitive records any
    node: the clause checks the call as ``apply`` does (``check_output``) and
    calls the primitive's kernel itself, declining whatever either refuses."""
    make = getattr(fibers.speedups, "TracerClause", None)
    if (make is None or op.params or op.primitive in (None, IDENTITY)
            or op.primitive_args is not as_given):
        return None
    prim = PRIMITIVES.get(op.primitive)
    if prim is None or prim.sequence or prim.nparams or prim.nin != len(op.inputs):
        return None
    recording = compiled_recording(prim)
    by_kernel = op.direct is None or recording is None
    compute, admit = (prim.effect.default, op.check_output) if by_kernel else (op.direct, op.calls_direct)
    # no elementwise or binary node: the one _general_factory records,
    # (rule, i, ids, inputs, (), out, prim), -1 for an input not differentiated
    diff = None if recording is not None else prim.diff
    recording = recording or (prim.nin, prim.vjp, None, None)
    # Each input's element type: out's (a floating operand) or the operand's own.
    types = tuple(None if o.differentiable else o.dtype.str for o in op.inputs)
    # In the order tape_calls.c's SPEC_* name them: the function computing
    # the primitive's result, the call's admission and the admitted shapes'
    # memo, whether the result comes from the primitive's kernel (its
    # refusals decline); the primitive's effect, default and itself;
    # (inputs, rule, rule_a, rule_b) and the general node's differentiable
    # inputs (None: an elementwise or binary node); the inputs' types; the
    # types the clause recognises; the view identities; np.asarray; the
    # registry, the primitive's name and the op (both compared on every
    # call: a changed table declines).
    spec = (compute, admit, {}, by_kernel, prim.effect, prim.effect.default, prim, *recording, diff,
            types, (BufferTracer, MemoryTape), _Entry, ad.Tensor, ad.Tape, np.ndarray, _FLOATING,
            memref.VIEW_IDENTITIES, np.asarray, PRIMITIVES, op.primitive, op)
    return make(clause, slot, spec)


_DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float16), 3: np.dtype(np.int64)}   # KINA_DTYPE_*


def dtype_of_code(code: int) -> np.dtype:
    """The element type of a ``KINA_DTYPE_*`` code, or KinaTypeError."""
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise KinaTypeError(f"unknown element type code {code} (KINA_DTYPE_F32 = 1, "
                            "KINA_DTYPE_F16 = 2, KINA_DTYPE_I64 = 3)")
    return dtype


class MemoryTape(BufferTracer):
    """A reverse-mode tape over memory: a :class:`BufferTracer` with its own autograd tape.

    ``begin`` -> ``watch``/``constant`` -> runtime ops -> ``end`` ->
    ``backward`` -> ``grad``, on the fiber (and OS thread) that began it.

    A tape still recording when the fiber it records on ends (or its thread
    exits) is *stale*: what it held is released then, every later call but
    :meth:`free` raises ValidationError.
    """

    def __init__(self, strict: bool = True):
        super().__init__(strict)
        self.tape = ad.Tape()
        self.thread = fibers.local.state.serial
        self.ended = False
        self.stale = False
        self._watched: dict = {}          # key -> box of self.tape
        self._gradients: dict | None = None
        self._fiber = None                # weak reference to the fiber it records on

    def _check_thread(self):
        if self.stale:
            raise ValidationError("this tape is stale: the fiber it recorded on ended before the "
                                  "tape was ended (free it)")
        fibers.check_owner(self, "tape")

    def begin(self) -> "MemoryTape":
        self._check_thread()
        if self.recording or self.ended:
            raise ValidationError(f"{self!r} was already begun")
        self.tape.__enter__()
        try:
            self.start()
        except BaseException:
            self.tape.__exit__(None, None, None)
            raise
        self._fiber = weakref.ref(fibers.current(), self._fiber_ended)
        return self

    def _fiber_ended(self, _ref) -> None:
        """The fiber this tape records on is gone (its job ended, or its thread
        exited), and with it the handler stack the tape was on: the tape can
        never be ended, so it lets go of everything it held."""
        if not self.recording:
            return
        self.stale = True
        self.recording = False
        self._handler = None      # went with the fiber's stack (never exited: not pooled)
        self.tape.abandon()
        self.tape = None
        self.parent = None
        self.table.clear()
        self._watched.clear()
        self._gradients = None

    def end(self) -> None:
        self._check_thread()
        if self.ended:
            raise ValidationError("the tape was already ended")
        self.stop()
        self.tape.__exit__(None, None, None)
        self.ended = True
        self._fiber = None

    def watch(self, array) -> None:
        """Make ``array``'s buffer a differentiable input (its values are copied now).

        Refused for a buffer this tape already holds a value of (produced by
        one of its ops, or taken as a constant) as long as the buffer still
        holds that value: watching it would make it a new leaf, and the
        gradients would silently miss every use or path before the watch."""
        self._check_thread()
        self._require_recording("watch")
        if array.dtype.kind != "f":
            raise KinaTypeError(f"cannot watch a {array.dtype} buffer: only floating buffers "
                                "are differentiable (declare it constant)")
        key = buffer_key(array)
        if key in self._watched:
            raise ValidationError(f"{describe(array)} is already watched by this tape")
        known = self._holds(key, array)
        if known is not None and known.kind == "produced":
            raise ValidationError(
                f"cannot watch {describe(array)}: it holds a value produced by a recorded runtime op "
                "of this tape; a watched buffer is a new input, so the gradients of the inputs it "
                "was computed from would silently lose every path through it (watch inputs before "
                "computing from them; differentiate with respect to an intermediate value with a "
                "nested tape)")
        if known is not None and known.kind == "constant":
            raise ValidationError(
                f"cannot watch {describe(array)}: this tape already took it as a constant (declared, "
                "or read by a lenient tape); its uses so far would be missing from its gradient "
                "(watch it before it is used, or use a new tape)")
        outer = self.parent.lookup(key) if self.parent is not None else None
        if outer is not None and _unchanged(array, outer.value):
            # nested: a new box around the outer value (as_input: never the
            # outer entry's Tensor itself, which other tapes' tables hold)
            box = self.tape.watch(as_input(outer.tensor))
        else:
            box = self.tape.watch(array_module(array).array(array, copy=True))
        self._watched[key] = box
        self.table[key] = _Entry(box, _raw(box), "watched")

    def constant(self, array) -> None:
        """Declare ``array``'s buffer an input that is not differentiated (copied now).

        Refused for a buffer this tape watches or produced, as long as it holds
        that value: its later uses would be data, so the gradients through them
        would silently be 0.  Declaring a constant again is allowed (a refilled
        constant buffer), and so is a buffer the host has written since."""
        self._check_thread()
        self._require_recording("constant")
        known = self._holds(buffer_key(array), array)
        if known is not None and known.kind == "watched":
            raise ValidationError(f"cannot declare {describe(array)} constant: it is watched by "
                                  "this tape, and a constant's gradient would silently be 0")
        if known is not None and known.kind == "produced":
            raise ValidationError(
                f"cannot declare {describe(array)} constant: it holds a value produced by a "
                "recorded runtime op of this tape, and reading it as a constant would silently "
                "cut the gradients' paths through it")
        self.declare_constant(array)

    def _holds(self, key, array):
        """This tape's own entry for ``array``'s buffer if the buffer still holds its value."""
        entry = self.table.get(key)
        if entry is not None and _unchanged(array, entry.value):
            return entry
        return None

    def backward(self, output, cotangent) -> None:
        """Reverse mode from ``output`` seeded with ``cotangent``; replaces earlier gradients."""
        self._check_thread()
        if not self.ended:
            raise ValidationError("backward needs an ended tape: call kina_tape_end first")
        entry = self.table.get(buffer_key(output))
        if entry is None or entry.kind not in ("produced", "watched"):
            raise ValidationError(f"backward of {describe(output)}, which this tape never "
                                  "produced or watched")
        if not _unchanged(output, entry.value):
            raise TapeError(f"backward: {describe(output)} was overwritten after the tape "
                            "recorded it")
        if tuple(cotangent.shape) != tuple(output.shape):
            raise ValidationError(f"backward: cotangent of shape {list(cotangent.shape)} for an "
                                  f"output of shape {list(output.shape)}")
        seed = array_module(cotangent).array(cotangent, copy=True)
        keys = list(self._watched)
        # seen_by: a value a nested tape produced (one now ended or stale, whose
        # boxes are finished) is what this tape recorded for it, or a constant
        grads = self.tape.gradient(seen_by(self.tape, entry.tensor), [self._watched[k] for k in keys], seed)
        self._gradients = dict(zip(keys, grads))

    def grad(self, watched, out) -> None:
        """Write the last backward's gradient for the ``watched`` buffer into ``out``."""
        self._check_thread()
        key = buffer_key(watched)
        if key not in self._watched:
            raise ValidationError(f"grad of {describe(watched)}, which this tape does not watch")
        if self._gradients is None:
            raise ValidationError("grad before backward: call kina_tape_backward first")
        if tuple(out.shape) != tuple(watched.shape):
            raise ValidationError(f"grad: out has shape {list(out.shape)}, the watched buffer "
                                  f"{list(watched.shape)}")
        g = self._gradients[key]
        parent = self.parent
        if parent is not None and parent.recording:
            parent.record(out, g)       # an outer tape sees the gradient as what it is
        else:
            out[...] = array_module(out).asarray(_raw(g))

    def free(self) -> None:
        if self.stale:          # nothing left to release, from any thread
            return
        self._check_thread()
        if self.recording:
            self.end()
        self.table.clear()
        self._watched.clear()
        self._gradients = None

    def _require_recording(self, what):
        if not self.recording:
            raise ValidationError(f"{what} needs a recording tape (after begin, before end)")
