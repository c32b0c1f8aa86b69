"""Functions built from the primitives (no rules of their own), with the
NumPy functions they stand for on Tensors."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import gpu_ops
from ..errors import UnimplementedError, ValidationError
from .primitives import numpy_rule
from .tensor import Tensor, _as_array, _holds_tensor, _raw, _shape, array_module
from .tensor import recordable as o

__all__ = ["dot", "ravel", "flatten", "squeeze", "array"]


def _sample_dot(draw):
    case = draw.choice(["scalar", "vector", "matrix", "nd"])
    k = draw.integers(1, 3)
    if case == "scalar":
        return [draw.array(()), draw.array(draw.shape(max_dims=2))], {}
    if case == "vector":
        return [draw.array((k,)), draw.array((k,) + draw.shape(max_dims=1))], {}
    if case == "matrix":
        return [draw.array(draw.shape(min_dims=1, max_dims=1) + (k,)),
                draw.array((k, draw.integers(1, 3)))], {}
    return [draw.array(draw.shape(max_dims=2) + (k,)),
            draw.array(draw.shape(min_dims=1, max_dims=1) + (k, draw.integers(1, 3)))], {}


@numpy_rule(np.dot, sample=_sample_dot, reference=lambda np, a, b: np.dot(a, b))
def dot(a: Any, b: Any) -> Any:
    """NumPy's ``dot``: products of scalars, ``matmul`` for rank <= 2 (and for a
    1-D or 2-D ``b``), and for N-D ``b`` the sum over ``a``'s last axis and
    ``b``'s second-to-last."""
    a, b = _as_array(a), _as_array(b)
    sa, sb = _shape(_raw(a)), _shape(_raw(b))
    if not sa or not sb:
        return o.mul(a, b)
    if len(sb) <= 2:
        return o.matmul(a, b)
    # move b's contracted axis (-2) first: (k, rest...) -> (k, prod(rest))
    nb = len(sb)
    perm = (nb - 2,) + tuple(i for i in range(nb) if i != nb - 2)
    rest = tuple(sb[i] for i in perm[1:])
    b2 = o.reshape(o.transpose(b, perm), (sb[-2], math.prod(rest)))
    return o.reshape(o.matmul(a, b2), tuple(sa[:-1]) + rest)


def _flat_order(name, order):
    if order in ("A", "K"):
        raise UnimplementedError(
            f"{name}(..., order={order!r}) depends on the memory layout of the array, which "
            "tracing does not promise to keep: say order='C' or order='F'")
    return order


def _sample_ravel(draw):
    kwargs = {"order": draw.choice(["C", "F"])} if draw.boolean() else {}
    return [draw.array(draw.shape())], kwargs


@numpy_rule(np.ravel, sample=_sample_ravel,
            reference=lambda np, x, order="C": np.ravel(x, order=order))
def ravel(x: Any, order: str = "C") -> Any:
    """``x`` flattened to one dimension, in C (or ``order='F'``: Fortran) index order."""
    return o.reshape(x, (-1,), _flat_order("ravel", order))


def flatten(x: Any, order: str = "C") -> Any:
    """``x`` flattened to one dimension (``Tensor.flatten``), as ``ravel``."""
    return o.reshape(x, (-1,), _flat_order("flatten", order))


def _sample_squeeze(draw):
    shape = draw.shape(max_side=2)
    ones = [i for i, s in enumerate(shape) if s == 1]
    if not ones or draw.boolean():
        return [draw.array(shape)], {}
    axis = draw.choice(ones) - (len(shape) if draw.boolean() else 0)
    return [draw.array(shape)], {"axis": axis if draw.boolean() else (axis,)}


@numpy_rule(np.squeeze, sample=_sample_squeeze,
            reference=lambda np, x, axis=None: np.squeeze(x, axis))
def squeeze(x: Any, axis: Any = None) -> Any:
    """``x`` without its size-1 axes (only ``axis`` when given; one that is
    not of size 1 is a ValidationError)."""
    x = _as_array(x)
    shape = _shape(_raw(x))
    if axis is None:
        axes = {i for i, s in enumerate(shape) if s == 1}
    else:
        axes = {gpu_ops.normalize_axis(int(a), len(shape))
                for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
        for a in axes:
            if shape[a] != 1:
                raise ValidationError(f"squeeze: axis {a} has size {shape[a]}, not 1")
    return o.reshape(x, tuple(s for i, s in enumerate(shape) if i not in axes))


def array(obj: Any, dtype: Any = None) -> Any:
    """An array from ``obj`` as ``numpy.array`` makes it, but differentiable:
    Tensors (also inside lists and tuples) keep their traces."""
    if isinstance(obj, Tensor) or (isinstance(obj, (list, tuple)) and _holds_tensor(obj)):
        return Tensor(obj, dtype)
    return array_module(obj).array(_as_array(obj), dtype=dtype)


for _method in (ravel, flatten, squeeze):
    setattr(Tensor, _method.__name__, _method)
del _method
