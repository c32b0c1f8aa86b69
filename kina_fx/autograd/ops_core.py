"""The core ops: arithmetic, the elementwise functions of the runtime,
reductions, shapes, indexing, softmax and the loss, and building arrays.

One ``@op`` block each (docs/autograd.md, "How to add an op"; the registry is
:mod:`.primitives`).  Elementwise ops give one derivative rule ``d_<input>``
for both modes; the others their reverse (``vjp_``) and forward (``jvp_``)
rules side by side.  The rest of the table is in ``ops_math.py``,
``ops_linalg.py``, ``ops_shape.py`` and ``ops_collective.py``.
"""
from __future__ import annotations

import inspect
import math
import operator as _operator

import numpy as np

from .. import gpu_ops
from ..errors import KinaTypeError, UnimplementedError, ValidationError
from . import samples
from .primitives import (COMPLEX_REFUSAL, expand_back, extremum_weights, norm_axes, op,
                         reduction_prepare, unary_ufunc, unbroadcast, unwrapping,
                         weighted_reduction)
from .tensor import (Tensor, _operand, _raw, _shape, array_module, as_sequence, is_traced,
                     kernels, recordable)

__all__ = [
    "add", "sub", "mul", "div", "pow", "neg", "exp", "log", "tanh", "sigmoid", "relu", "cast",
    "matmul", "sum", "mean", "max", "reshape", "transpose", "broadcast_to", "getitem",
    "index_add", "gather", "softmax", "log_softmax", "cross_entropy", "repeat_interleave",
    "where", "stop_gradient", "stack", "concatenate", "clip",
]

_ndarray = np.ndarray
_pymax = max
_pysum = sum


# --- arithmetic -----------------------------------------------------------------------


def _arithmetic_kernel(operator):
    """The kernel of an arithmetic op: ``operator`` (``operator.add``) of the
    raw arrays (NumPy and CuPy arrays implement them)."""
    name = operator.__name__
    def kernel(a, b):
        if a.__class__ is Tensor:
            a = _operand(a, name)
        if b.__class__ is Tensor:
            b = _operand(b, name)
        return operator(a, b)
    kernel.__name__ = kernel.__qualname__ = f"{operator.__name__}_kernel"
    return unwrapping(kernel)


@op(numpy=np.add, operator="add", elementwise=True, raw=_operator.add,
    sample=samples.elementwise("real", "real"), reference=lambda np, a, b: a + b)
class add:
    """``a + b`` with NumPy broadcasting; cotangents are summed over broadcast axes."""
    kernel = _arithmetic_kernel(_operator.add)

    def d_a(o, v, out, a, b):
        return v

    def d_b(o, v, out, a, b):
        return v


@op(numpy=np.subtract, operator="sub", elementwise=True, raw=_operator.sub,
    sample=samples.elementwise("real", "real"), reference=lambda np, a, b: a - b)
class sub:
    """``a - b`` with NumPy broadcasting."""
    kernel = _arithmetic_kernel(_operator.sub)

    def d_a(o, v, out, a, b):
        return v

    def d_b(o, v, out, a, b):
        return o.neg(v)


@op(numpy=np.multiply, operator="mul", elementwise=True, raw=_operator.mul,
    sample=samples.elementwise("real", "real"), reference=lambda np, a, b: a * b)
class mul:
    """``a * b`` with NumPy broadcasting."""
    kernel = _arithmetic_kernel(_operator.mul)

    def d_a(o, v, out, a, b):
        return o.mul(v, b)

    def d_b(o, v, out, a, b):
        return o.mul(a, v)


@op(numpy=(np.true_divide,), operator="truediv", elementwise=True, raw=_operator.truediv,
    sample=samples.elementwise("real", "away_from_zero"), reference=lambda np, a, b: a / b)
class div:
    """``a / b`` with NumPy broadcasting."""
    kernel = _arithmetic_kernel(_operator.truediv)

    def d_a(o, v, out, a, b):
        return o.div(v, b)

    def d_b(o, v, out, a, b):
        return o.neg(o.div(o.mul(v, out), b))


def _pow_dx(o, x, p):
    """d(x**p)/dx = p * x**(p-1), exact for p = 0, 1, 2, and 0 (not NaN) where
    p == 0 even at x == 0 (as HIPS autograd and JAX)."""
    if isinstance(p, (int, float)):
        if p == 0:
            return o.mul(x, 0.0)
        if p == 1:
            return o.add(o.mul(x, 0.0), 1.0)
        if p == 2:
            return o.mul(x, 2.0)
        return o.mul(p, o.pow(x, p - 1))
    return o.mul(p, o.pow(x, o.where(_raw(p) != 0, o.sub(p, 1.0), 1.0)))


def _log_base(o, x):
    """log(x) where x != 0, else 0: the factor of d(x**p)/dp, which is 0 (not
    NaN) at x == 0 where x**p is 0 or 1 (HIPS autograd's and JAX's convention)."""
    return o.log(o.where(_raw(x) == 0, 1.0, x))


def _sample_pow(draw):
    if draw.boolean():
        return samples.elementwise("positive", "real")(draw)
    shape = draw.shape()
    return [draw.array(shape, "positive"), draw.choice([0, 1, 2, 3, -1, 0.5, 2.5])], {}


@op(numpy=np.power, operator="pow", elementwise=True, raw=_operator.pow, sample=_sample_pow,
    reference=lambda np, x, p: x ** p)
class pow:
    """``x ** p`` with NumPy broadcasting (``p`` may be traced too).  At
    ``x == 0`` the derivative with respect to ``p`` is 0, as in HIPS autograd
    and JAX."""
    def kernel(x, p):
        if x.__class__ is Tensor:
            x = _operand(x, "pow")
        if p.__class__ is Tensor:
            p = _operand(p, "pow")
        return x ** p
    unwrapping(kernel)

    def d_x(o, v, out, x, p):
        return o.mul(v, _pow_dx(o, x, p))

    def d_p(o, v, out, x, p):
        return o.mul(o.mul(v, out), _log_base(o, x))


@op(numpy=np.negative, operator="neg", elementwise=True, raw=_operator.neg, linear=True,
    sample=samples.elementwise(), reference=lambda np, x: -x)
class neg:
    """``-x``."""
    def kernel(x):
        if x.__class__ is Tensor:
            x = _operand(x, "neg")
        return -x
    unwrapping(kernel)

    def vjp_x(o, g, out, x):
        return o.neg(g)


# --- elementwise functions ---------------------------------------------------------------


@unary_ufunc(methods=("exp",))
def exp(o, v, out, x):
    """Elementwise ``e**x``."""
    return o.mul(v, out)


@unary_ufunc("positive", methods=("log",))
def log(o, v, out, x):
    """Elementwise natural logarithm."""
    return o.div(v, x)


@unary_ufunc(methods=("tanh",))
def tanh(o, v, out, x):
    """Elementwise hyperbolic tangent."""
    # v * (1 - out**2) without the Python 1.0: a NumPy call with a Python
    # scalar operand costs twice one with two arrays (docs/benchmarks.md)
    return o.sub(v, o.mul(o.mul(v, out), out))


@op(elementwise=True, sample=samples.elementwise(),
    reference=lambda np, x: 1.0 / (1.0 + np.exp(-x)))
class sigmoid:
    """Elementwise logistic function ``1 / (1 + exp(-x))`` (the runtime's
    kernel: SciPy's/CuPy's ``expit`` when installed)."""
    def kernel(x):
        if x.__class__ is Tensor:
            x = _operand(x, "sigmoid")
        return gpu_ops.sigmoid(x)
    unwrapping(kernel)

    def d_x(o, v, out, x):
        return o.mul(v, o.mul(out, o.sub(1.0, out)))


def _positive_mask(x):
    # A constant at every level: the derivative of a mask is zero.
    return _raw(x) > 0


@op(elementwise=True, sample=samples.elementwise("away_from_zero"),
    reference=lambda np, x: np.maximum(x, 0.0))
class relu:
    """Elementwise ``max(x, 0)`` (derivative 0 at 0)."""
    def kernel(x):
        if x.__class__ is Tensor:
            x = _operand(x, "relu")
        if x.__class__ is _ndarray and x.dtype.kind == "f":
            return gpu_ops.relu(x)          # the runtime's kernel
        return array_module(x).maximum(x, 0)
    unwrapping(kernel)

    def d_x(o, v, out, x):
        return o.mul(v, _positive_mask(x))


def _dtype_of(v):
    return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype


@op(methods=("astype",), linear=True,
    sample=lambda draw: ([draw.array(draw.shape())], {"dtype": np.float64}),
    reference=lambda np, x, dtype: x)
class cast:
    """``x.astype(dtype)``; the cotangent is cast back to ``x``'s dtype.
    Complex dtypes are refused for traced values (see "What kina_fx refuses")."""
    def kernel(x, dtype):
        return x.astype(dtype) if hasattr(x, "astype") else np.asarray(x, dtype=dtype)

    def prepare(x, dtype):
        dtype = np.dtype(dtype)
        if dtype.kind == "c" and is_traced(x):
            raise KinaTypeError(COMPLEX_REFUSAL + " (cast to a complex dtype)")
        return x, dtype

    def vjp_x(o, g, out, x, dtype):
        return o.cast(g, _dtype_of(x))


# --- linear algebra and reductions --------------------------------------------------


def _swap_last(o, x):
    nd = len(x.shape)
    if nd < 2:
        return x
    return o.transpose(x, tuple(range(nd - 2)) + (nd - 1, nd - 2))


def _sample_matmul(draw):
    m, k, n = (draw.integers(1, 3) for _ in range(3))
    case = draw.choice(["2d", "vec_mat", "mat_vec", "vec_vec", "batched"])
    if case == "2d":
        a, b = (m, k), (k, n)
    elif case == "vec_mat":
        a, b = (k,), (k, n)
    elif case == "mat_vec":
        a, b = (m, k), (k,)
    elif case == "vec_vec":
        a, b = (k,), (k,)
    else:
        batch = draw.broadcastable(2, min_dims=1, max_dims=2)
        a, b = batch[0] + (m, k), batch[1] + (k, n)
    return [draw.array(a), draw.array(b)], {}


def _promote_for_matmul(o, g, a, b):
    """``g``, ``a`` and ``b`` with 1-D operands promoted as NumPy does."""
    if len(a.shape) == 1:
        a = o.reshape(a, (1,) + a.shape)
        g = o.reshape(g, g.shape[:-1] + (1,) + g.shape[-1:])
    if len(b.shape) == 1:
        b = o.reshape(b, b.shape + (1,))
        g = o.reshape(g, g.shape + (1,))
    return g, a, b


def _matrices(g, a, b) -> bool:
    """Whether a product's cotangent and operands are all 2-D NumPy arrays:
    then its rules below compute ``g @ b.T`` and ``a.T @ g`` through the
    kernels (no promotion, no broadcasting to undo), which the fast path
    computes without them."""
    nd = np.ndarray
    return (g.__class__ is nd and a.__class__ is nd and b.__class__ is nd
            and g.ndim == 2 and a.ndim == 2 and b.ndim == 2)


@op(numpy=np.matmul, operator="matmul", sample=_sample_matmul,
    reference=lambda np, a, b: np.matmul(a, b))
class matmul:
    """``a @ b`` with NumPy's rules (1-D operands, batched for rank >= 3).  A
    scalar operand is a ValidationError (use ``mul``)."""
    def kernel(a, b):
        return gpu_ops.matmul(a, b)     # its shape rule, gpu_ops.matmul_shape, refuses scalars

    def vjp_a(o, g, out, a, b):
        if o is kernels and _matrices(g, a, b):
            return g @ b.T              # first order on 2-D arrays: what the rest comes down to
        a_shape = a.shape
        g, a, b = _promote_for_matmul(o, g, a, b)
        ga = o.matmul(g, _swap_last(o, b))
        if ga.shape != a.shape:
            ga = unbroadcast(o, ga, a.shape)
        return ga if ga.shape == a_shape else o.reshape(ga, a_shape)

    def vjp_b(o, g, out, a, b):
        if o is kernels and _matrices(g, a, b):
            return a.T @ g
        b_shape = b.shape
        g, a, b = _promote_for_matmul(o, g, a, b)
        gb = o.matmul(_swap_last(o, a), g)
        if gb.shape != b.shape:
            gb = unbroadcast(o, gb, b.shape)
        return gb if gb.shape == b_shape else o.reshape(gb, b_shape)

    def jvp_a(o, t, out, a, b):
        return o.matmul(t, b)

    def jvp_b(o, t, out, a, b):
        return o.matmul(a, t)


def _reduce_kernel(method, np_fn):
    def kernel(x, axis, keepdims):
        try:        # the array's own method: no Python-level NumPy wrapper
            return getattr(x, method)(axis=axis, keepdims=keepdims)
        except AttributeError:      # a Python scalar
            return np_fn(x, axis=axis, keepdims=keepdims)
    kernel.__name__ = kernel.__qualname__ = f"{method}_kernel"
    return kernel


@op(numpy=np.sum, methods=("sum",), linear=True, sample=samples.reduction(empty=True),
    reference=lambda np, x, axis=None, keepdims=False: np.sum(x, axis=axis, keepdims=keepdims))
class sum:
    """Sum over ``axis`` (None: all; an int or a tuple, negative allowed)."""
    kernel = _reduce_kernel("sum", np.sum)
    prepare = reduction_prepare

    def vjp_x(o, g, out, x, axis, keepdims):
        return expand_back(o, g, x.shape, axis, keepdims)


def _count(shape, axis):
    return math.prod(shape[i] for i in norm_axes(axis, len(shape)))


@op(numpy=np.mean, methods=("mean",), linear=True, sample=samples.reduction(),
    reference=lambda np, x, axis=None, keepdims=False: np.mean(x, axis=axis,
                                                                keepdims=keepdims))
class mean:
    """Mean over ``axis`` (None: all; an int or a tuple, negative allowed)."""
    kernel = _reduce_kernel("mean", np.mean)
    prepare = reduction_prepare

    def vjp_x(o, g, out, x, axis, keepdims):
        shape = x.shape
        return o.div(expand_back(o, g, shape, axis, keepdims), _count(shape, axis))


@op(numpy=(np.max, np.amax), methods=("max",), sample=samples.reduction(),
    reference=lambda np, x, axis=None, keepdims=False: np.max(x, axis=axis, keepdims=keepdims))
class max:
    """Maximum over ``axis``; tied maxima share the gradient equally."""
    kernel = _reduce_kernel("max", np.max)
    prepare = reduction_prepare
    vjp_x, jvp_x = weighted_reduction(extremum_weights)


# --- shapes ------------------------------------------------------------------------------


def _sample_reshape(draw):
    shape = draw.shape()
    size = math.prod(shape)
    target = draw.choice([(size,), (1, size), (size, 1), (-1,), (1, -1, 1), size, -1,
                          tuple(reversed(shape))])
    kwargs = {"shape": target}
    if draw.boolean():
        kwargs["order"] = draw.choice(["C", "F"])
    return [draw.array(shape)], kwargs


def _resolve_shape(x, shape):
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(_operator.index(s) for s in shape)
    if -1 in shape:
        total = math.prod(_shape(_raw(x)))
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(total // known if known and s == -1 else s for s in shape)
    return shape


def _reshape_order(order):
    if order in ("C", "F"):
        return order
    if order == "A":
        raise UnimplementedError(
            "reshape(..., order='A') depends on the memory layout of the array, which "
            "tracing does not promise to keep: say order='C' or order='F'")
    raise ValidationError(f"reshape: order must be 'C' or 'F', not {order!r}")


@op(numpy=np.reshape, linear=True, sample=_sample_reshape,
    reference=lambda np, x, shape, order="C": np.reshape(x, shape, order=order))
class reshape:
    """``x`` with a new shape (one ``-1`` allowed), its elements read and
    written in C (``order='C'``) or Fortran (``'F'``) index order.  ``copy``
    is accepted and ignored: Tensors are immutable, so a copy and a view are
    the same value."""
    def kernel(x, shape, order="C"):
        try:
            return x.reshape(shape, order=order)
        except AttributeError:
            return np.reshape(x, shape, order=order)

    def prepare(x, shape, order="C", *, copy=None):
        return x, _resolve_shape(x, shape), _reshape_order(order)

    def vjp_x(o, g, out, x, shape, order):
        return o.reshape(g, _shape(x), order)

    def method(self, *shape, order="C"):
        """``t.reshape(2, 3)`` or ``t.reshape((2, 3))``."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return recordable.reshape(self, shape, order)


def _sample_transpose(draw):
    shape = draw.shape()
    axes = None
    if draw.boolean():
        axes = tuple(draw.choice([list(p) for p in _permutations(len(shape))]))
        axes = tuple(a - len(shape) if i % 2 else a for i, a in enumerate(axes))
    return [draw.array(shape)], {"axes": axes}


def _permutations(n):
    import itertools
    return list(itertools.permutations(range(n)))


@op(numpy=np.transpose, linear=True, sample=_sample_transpose,
    # HIPS autograd inverts negative axes wrongly: give it non-negative ones
    reference=lambda np, x, axes=None: np.transpose(
        x, None if axes is None else tuple(a % np.ndim(x) for a in axes)))
class transpose:
    """Permute axes (reverse them when ``axes`` is None)."""
    def kernel(x, axes):
        try:
            return x.transpose(axes)
        except AttributeError:
            return np.transpose(x, axes)

    def prepare(x, axes=None):
        if axes is not None:
            nd = len(_shape(_raw(x)))
            axes = tuple(gpu_ops.normalize_axis(int(a), nd) for a in axes)
        return x, axes

    def vjp_x(o, g, out, x, axes):
        return o.transpose(g, None if axes is None else tuple(np.argsort(axes)))

    def method(self, *axes):
        """``t.transpose()``, ``t.transpose(1, 0)`` or ``t.transpose((1, 0))``."""
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = axes[0]
        return recordable.transpose(self, axes or None)


setattr(Tensor, "T", property(lambda self: recordable.transpose(self),
                             doc="The transpose (axes reversed)."))


def _sample_broadcast_to(draw):
    src = draw.shape()
    extra = draw.shape(max_dims=2)
    target = extra + tuple(draw.integers(1, 3) if s == 1 else s for s in src)
    return [draw.array(src)], {"shape": target}


@op(numpy=np.broadcast_to, linear=True, sample=_sample_broadcast_to,
    reference=lambda np, x, shape: np.broadcast_to(
        np.reshape(x, (1,) * (len(shape) - np.ndim(x)) + np.shape(x)), shape))
class broadcast_to:
    """``x`` broadcast to ``shape``; the gradient sums over the broadcast axes."""
    def kernel(x, shape):
        return array_module(x).broadcast_to(x, shape)

    def prepare(x, shape):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        return x, tuple(int(s) for s in shape)

    def vjp_x(o, g, out, x, shape):
        return unbroadcast(o, g, _shape(x))


# --- indexing -------------------------------------------------------------------------


def _raw_index(index):
    if isinstance(index, tuple):
        return tuple(_raw(i) for i in index)
    if isinstance(index, list):
        return np.asarray([_raw(i) for i in index])
    return _raw(index)


def _sample_getitem(draw):
    shape = draw.shape(min_dims=2, max_dims=3, min_side=2, max_side=4)
    kind = draw.choice(["slice", "int", "fancy", "mixed", "newaxis", "bool"])
    if kind == "slice":
        index = (slice(1, None), slice(None, None, -1))
    elif kind == "int":
        index = -1
    elif kind == "fancy":
        index = draw.integer_array((5,), 0, shape[0] - 1)
    elif kind == "mixed":
        index = (Ellipsis, draw.integer_array((3,), 0, shape[-1] - 1))
    elif kind == "newaxis":
        index = (None, 0)
    else:
        index = draw.bool_array((shape[0],))
    return [draw.array(shape), index], {}


@op(methods=("__getitem__",), linear=True, sample=_sample_getitem,
    reference=lambda np, x, index: x[index])
class getitem:
    """``x[index]`` with NumPy indexing (basic and advanced); its transpose is
    ``index_add``."""
    def kernel(x, index):
        return x[index]

    def prepare(x, index):
        return x, _raw_index(index)

    def vjp_x(o, g, out, x, index):
        return o.index_add(g, index, _shape(x))


def _sample_index_add(draw):
    shape = draw.shape(min_dims=1)
    index = draw.integer_array((draw.integers(1, 4),), 0, shape[0] - 1)
    return [draw.array((len(index),) + shape[1:]), index, shape], {}


@op(linear=True, sample=_sample_index_add)
class index_add:
    """zeros(``shape``) with ``g`` added at ``index`` (repeated indices
    accumulate): the transpose of ``getitem``."""
    def kernel(g, index, shape):
        xp = array_module(g)
        z = xp.zeros(shape, dtype=getattr(g, "dtype", None))
        if xp is np:
            np.add.at(z, index, g)
        else:  # CuPy
            import cupyx
            cupyx.scatter_add(z, index, g)
        return z

    def prepare(g, index, shape):
        return g, _raw_index(index), tuple(shape)

    def vjp_g(o, ct, out, g, index, shape):
        return o.getitem(ct, index)


def _sample_gather(draw):
    shape = draw.shape(min_dims=1)
    idx = draw.integer_array(draw.shape(max_dims=2, max_side=4), 0, shape[0] - 1)
    return [draw.array(shape), idx], {}


@op(constant=("indices",), linear=True, sample=_sample_gather,
    reference=lambda np, values, indices: values[indices])
class gather:
    """Rows of ``values`` picked by integer ``indices`` (shape ``indices.shape +
    values.shape[1:]``), as the runtime ABI's gather: an index outside ``[0,
    rows)`` is a ValidationError; repeated rows accumulate their gradients."""
    def kernel(values, indices):
        return gpu_ops.gather(values, indices)

    def vjp_values(o, g, out, values, indices):
        return o.index_add(g, _raw(indices), values.shape)


# --- softmax and the loss ------------------------------------------------------------------


def _softmax_reference(np, x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax_reference(np, x, axis=-1):
    s = x - np.max(x, axis=axis, keepdims=True)
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


def _axis_prepare(x, axis=-1):
    return x, int(axis)


@op(sample=samples.along_axis(), reference=_softmax_reference)
class softmax:
    """Numerically stable softmax along ``axis``."""
    def kernel(x, axis):
        return gpu_ops.softmax(x, axis)

    prepare = _axis_prepare

    def vjp_x(o, g, out, x, axis):
        gy = o.mul(g, out)
        return o.sub(gy, o.mul(out, o.sum(gy, axis, True)))

    def jvp_x(o, t, out, x, axis):
        ty = o.mul(t, out)
        return o.sub(ty, o.mul(out, o.sum(ty, axis, True)))


@op(sample=samples.along_axis(), reference=_log_softmax_reference)
class log_softmax:
    """Numerically stable log-softmax along ``axis``: ``x - logsumexp(x, axis)``,
    the logarithm of :func:`softmax`."""
    def kernel(x, axis):
        return gpu_ops.log_softmax(x, axis)

    prepare = _axis_prepare

    def vjp_x(o, g, out, x, axis):
        return o.sub(g, o.mul(o.exp(out), o.sum(g, axis, True)))

    def jvp_x(o, t, out, x, axis):
        return o.sub(t, o.sum(o.mul(o.exp(out), t), axis, True))


def _one_hot(labels, like):
    xp = array_module(like)
    labels = xp.asarray(_raw(labels))
    return (labels[..., None] == xp.arange(like.shape[-1])).astype(like.dtype)


def _reference_onehot(labels, classes):
    return (np.asarray(labels)[..., None] == np.arange(classes)).astype(np.float64)


def _sample_cross_entropy(draw):
    lead = draw.shape(max_dims=2, max_side=4)
    classes = draw.integers(1, 5)
    return [draw.array(lead + (classes,)), draw.integer_array(lead, 0, classes - 1)], {}


def _cross_entropy_reference(np, logits, labels):
    n = _pymax(1, math.prod(np.shape(labels)))
    onehot = _reference_onehot(labels, np.shape(logits)[-1])
    return -np.sum(_log_softmax_reference(np, logits) * onehot) / n


@op(constant=("labels",), sample=_sample_cross_entropy, reference=_cross_entropy_reference)
class cross_entropy:
    """Mean over samples of ``-log_softmax(logits)[label]``: ``logits`` is
    ``(..., classes)``, ``labels`` integer class indices in ``[0, classes)`` of
    shape ``logits.shape[:-1]`` (float labels are a TypeError, out-of-range
    ones a ValidationError)."""
    def kernel(logits, labels):
        xp = array_module(logits)
        labels = xp.asarray(labels)
        if labels.dtype.kind not in "iu":
            raise KinaTypeError(
                f"cross_entropy needs integer class labels, got dtype {labels.dtype} "
                "(for probability targets use -sum(targets * log_softmax(logits)))")
        if not _shape(logits):
            raise ValidationError("cross_entropy needs logits of rank >= 1 (classes last)")
        if labels.shape != logits.shape[:-1]:
            raise ValidationError(
                f"cross_entropy: labels of shape {labels.shape} for logits {logits.shape}")
        return gpu_ops.cross_entropy(logits, labels)    # the runtime's kernel

    def vjp_logits(o, g, out, logits, labels):
        n = _pymax(1, math.prod(logits.shape[:-1]))
        if (o is kernels and g.__class__ is not Tensor and logits.__class__ is not Tensor
                and getattr(g, "dtype", None) == logits.dtype):
            # First order on raw arrays: the runtime's fused kernel (one buffer).
            return gpu_ops.cross_entropy_grad(logits, array_module(logits).asarray(_raw(labels)),
                                              g / n)
        diff = o.sub(o.softmax(logits, -1), _one_hot(labels, _raw(logits)))
        return o.mul(diff, o.div(g, n))

    def jvp_logits(o, t, out, logits, labels):
        n = _pymax(1, math.prod(logits.shape[:-1]))
        diff = o.sub(o.softmax(logits, -1), _one_hot(labels, _raw(logits)))
        return o.div(o.sum(o.mul(diff, t), None, False), n)


def _sample_repeat_interleave(draw):
    shape = draw.shape(min_dims=1)
    axis = draw.choice([None] + list(range(-len(shape), len(shape))))
    return [draw.array(shape), draw.integers(0, 3)], {"axis": axis}


@op(numpy=(), linear=True, sample=_sample_repeat_interleave,
    reference=lambda np, x, repeats, axis=None: np.repeat(
        x, repeats, None if axis is None else axis % np.ndim(x)))
class repeat_interleave:
    """Each element repeated ``repeats`` times along ``axis``, PyTorch's
    semantics: ``axis=None`` repeats the flattened array."""
    def kernel(x, repeats, axis):
        return gpu_ops.repeat_interleave(x, repeats, axis)

    def prepare(x, repeats, axis=None):
        try:
            repeats = _operator.index(repeats)
        except TypeError:
            raise KinaTypeError(f"repeat_interleave: repeats must be an int, not "
                                f"{type(repeats).__name__}") from None
        if repeats < 0:
            raise ValidationError(f"repeat_interleave: repeats must be >= 0, got {repeats}")
        if axis is None:
            return recordable.reshape(x, (-1,)), repeats, 0
        return x, repeats, _operator.index(axis)

    def vjp_x(o, g, out, x, repeats, axis):
        shape = x.shape
        ax = gpu_ops.normalize_axis(axis, len(shape))
        g = o.reshape(g, shape[:ax] + (shape[ax], repeats) + shape[ax + 1:])
        return o.sum(g, ax + 1, False)


def _sample_where(draw):
    c, a, b = draw.broadcastable(3)
    return [draw.bool_array(c), draw.array(a), draw.array(b)], {}


@op(numpy=np.where, constant=("cond",), elementwise=True, sample=_sample_where,
    # HIPS autograd's own where does not undo broadcasting: the mask form does
    reference=lambda np, cond, a, b: a * cond + b * (1.0 - cond))
class where:
    """``a`` where ``cond`` else ``b`` (broadcasting); ``cond`` gets no gradient."""
    def kernel(cond, a, b):
        return array_module(cond, a, b).where(cond, a, b)

    def prepare(cond, a=None, b=None):
        if a is None or b is None:
            raise KinaTypeError("where(cond) with one argument (nonzero) is not "
                                "differentiable: use numpy.nonzero(t.data)")
        return cond, a, b

    def d_a(o, v, out, cond, a, b):
        return o.where(_raw(cond), v, 0.0)

    def d_b(o, v, out, cond, a, b):
        return o.where(_raw(cond), 0.0, v)


@op(constant=("x",))
class stop_gradient:
    """``x`` as a constant for every enclosing ``grad``/``vjp``/``jvp``/``Tape``."""
    def kernel(x):
        return x


# --- building arrays: stack, concatenate, clip -----------------------------------------------


def _sample_stack(draw):
    shape = draw.shape(max_dims=2)
    n = draw.integers(1, 3)
    return [[draw.array(shape) for _ in range(n)]], {
        "axis": draw.integers(-len(shape) - 1, len(shape))}


def _asarrays(xs):
    xp = array_module(*xs)
    return xp, [xp.asarray(x) for x in xs]


@op(numpy=np.stack, sequence=True, linear=True, sample=_sample_stack,
    reference=lambda np, xs, axis=0: np.stack(xs, axis))
class stack:
    """Arrays of one shape joined along a new ``axis``.  Lists of Tensors
    passed where an array is expected are stacked with it."""
    def kernel(xs, axis):
        xp, arrays = _asarrays(xs)
        return xp.stack(arrays, axis)

    def prepare(xs, axis=0):
        return as_sequence("stack", xs), _operator.index(axis)

    def vjp_xs(o, g, out, i, xs, axis):
        ax = gpu_ops.normalize_axis(axis, len(out.shape))
        return o.getitem(g, (slice(None),) * ax + (i,))


def _sample_concatenate(draw):
    base = draw.shape(min_dims=1, max_dims=3)
    axis = draw.integers(-len(base), len(base) - 1)
    ax = axis % len(base)
    xs = []
    for _ in range(draw.integers(1, 3)):
        shape = base[:ax] + (draw.integers(0, 3),) + base[ax + 1:]
        xs.append(draw.array(shape))
    return [xs], {"axis": axis}


@op(numpy=np.concatenate, sequence=True, linear=True, sample=_sample_concatenate,
    reference=lambda np, xs, axis=0: np.concatenate(xs, axis))
class concatenate:
    """Arrays joined along an existing ``axis`` (None: flattened first)."""
    def kernel(xs, axis):
        xp, arrays = _asarrays(xs)
        return xp.concatenate(arrays, axis)

    def prepare(xs, axis=0):
        xs = as_sequence("concatenate", xs)
        if axis is None:
            return [recordable.reshape(x, (-1,)) for x in xs], 0
        return xs, _operator.index(axis)

    def vjp_xs(o, g, out, i, xs, axis):
        ax = gpu_ops.normalize_axis(axis, len(out.shape))
        start = _pysum(_shape(x)[ax] for x in xs[:i])
        stop = start + _shape(xs[i])[ax]
        return o.getitem(g, (slice(None),) * ax + (slice(start, stop),))


def _clip_masks(x, lo, hi):
    """Raw masks of where ``minimum(maximum(x, lo), hi)`` takes each input."""
    rx, rlo, rhi = _raw(x), _raw(lo), _raw(hi)
    xp = array_module(rx, rlo, rhi)
    m = xp.maximum(rx, rlo)
    inside = m <= rhi
    return (rx >= rlo) & inside, (rx < rlo) & inside, ~inside


_CLIP_KEYWORDS = "min" in inspect.signature(np.clip).parameters     # NumPy >= 2.1


def _sample_clip(draw):
    sx, slo, shi = draw.broadcastable(3)
    x = draw.array(sx)
    lo = draw.choice([None, -0.5, "array"])
    hi = draw.choice([None, 0.7, "array"])
    if lo == "array":
        lo = np.asarray(draw.array(slo) - 0.6)
    if hi == "array":
        hi = np.asarray(draw.array(shi) + 0.8)
    if _CLIP_KEYWORDS and not isinstance(lo, np.ndarray) and not isinstance(hi, np.ndarray) \
            and draw.boolean():     # (arrays stay arguments: the generic tests vary those)
        return [x], {"min": lo, "max": hi}
    return [x, lo, hi], {}


def _clip_reference(np, x, a_min=None, a_max=None, *, min=None, max=None):
    lo, hi = a_min if min is None else min, a_max if max is None else max
    return np.minimum(np.maximum(x, -np.inf if lo is None else lo), np.inf if hi is None else hi)


@op(numpy=np.clip, elementwise=True, sample=_sample_clip, reference=_clip_reference)
class clip:
    """``minimum(maximum(x, a_min), a_max)`` (a bound may be None; ``min=``
    and ``max=`` are NumPy 2.1's names for them).  Each
    output element's gradient goes to the input it was taken from (``x`` on
    the boundary), so the bounds are differentiable too."""
    def kernel(x, a_min, a_max):
        return array_module(x, a_min, a_max).minimum(
            array_module(x, a_min).maximum(x, a_min), a_max)

    def prepare(x, a_min=None, a_max=None, *, min=None, max=None):
        # NumPy 2.1's min=/max= spell a_min/a_max (one of each pair at most)
        if min is not None:
            if a_min is not None:
                raise KinaTypeError("clip: a_min and min are the same bound: give one")
            a_min = min
        if max is not None:
            if a_max is not None:
                raise KinaTypeError("clip: a_max and max are the same bound: give one")
            a_max = max
        return (x, -math.inf if a_min is None else a_min,
                math.inf if a_max is None else a_max)

    def d_x(o, v, out, x, a_min, a_max):
        return o.mul(v, _clip_masks(x, a_min, a_max)[0])

    def d_a_min(o, v, out, x, a_min, a_max):
        return o.mul(v, _clip_masks(x, a_min, a_max)[1])

    def d_a_max(o, v, out, x, a_min, a_max):
        return o.mul(v, _clip_masks(x, a_min, a_max)[2])
