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


def _call_rule(name, rule, args, kwargs):
    if kwargs:
        params = inspect.signature(rule).parameters
        unknown = [k for k in kwargs if k not in params]
        if any(kwargs[k] is not None for k in unknown):
            bad = sorted(k for k in unknown if kwargs[k] is not None)
            raise KinaTypeError(
                f"numpy.{name}(..., {', '.join(k + '=...' for k in bad)}) on a Tensor: "
                f"kina_fx.autograd.{rule.__name__} takes {inspect.signature(rule)}")
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return rule(*args, **kwargs)


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
    if method == "__call__":
        if "out" in kwargs:
            raise KinaTypeError(f"numpy.{name}(..., out=...) on a Tensor: Tensors are "
                                "immutable (no in-place operations)")
        rule = NUMPY_RULES.get(ufunc)
        if rule is not None:
            return _call_rule(name, rule, inputs, kwargs)
        if ufunc in NONDIFFERENTIABLE:
            return ufunc(*_raw_tree(inputs), **_raw_tree(kwargs))
    raise KinaTypeError(refusal_message(name))


def _array_function(self, func, types, args, kwargs):
    rule = NUMPY_RULES.get(func)
    if rule is not None:
        return _call_rule(func.__name__, rule, args, kwargs)
    if func in NONDIFFERENTIABLE:
        return func(*_raw_tree(args), **_raw_tree(kwargs))
    raise KinaTypeError(refusal_message(func.__name__))


setattr(Tensor, "__array_ufunc__", _array_ufunc)
setattr(Tensor, "__array_function__", _array_function)
