"""Breadth ops (math): elementwise functions, reductions and contractions.

One ``@op`` block each (docs/autograd.md, "How to add an op"), or a function
composed of primitives where that is exact and simpler (its docstring says
so).  Rules are written with the operations of ``o``, so every derivative is
differentiable again.  Every public name in ``__all__`` is re-exported by
``kina_fx.autograd``.

Conventions decided here (documented in docs/autograd.md, "Derivatives at
kinks"): ``abs`` has derivative 0 at 0 (``sign``); ``maximum``/``minimum``
split the gradient equally between tied operands (as JAX); ``sign``,
``floor`` and ``ceil`` have derivative 0; ``prod`` is exact with zeros, to
every order.
"""
from __future__ import annotations

import math
import operator as _operator
import string

import numpy as np

from .. import gpu_ops
from ..errors import KinaTypeError, UnimplementedError, ValidationError
from . import samples
from .ops_core import mul as _mul
from .ops_core import reshape
from .primitives import (axis_param, constant_ufunc, extremum_weights, norm_axes,
                         numpy_rule, op, reduction_prepare, unary_ufunc, unbroadcast,
                         weighted_reduction, xp_kernel)
from .tensor import _as_array, _raw, _shape, array_module

__all__ = [
    "abs", "sqrt", "square", "sign", "sin", "cos", "tan", "sinh", "cosh", "arcsin", "arccos",
    "arctan", "arcsinh", "arccosh", "arctanh", "log1p", "expm1", "log2", "log10", "exp2",
    "floor", "ceil", "maximum", "minimum", "mod", "logaddexp", "arctan2", "hypot",
    "min", "prod", "var", "std", "logsumexp", "cumsum",
    "tensordot", "einsum", "outer", "inner",
]

_pyabs, _pymax, _pymin = abs, max, min
_eye = np.eye
_LN2, _LN10 = math.log(2.0), math.log(10.0)


def _dtype(v):
    v = _raw(v)
    return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype


def _weights(mask, like):
    """A raw mask (or 0/0.5/1 weights) as an array of ``like``'s dtype: a
    constant at every level (masks have no derivative)."""
    return array_module(_raw(like)).asarray(mask, dtype=_dtype(like))


# =====================================================================================
# Elementwise functions of one array
# =====================================================================================


def _sign_of(x):
    rx = _raw(x)
    return array_module(rx).sign(rx)


@op(numpy=(np.absolute, np.fabs), methods=("__abs__",), elementwise=True,
    sample=samples.elementwise("away_from_zero"), reference=lambda np, x: np.abs(x))
class abs:
    """Elementwise ``|x|``.  Its derivative at 0 is 0 (``sign(0)``), as in HIPS
    autograd and PyTorch (JAX takes 1): the subgradient of least norm."""
    kernel = xp_kernel("abs")

    def d_x(o, v, out, x):
        return o.mul(v, _sign_of(x))


@unary_ufunc("positive")
def sqrt(o, v, out, x):
    """Elementwise square root (its derivative at 0 is infinite)."""
    return o.div(o.mul(v, 0.5), out)


@unary_ufunc()
def square(o, v, out, x):
    """Elementwise ``x * x``."""
    return o.mul(v, o.mul(x, 2.0))


# Piecewise constant, so their derivative is 0:
sign = constant_ufunc("sign", "Elementwise sign (-1, 0 or 1): piecewise constant, so its "
                      "derivative is 0.", "away_from_zero")
floor = constant_ufunc("floor", "Elementwise floor: piecewise constant, so its derivative is 0.")
ceil = constant_ufunc("ceil", "Elementwise ceiling: piecewise constant, so its derivative is 0.")


@unary_ufunc()
def sin(o, v, out, x):
    """Elementwise sine."""
    return o.mul(v, o.cos(x))


@unary_ufunc()
def cos(o, v, out, x):
    """Elementwise cosine."""
    return o.neg(o.mul(v, o.sin(x)))


@unary_ufunc("unit")
def tan(o, v, out, x):
    """Elementwise tangent."""
    return o.mul(v, o.add(1.0, o.mul(out, out)))


@unary_ufunc()
def sinh(o, v, out, x):
    """Elementwise hyperbolic sine."""
    return o.mul(v, o.cosh(x))


@unary_ufunc()
def cosh(o, v, out, x):
    """Elementwise hyperbolic cosine."""
    return o.mul(v, o.sinh(x))


def _inv_sqrt_one_minus_square(o, x):
    return o.div(1.0, o.sqrt(o.sub(1.0, o.mul(x, x))))


@unary_ufunc("unit")
def arcsin(o, v, out, x):
    """Elementwise inverse sine, on ``[-1, 1]``."""
    return o.mul(v, _inv_sqrt_one_minus_square(o, x))


@unary_ufunc("unit")
def arccos(o, v, out, x):
    """Elementwise inverse cosine, on ``[-1, 1]``."""
    return o.neg(o.mul(v, _inv_sqrt_one_minus_square(o, x)))


@unary_ufunc()
def arctan(o, v, out, x):
    """Elementwise inverse tangent."""
    return o.div(v, o.add(1.0, o.mul(x, x)))


@unary_ufunc()
def arcsinh(o, v, out, x):
    """Elementwise inverse hyperbolic sine."""
    return o.div(v, o.sqrt(o.add(o.mul(x, x), 1.0)))


@unary_ufunc("above_one")
def arccosh(o, v, out, x):
    """Elementwise inverse hyperbolic cosine, on ``[1, inf)``."""
    return o.div(v, o.sqrt(o.sub(o.mul(x, x), 1.0)))


@unary_ufunc("unit")
def arctanh(o, v, out, x):
    """Elementwise inverse hyperbolic tangent, on ``(-1, 1)``."""
    return o.div(v, o.sub(1.0, o.mul(x, x)))


@unary_ufunc("unit")
def log1p(o, v, out, x):
    """Elementwise ``log(1 + x)``, accurate for small ``x``."""
    return o.div(v, o.add(x, 1.0))


@unary_ufunc()
def expm1(o, v, out, x):
    """Elementwise ``exp(x) - 1``, accurate for small ``x``."""
    return o.mul(v, o.add(out, 1.0))


@unary_ufunc("positive")
def log2(o, v, out, x):
    """Elementwise base-2 logarithm."""
    return o.div(v, o.mul(x, _LN2))


@unary_ufunc("positive")
def log10(o, v, out, x):
    """Elementwise base-10 logarithm."""
    return o.div(v, o.mul(x, _LN10))


@unary_ufunc()
def exp2(o, v, out, x):
    """Elementwise ``2 ** x``."""
    return o.mul(v, o.mul(out, _LN2))


# =====================================================================================
# Elementwise functions of two arrays (NumPy broadcasting)
# =====================================================================================


def _max_weight_of_a(a, b, out, larger):
    """Raw weights of ``a`` in ``maximum(a, b)`` (``larger``) or ``minimum``:
    1 where ``a`` wins, 0.5 on ties, 0 where ``b`` wins."""
    ra, rb = _raw(a), _raw(b)
    wins = (ra > rb) if larger else (ra < rb)
    return _weights(wins + 0.5 * (ra == rb), out)


def _extremum_rules(larger):
    """The derivative rules of maximum (``larger``) and minimum: ``a``'s
    share of the gradient is its weight, ``b``'s the rest."""
    def d_a(o, v, out, a, b):
        return o.mul(v, _max_weight_of_a(a, b, out, larger))

    def d_b(o, v, out, a, b):
        return o.mul(v, 1.0 - _max_weight_of_a(a, b, out, larger))
    return d_a, d_b


@op(numpy=np.maximum, elementwise=True, sample=samples.elementwise("real", "real"),
    reference=lambda np, a, b: np.maximum(a, b))
class maximum:
    """Elementwise maximum with NumPy broadcasting.  Where ``a == b`` each
    operand gets half of the gradient (as JAX; HIPS autograd also splits)."""
    def kernel(a, b):
        return array_module(a, b).maximum(a, b)

    d_a, d_b = _extremum_rules(larger=True)


@op(numpy=np.minimum, elementwise=True, sample=samples.elementwise("real", "real"),
    reference=lambda np, a, b: np.minimum(a, b))
class minimum:
    """Elementwise minimum with NumPy broadcasting; ties split the gradient
    equally, as ``maximum``."""
    def kernel(a, b):
        return array_module(a, b).minimum(a, b)

    d_a, d_b = _extremum_rules(larger=False)


def _floor_quotient(a, b):
    ra, rb = _raw(a), _raw(b)
    return array_module(ra, rb).floor(ra / rb)


@op(numpy=np.remainder, operator="mod", elementwise=True,
    sample=samples.elementwise("real", "away_from_zero"), reference=lambda np, a, b: np.mod(a, b))
class mod:
    """``a % b`` with the sign of ``b`` (``numpy.mod``/``remainder``):
    ``a - floor(a / b) * b``, so the derivatives are 1 and ``-floor(a / b)``
    (it jumps where ``a / b`` is an integer)."""
    def kernel(a, b):
        return array_module(a, b).remainder(a, b)

    def d_a(o, v, out, a, b):
        return v

    def d_b(o, v, out, a, b):
        return o.neg(o.mul(v, _floor_quotient(a, b)))


@op(numpy=np.logaddexp, elementwise=True, sample=samples.elementwise("real", "real"),
    reference=lambda np, a, b: np.logaddexp(a, b))
class logaddexp:
    """Elementwise ``log(exp(a) + exp(b))`` without overflow."""
    def kernel(a, b):
        return array_module(a, b).logaddexp(a, b)

    def d_a(o, v, out, a, b):
        return o.mul(v, o.exp(o.sub(a, out)))

    def d_b(o, v, out, a, b):
        return o.mul(v, o.exp(o.sub(b, out)))


def _radius_squared(o, y, x):
    return o.add(o.mul(x, x), o.mul(y, y))


@op(numpy=np.arctan2, elementwise=True, sample=samples.elementwise("real", "away_from_zero"),
    reference=lambda np, y, x: np.arctan2(y, x))
class arctan2:
    """Elementwise angle of the point ``(x, y)``: ``arctan2(y, x)`` (it jumps
    across the negative ``x`` axis)."""
    def kernel(y, x):
        return array_module(y, x).arctan2(y, x)

    def d_y(o, v, out, y, x):
        return o.div(o.mul(v, x), _radius_squared(o, y, x))

    def d_x(o, v, out, y, x):
        return o.neg(o.div(o.mul(v, y), _radius_squared(o, y, x)))


@op(numpy=np.hypot, elementwise=True, sample=samples.elementwise("away_from_zero", "real"),
    reference=lambda np, a, b: np.sqrt(a * a + b * b))
class hypot:
    """Elementwise ``sqrt(a**2 + b**2)`` without overflow (not differentiable at
    ``a == b == 0``)."""
    def kernel(a, b):
        return array_module(a, b).hypot(a, b)

    def d_a(o, v, out, a, b):
        return o.div(o.mul(v, a), out)

    def d_b(o, v, out, a, b):
        return o.div(o.mul(v, b), out)


# =====================================================================================
# Reductions
# =====================================================================================


def _count(shape, axis):
    return math.prod(shape[i] for i in norm_axes(axis, len(shape)))


def _keepdims_shape(shape, axis):
    axes = norm_axes(axis, len(shape))
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _kept(o, v, shape, axis, keepdims):
    """A reduction's output (or cotangent) ``v`` with the reduced axes kept
    as size 1, so it broadcasts against the input."""
    return v if keepdims else o.reshape(v, _keepdims_shape(shape, axis))


@op(numpy=(np.min, np.amin), methods=("min",), sample=samples.reduction(),
    reference=lambda np, x, axis=None, keepdims=False: np.min(x, axis=axis, keepdims=keepdims))
class min:
    """Minimum over ``axis`` (None: all; an int or a tuple, negative allowed);
    tied minima share the gradient equally (as ``max``)."""
    def kernel(x, axis, keepdims):
        return array_module(x).min(x, axis=axis, keepdims=keepdims)

    prepare = reduction_prepare
    vjp_x, jvp_x = weighted_reduction(extremum_weights)


def _inclusive_cumprod(o, y):
    """Products of ``y``'s prefixes along the last axis, with multiplications
    only (a Hillis-Steele scan: log2(n) steps), so it is exact with zeros and
    differentiable to any order."""
    n = y.shape[-1]
    k = 1
    while k < n:
        head = o.getitem(y, (Ellipsis, slice(0, k)))
        tail = o.mul(o.getitem(y, (Ellipsis, slice(k, None))),
                     o.getitem(y, (Ellipsis, slice(0, n - k))))
        y = o.concatenate([head, tail], -1)
        k *= 2
    return y


def _exclusive_cumprod(o, y):
    """``prod(y[..., :i])`` for each ``i`` (1 for ``i == 0``)."""
    ry = _raw(y)
    ones = array_module(ry).ones(ry.shape[:-1] + (1,), dtype=ry.dtype)
    inclusive = _inclusive_cumprod(o, o.getitem(y, (Ellipsis, slice(0, -1))))
    return o.concatenate([ones, inclusive], -1)


def _products_of_the_others(o, x, out, axis, keepdims):
    """For each element of ``x``, the product of the other elements of its
    reduction group (``axis``): the derivative of ``prod``, without dividing
    by ``x`` (so zeros are exact)."""
    shape = tuple(x.shape)
    nd = len(shape)
    axes = norm_axes(axis, nd)
    rx = _raw(x)
    n = math.prod(shape[i] for i in axes)
    if n <= 1 or math.prod(shape) == 0:
        return array_module(rx).ones(shape, dtype=rx.dtype)
    kept = tuple(i for i in range(nd) if i not in axes)
    perm = kept + axes
    xt = o.transpose(x, perm) if perm != tuple(range(nd)) else x
    moved = tuple(shape[i] for i in perm)
    flat = o.reshape(xt, tuple(shape[i] for i in kept) + (n,))
    backwards = (Ellipsis, slice(None, None, -1))
    before = _exclusive_cumprod(o, flat)
    after = o.getitem(_exclusive_cumprod(o, o.getitem(flat, backwards)), backwards)
    others = o.reshape(o.mul(before, after), moved)
    if perm == tuple(range(nd)):
        return others
    return o.transpose(others, tuple(int(i) for i in np.argsort(perm)))


def _sample_prod(draw):
    shape = draw.shape(min_side=0)
    x = draw.array(shape)
    return [x], {"axis": draw.axis(len(shape)), "keepdims": draw.boolean()}


@op(numpy=np.prod, methods=("prod",), sample=_sample_prod,
    reference=lambda np, x, axis=None, keepdims=False: np.prod(x, axis=axis, keepdims=keepdims))
class prod:
    """Product over ``axis`` (None: all; an int or a tuple, negative allowed).
    The derivative is the product of the other elements, computed with
    multiplications only: exact where ``x`` has zeros, to every order (HIPS
    autograd divides by ``x`` and gives NaN there)."""
    def kernel(x, axis, keepdims):
        return array_module(x).prod(x, axis=axis, keepdims=keepdims)

    prepare = reduction_prepare
    vjp_x, jvp_x = weighted_reduction(_products_of_the_others)


def _ddof_param(ddof):
    try:
        return _operator.index(ddof)
    except TypeError:
        return float(ddof)


def _var_prepare(x, axis=None, ddof=0, keepdims=False):
    return x, axis_param(axis), _ddof_param(ddof), bool(keepdims)


def _sample_var(draw):
    shape = draw.shape()
    axis = draw.axis(len(shape))
    n = _count(shape, axis)
    return [draw.array(shape)], {"axis": axis, "ddof": draw.integers(0, _pymax(0, n - 1)),
                                 "keepdims": draw.boolean()}


def _inverse_dof(shape, axis, ddof):
    dof = _count(shape, axis) - ddof
    return 1.0 / dof if dof > 0 else math.inf


@op(numpy=np.var, methods=("var",), sample=_sample_var,
    reference=lambda np, x, axis=None, ddof=0, keepdims=False: np.var(
        x, axis=axis, ddof=ddof, keepdims=keepdims))
class var:
    """Variance over ``axis``: ``sum((x - mean)**2) / (n - ddof)``."""
    def kernel(x, axis, ddof, keepdims):
        return array_module(x).var(x, axis=axis, ddof=ddof, keepdims=keepdims)

    prepare = _var_prepare

    def vjp_x(o, g, out, x, axis, ddof, keepdims):
        scale = 2.0 * _inverse_dof(x.shape, axis, ddof)
        centered = o.sub(x, o.mean(x, axis, True))
        return o.mul(_kept(o, g, x.shape, axis, keepdims), o.mul(centered, scale))

    def jvp_x(o, t, out, x, axis, ddof, keepdims):
        scale = 2.0 * _inverse_dof(x.shape, axis, ddof)
        centered = o.sub(x, o.mean(x, axis, True))
        return o.mul(o.sum(o.mul(centered, t), axis, keepdims), scale)


def _std_factor(o, out, x, axis, ddof, keepdims):
    """``1 / ((n - ddof) * std)``, broadcastable against ``x``, and 0 where
    the standard deviation is 0 (all elements equal: there the gradient is
    the least-norm subgradient, 0, as ``abs`` and ``norm`` at 0)."""
    zero = array_module(_raw(out)).reshape(_raw(out), _keepdims_shape(x.shape, axis)) == 0
    kept = _kept(o, out, x.shape, axis, keepdims)
    return o.where(zero, 0.0, o.div(_inverse_dof(x.shape, axis, ddof),
                                    o.where(zero, 1.0, kept)))


@op(numpy=np.std, methods=("std",), sample=_sample_var,
    reference=lambda np, x, axis=None, ddof=0, keepdims=False: np.std(
        x, axis=axis, ddof=ddof, keepdims=keepdims))
class std:
    """Standard deviation over ``axis``: ``sqrt(var(x, axis, ddof))``.  Where
    it is 0 (all elements equal) the gradient is 0, the least-norm
    subgradient (JAX gives NaN), so a one-element ``std`` -- constant 0 --
    has the right gradient."""
    def kernel(x, axis, ddof, keepdims):
        return array_module(x).std(x, axis=axis, ddof=ddof, keepdims=keepdims)

    prepare = _var_prepare

    def vjp_x(o, g, out, x, axis, ddof, keepdims):
        centered = o.sub(x, o.mean(x, axis, True))
        factor = _std_factor(o, out, x, axis, ddof, keepdims)
        return o.mul(o.mul(_kept(o, g, x.shape, axis, keepdims), centered), factor)

    def jvp_x(o, t, out, x, axis, ddof, keepdims):
        centered = o.mul(o.sub(x, o.mean(x, axis, True)),
                         _std_factor(o, out, x, axis, ddof, keepdims))
        return o.sum(o.mul(centered, t), axis, keepdims)


def _logsumexp_reference(np, x, axis=None, keepdims=False):
    # any shift c gives the same function: log(sum(exp(x - c))) + c
    c = np.max(x, axis=axis, keepdims=True)
    r = np.log(np.sum(np.exp(x - c), axis=axis, keepdims=True)) + c
    return r if keepdims else np.squeeze(r, axis=axis)


@op(sample=samples.reduction(), reference=_logsumexp_reference)
class logsumexp:
    """``log(sum(exp(x), axis))`` without overflow (``scipy.special.logsumexp``
    for real inputs, no ``b``); the gradient is the softmax along ``axis``."""
    def kernel(x, axis, keepdims):
        xp = array_module(x)
        m = xp.max(x, axis=axis, keepdims=True)
        m = xp.where(xp.isfinite(m), m, 0)
        r = xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True)) + m
        return r if keepdims else xp.squeeze(r, axis=axis)

    prepare = reduction_prepare

    def vjp_x(o, g, out, x, axis, keepdims):
        shape = x.shape
        weights = o.exp(o.sub(x, _kept(o, out, shape, axis, keepdims)))
        return o.mul(_kept(o, g, shape, axis, keepdims), weights)

    def jvp_x(o, t, out, x, axis, keepdims):
        weights = o.exp(o.sub(x, _kept(o, out, x.shape, axis, keepdims)))
        return o.sum(o.mul(t, weights), axis, keepdims)


def _sample_cumsum(draw):
    shape = draw.shape(min_side=0)
    if not shape or draw.boolean():
        return [draw.array(shape)], {}
    return [draw.array(shape)], {"axis": draw.integers(-len(shape), len(shape) - 1)}


@op(numpy=np.cumsum, methods=("cumsum",), linear=True, sample=_sample_cumsum,
    reference=lambda np, x, axis=None: np.cumsum(x, axis=axis))
class cumsum:
    """Running sums along ``axis`` (None: of the flattened array)."""
    def kernel(x, axis):
        return array_module(x).cumsum(x, axis=axis)

    def prepare(x, axis=None):
        if axis is None:
            return reshape(x, (-1,)), 0
        x = _as_array(x)
        return x, gpu_ops.normalize_axis(_operator.index(axis), len(_shape(_raw(x))))

    def vjp_x(o, g, out, x, axis):
        return o.flip(o.cumsum(o.flip(g, axis), axis), axis)


# =====================================================================================
# Contractions
# =====================================================================================


def _tensordot_axes(a, b, axes):
    """``axes`` as two tuples of non-negative axes of ``a`` and ``b``."""
    na, nb = len(_shape(_raw(a))), len(_shape(_raw(b)))
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if not 0 <= n <= _pymin(na, nb):
            raise ValidationError(f"tensordot: axes={n} for operands of rank {na} and {nb}")
        return tuple(range(na - n, na)), tuple(range(n))
    try:
        axes_a, axes_b = axes
    except (TypeError, ValueError):
        raise ValidationError(f"tensordot: axes must be an int or a pair of axis sequences, "
                              f"not {axes!r}") from None
    axes_a = (axes_a,) if isinstance(axes_a, (int, np.integer)) else tuple(axes_a)
    axes_b = (axes_b,) if isinstance(axes_b, (int, np.integer)) else tuple(axes_b)
    if len(axes_a) != len(axes_b):
        raise ValidationError(f"tensordot: {len(axes_a)} axes of a paired with "
                              f"{len(axes_b)} of b")
    axes_a = tuple(gpu_ops.normalize_axis(int(i), na) for i in axes_a)
    axes_b = tuple(gpu_ops.normalize_axis(int(i), nb) for i in axes_b)
    if len(set(axes_a)) != len(axes_a) or len(set(axes_b)) != len(axes_b):
        raise ValidationError(f"tensordot: repeated axis in {axes!r}")
    return axes_a, axes_b


def _as_operand(v):
    """An operand whose shape the rules read: a Python scalar as a 0-d array."""
    v = _as_array(v)
    return v if hasattr(_raw(v), "shape") else np.asarray(v)


def _to_order(o, v, source_axes):
    """``v`` (whose axis ``p`` is axis ``source_axes[p]`` of the target)
    transposed into the target's axis order."""
    perm = tuple(int(i) for i in np.argsort(source_axes))
    return v if perm == tuple(range(len(perm))) else o.transpose(v, perm)


def _sample_tensordot(draw):
    k = draw.integers(0, 2)
    contracted = draw.shape(min_dims=k, max_dims=k)
    free_a, free_b = draw.shape(max_dims=2), draw.shape(max_dims=2)
    if draw.boolean():
        return [draw.array(free_a + contracted), draw.array(contracted + free_b)], {"axes": k}
    # contracted axes first in a (negative), last and reversed in b
    a_shape = contracted + free_a
    b_shape = free_b + contracted[::-1]
    axes_a = [i - len(a_shape) for i in range(k)]
    axes_b = [len(free_b) + k - 1 - i for i in range(k)]
    return [draw.array(a_shape), draw.array(b_shape)], {"axes": (axes_a, axes_b)}


@op(numpy=np.tensordot, sample=_sample_tensordot,
    reference=lambda np, a, b, axes=2: np.tensordot(a, b, axes))
class tensordot:
    """Sum of products over ``axes``: an int ``n`` (the last ``n`` axes of
    ``a`` with the first ``n`` of ``b``) or a pair of axis sequences, as NumPy."""
    def kernel(a, b, axes):
        return array_module(a, b).tensordot(a, b, axes=axes)

    def prepare(a, b, axes=2):
        a, b = _as_operand(a), _as_operand(b)
        return a, b, _tensordot_axes(a, b, axes)

    def vjp_a(o, g, out, a, b, axes):
        axes_a, axes_b = axes
        free_a = [i for i in range(len(a.shape)) if i not in axes_a]
        free_b = [j for j in range(len(b.shape)) if j not in axes_b]
        g_free_b = tuple(range(len(free_a), len(free_a) + len(free_b)))
        ga = o.tensordot(g, b, (g_free_b, tuple(free_b)))
        # ga: a's free axes, then b's contracted axes in b's order (paired with a's)
        paired = [axes_a[k] for k in sorted(range(len(axes_b)), key=lambda k: axes_b[k])]
        return _to_order(o, ga, free_a + paired)

    def vjp_b(o, g, out, a, b, axes):
        axes_a, axes_b = axes
        free_a = [i for i in range(len(a.shape)) if i not in axes_a]
        free_b = [j for j in range(len(b.shape)) if j not in axes_b]
        gb = o.tensordot(a, g, (tuple(free_a), tuple(range(len(free_a)))))
        paired = [axes_b[k] for k in sorted(range(len(axes_a)), key=lambda k: axes_a[k])]
        return _to_order(o, gb, paired + free_b)

    def jvp_a(o, t, out, a, b, axes):
        return o.tensordot(t, b, axes)

    def jvp_b(o, t, out, a, b, axes):
        return o.tensordot(a, t, axes)


def _einsum_terms(subscripts):
    """('ij', 'jk'), 'ik' from the canonical 'ij,jk->ik'."""
    lhs, out = subscripts.split("->")
    return tuple(lhs.split(",")), out


def _canonical_einsum(subscripts, shapes):
    """Check an einsum specification against the operands' shapes; return it
    in explicit form ``"ij,jk->ik"`` (implicit output: the letters used once,
    in alphabetical order, as NumPy)."""
    if not isinstance(subscripts, str):
        raise KinaTypeError("einsum: the subscripts must be a string such as 'ij,jk->ik' "
                            "(the interleaved form einsum(a, [0, 1], b, [1, 2]) is not "
                            "supported)")
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise UnimplementedError(
            f"einsum {subscripts!r}: ellipsis ('...') is not supported; name every axis "
            "(e.g. 'bij,bjk->bik')")
    if spec.count("->") > 1:
        raise ValidationError(f"einsum {subscripts!r}: more than one '->'")
    lhs, arrow, out = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValidationError(f"einsum {subscripts!r}: {len(terms)} operand subscripts for "
                              f"{len(shapes)} operands")
    letters = "".join(terms)
    bad = sorted(set(letters + out) - set(string.ascii_letters))
    if bad:
        raise ValidationError(f"einsum {subscripts!r}: subscripts must be letters, not {bad}")
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(out)) != len(out) or set(out) - set(letters):
        raise ValidationError(f"einsum {subscripts!r}: each output subscript must appear "
                              "once in the output and in some operand")
    dims = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            raise ValidationError(f"einsum {subscripts!r}: operand subscripts {term!r} for "
                                  f"an operand of shape {tuple(shape)}")
        for c, s in zip(term, shape):
            d = dims.setdefault(c, s)
            if d != s and 1 not in (d, s):
                raise ValidationError(f"einsum {subscripts!r}: axis {c!r} has sizes {d} "
                                      f"and {s}")
            dims[c] = _pymax(d, s)
    return ",".join(terms) + "->" + out


def _letter_sizes(terms, xs):
    dims = {}
    for term, x in zip(terms, xs):
        for c, s in zip(term, _shape(x)):
            dims[c] = _pymax(dims.get(c, 1), s)
    return dims


def _sample_einsum(draw):
    spec = draw.choice(["ij,jk->ik", "ij,jk", "i,i->", "i,j->ij", "bij,bjk->bik", "ij->ji",
                        "ij->", "ij->j", "ijk,ik->ji", "ij,ij->ij", "i,->i", "ii->", "ii->i",
                        "iij,j->i", "ij,jk,kl->il"])
    lhs = spec.split("->")[0]
    sizes = {c: draw.integers(1, 3) for c in sorted(set(lhs) - {","})}
    xs = []
    for term in lhs.split(","):
        shape = tuple(sizes[c] for c in term)
        if spec == "ij,ij->ij" and not xs:        # a broadcast (size-1) axis
            shape = (1,) + shape[1:]
        xs.append(draw.array(shape))
    return [spec] + xs, {}


def _einsum_reference(np, subscripts, *operands):
    """einsum with every subscript distinct within each operand: a repeated
    one (a trace or diagonal) becomes a fresh letter tied to it by an identity
    matrix (HIPS autograd's einsum rule cannot transpose repeated subscripts)."""
    terms, out = _einsum_terms(_canonical_einsum(subscripts, [np.shape(x) for x in operands]))
    free = iter(c for c in string.ascii_letters if c not in subscripts)
    new_terms, extra = [], []
    for term, x in zip(terms, operands):
        seen = ""
        for c, size in zip(term, np.shape(x)):
            if c in seen:
                f = next(free)
                extra.append((c + f, _eye(size)))
                c = f
            seen += c
        new_terms.append(seen)
    spec = ",".join(new_terms + [t for t, _ in extra]) + "->" + out
    return np.einsum(spec, *operands, *[e for _, e in extra])


@op(numpy=np.einsum, sequence=True, sample=_sample_einsum, reference=_einsum_reference)
class einsum:
    """Einstein summation ``einsum(subscripts, *operands)`` with letter
    subscripts, any number of operands, explicit (``'ij,jk->ik'``) or implicit
    (``'ij,jk'``) output, repeated subscripts within an operand (``'ii->'``,
    ``'ii->i'``) and size-1 broadcasting.  Refused with a clear error:
    ellipsis (``'...'``) and the interleaved ``einsum(a, [0, 1], ...)`` form.
    ``optimize`` is accepted and ignored (the result is the same)."""
    def kernel(xs, subscripts):
        return array_module(*xs).einsum(subscripts, *xs, optimize=len(xs) > 2)

    def prepare(*args, optimize=None):
        if len(args) == 2 and isinstance(args[0], (list, tuple)) and isinstance(args[1], str):
            operands, subscripts = args           # the kernel's order (rules use it)
        elif args:
            subscripts, operands = args[0], args[1:]
        else:
            raise KinaTypeError("einsum(subscripts, *operands) needs a subscripts string")
        operands = tuple(_as_array(x) for x in operands)
        return operands, _canonical_einsum(subscripts, [_shape(_raw(x)) for x in operands])

    def vjp_xs(o, g, out, i, xs, subscripts):
        terms, out_term = _einsum_terms(subscripts)
        sizes = _letter_sizes(terms, xs)
        rg = _raw(g)
        xp, dtype = array_module(rg), _dtype(rg)
        others = [terms[j] for j in range(len(xs)) if j != i]
        free = iter(c for c in string.ascii_letters if c not in sizes)
        target, extra_terms, extra = [], [], []
        for c in terms[i]:
            if c in target:       # a repeated subscript: the gradient lives on the diagonal
                f = next(free)
                target.append(f)
                extra_terms.append(c + f)
                extra.append(xp.eye(sizes[c], dtype=dtype))
            else:
                target.append(c)
        present = set(out_term).union(*others, *extra_terms)
        for c in dict.fromkeys(terms[i]):
            if c not in present:  # summed away in this operand alone: constant along it
                extra_terms.append(c)
                extra.append(xp.ones(sizes[c], dtype=dtype))
        spec = ",".join([out_term] + others + extra_terms) + "->" + "".join(target)
        operands = [g] + [xs[j] for j in range(len(xs)) if j != i] + extra
        return unbroadcast(o, o.einsum(operands, spec), _shape(xs[i]))

    def jvp_xs(o, t, out, i, xs, subscripts):
        return o.einsum(tuple(xs[:i]) + (t,) + tuple(xs[i + 1:]), subscripts)


def _sample_outer(draw):
    return [draw.array(draw.shape(max_dims=2)), draw.array(draw.shape(max_dims=2))], {}


@numpy_rule(np.outer, sample=_sample_outer,
            reference=lambda np, a, b: np.outer(np.ravel(a), np.ravel(b)))
def outer(a, b):
    """Outer product of the flattened ``a`` and ``b``, composed as
    ``mul(reshape(a, (-1, 1)), reshape(b, (-1,)))`` (exact)."""
    return _mul(reshape(a, (-1, 1)), reshape(b, (-1,)))


def _sample_inner(draw):
    k = draw.integers(1, 3)
    if draw.boolean():
        return [draw.array(()), draw.array(draw.shape(max_dims=2))], {}
    return [draw.array(draw.shape(max_dims=2) + (k,)),
            draw.array(draw.shape(max_dims=1) + (k,))], {}


@numpy_rule(np.inner, sample=_sample_inner, reference=lambda np, a, b: np.inner(a, b))
def inner(a, b):
    """Sum of products over the last axes (NumPy's ``inner``), composed as
    ``tensordot(a, b, ((-1,), (-1,)))`` (``mul`` for a scalar operand; exact)."""
    a, b = _as_array(a), _as_array(b)
    if not _shape(_raw(a)) or not _shape(_raw(b)):
        return _mul(a, b)
    return tensordot(a, b, ((-1,), (-1,)))

