"""Reverse mode: the Tape, a handler whose clauses record primitives.

A :class:`Tape` is a handler of tail-resumptive ``fun`` clauses, one per
primitive of the op table.  A clause looks at the arguments: if none is one of
*its own* boxes it performs the primitive again (outer handlers see it,
nothing is recorded).  Otherwise it unwraps its boxes, performs the primitive
on the values one level out (an enclosing trace records *that*), records one
node and answers with a new box.  No fiber switch on the hot path.

``Tape.gradient`` walks the nodes backwards in a plain loop.  The rules are
written against an operation namespace: the recordable one when an enclosing
trace may be watching (grad of grad, jvp of grad), the raw kernels otherwise
(:data:`BACKWARD_OBSERVED`): the first-order fast path performs no effects.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as _np

from .. import fibers
from ..errors import KinaTypeError, ValidationError
from ..handlers import Effect, Handler, perform
from .primitives import COMPLEX_REFUSAL, PRIMITIVES, bump_generation, registry_generation
from .tensor import (Tensor, _box, _lift, _lift_operand, _new, _raw, _shape, array_module, kernels,
                     recordable)

__all__ = ["Tape", "BACKWARD_OBSERVED", "observe_backward", "ops_for_backward",
           "COMPLEX_REFUSAL", "is_complex", "own", "register_clauses", "as_input",
           "compiled_recording", "seen_by"]

_pymax = max
_speedups = fibers.speedups

# --- observing the backward pass -----------------------------------------------------

#: Performed once per backward pass.  Its default answers False: nobody outside
#: wants to see the pass, which then runs on the raw kernels (fast path).  Live
#: tapes and jvp traces answer True (their values may flow through the pass:
#: that is how grad of grad works), and so does :func:`observe_backward`.
BACKWARD_OBSERVED = Effect("kina_fx.autograd.backward_observed")
setattr(BACKWARD_OBSERVED, "default", lambda: False)


def _yes():
    return True


def observe_backward() -> Handler:
    """A handler making backward passes perform their primitives, so handlers
    installed around it (op loggers, FLOP counters, casts) see them too::

        with Handler(fun={effect_of("matmul"): count}), observe_backward():
            g = grad(loss)(w)
    """
    return Handler(fun={BACKWARD_OBSERVED: _yes})


def ops_for_backward():
    """The namespace a backward pass runs its rules on now."""
    return recordable if perform(BACKWARD_OBSERVED) else kernels


# --- complex numbers are refused ---------------------------------------------------------

def is_complex(v: Any) -> bool:
    c = v.__class__
    if c is float or c is int:
        return False
    if c is complex:
        return True
    dt = getattr(v, "dtype", None)
    return dt is not None and dt.kind == "c"


def _refuse_complex(prim):
    raise KinaTypeError(f"{COMPLEX_REFUSAL} (a complex operand of {prim.name} meets a "
                        "traced value)")


# --- the tape ---------------------------------------------------------------------------

_tags = itertools.count(1)


class Tape:
    """A reverse-mode trace.  Use it directly or through ``grad``/``vjp``::

        with Tape() as t:
            x = t.watch(x0)
            y = (x * x).sum()
        dx, = t.gradient(y, [x])

    While the ``with`` block runs, the tape's handler intercepts every
    primitive; ops on its own boxes are recorded, the rest pass through.
    """

    def __init__(self, name: str | None = None):
        self.tag = next(_tags)
        self.name = name or f"tape{self.tag}"
        self._nodes: list = []   # (rule, out_id, in_ids, u, v, out, prim): see _backward
        self._n = 0              # ids handed out so far
        self._leaves: dict = {}  # id -> (name or None, value), for watched values
        self._live = False
        self._handler: Any = None

    def __repr__(self):
        return f"<Tape {self.name} nodes={len(self._nodes)}{' live' if self._live else ''}>"

    # -- recording --
    def __enter__(self) -> "Tape":
        if self._live:
            raise ValidationError(f"{self!r} is already recording")
        return _tape_pool.enter(self)

    def __exit__(self, *exc: Any) -> None:
        _tape_pool.exit(self, exc)

    def abandon(self) -> None:
        """The handler stack this tape records on is gone (the fiber it began
        on ended while it recorded, :class:`~kina_fx.autograd.memory.MemoryTape`):
        it never records again, and its boxes are finished ones (what they
        hold one level out is what counts)."""
        self._live = False
        self._handler = None

    def _record(self, rule, ids, u, v, out, prim) -> Tensor:
        """Append the node ``(rule, id of out, ids, u, v, out, prim)`` (see
        :meth:`_backward`) and return ``out``'s box.  The hottest clauses
        (:func:`_elementwise_factory` and its siblings) inline it."""
        i = self._n
        self._n = i + 1
        self._nodes.append((rule, i, ids, u, v, out, prim))
        return _box(out, self, i)

    def watch(self, x, name: str | None = None) -> Tensor:
        """A box of this tape for ``x`` (array, scalar or Tensor): the values
        gradients can be taken with respect to.

        A plain (untraced) Tensor is watched in place, as TensorFlow's
        ``tape.watch(x)``: ``x`` itself becomes the box (and goes back to
        acting as a plain Tensor when the tape finishes), and so is one a
        finished tape watched.  Arrays, scalars and every other Tensor get a
        new box, which is returned: a finished tape's result stays that
        tape's, so its gradients after it finished stay right."""
        if x.__class__ is Tensor and self._live and _adoptable(x):
            v = _lift(x)
            if v.__class__ is not Tensor:          # plain all the way down: adopt
                as_input(v)                        # (type checks)
                i = self._n
                self._n = i + 1
                self._leaves[i] = (name, v)
                x._value = v
                x._trace = self
                x._id = i
                return x
        return self._watch(x, name)

    def _watch(self, x, name=None):
        if x.__class__ is Tensor and x._trace is self:
            x = x._value
        x = as_input(x)
        i = self._n
        self._n = i + 1
        self._leaves[i] = (name, x)
        return _box(x, self, i)

    # -- the backward pass --
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None) -> Any:
        """Gradients of ``target`` (a box or a list of boxes of this tape) with
        respect to ``sources`` (a box or a list of boxes).  ``output_gradients``
        are the cotangents of the targets (default: ones).  A source the
        targets do not depend on gets zeros.  Returns a list when ``sources``
        is a list or tuple, else one value; values are one level in (arrays,
        or boxes of an enclosing trace)."""
        single = not isinstance(sources, (list, tuple))
        srcs = [sources] if single else list(sources)
        targets = target if isinstance(target, (list, tuple)) else [target]
        if output_gradients is None:
            seeds = [None] * len(targets)
        else:
            seeds = output_gradients if isinstance(target, (list, tuple)) \
                else [output_gradients]
        grads = [None] * self._n
        for t, s in zip(targets, seeds):
            t = _target_of(self, t)
            if t.__class__ is not Tensor:
                continue          # a constant target: contributes nothing
            if s is None:
                v = _raw(t)
                s = array_module(v).ones(_shape(v), dtype=getattr(v, "dtype", None))
            elif s.__class__ is Tensor:
                s = _lift(s)
            j = t._id
            grads[j] = s if grads[j] is None else recordable.add(grads[j], s)
        self._backward(grads, ops_for_backward())
        out = []
        for x in srcs:
            if x.__class__ is not Tensor or x._trace is not self:
                raise ValidationError("gradient sources must be boxes of this tape "
                                      "(values returned by tape.watch or made on it)")
            g = grads[x._id]
            if g is None:
                v = _raw(x)
                g = array_module(v).zeros(_shape(v), dtype=getattr(v, "dtype", None))
            out.append(g)
        return out[0] if single else out

    def _backward(self, grads, o):
        # A plain loop over the recorded nodes, newest first.  A node is
        # (rule, out_id, in_ids, u, v, out, prim).  One-input nodes have an int
        # ``in_ids`` and ``rule(o, g, out, u[, v])`` returns its cotangent:
        # elementwise primitives (u = x, v = None), primitives with parameters
        # (u = x, v = the parameters) and binary ones with one traced operand
        # (u, v = a, b).  The others have a tuple of ids (-1: constant), u, v =
        # arrays, parameters, and ``rule(o, g, out, u, v, ids)`` returns one
        # cotangent per id.
        nodes = reversed(self._nodes)
        if o is not kernels:
            # Observed: the rules' ops are recorded by the traces running now.
            # A value recorded one level out may be a box of a trace that has
            # finished since (an enclosing tape ended before this gradient):
            # what it holds now is what those traces see.
            nodes = ((rule, oid, ids, _now(u), _now(v), _now(out), prim)
                     for rule, oid, ids, u, v, out, prim in nodes)
        for rule, oid, ids, u, v, out, _ in nodes:
            g = grads[oid]
            if g is None:
                continue
            if ids.__class__ is int:
                ct = rule(o, g, out, u) if v is None else rule(o, g, out, u, v)
                prev = grads[ids]
                grads[ids] = ct if prev is None else o.add(prev, ct)
                continue
            for j, ct in zip(ids, rule(o, g, out, u, v, ids)):
                if j >= 0 and ct is not None:
                    prev = grads[j]
                    grads[j] = ct if prev is None else o.add(prev, ct)

    # -- drawing --
    def to_dot(self, name: str = "tape") -> str:
        """The recorded graph in Graphviz DOT: one ellipse per value
        (watched inputs filled), one box per primitive application."""
        lines = [f"digraph {name} {{", "  rankdir=LR;",
                 "  node [fontname=\"Helvetica\", fontsize=10];"]

        def label(v):
            v = _raw(v)
            return f"{tuple(_shape(v))} {getattr(v, 'dtype', type(v).__name__)}"

        for k, (i, (leaf, value)) in enumerate(self._leaves.items()):
            leaf = leaf or f"x{k}"
            lines.append(f"  v{i} [label=\"{leaf}\\n{label(value)}\", shape=ellipse, style=filled, "
                         f"fillcolor=lightblue];")
        for k, (rule, oid, ids, u, v, out, prim) in enumerate(self._nodes):
            lines.append(f"  op{k} [label=\"{prim.name}\", shape=box];")
            lines.append(f"  v{oid} [label=\"{label(out)}\", shape=ellipse];")
            for j in ((ids,) if ids.__class__ is int else ids):
                if j >= 0:
                    lines.append(f"  v{j} -> op{k};")
            lines.append(f"  op{k} -> v{oid};")
        lines.append("}")
        return "\n".join(lines) + "\n"


def seen_by(tape, value):
    """``value`` as ``tape`` sees it: a box of a trace nested in ``tape`` (running
    or finished) holds its value one level out, so boxes of other traces are
    lifted until a box of ``tape`` or a value no trace of ``tape`` follows."""
    while value.__class__ is Tensor and value._trace is not tape:
        value = value._value
    return value


def _target_of(tape, target):
    """A gradient target as ``tape`` sees it (:func:`seen_by`), refused as an
    operand of a recorded op is (:func:`~kina_fx.autograd.tensor._lift_operand`)
    when what ``tape`` would see is a finished trace's value that no running
    trace follows: taken for a constant it would silently cut the gradient
    paths it stood for."""
    v = seen_by(tape, target)
    if v.__class__ is not Tensor and target.__class__ is Tensor:
        _lift_operand(target, tape)
    return v


def _now(value):
    """A recorded value as the running traces see it now: boxes of finished
    traces lifted to what they hold (:func:`_lift`), tuples item by item."""
    c = value.__class__
    if c is Tensor:
        return _lift(value)
    if c is tuple:
        return tuple([_now(v) for v in value])
    return value


def _adoptable(x) -> bool:
    """Whether ``watch`` may make Tensor ``x`` itself its box: ``x`` is plain, or
    a value a finished tape watched (a leaf: no node of that tape is its
    output, so nothing that tape computes later reads it)."""
    tr = x._trace
    if tr is None:
        return True
    leaves = getattr(tr, "_leaves", None)
    return not tr._live and leaves is not None and x._id in leaves


def as_input(x: Any) -> Any:
    """A leaf passed to a transform (or watched), as the value its box will hold."""
    if x.__class__ is _np.ndarray and x.dtype.kind == "f":
        return x            # the common leaf, as the checks below would return it
    if x.__class__ is Tensor:
        x = _lift(x)
        if x.__class__ is Tensor:
            return x
    if isinstance(x, bool) or (hasattr(x, "dtype") and x.dtype.kind == "b"):
        raise KinaTypeError("cannot differentiate with respect to a bool")
    if isinstance(x, complex) or is_complex(x):
        raise KinaTypeError(COMPLEX_REFUSAL)
    if isinstance(x, (int, float)):
        return _np.asarray(x, dtype=_np.float64)
    if isinstance(x, _np.generic):
        x = _np.asarray(x)
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        if x.dtype.kind != "f":
            raise KinaTypeError(f"cannot differentiate with respect to dtype {x.dtype} "
                                "(use a floating-point array)")
        return x
    if isinstance(x, (list, tuple)):
        from .tensor import _as_array
        return as_input(_as_array(x) if x else _np.asarray(x, dtype=_np.float64))
    raise KinaTypeError(f"cannot trace a value of type {type(x).__name__}")


# --- clauses ------------------------------------------------------------------------------


def own(tape, x):
    """(id, inner value) for an argument of a primitive seen by ``tape``."""
    if x.__class__ is Tensor:
        tr = x._trace
        if tr is tape:
            return x._id, x._value
        if tr is None or not tr._live:
            x = _lift_operand(x, tape)
            if x.__class__ is Tensor and x._trace is tape:
                return x._id, x._value
    return -1, x


class _Recorder:
    """What a pooled handler's clauses read: the trace now using it."""

    __slots__ = ("tape",)

    def __init__(self, tape=None):
        self.tape = tape


class _Pool:
    """Finished traces' handlers, kept while the op table does not change.

    Handlers are pooled: building one (a clause per primitive) costs more
    than a small function's whole forward pass.  A pooled handler's clauses
    read the trace from its _Recorder, so a box of an earlier trace never
    passes for one of this trace (boxes name their trace).  ``build()`` makes
    a new ``(handler, recorder)``; tapes and jvp traces have a pool each.
    """

    def __init__(self, build):
        self.build = build
        self.items = []
        self.generation = -1

    def enter(self, trace):
        """Install a handler recording on ``trace`` (its ``__enter__``)."""
        if self.generation != registry_generation():
            self.items = []
            self.generation = registry_generation()
        trace._handler = self.items.pop() if self.items else self.build()
        handler, rec = trace._handler
        rec.tape = trace
        handler.__enter__()
        trace._live = True
        return trace

    def exit(self, trace, exc):
        """Uninstall ``trace``'s handler and keep it (its ``__exit__``)."""
        trace._live = False
        handler, rec = trace._handler
        trace._handler = None
        handler.__exit__(*exc)
        rec.tape = None
        if self.generation == registry_generation() and len(self.items) < 64:
            self.items.append((handler, rec))


def extra_clauses():
    """Clauses every trace's handler has besides one per primitive (effect ->
    (make_tape_clause, make_jvp_clause)): see :func:`register_clauses`."""
    return _EXTRA


_EXTRA: dict = {}


def register_clauses(effect: Effect, make_tape_clause: Callable,
                     make_jvp_clause: Callable) -> None:
    """Give every tape and jvp trace a clause for ``effect`` (not a primitive
    of the table: :mod:`kina_fx.autograd.custom` uses it for custom_vjp and
    custom_jvp calls).  ``make_*_clause(rec)`` builds the clause of one
    handler; ``rec.tape`` is the trace using it."""
    _EXTRA[effect] = (make_tape_clause, make_jvp_clause)
    bump_generation()


def _new_tape_handler():
    rec = _Recorder()
    fun = {p.effect: clause_factory(p)(rec) for p in PRIMITIVES.values()}
    for eff, (make_tape, _) in _EXTRA.items():
        fun[eff] = make_tape(rec)
    fun[BACKWARD_OBSERVED] = _yes
    return Handler(fun=fun), rec


_tape_pool = _Pool(_new_tape_handler)


_factories: dict = {}


def clause_factory(prim):
    """``make(rec) -> clause`` for one primitive, built once; a clause records
    on ``rec.tape``."""
    factory = _factories.get(prim)
    if factory is None:
        nodes = compiled_recording(prim)
        if prim.sequence:
            factory = _sequence_factory(prim)
        elif nodes is not None and nodes[0] == 1:
            factory = _elementwise_factory(prim, nodes[1])
        elif prim.nin == 1 and prim.diff == (True,):
            factory = _unary_factory(prim, _params_adapter(prim.vjp_rules[0]))
        elif nodes is not None:
            factory = _binary_factory(prim)
        else:
            factory = _general_factory(prim)
        _factories[prim] = factory
    return factory


def compiled_recording(prim):
    """``(inputs, rule, rule_a, rule_b)`` when ``prim`` records a binary node
    (``rule`` = ``prim.vjp``, then ``prim.vjp_rules``: :func:`_binary_factory`)
    or an elementwise one (one input, ``rule`` its rule, the others None:
    :func:`_elementwise_factory`), else None.  :func:`clause_factory` picks
    those two factories by it, and the compiled tape clause of the runtime
    ops (``kina_fx/_speedups_c/tape_calls.c``) builds the same node tuples
    from it."""
    if prim.sequence or prim.nparams != 0:
        return None
    if prim.nin == 1 and prim.diff == (True,):
        return (1, prim.vjp_rules[0], None, None)
    if prim.nin == 2 and prim.diff == (True, True):
        return (2, prim.vjp, *prim.vjp_rules)
    return None


def _params_adapter(rule):
    def node_rule(o, g, out, x, params):
        return rule(o, g, out, x, *params)
    node_rule.__name__ = getattr(rule, "__qualname__", "rule")
    return node_rule


def _elementwise_factory(prim, rule):
    # This clause and _binary_factory's are transcribed in C
    # (kina_fx/_speedups_c/tape_clauses.c, wrapped by _compiled_clause):
    # a change to either needs the matching change there.
    eff = prim.effect

    def make(rec):
        def clause(x):
            if x.__class__ is Tensor:
                tape = rec.tape
                if x._trace is not tape:
                    tr = x._trace
                    if tr is not None and tr._live:
                        return perform(eff, x)     # an enclosing trace's box
                    x = _lift_operand(x, tape)     # a plain Tensor or a finished trace's box
                    if x.__class__ is not Tensor or x._trace is not tape:
                        return perform(eff, x)
                v = x._value
                out = perform(eff, v)
                i = tape._n
                tape._n = i + 1
                tape._nodes.append((rule, i, x._id, v, None, out, prim))
                # the box built inline, not by _box: the hottest clause (tanh,
                # exp, ...), one call less per op; _binary_factory's likewise
                b = _new(Tensor)
                b._value = out
                b._trace = tape
                b._id = i
                return b
            return perform(eff, x)
        return _compiled_clause(clause, rec, (1, eff, prim, rule, None, None, None, None, Tensor))
    return make


def _unary_factory(prim, rule):
    eff = prim.effect

    def make(rec):
        def clause(x, *params):
            if x.__class__ is Tensor:
                tape = rec.tape
                tr = x._trace
                if tr is not tape and (tr is None or not tr._live):
                    x = _lift_operand(x, tape)
                    tr = x._trace if x.__class__ is Tensor else None
                if tr is tape:
                    v = x._value
                    out = perform(eff, v, *params)
                    i = tape._n
                    tape._n = i + 1
                    tape._nodes.append((rule, i, x._id, v, params, out, prim))
                    return _box(out, tape, i)
            return perform(eff, x, *params)
        return clause
    return make


def _binary_factory(prim):
    eff = prim.effect
    rule = prim.vjp
    rule_a, rule_b = prim.vjp_rules
    # The other operand a Python float or int: the traced one has the
    # result's shape, nothing was broadcast, and the node takes the
    # elementwise rule itself, one frame fewer in backward (y * 1.5).
    scalar_a, scalar_b = prim.unbroadcast_vjp_rules

    def make(rec):
        def clause(a, b):
            tape = rec.tape
            ia = ib = -1
            if a.__class__ is Tensor:
                ia, a = (a._id, a._value) if a._trace is tape else own(tape, a)
            if b.__class__ is Tensor:
                ib, b = (b._id, b._value) if b._trace is tape else own(tape, b)
            out = perform(eff, a, b)
            i = tape._n
            if ia < 0 or ib < 0:
                if ia < 0 and ib < 0:
                    return out
                # one traced operand (id j) and a constant
                if ib < 0:
                    j, constant, one_rule, scalar_rule = ia, b, rule_a, scalar_a
                else:
                    j, constant, one_rule, scalar_rule = ib, a, rule_b, scalar_b
                c = constant.__class__
                if c is float or c is int:
                    one_rule = scalar_rule
                elif is_complex(constant):
                    _refuse_complex(prim)
                tape._nodes.append((one_rule, i, j, a, b, out, prim))
            else:
                tape._nodes.append((rule, i, (ia, ib), (a, b), (), out, prim))
            tape._n = i + 1
            r = _new(Tensor)
            r._value = out
            r._trace = tape
            r._id = i
            return r
        return _compiled_clause(clause, rec, (2, eff, prim, rule, rule_a, rule_b, scalar_a, scalar_b, Tensor))
    return make


def _compiled_clause(clause, rec, spec):
    """``clause`` (the reference) wrapped in its compiled form, which records
    the common case itself (``kina_fx/_speedups_c/tape_clauses.c`` says
    which), or ``clause`` itself in pure Python.  ``spec``: (inputs, the
    effect, the primitive, its rule, the binary rules for input a and b and
    their scalar forms, the Tensor class), as the C file's SPEC_* name them."""
    make = getattr(_speedups, "TapeClause", None)
    return clause if make is None else make(clause, rec, spec)


def _general_factory(prim):
    eff, rule, nin, diff = prim.effect, prim.vjp, prim.nin, prim.diff

    def make(rec):
        def clause(*args):
            tape = rec.tape
            ids = []
            inner = list(args)
            for k in range(nin):
                i, inner[k] = own(tape, args[k])
                ids.append(i if diff[k] else -1)
            out = perform(eff, *inner)
            if _pymax(ids) < 0:
                return out
            for k in range(nin):
                if ids[k] < 0 and is_complex(inner[k]):
                    _refuse_complex(prim)
            return tape._record(rule, tuple(ids), tuple(inner[:nin]), tuple(inner[nin:]), out,
                                prim)
        return clause
    return make


def _sequence_factory(prim):
    eff, rule, diff = prim.effect, prim.vjp, prim.diff[0]

    def make(rec):
        def clause(xs, *params):
            tape = rec.tape
            ids = []
            inner = []
            for x in xs:
                i, v = own(tape, x)
                ids.append(i if diff else -1)
                inner.append(v)
            inner = tuple(inner)
            out = perform(eff, inner, *params)
            if not ids or _pymax(ids) < 0:
                return out
            for i, v in zip(ids, inner):
                if i < 0 and is_complex(v):
                    _refuse_complex(prim)
            return tape._record(rule, tuple(ids), (inner,), params, out, prim)
        return clause
    return make
