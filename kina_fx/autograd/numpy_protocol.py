"""NumPy's protocols on Tensors: differentiate what has a rule, refuse the rest.

``np.tanh(t)`` and ``np.concatenate([t, u])`` reach ``Tensor.__array_ufunc__``
and ``Tensor.__array_function__``.  A NumPy function with a rule in
:data:`~kina_fx.autograd.primitives.NUMPY_RULES` (registered by the ops) runs
that rule, so it is differentiated; a function in :data:`NONDIFFERENTIABLE`
(comparisons, predicates, shapes, indices: outputs that are booleans or
integers, so there is no gradient to lose) runs on the raw values; any other
raises a ``TypeError`` naming the function -- never a silently cut gradient.
``np.asarray``/``np.array`` are not dispatched by NumPy: they call
``Tensor.__array__``, which refuses boxes of running traces.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from ..errors import KinaTypeError
from .primitives import NUMPY_RULES
from .tensor import Tensor, _raw

__all__ = ["NONDIFFERENTIABLE", "refusal_message"]


def _names(module, names):
    return {getattr(module, n) for n in names if hasattr(module, n)}


#: NumPy functions whose results carry no derivative (booleans, integers,
#: shapes): computed on the raw values of Tensors.
NONDIFFERENTIABLE = _names(np, [
    # ufuncs with boolean results
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "isfinite", "isinf", "isnan", "isnat", "signbit", "logical_and", "logical_or",
    "logical_xor", "logical_not",
    # shapes, dtypes and predicates
    "shape", "ndim", "size", "result_type", "min_scalar_type", "can_cast", "iscomplexobj",
    "isrealobj", "iscomplex", "isreal", "may_share_memory",
    "shares_memory", "isclose", "allclose", "array_equal", "array_equiv", "isneginf",
    "isposinf", "any", "all",
    # integer results: positions and counts
    "argmax", "argmin", "argsort", "argpartition", "nonzero", "flatnonzero", "argwhere",
    "count_nonzero", "searchsorted", "digitize", "lexsort", "nanargmax", "nanargmin",
])

_HINTS = {
    "add.reduce": "kina_fx.autograd.sum", "maximum.reduce": "kina_fx.autograd.max",
    "asarray": "Tensor(...) or kina_fx.autograd.stack", "array": "Tensor(...) or "
    "kina_fx.autograd.stack",
}


def refusal_message(name: str) -> str:
    hint = _HINTS.get(name)
    use = f"use {hint}, " if hint else "use a kina_fx.autograd function (docs/autograd.md has " \
        "the op table), "
    return (f"numpy.{name} has no kina_fx.autograd rule, so applying it to a Tensor would "
            f"silently lose the gradient: {use}apply it to t.data for a constant, or give it "
            "a rule with kina_fx.autograd.primitive/defvjp or custom_vjp")


def _raw_tree(v):
    if v.__class__ is Tensor:
        return _raw(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_raw_tree(x) for x in v)
    if isinstance(v, dict):
        return {k: _raw_tree(x) for k, x in v.items()}
    return v


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

#: The keywords every ufunc takes, at the values that change nothing.
_UFUNC_DEFAULTS = {"where": True, "casting": "same_kind", "order": "K", "dtype": None,
                   "subok": True, "signature": None, "keepdims": False}


#: Stand-ins with the signatures NumPy >= 2.3 gives these builtins; NumPy 2.2
#: (the last for Python 3.10) gives none, and without one a positional argument
#: would reach the rule by position (``np.concatenate(ts, 1, None)``'s ``None``
#: is ``out``, not the rule's third parameter).
_BUILTIN_SIGNATURES = {
    np.where: lambda condition, x=None, y=None, /: None,
    np.concatenate: lambda arrays, /, axis=0, out=None, *, dtype=None, casting="same_kind": None,
    np.dot: lambda a, b, out=None: None,
    np.inner: lambda a, b, /: None,
}


@functools.lru_cache(maxsize=None)
def _signature(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):     # ufuncs, and builtins without one
        stand_in = _BUILTIN_SIGNATURES.get(fn)
        return None if stand_in is None else inspect.signature(stand_in)


@functools.lru_cache(maxsize=None)
def _ufunc_defaults(ufunc) -> dict:
    """The default of each keyword of ``ufunc``: its signature's where it has
    one, else those every ufunc takes."""
    sig = _signature(ufunc) if ufunc.__class__ is np.ufunc else None
    own = {} if sig is None else {p.name: p.default for p in sig.parameters.values()
                                  if p.default is not p.empty}
    return {**_UFUNC_DEFAULTS, **own}


def _is_default(value, default):
    if value is default or value is None:
        return True
    return type(value) in (bool, str) and type(default) is type(value) and value == default


def _unsupported(name, rule, keywords):
    return KinaTypeError(
        f"numpy.{name}(..., {', '.join(k + '=...' for k in sorted(keywords))}) on a Tensor: "
        f"kina_fx.autograd.{rule.__name__} takes {inspect.signature(rule)}")


def _call_rule(func, name, rule, args, kwargs):
    """``rule`` called with what NumPy's ``func(*args, **kwargs)`` means.

    The arguments are bound to NumPy's own signature, so a positional argument
    means what it means in NumPy (``np.mean(t, 0, np.float32)``'s third one is
    ``dtype``, not the rule's ``keepdims``), then passed to the rule by name:
    a NumPy parameter the rule has by the same name, or one in the same
    position under another name (``a`` for ``x``).  A NumPy parameter the rule
    does not take is dropped at its default (None, or NumPy's default) and
    refused otherwise: never silently ignored."""
    nsig, rsig = _signature(func), _signature(rule)
    if nsig is None or func.__class__ is np.ufunc:
        # A ufunc: its inputs (NumPy has checked their number; outputs come as
        # ``out=``), then keywords.  Binding them to the ufunc's signature
        # (NumPy >= 2.4 gives one) would cost more than a small op.
        defaults = _ufunc_defaults(func)
        unknown = {k for k, v in kwargs.items()
                   if k not in rsig.parameters and not _is_default(v, defaults.get(k))}
        if unknown:
            raise _unsupported(name, rule, unknown)
        return rule(*args, **{k: v for k, v in kwargs.items() if k in rsig.parameters})
    try:
        bound = nsig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"numpy.{name}: {e}") from None
    rparams = list(rsig.parameters.values())
    rule_takes_any = any(p.kind is p.VAR_KEYWORD for p in rparams)
    pos, kw, refused = [], {}, []
    for i, p in enumerate(nsig.parameters.values()):
        if p.name not in bound.arguments:
            continue
        value = bound.arguments[p.name]
        if p.kind is p.VAR_POSITIONAL:
            pos.extend(value)
            continue
        items = value.items() if p.kind is p.VAR_KEYWORD else [(p.name, value)]
        for key, v in items:
            if key in rsig.parameters or (p.kind is p.VAR_KEYWORD and rule_takes_any):
                kw[key] = v
            elif (p.kind in _POSITIONAL and i < len(rparams) and rparams[i].kind in _POSITIONAL
                  and rparams[i].name not in nsig.parameters):
                kw[rparams[i].name] = v         # the same slot under another name
            elif not _is_default(v, p.default):
                refused.append(key)
    if refused:
        raise _unsupported(name, rule, refused)
    # leading parameters given by name go by position (public functions take
    # their arrays positionally)
    if not pos:
        for p in rparams:
            if p.kind not in _POSITIONAL or p.name not in kw:
                break
            pos.append(kw.pop(p.name))
    return rule(*pos, **kw)


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
    if method == "__call__":
        if "out" in kwargs:
            raise KinaTypeError(f"numpy.{name}(..., out=...) on a Tensor: Tensors are "
                                "immutable (no in-place operations)")
        rule = NUMPY_RULES.get(ufunc)
        if rule is not None:
            return _call_rule(ufunc, name, rule, inputs, kwargs)
        if ufunc in NONDIFFERENTIABLE:
            return ufunc(*_raw_tree(inputs), **_raw_tree(kwargs))
    raise KinaTypeError(refusal_message(name))


def _array_function(self, func, types, args, kwargs):
    rule = NUMPY_RULES.get(func)
    if rule is not None:
        return _call_rule(func, func.__name__, rule, args, kwargs)
    if func in NONDIFFERENTIABLE:
        return func(*_raw_tree(args), **_raw_tree(kwargs))
    raise KinaTypeError(refusal_message(func.__name__))


setattr(Tensor, "__array_ufunc__", _array_ufunc)
setattr(Tensor, "__array_function__", _array_function)
