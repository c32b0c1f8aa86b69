"""Breadth ops (shape): joining, splitting, moving and selecting elements.

One ``@op`` block each (docs/autograd.md, "How to add an op"), or a function
composed of primitives where that is exact and simpler (its docstring says
so: most of these are ``reshape``, ``transpose``, ``concatenate`` or
``getitem`` in disguise).  Every public name in ``__all__`` is re-exported by
``kina_fx.autograd``.  (``stack``, ``concatenate``, ``ravel``, ``squeeze``
and ``array`` live in ``ops_core.py`` and ``functions.py``.)
"""
from __future__ import annotations

import operator as _operator

import numpy as np
import numpy as _numpy      # references get ``np`` as a parameter; constants use NumPy

from .. import gpu_ops
from ..errors import KinaTypeError, UnimplementedError, ValidationError
from .ops_core import broadcast_to, concatenate, getitem, index_add, reshape, transpose
from .ops_core import sum as _sum
from .primitives import axis_param, numpy_rule, op
from .tensor import Tensor, _as_array, _raw, _shape, array_module, as_sequence, is_traced

__all__ = [
    "atleast_1d", "atleast_2d", "atleast_3d", "hstack", "vstack", "dstack", "column_stack",
    "split", "array_split", "expand_dims", "swapaxes", "moveaxis", "flip", "fliplr", "flipud",
    "roll", "tile", "pad", "sort", "take_along_axis", "tril", "triu", "diag", "diagonal",
    "trace",
]

_pyabs, _pymax, _pymin = abs, max, min


def _ndim(x):
    return len(_shape(_raw(x)))


def _axis(axis, ndim):
    return gpu_ops.normalize_axis(_operator.index(axis), ndim)


def _axes(axis, ndim):
    """An int or a sequence of axes as a tuple of non-negative axes."""
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    axes = tuple(_axis(a, ndim) for a in axis)
    if len(set(axes)) != len(axes):
        raise ValidationError(f"repeated axis in {axis}")
    return axes


def _unpack(results):
    return results[0] if len(results) == 1 else tuple(results)


def _each(fn, arys):
    return _unpack([fn(x) for x in arys])


# =====================================================================================
# Joining (composites of reshape and concatenate)
# =====================================================================================


def _sample_arrays(max_dims=2, sequence=False):
    """One to three arrays: as separate arguments, or (``sequence``) one list
    of arrays of one shape."""
    def sample(draw):
        n = draw.integers(1, 3)
        if sequence:
            shape = draw.shape(max_dims=max_dims)
            return [[draw.array(shape) for _ in range(n)]], {}
        return [draw.array(draw.shape(max_dims=max_dims)) for _ in range(n)], {}
    return sample


@numpy_rule(np.atleast_1d, sample=_sample_arrays(),
            reference=lambda np, *arys: _each(np.atleast_1d, arys))
def atleast_1d(*arys):
    """Each array with at least one axis (a 0-d one becomes ``(1,)``), composed
    with ``reshape``; one array for one argument, else a tuple."""
    results = []
    for x in arys:
        x = _as_array(x)
        results.append(x if _ndim(x) >= 1 else reshape(x, (1,)))
    return _unpack(results)


@numpy_rule(np.atleast_2d, sample=_sample_arrays(),
            reference=lambda np, *arys: _each(np.atleast_2d, arys))
def atleast_2d(*arys):
    """Each array with at least two axes (``(n,)`` becomes ``(1, n)``), composed
    with ``reshape``."""
    results = []
    for x in arys:
        x = _as_array(x)
        shape = _shape(_raw(x))
        results.append(x if len(shape) >= 2 else reshape(x, (1,) * (2 - len(shape)) + shape))
    return _unpack(results)


@numpy_rule(np.atleast_3d, sample=_sample_arrays(max_dims=3),
            reference=lambda np, *arys: _each(np.atleast_3d, arys))
def atleast_3d(*arys):
    """Each array with at least three axes (``(n,)`` becomes ``(1, n, 1)``,
    ``(m, n)`` becomes ``(m, n, 1)``), composed with ``reshape``."""
    results = []
    for x in arys:
        x = _as_array(x)
        shape = _shape(_raw(x))
        if len(shape) == 0:
            x = reshape(x, (1, 1, 1))
        elif len(shape) == 1:
            x = reshape(x, (1,) + shape + (1,))
        elif len(shape) == 2:
            x = reshape(x, shape + (1,))
        results.append(x)
    return _unpack(results)


def _sequence(name, tup):
    return [_as_array(x) for x in as_sequence(name, tup)]


def _sample_hstack(draw):
    shape = draw.shape(max_dims=3)
    xs = []
    for _ in range(draw.integers(1, 3)):
        s = list(shape)
        if len(s) >= 1:
            s[1 if len(s) > 1 else 0] = draw.integers(0, 2)
        xs.append(draw.array(tuple(s)))
    return [xs], {}


def _no_dtype(name, dtype):
    if dtype is not None:
        raise KinaTypeError(f"{name}(..., dtype=...) is not supported on Tensors: cast the "
                            "result (Tensor.astype)")


@numpy_rule(np.hstack, sample=_sample_hstack, reference=lambda np, tup: np.hstack(tup))
def hstack(tup, *, dtype=None, casting="same_kind"):
    """Arrays joined column-wise (along axis 1; axis 0 for 1-D arrays), as
    NumPy: ``concatenate`` of ``atleast_1d`` (``dtype`` is refused)."""
    _no_dtype("hstack", dtype)
    xs = [atleast_1d(x) for x in _sequence("hstack", tup)]
    return concatenate(xs, 0 if _ndim(xs[0]) == 1 else 1)


def _sample_vstack(draw):
    shape = draw.shape(max_dims=3)
    xs = []
    for _ in range(draw.integers(1, 3)):
        s = shape if len(shape) < 2 else (draw.integers(0, 2),) + shape[1:]
        xs.append(draw.array(s))
    return [xs], {}


@numpy_rule(np.vstack, sample=_sample_vstack, reference=lambda np, tup: np.vstack(tup))
def vstack(tup, *, dtype=None, casting="same_kind"):
    """Arrays joined row-wise (along axis 0, 1-D arrays as rows), as NumPy:
    ``concatenate`` of ``atleast_2d`` (``dtype`` is refused)."""
    _no_dtype("vstack", dtype)
    return concatenate([atleast_2d(x) for x in _sequence("vstack", tup)], 0)


@numpy_rule(np.dstack, sample=_sample_arrays(max_dims=3, sequence=True),
            reference=lambda np, tup: np.dstack(tup))
def dstack(tup):
    """Arrays joined along the third axis, as NumPy: ``concatenate`` of
    ``atleast_3d``."""
    return concatenate([atleast_3d(x) for x in _sequence("dstack", tup)], 2)


def _sample_column_stack(draw):
    n = draw.integers(1, 3)
    return [[draw.array((n,) if draw.boolean() else (n, draw.integers(1, 2)))
             for _ in range(draw.integers(1, 3))]], {}


@numpy_rule(np.column_stack, sample=_sample_column_stack,
            reference=lambda np, tup: np.column_stack(tup))
def column_stack(tup):
    """1-D arrays as columns (and 2-D arrays as they are) joined along axis 1,
    composed with ``reshape`` and ``concatenate``."""
    xs = []
    for x in _sequence("column_stack", tup):
        shape = _shape(_raw(x))
        xs.append(reshape(x, (shape[0] if shape else 1, 1)) if len(shape) < 2 else x)
    return concatenate(xs, 1)


# =====================================================================================
# Splitting (composites of getitem)
# =====================================================================================


def _split(x, indices_or_sections, axis, equal, name):
    x = _as_array(x)
    shape = _shape(_raw(x))
    ax = _axis(axis, len(shape))
    n = shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0:
            raise ValidationError(f"{name}: the number of sections must be > 0, got {sections}")
        if equal and n % sections:
            raise ValidationError(f"{name}: an axis of size {n} does not split into "
                                  f"{sections} equal sections (use array_split)")
        size, extra = divmod(n, sections)
        bounds = [0]
        for k in range(sections):
            bounds.append(bounds[-1] + size + (1 if k < extra else 0))
    else:
        bounds = [0] + [_operator.index(i) for i in indices_or_sections] + [n]
    lead = (slice(None),) * ax
    return [getitem(x, lead + (slice(start, stop),)) for start, stop in zip(bounds, bounds[1:])]


def _sample_split(draw):
    shape = draw.shape(min_dims=1)
    axis = draw.integers(-len(shape), len(shape) - 1)
    n = shape[axis]
    if draw.boolean():
        sections = draw.choice([d for d in range(1, n + 1) if n % d == 0])
    else:
        sections = sorted(draw.integers(0, n) for _ in range(draw.integers(0, 2)))
    return [draw.array(shape), sections], {"axis": axis}


@numpy_rule(np.split, sample=_sample_split,
            reference=lambda np, x, indices_or_sections, axis=0: np.split(
                x, indices_or_sections, axis))
def split(x, indices_or_sections, axis=0):
    """A list of pieces of ``x`` along ``axis``: ``indices_or_sections`` is a
    number of equal sections (else a ValidationError) or the split indices;
    each piece is a ``getitem`` slice."""
    return _split(x, indices_or_sections, axis, True, "split")


def _sample_array_split(draw):
    shape = draw.shape(min_dims=1)
    return [draw.array(shape), draw.integers(1, 4)], {"axis": draw.integers(0, len(shape) - 1)}


@numpy_rule(np.array_split, sample=_sample_array_split,
            reference=lambda np, x, indices_or_sections, axis=0: np.array_split(
                x, indices_or_sections, axis))
def array_split(x, indices_or_sections, axis=0):
    """As ``split``, but a number of sections need not divide the axis (the
    first pieces are one longer), as NumPy."""
    return _split(x, indices_or_sections, axis, False, "array_split")


# =====================================================================================
# Moving axes (composites of reshape and transpose)
# =====================================================================================


def _sample_expand_dims(draw):
    shape = draw.shape()
    n = len(shape) + draw.integers(1, 2)
    if n == len(shape) + 1:
        axis = draw.integers(-n, n - 1)
    else:
        first = draw.integers(0, n - 1)
        axis = (first, draw.choice([a - n for a in range(n) if a != first]))
    return [draw.array(shape)], {"axis": axis}


@numpy_rule(np.expand_dims, sample=_sample_expand_dims,
            reference=lambda np, x, axis: np.expand_dims(x, axis))
def expand_dims(x, axis):
    """``x`` with new size-1 axes at ``axis`` (an int or a tuple, positions in
    the result), composed with ``reshape``."""
    x = _as_array(x)
    shape = _shape(_raw(x))
    n = len(shape) + (1 if isinstance(axis, (int, np.integer)) else len(axis))
    new = set(_axes(axis, n))
    rest = iter(shape)
    return reshape(x, tuple(1 if i in new else next(rest) for i in range(n)))


def _sample_swapaxes(draw):
    shape = draw.shape(min_dims=1)
    nd = len(shape)
    return [draw.array(shape), draw.integers(-nd, nd - 1), draw.integers(-nd, nd - 1)], {}


@numpy_rule(np.swapaxes, sample=_sample_swapaxes,
            reference=lambda np, x, axis1, axis2: np.swapaxes(x, axis1, axis2))
def swapaxes(x, axis1, axis2):
    """``x`` with two axes interchanged, composed with ``transpose``."""
    x = _as_array(x)
    nd = _ndim(x)
    perm = list(range(nd))
    a, b = _axis(axis1, nd), _axis(axis2, nd)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, tuple(perm))


def _sample_moveaxis(draw):
    shape = draw.shape(min_dims=1)
    nd = len(shape)
    if draw.boolean():
        return [draw.array(shape), draw.integers(-nd, nd - 1), draw.integers(-nd, nd - 1)], {}
    k = draw.integers(1, nd)
    src = draw.choice([tuple(range(k)), tuple(range(nd - k, nd))])
    dst = tuple(draw.choice([list(range(k)), list(range(nd - 1, nd - 1 - k, -1))]))
    return [draw.array(shape), src, dst], {}


@numpy_rule(np.moveaxis, sample=_sample_moveaxis,
            reference=lambda np, x, source, destination: np.moveaxis(x, source, destination))
def moveaxis(x, source, destination):
    """``x`` with axes ``source`` moved to positions ``destination`` (ints or
    sequences of the same length), the others in order; composed with
    ``transpose``."""
    x = _as_array(x)
    nd = _ndim(x)
    src, dst = _axes(source, nd), _axes(destination, nd)
    if len(src) != len(dst):
        raise ValidationError("moveaxis: source and destination need the same number of axes")
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, tuple(order))


# =====================================================================================
# Reordering elements (primitives)
# =====================================================================================


def _sample_flip(draw):
    shape = draw.shape(min_side=0)
    return [draw.array(shape)], {"axis": draw.axis(len(shape))}


def _flip_reference(np, x, axis=None):
    axes = range(np.ndim(x)) if axis is None else _axes(axis, np.ndim(x))
    return x[tuple(slice(None, None, -1) if i in axes else slice(None)
                   for i in range(np.ndim(x)))]


@op(numpy=np.flip, linear=True, sample=_sample_flip, reference=_flip_reference)
class flip:
    """``x`` with the order of elements reversed along ``axis`` (None: all
    axes; an int or a tuple)."""
    def kernel(x, axis):
        return array_module(x).flip(x, axis)

    def prepare(x, axis=None):
        x = _as_array(x)
        return x, None if axis is None else axis_param(_axes(axis, _ndim(x)))

    def vjp_x(o, g, out, x, axis):
        return o.flip(g, axis)


def _sample_matrix(min_dims=2):
    def sample(draw):
        return [draw.array(draw.shape(min_dims=min_dims, max_dims=3, min_side=0))], {}
    return sample


@numpy_rule(np.fliplr, sample=_sample_matrix(),
            reference=lambda np, m: _flip_reference(np, m, 1))
def fliplr(m):
    """``flip(m, 1)`` (rank >= 2), as NumPy."""
    if _ndim(_as_array(m)) < 2:
        raise ValidationError("fliplr needs an array of rank >= 2")
    return flip(m, 1)


@numpy_rule(np.flipud, sample=_sample_matrix(min_dims=1),
            reference=lambda np, m: _flip_reference(np, m, 0))
def flipud(m):
    """``flip(m, 0)`` (rank >= 1), as NumPy."""
    if _ndim(_as_array(m)) < 1:
        raise ValidationError("flipud needs an array of rank >= 1")
    return flip(m, 0)


def _shift_param(shift):
    if isinstance(shift, (int, np.integer)):
        return int(shift)
    return tuple(_operator.index(s) for s in shift)


def _sample_roll(draw):
    shape = draw.shape(min_side=0)
    if not shape or draw.boolean():
        return [draw.array(shape), draw.integers(-4, 4)], {}
    axes = draw.axis(len(shape), none=False)
    shift = draw.integers(-4, 4) if isinstance(axes, int) else tuple(
        draw.integers(-4, 4) for _ in axes)
    return [draw.array(shape), shift], {"axis": axes}


def _roll_reference(np, x, shift, axis=None):
    if isinstance(shift, int):
        return np.roll(x, shift, axis)
    for s, a in zip(shift, axis):     # one axis at a time (HIPS rolls by an int)
        x = np.roll(x, s, a)
    return x


@op(numpy=np.roll, linear=True, sample=_sample_roll, reference=_roll_reference)
class roll:
    """Elements shifted by ``shift`` along ``axis`` (None: the flattened
    array), wrapping around, as NumPy."""
    def kernel(x, shift, axis):
        return array_module(x).roll(x, shift, axis)

    def prepare(x, shift, axis=None):
        x = _as_array(x)
        return x, _shift_param(shift), None if axis is None else axis_param(axis)

    def vjp_x(o, g, out, x, shift, axis):
        back = -shift if isinstance(shift, int) else tuple(-s for s in shift)
        return o.roll(g, back, axis)


def _sample_tile(draw):
    shape = draw.shape()
    reps = tuple(draw.integers(0, 2) for _ in range(draw.integers(0, 3)))
    return [draw.array(shape), reps if draw.boolean() or len(reps) != 1 else reps[0]], {}


def _tile_reference(np, x, reps):
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    # the same function with reps as long as x.ndim: HIPS autograd's tile
    # gradient is wrong when reps is shorter (tile((2, 3) array, 2)) ...
    reps = (1,) * (np.ndim(x) - len(reps)) + reps
    # ... and divides by a zero repetition: tile once and keep nothing of those axes
    tiled = np.tile(x, tuple(r or 1 for r in reps))
    offset = np.ndim(tiled) - len(reps)
    return tiled[(slice(None),) * offset + tuple(slice(0, 0) if r == 0 else slice(None)
                                                 for r in reps)]


@op(numpy=np.tile, linear=True, sample=_sample_tile, reference=_tile_reference)
class tile:
    """``x`` repeated ``reps`` times along each axis (NumPy's rules for
    ``reps`` shorter or longer than ``x.ndim``)."""
    def kernel(x, reps):
        return array_module(x).tile(x, reps)

    def prepare(x, reps):
        reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
        reps = tuple(_operator.index(r) for r in reps)
        if any(r < 0 for r in reps):
            raise ValidationError(f"tile: negative repetitions {reps}")
        return x, reps

    def vjp_x(o, g, out, x, reps):
        shape = tuple(x.shape)
        d = _pymax(len(shape), len(reps))
        full = (1,) * (d - len(shape)) + shape
        reps = (1,) * (d - len(reps)) + reps
        g = o.reshape(g, tuple(v for r, s in zip(reps, full) for v in (r, s)))
        return o.reshape(o.sum(g, tuple(range(0, 2 * d, 2)), False), shape)


def _pad_widths(pad_width, ndim):
    if ndim == 0:
        return ()
    widths = np.asarray(_raw(pad_width))
    if widths.dtype.kind not in "iu":
        raise KinaTypeError(f"pad: pad_width must be integers, got {pad_width!r}")
    try:
        widths = np.broadcast_to(widths, (ndim, 2))
    except ValueError:
        raise ValidationError(f"pad: pad_width {pad_width!r} for an array of rank "
                              f"{ndim}") from None
    if (widths < 0).any():
        raise ValidationError(f"pad: negative pad_width {pad_width!r}")
    return tuple((int(b), int(a)) for b, a in widths)


def _sample_pad(draw):
    shape = draw.shape(min_side=0)
    width = draw.choice([1, (0, 2), "per_axis"])
    if width == "per_axis" and shape:
        width = tuple((draw.integers(0, 2), draw.integers(0, 2)) for _ in shape)
    elif width == "per_axis":
        width = 2
    kwargs = {"constant_values": draw.choice([0.0, 1.5])} if draw.boolean() else {}
    return [draw.array(shape), width], kwargs


@op(numpy=np.pad, sample=_sample_pad,
    reference=lambda np, x, pad_width, mode="constant", constant_values=0: np.pad(
        x, pad_width, mode, constant_values=constant_values))
class pad:
    """``x`` padded with ``constant_values`` (``mode='constant'``, NumPy's
    ``pad_width`` forms).  Other modes are an UnimplementedError; traced
    ``constant_values`` a TypeError (pad with ``concatenate`` instead)."""
    def kernel(x, pad_width, mode, constant_values):
        return array_module(x).pad(x, pad_width or 0, mode="constant",   # () for 0-d x
                                   constant_values=constant_values)

    def prepare(x, pad_width, mode="constant", constant_values=0, **kwargs):
        if callable(mode) or mode != "constant":
            raise UnimplementedError(
                f"pad: mode={mode!r} is not supported by kina_fx.autograd (only "
                "mode='constant'); build it from getitem and concatenate")
        if kwargs:
            raise KinaTypeError(f"pad: mode='constant' takes no {sorted(kwargs)}")
        if is_traced(constant_values):
            raise KinaTypeError("pad: constant_values must be a constant (to pad with a "
                                "traced value, concatenate it)")
        x = _as_array(x)
        nd = _ndim(x)
        values = np.asarray(_raw(constant_values), dtype=np.float64)
        if values.ndim == 0:
            values = float(values)
        else:
            values = tuple((float(b), float(a)) for b, a in np.broadcast_to(values, (nd, 2)))
        return x, _pad_widths(pad_width, nd), "constant", values

    def vjp_x(o, g, out, x, pad_width, mode, constant_values):
        if not pad_width:
            return g
        return o.getitem(g, tuple(slice(before, before + size)
                                  for (before, _), size in zip(pad_width, x.shape)))

    def jvp_x(o, t, out, x, pad_width, mode, constant_values):
        return o.pad(t, pad_width, "constant", 0.0)


def _along_axis(indices, axis):
    """The advanced index with which ``x[index]`` is
    ``take_along_axis(x, indices, axis)``."""
    xp = array_module(indices)
    nd = indices.ndim
    index = []
    for k, size in enumerate(indices.shape):
        if k == axis:
            index.append(indices)
        else:
            index.append(xp.arange(size).reshape((1,) * k + (size,) + (1,) * (nd - k - 1)))
    return tuple(index)


def _sorting_permutation(x, axis):
    rx = _raw(x)
    return array_module(rx).argsort(rx, axis=axis, kind="stable")


def _sample_sort(draw):
    shape = draw.shape(min_dims=1, min_side=0)
    if draw.boolean():
        return [draw.array(shape)], {"axis": None}
    return [draw.array(shape)], {"axis": draw.integers(-len(shape), len(shape) - 1)}


def _sort_reference(np, x, axis=-1):
    if axis is None:
        return np.sort(np.ravel(x))
    if np.size(x) == 0:
        return x                 # nothing to sort
    if np.ndim(x) <= 1:
        return np.sort(x, axis)
    # one 1-D sort per row (HIPS autograd sorts 1-D arrays only)
    moved = np.moveaxis(x, axis, -1)
    rows = np.reshape(moved, (-1, np.shape(moved)[-1]))
    stacked = np.stack([np.sort(rows[i]) for i in range(np.shape(rows)[0])])
    return np.moveaxis(np.reshape(stacked, np.shape(moved)), -1, axis)


@op(numpy=np.sort, sample=_sample_sort, reference=_sort_reference)
class sort:
    """``x`` sorted along ``axis`` (None: flattened).  The gradient goes back
    through the sorting permutation (a stable one: tied elements keep their
    order, so each gets its own slot's gradient).  ``kind``/``stable`` are
    accepted (the values are the same); ``order`` is refused."""
    def kernel(x, axis):
        return array_module(x).sort(x, axis=axis)

    def prepare(x, axis=-1, kind=None, order=None, *, stable=None):
        if order is not None:
            raise KinaTypeError("sort: order= (fields of structured arrays) is not supported")
        if axis is None:
            return reshape(x, (-1,)), 0
        x = _as_array(x)
        return x, _axis(axis, _ndim(x))

    def vjp_x(o, g, out, x, axis):
        perm = _sorting_permutation(x, axis)
        inverse = array_module(perm).argsort(perm, axis=axis)
        return o.getitem(g, _along_axis(inverse, axis))

    def jvp_x(o, t, out, x, axis):
        return o.getitem(t, _along_axis(_sorting_permutation(x, axis), axis))


def _sample_take_along_axis(draw):
    shape = draw.shape(min_dims=1)
    axis = draw.integers(-len(shape), len(shape) - 1)
    idx_shape = list(shape)
    idx_shape[axis] = draw.integers(0, 4)
    return [draw.array(shape), draw.integer_array(tuple(idx_shape), 0, shape[axis] - 1),
            axis], {}


@numpy_rule(np.take_along_axis, sample=_sample_take_along_axis,
            reference=lambda np, x, indices, axis: _take_along_axis_reference(
                np, x, indices, axis))
def take_along_axis(x, indices, axis=-1):
    """Elements of ``x`` picked along ``axis`` (default: the last; None: of
    the flattened ``x``) by integer ``indices``, as NumPy; composed with
    ``getitem`` (repeated indices accumulate their gradients)."""
    x = _as_array(x)
    indices = array_module(_raw(x)).asarray(_raw(indices))
    if indices.dtype.kind not in "iu":
        raise KinaTypeError("take_along_axis needs integer indices")
    if axis is None:
        return getitem(reshape(x, (-1,)), _along_axis(indices, 0))
    ax = _axis(axis, _ndim(x))
    if indices.ndim != _ndim(x):
        raise ValidationError("take_along_axis: indices and x need the same rank")
    index = list(_along_axis(indices, ax))
    return getitem(x, tuple(index))


def _take_along_axis_reference(np, x, indices, axis):
    # HIPS autograd has no take_along_axis rule: the same advanced index
    return x[_along_axis(indices, axis % indices.ndim)]


# =====================================================================================
# Triangles and diagonals
# =====================================================================================


def _sample_triangle(draw):
    shape = draw.shape(min_dims=1, max_dims=3)
    return [draw.array(shape)], {"k": draw.integers(-2, 2)}


def _square(np, x):
    # NumPy's triangles of a 1-D array: the array broadcast to a square
    return x * np.ones((np.shape(x)[0], 1)) if np.ndim(x) == 1 else x


def _triangle(name, doc):
    """Register ``tril`` or ``triu`` (``name``): the two differ only in the
    triangle kept, and each is its own transpose (linear, the cotangent's
    same triangle)."""
    class triangle:
        def kernel(x, k):
            return getattr(array_module(x), name)(x, k)

        def prepare(x, k=0):
            x = _as_array(x)
            shape = _shape(_raw(x))
            if not shape:
                raise ValidationError(f"{name} needs an array of rank >= 1")
            if len(shape) == 1:   # NumPy: a 1-D array is broadcast to (n, n)
                x = broadcast_to(x, (shape[0], shape[0]))
            return x, _operator.index(k)

        def vjp_x(o, g, out, x, k):
            return getattr(o, name)(g, k)
    triangle.__doc__ = doc
    return op(name, numpy=getattr(np, name), linear=True, sample=_sample_triangle,
              reference=lambda np, x, k=0: getattr(np, name)(_square(np, x), k))(triangle)


tril = _triangle("tril", """The lower triangle of the last two axes: elements above the ``k``-th
    diagonal set to zero (a 1-D ``x`` is broadcast to a square, as NumPy).""")
triu = _triangle("triu", """The upper triangle of the last two axes: elements below the ``k``-th
    diagonal set to zero (a 1-D ``x`` is broadcast to a square, as NumPy).""")


def _diagonal_positions(xp, rows, cols, offset):
    n = _pymax(0, _pymin(rows - _pymax(0, -offset), cols - _pymax(0, offset)))
    return xp.arange(n) + _pymax(0, -offset), xp.arange(n) + _pymax(0, offset)


def _sample_diagonal(draw):
    shape = draw.shape(min_dims=2, max_dims=3, min_side=1, max_side=4)
    nd = len(shape)
    a1 = draw.integers(-nd, nd - 1)
    a2 = draw.choice([a for a in range(nd) if a != a1 % nd])
    return [draw.array(shape)], {"offset": draw.integers(-2, 2), "axis1": a1, "axis2": a2}


def _diagonal_reference(np, x, offset=0, axis1=0, axis2=1):
    # the diagonal as an advanced index of the two axes moved last
    shape = np.shape(x)
    rows, cols = _diagonal_positions(_numpy, shape[axis1], shape[axis2], offset)
    return np.moveaxis(x, (axis1, axis2), (-2, -1))[..., rows, cols]


@numpy_rule(np.diagonal, sample=_sample_diagonal, reference=_diagonal_reference)
def diagonal(x, offset=0, axis1=0, axis2=1):
    """The ``offset``-th diagonal of the ``axis1``/``axis2`` planes, on a new
    last axis, as NumPy; composed with ``transpose`` and ``getitem``."""
    x = _as_array(x)
    shape = _shape(_raw(x))
    nd = len(shape)
    if nd < 2:
        raise ValidationError("diagonal needs an array of rank >= 2")
    a1, a2 = _axis(axis1, nd), _axis(axis2, nd)
    if a1 == a2:
        raise ValidationError("diagonal: axis1 and axis2 must differ")
    perm = tuple(i for i in range(nd) if i not in (a1, a2)) + (a1, a2)
    xt = transpose(x, perm) if perm != tuple(range(nd)) else x
    rows, cols = _diagonal_positions(array_module(_raw(x)), shape[a1], shape[a2],
                                     _operator.index(offset))
    return getitem(xt, (Ellipsis, rows, cols))


def _sample_diag(draw):
    if draw.boolean():
        return [draw.array(draw.shape(min_dims=1, max_dims=1, min_side=0))], {
            "k": draw.integers(-2, 2)}
    return [draw.array(draw.shape(min_dims=2, max_dims=2))], {"k": draw.integers(-2, 2)}


def _diag_reference(np, v, k=0):
    if np.ndim(v) == 2:
        return _diagonal_reference(np, v, k)
    n = np.shape(v)[0]
    # P diag(v) Q^T with P, Q the 0/1 matrices placing row/column m at m + shift
    place = _numpy.eye(n + _pyabs(k), n, -_pymax(0, -k)), _numpy.eye(n + _pyabs(k), n,
                                                                     -_pymax(0, k))
    return np.dot(np.dot(place[0], v[:, None] * _numpy.eye(n)), place[1].T)


@numpy_rule(np.diag, sample=_sample_diag, reference=_diag_reference)
def diag(v, k=0):
    """For a 1-D ``v``, the square matrix with ``v`` on its ``k``-th diagonal
    (composed with the primitive ``index_add``); for a 2-D ``v``, its ``k``-th
    diagonal (``diagonal``), as NumPy."""
    v = _as_array(v)
    shape = _shape(_raw(v))
    k = _operator.index(k)
    if len(shape) == 1:
        n = shape[0] + _pyabs(k)
        rows, cols = _diagonal_positions(array_module(_raw(v)), n, n, k)
        return index_add(v, (rows, cols), (n, n))
    if len(shape) == 2:
        return diagonal(v, k)
    raise ValidationError(f"diag needs a 1-D or 2-D array, not rank {len(shape)}")


@numpy_rule(np.trace, sample=_sample_diagonal,
            reference=lambda np, x, offset=0, axis1=0, axis2=1: np.sum(
                _diagonal_reference(np, x, offset, axis1, axis2), -1))
def trace(x, offset=0, axis1=0, axis2=1):
    """Sum of the ``offset``-th diagonal of the ``axis1``/``axis2`` planes,
    composed as ``sum(diagonal(...), -1)``."""
    return _sum(diagonal(x, offset, axis1, axis2), -1)


Tensor.swapaxes = swapaxes
Tensor.diagonal = diagonal
Tensor.trace = trace
