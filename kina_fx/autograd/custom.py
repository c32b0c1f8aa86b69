"""Defining your own differentiable functions, in JAX's style and in HIPS autograd's.

* :func:`primitive` / :func:`defvjp` / :func:`defjvp` (HIPS autograd): a new
  primitive of the op table.  Its function runs on raw arrays and is never
  traced; its rules get the values one level out, so they apply at every
  level of nesting and may themselves be differentiated.
* :class:`custom_vjp` / :class:`custom_jvp` (JAX): a function written with
  kina_fx operations, with a rule replacing its derivative in the trace that
  differentiates it.  Enclosing traces differentiate the rule (and, for
  custom_vjp, the forward function) as ordinary code, as JAX does.
"""
from __future__ import annotations

import itertools
from typing import Callable

from ..errors import KinaTypeError, ValidationError
from ..handlers import Effect, perform
from .primitives import PRIMITIVES, op
from .tape import Tape, own, register_clauses
from .tensor import Tensor, _lift, _plain, _raw, _shape, array_module

__all__ = ["primitive", "defvjp", "defjvp", "custom_vjp", "custom_jvp"]

_counter = itertools.count()


# --- HIPS autograd style: primitive, defvjp, defjvp -------------------------------------


class _Rules:
    """The rules defvjp/defjvp give a user primitive, by argument position."""

    def __init__(self, name):
        self.name = name
        self.vjps = {}
        self.jvps = {}

    def _rule(self, rules, kind, i):
        try:
            return rules[i]
        except KeyError:
            raise KinaTypeError(f"primitive {self.name}: no {kind} for argument {i} "
                                f"(give one with def{kind.lower()})") from None

    def vjp(self, i, out, args, kwargs, g):
        maker = self._rule(self.vjps, "VJP", i)
        if maker is None:           # declared without derivative: zero cotangent
            return _zeros_for(args[i])
        return maker(out, *args, **kwargs)(g)

    def jvp(self, i, t, out, args, kwargs):
        fn = self._rule(self.jvps, "JVP", i)
        if fn is None:
            return None
        return fn(t, out, *args, **kwargs)


def _zeros_for(x):
    v = _raw(x)
    return array_module(v).zeros(_shape(v), dtype=getattr(v, "dtype", None))


def primitive(fn: Callable) -> Callable:
    """Make ``fn`` a primitive, as HIPS autograd's ``primitive``: ``fn`` is called
    on raw arrays (never traced); give its derivatives with :func:`defvjp` and
    :func:`defjvp`.  Every positional argument may be an array; keyword
    arguments are static parameters.  Returns the public function (also
    registered in ``PRIMITIVES`` under ``"custom.<qualname>"``)."""
    base = "custom." + getattr(fn, "__qualname__", getattr(fn, "__name__", "fn"))
    name = base
    while name in PRIMITIVES:
        name = f"{base}#{next(_counter)}"
    rules = _Rules(name)

    def kernel(args, kwargs):
        return fn(*args, **kwargs)

    def prepare(*args, **kwargs):
        return args, kwargs

    def vjp_args(o, g, out, i, args, kwargs):
        return rules.vjp(i, out, args, kwargs, g)

    def jvp_args(o, t, out, i, args, kwargs):
        part = rules.jvp(i, t, out, args, kwargs)
        return o.mul(out, 0.0) if part is None else part

    block = type(name, (), {"kernel": staticmethod(kernel), "prepare": staticmethod(prepare),
                            "vjp_args": staticmethod(vjp_args),
                            "jvp_args": staticmethod(jvp_args), "__doc__": fn.__doc__,
                            "__module__": getattr(fn, "__module__", __name__)})
    for k in ("kernel", "prepare", "vjp_args", "jvp_args"):    # plain functions for op()
        setattr(block, k, vars(block)[k].__func__)
    public = op(name=name, sequence=True)(block)
    public.__name__ = getattr(fn, "__name__", name)
    public.__qualname__ = getattr(fn, "__qualname__", name)
    public.__wrapped__ = fn
    public.rules = rules
    return public


def _rules_of(f):
    rules = getattr(f, "rules", None)
    if not isinstance(rules, _Rules):
        raise KinaTypeError(f"{getattr(f, '__name__', f)!r} is not a primitive made by "
                            "kina_fx.autograd.primitive")
    return rules


def defvjp(f: Callable, *vjpmakers, argnums=None) -> None:
    """HIPS autograd's ``defvjp``: ``vjpmakers[k](ans, *args, **kwargs)`` returns
    ``g -> cotangent`` of argument ``argnums[k]`` (default: 0, 1, ...); a
    maker of None declares that argument's cotangent zero."""
    rules = _rules_of(f)
    argnums = range(len(vjpmakers)) if argnums is None else argnums
    for i, maker in zip(argnums, vjpmakers):
        rules.vjps[i] = maker


def defjvp(f: Callable, *jvpfuns, argnums=None) -> None:
    """HIPS autograd's ``defjvp``: ``jvpfuns[k](g, ans, *args, **kwargs)`` is the
    output tangent's part from argument ``argnums[k]``'s tangent ``g``; None
    declares it zero."""
    rules = _rules_of(f)
    argnums = range(len(jvpfuns)) if argnums is None else argnums
    for i, fn in zip(argnums, jvpfuns):
        rules.jvps[i] = fn


# --- JAX style: custom_vjp, custom_jvp ----------------------------------------------------

CUSTOM_VJP_CALL = Effect("kina_fx.autograd.custom_vjp_call")
CUSTOM_JVP_CALL = Effect("kina_fx.autograd.custom_jvp_call")


def _call_default(fn, args):
    return fn.fun(*args)


setattr(CUSTOM_VJP_CALL, "default", _call_default)
setattr(CUSTOM_JVP_CALL, "default", _call_default)


class _Custom:
    def __init__(self, fun, nondiff_argnums):
        self.fun = fun
        self.nondiff = frozenset(nondiff_argnums)
        self.name = getattr(fun, "__name__", "f")
        self.__name__ = self.name
        self.__doc__ = fun.__doc__
        self.__wrapped__ = fun

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"

    def _perform(self, effect, args):
        wrap = any(a.__class__ is Tensor for a in args)
        r = perform(effect, self, args)
        return r if r.__class__ is Tensor or not wrap else _plain(r)


class custom_vjp(_Custom):
    """A function with a custom reverse-mode rule, as JAX's ``jax.custom_vjp``::

        @custom_vjp
        def f(x, y): ...
        def f_fwd(x, y): return f(x, y), residuals
        def f_bwd(residuals, g): return (g_x, g_y)    # one per differentiable argument
        f.defvjp(f_fwd, f_bwd)

    ``f`` returns one array.  Where a trace differentiates ``f`` it calls
    ``f_fwd`` and, in the backward pass, ``f_bwd``; traces enclosing that one
    differentiate ``f_fwd`` and ``f_bwd`` as ordinary code (so grad of grad
    works when they are written with kina_fx operations).  Forward mode
    (``jvp``) of a custom_vjp function is a ``KinaTypeError``, as in JAX.
    ``nondiff_argnums``: positions of static arguments (passed to ``f_bwd``
    first, as JAX does, and getting no cotangent)."""

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.fwd = self.bwd = None

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args):
        if self.fwd is None:
            raise KinaTypeError(f"custom_vjp function {self.name}: call defvjp(fwd, bwd) "
                                "before using it")
        return self._perform(CUSTOM_VJP_CALL, args)


class custom_jvp(_Custom):
    """A function with a custom forward-mode rule, as JAX's ``jax.custom_jvp``::

        @custom_jvp
        def f(x): ...
        @f.defjvp
        def f_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return f(x), rule(x) * t          # the tangent must be linear in tangents

    Reverse mode uses the same rule, transposed: the cotangent is the gradient
    of ``<g, tangent_out>`` with respect to the tangents, so the rule must be
    linear in them (as JAX requires).  Zero tangents are passed as zero arrays.
    ``nondiff_argnums``: positions of static arguments (passed to the rule
    first, as JAX does)."""

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.jvp = None

    def defjvp(self, jvp: Callable) -> Callable:
        self.jvp = jvp
        return jvp

    def __call__(self, *args):
        if self.jvp is None:
            raise KinaTypeError(f"custom_jvp function {self.name}: call defjvp(rule) "
                                "before using it")
        return self._perform(CUSTOM_JVP_CALL, args)


def _split(fn, values):
    """(static arguments, differentiable arguments) in call order."""
    static = tuple(v for i, v in enumerate(values) if i in fn.nondiff)
    diff = tuple(v for i, v in enumerate(values) if i not in fn.nondiff)
    return static, diff


def _check_shape(what, value, like):
    if tuple(_shape(_raw(value))) != tuple(_shape(_raw(like))):
        raise ValidationError(f"{what} has shape {tuple(_shape(_raw(value)))}, expected "
                              f"{tuple(_shape(_raw(like)))}")


class _Node:
    """What to_dot shows for a custom call's node."""

    def __init__(self, name):
        self.name = name


def _owned(tape, fn, args):
    ids, inner = [], []
    for i, a in enumerate(args):
        j, v = own(tape, a)
        ids.append(j if i not in fn.nondiff else -1)
        inner.append(v)
    return ids, tuple(inner)


# custom_vjp under a tape: f_fwd on the values one level out, f_bwd backwards.

def _per_argument(fn, nargs, cts):
    """The cotangents ``cts`` of the differentiable arguments of ``fn`` as
    one per argument (None for those in ``fn.nondiff``)."""
    it = iter(cts)
    return [None if i in fn.nondiff else next(it) for i in range(nargs)]


def _vjp_rule(fn, residuals):
    def rule(o, g, out, args, params, ids):
        static, _ = _split(fn, args)
        cts = fn.bwd(*static, residuals, g)
        if not isinstance(cts, (tuple, list)):
            raise KinaTypeError(f"custom_vjp {fn.name}: bwd must return a tuple (one "
                                f"cotangent per differentiable argument), got "
                                f"{type(cts).__name__}")
        ndiff = len(args) - len(static)
        if len(cts) != ndiff:
            raise ValidationError(f"custom_vjp {fn.name}: bwd returned {len(cts)} "
                                  f"cotangents for {ndiff} differentiable arguments")
        full = _per_argument(fn, len(args), cts)
        for i, (a, ct) in enumerate(zip(args, full)):
            if ids[i] >= 0 and ct is not None:
                _check_shape(f"custom_vjp {fn.name}: the cotangent of argument {i}", ct, a)
        return full
    return rule


def _custom_vjp_tape_clause(rec):
    def clause(fn, args):
        tape = rec.tape
        ids, inner = _owned(tape, fn, args)
        if max(ids, default=-1) < 0:
            return perform(CUSTOM_VJP_CALL, fn, inner)
        res = fn.fwd(*inner)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise KinaTypeError(f"custom_vjp {fn.name}: fwd must return (output, "
                                "residuals)")
        out, residuals = res
        out = _lift(out) if out.__class__ is Tensor else out
        return tape._record(_vjp_rule(fn, residuals), tuple(ids), inner, (), out,
                            _Node(f"custom_vjp {fn.name}"))
    return clause


def _custom_vjp_jvp_clause(rec):
    def clause(fn, args):
        trace = rec.tape
        for a in args:
            if a.__class__ is Tensor:
                v = a if a._trace is trace else _lift(a)
                if v.__class__ is Tensor and v._trace is trace:
                    raise KinaTypeError(
                        f"forward mode (jvp) of the custom_vjp function {fn.name}: a "
                        "custom_vjp function has no forward rule (as in JAX); use "
                        "custom_jvp or reverse mode")
        return perform(CUSTOM_VJP_CALL, fn, args)
    return clause


# custom_jvp: the rule in forward mode; transposed in reverse mode.

def _tangent_zeros(x):
    v = _raw(x)
    dtype = getattr(v, "dtype", None)
    if dtype is None or dtype.kind != "f":
        dtype = None
    return array_module(v).zeros(_shape(v), dtype=dtype)


def _custom_jvp_jvp_clause(rec):
    def clause(fn, args):
        trace = rec.tape
        inner, tangents, mine = [], [], False
        for a in args:
            if a.__class__ is Tensor:
                v = a if a._trace is trace else _lift(a)
                if v.__class__ is Tensor and v._trace is trace:
                    inner.append(v._value)
                    tangents.append(v._tangent)
                    mine = True
                    continue
                a = v
            inner.append(a)
            tangents.append(None)
        if not mine:
            return perform(CUSTOM_JVP_CALL, fn, tuple(inner))
        tangents = [_tangent_zeros(x) if t is None else t for x, t in zip(inner, tangents)]
        static, primals = _split(fn, inner)
        _, dtangents = _split(fn, tangents)
        res = fn.jvp(*static, primals, dtangents)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise KinaTypeError(f"custom_jvp {fn.name}: the rule must return "
                                "(primal_out, tangent_out)")
        out, tout = res
        out = _lift(out) if out.__class__ is Tensor else out
        _check_shape(f"custom_jvp {fn.name}: the tangent output", tout, out)
        return trace.dual(out, tout)
    return clause


def _transposed_jvp_rule(fn):
    def rule(o, g, out, args, params, ids):
        static, primals = _split(fn, args)
        with Tape() as t:
            boxes = [t.watch(_tangent_zeros(x)) if ids[i] >= 0 else _tangent_zeros(x)
                     for i, x in enumerate(args) if i not in fn.nondiff]
            _, tout = fn.jvp(*static, primals, tuple(boxes))
        watched = [b for b in boxes if b.__class__ is Tensor and b._trace is t]
        cts = iter(t.gradient(tout, watched, g) if watched else [])
        return _per_argument(fn, len(args), [
            next(cts) if b.__class__ is Tensor and b._trace is t else None for b in boxes])
    return rule


def _custom_jvp_tape_clause(rec):
    def clause(fn, args):
        tape = rec.tape
        ids, inner = _owned(tape, fn, args)
        out = perform(CUSTOM_JVP_CALL, fn, inner)
        if max(ids, default=-1) < 0:
            return out
        return tape._record(_transposed_jvp_rule(fn), tuple(ids), inner, (), out,
                            _Node(f"custom_jvp {fn.name}"))
    return clause


register_clauses(CUSTOM_VJP_CALL, _custom_vjp_tape_clause, _custom_vjp_jvp_clause)
register_clauses(CUSTOM_JVP_CALL, _custom_jvp_tape_clause, _custom_jvp_jvp_clause)

