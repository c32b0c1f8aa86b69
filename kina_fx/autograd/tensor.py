"""The Tensor: an array autograd can trace, and the helpers that see through boxes.

A ``Tensor`` is either *plain* (``_trace is None``: a wrapped NumPy/CuPy array)
or a *box* of one trace (a :class:`~kina_fx.autograd.tape.Tape` or a jvp
trace): ``_value`` is then the value one level further out -- an array, or a
box of an enclosing trace -- and ``_id`` its index on that trace.

The operators, most methods and the NumPy protocol (``__array_ufunc__``,
``__array_function__``) are installed by the op registry
(:mod:`kina_fx.autograd.primitives` and :mod:`kina_fx.autograd.numpy_protocol`):
an op declares its operator or method where it is defined.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import gpu_ops
from ..errors import KinaTypeError, ValidationError
from ..multishot import ReplayDiverged

array_module = gpu_ops.array_module
_new = object.__new__


class TracedValueReplayed(KinaTypeError, ReplayDiverged):
    """A multi-shot replay refused to answer a perform again with a value of a
    trace that has finished (:meth:`Tensor.__kina_replay__`): the refusal of a
    value outside its trace, and a replay that cannot go on."""


class Tensor:
    """An array (NumPy or CuPy) that autograd transforms can trace.

    ``Tensor(data, dtype=None)``: ``data`` is an array, a scalar, a Tensor or
    a (nested) list/tuple of them.  A Tensor passed in keeps its trace (a new
    box of the same value; with ``dtype`` a differentiable cast), and a
    sequence holding Tensors is stacked differentiably, so ``Tensor`` never
    cuts a gradient.  Inside ``grad``/``vjp``/``jvp``/``Tape`` the values a
    function sees are Tensors too (boxes of their trace).

    Tensors are not hashable (``==`` compares elementwise, as for NumPy and JAX
    arrays).  Converting a box of a running trace to a Python float or a NumPy
    array (``float(t)``, ``t.item()``, ``np.asarray(t)``, ``t.numpy()``) is a
    ``TypeError``: the result would silently stop depending on the input.  Use
    ``t.data`` (explicitly a constant) or ``stop_gradient``.
    """

    __slots__ = ("_value", "_trace", "_id", "_tangent", "__weakref__")
    __array_priority__ = 1000
    __hash__ = None  # type: ignore[assignment]    # elementwise __eq__, like ndarray

    _value: Any          # an array, or a box of an enclosing trace
    _trace: Any          # None (plain), a Tape or a JVPTrace
    _id: int             # index on the trace (-1: none)
    _tangent: Any        # jvp duals only

    def __new__(cls, data: Any, dtype: Any = None) -> "Tensor":
        if data.__class__ is Tensor:
            if dtype is not None and np.dtype(dtype) != np.dtype(_raw(data).dtype):
                return recordable.cast(data, dtype)
            t = _new(Tensor)
            t._value = data._value
            t._trace = data._trace
            t._id = data._id
            if data._trace is not None and hasattr(data, "_tangent"):
                t._tangent = data._tangent
            return t
        if isinstance(data, (list, tuple)):
            data = _as_array(data)
            if data.__class__ is Tensor:
                return Tensor(data, dtype)
        xp = array_module(data)
        return _plain(xp.asarray(data, dtype=dtype))

    # -- array-like surface --
    @property
    def shape(self) -> tuple:
        return _raw(self).shape

    @property
    def dtype(self) -> np.dtype:
        return _raw(self).dtype

    @property
    def ndim(self) -> int:
        return _raw(self).ndim

    @property
    def size(self) -> int:
        return _raw(self).size

    @property
    def data(self) -> Any:
        """The backend array (NumPy or CuPy) under every level of tracing:
        a constant (no gradient flows through it)."""
        return _raw(self)

    def numpy(self) -> np.ndarray:
        """The value as a NumPy array (copied from the device for CuPy)."""
        _refuse_if_traced(self, "Tensor.numpy()")
        return _to_numpy(_raw(self))

    def __array__(self, dtype=None, copy=None):
        _refuse_if_traced(self, "numpy.asarray/numpy.array of a Tensor")
        a = _to_numpy(_raw(self))
        return a if dtype is None else a.astype(dtype)

    def tolist(self) -> Any:
        _refuse_if_traced(self, "Tensor.tolist()")
        return _to_numpy(_raw(self)).tolist()

    def item(self) -> Any:
        _refuse_if_traced(self, "Tensor.item()")
        return _raw(self).item()

    def __float__(self):
        _refuse_if_traced(self, "float() of a Tensor")
        return float(_raw(self))

    def __complex__(self):
        _refuse_if_traced(self, "complex() of a Tensor")
        return complex(_raw(self))

    # Integers and booleans are piecewise constant: their derivative is zero,
    # so converting a traced value to one loses nothing.
    def __int__(self):
        return int(_raw(self))

    def __bool__(self):
        return bool(_raw(self))

    def __len__(self):
        return len(_raw(self))

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d Tensor")
        return (self[i] for i in range(len(self)))

    def __kina_replay__(self) -> None:
        """A multi-shot replay (:mod:`kina_fx.multishot`) asks before answering a
        perform again with this value: refused (:class:`TracedValueReplayed`)
        when a trace it belongs to has finished -- it was traced by the recorded
        run, and the replay runs a new trace, in which it would stand for a
        constant and cut the gradient paths it stood for."""
        v = self
        while v.__class__ is Tensor:
            tr = v._trace
            if tr is not None and not tr._live:
                raise TracedValueReplayed(
                    f"a multi-shot replay would answer a perform again with a value traced by "
                    f"{tr!r}, which has finished: the recorded run traced it, the replay runs a "
                    "new trace, and as a constant there it would silently cut the gradient paths "
                    "it stood for (docs/autograd.md, \"Traced values outside their trace\")")
            v = v._value

    def __repr__(self):
        level = "" if self._trace is None else f", traced by {self._trace!r}"
        return f"Tensor({_raw(self)!r}{level})"

    def __pos__(self):
        return self

    # Comparisons are not differentiable: they answer raw boolean arrays, the
    # same traced and untraced.
    def __eq__(self, other):
        return _raw(self) == _raw(other)

    def __ne__(self, other):
        return _raw(self) != _raw(other)

    def __lt__(self, other):
        return _raw(self) < _raw(other)

    def __le__(self, other):
        return _raw(self) <= _raw(other)

    def __gt__(self, other):
        return _raw(self) > _raw(other)

    def __ge__(self, other):
        return _raw(self) >= _raw(other)


def _to_numpy(v):
    if isinstance(v, np.ndarray) or np.isscalar(v):
        return np.asarray(v)
    return v.get()


def _raw(v):
    """``v`` with every level of Tensor wrapping removed (an array or a scalar)."""
    while v.__class__ is Tensor:
        v = v._value
    return v


def _plain(value):
    """A plain (untraced) Tensor around a raw result."""
    t = _new(Tensor)
    t._value = value
    t._trace = None
    t._id = -1
    return t


def _box(value, trace, i):
    """A box of ``trace`` (id ``i``) holding ``value`` (one level out)."""
    t = _new(Tensor)
    t._value = value
    t._trace = trace
    t._id = i
    return t


def _lift(v):
    """Drop wrappers that no live trace owns: plain Tensors and the boxes of
    traces that have finished.  The result is a raw value or a live box."""
    while v.__class__ is Tensor:
        tr = v._trace
        if tr is not None and tr._live:
            return v
        v = v._value
    return v


def _operand(v, op: str = "a primitive"):
    """``v`` as a kernel's operand: the raw value under its wrappers.

    A kernel runs where no trace took the op (an effect's default, or the raw
    kernels of a backward pass nobody observes), so a box of a trace that is
    still running means the op was performed outside that trace's scope: in
    the clause of an effect handler installed around ``grad``/``vjp``/``jvp``
    or a ``Tape``, or on a fiber the trace's handler is not on.  The trace
    does not see the op, and the result would silently stop depending on the
    traced input (a wrong gradient): refused, as ``float()`` of a traced value
    is.  Plain Tensors and the boxes of finished traces are unwrapped."""
    while v.__class__ is Tensor:
        tr = v._trace
        if tr is not None and tr._live:
            raise KinaTypeError(
                f"{op} was applied to a value traced by {tr!r} outside that trace's scope "
                "(in the clause of an effect handler installed around the traced function, "
                "or on a fiber the trace does not cover): the trace would not record it, "
                "and the gradient would silently miss its contribution. Compute on the "
                "value inside the traced function (e.g. resume the continuation with it "
                "and compute in the body), or use t.data or stop_gradient(t) for an "
                "explicit constant (docs/autograd.md, \"Traced values outside their trace\")")
        v = v._value
    return v


def _lift_operand(v, by):
    """:func:`_lift` of an operand of an op that the running trace ``by`` sees.

    A box of a *finished* trace whose value is raw is refused: it escaped its
    trace (kept in a variable, answered to an effect, or answered again to a
    multi-shot continuation whose replay runs a new trace), and as a constant
    here it would silently cut every gradient path it stood for.  Its
    ``.data`` (or ``stop_gradient`` inside its trace) is the explicit constant.
    Finished boxes around a running trace's box (nested transforms) lift to
    that box, and plain Tensors to their arrays, as before."""
    finished = None
    while v.__class__ is Tensor:
        tr = v._trace
        if tr is not None:
            if tr._live:
                return v
            finished = tr
        v = v._value
    if finished is not None:
        raise KinaTypeError(
            f"a value traced by {finished!r}, which has finished, is an operand of an "
            f"op {by!r} records: it escaped its trace (kept in a variable, answered to "
            "an effect, or answered again to a multi-shot continuation, whose replay "
            "runs a new trace), and as a constant here it would silently cut the "
            "gradient paths it stood for. Use its .data for an explicit constant "
            "(docs/autograd.md, \"Traced values outside their trace\")")
    return v


def is_traced(v: Any) -> bool:
    """Whether ``v`` is (or holds, one level in) a box of a running trace."""
    return v.__class__ is Tensor and _lift(v).__class__ is Tensor


def _refuse_if_traced(t, what):
    if is_traced(t):
        raise KinaTypeError(
            f"{what} would drop the gradient of a traced value (the result would "
            "not depend on the inputs being differentiated). Keep it a Tensor; for "
            "arrays of traced values use kina_fx.autograd.stack or Tensor([...]); "
            "for an explicit constant use t.data or stop_gradient(t)")


def _shape(v):
    return v.shape if hasattr(v, "shape") else ()


def _holds_tensor(seq) -> bool:
    for v in seq:
        if v.__class__ is Tensor:
            return True
        if isinstance(v, (list, tuple)) and _holds_tensor(v):
            return True
    return False


def _as_array(v):
    """An array argument as the op will see it: a (nested) list or tuple is
    turned into an array as NumPy would, but stacked with the differentiable
    ``stack`` when it holds Tensors, so no trace is cut."""
    if not isinstance(v, (list, tuple)):
        return v
    if not _holds_tensor(v):
        xp = array_module(*[x for x in v if not isinstance(x, (list, tuple))])
        if xp is np:
            return np.asarray(v)
        return xp.stack([xp.asarray(_as_array(x)) for x in v])
    return recordable.stack([_as_array(x) for x in v], 0)


def as_sequence(name: str, xs: Any) -> list:
    """The arrays of a sequence argument (``stack``'s, ``vstack``'s, ...) as
    NumPy takes it: a list or a tuple, or an array -- a Tensor too -- which
    is the sequence of its rows (``xs[i]``: differentiable).  An empty one is
    a ValidationError (NumPy's ValueError), anything else a KinaTypeError."""
    if xs.__class__ is list or xs.__class__ is tuple:
        items = list(xs)
    elif len(_shape(_raw(xs))) >= 1:
        items = [xs[i] for i in range(len(xs))]
    else:
        raise KinaTypeError(f"{name} takes a sequence of arrays, not {type(xs).__name__}")
    if not items:
        raise ValidationError(f"{name} needs a non-empty sequence of arrays")
    return items


class OpNamespace:
    """Operations by name, filled in by the op registry as ops are defined.

    Backward and forward rules are written once against such a namespace
    ``o``: :data:`recordable` (the public, performing functions: every
    operation is visible to enclosing traces, which is how derivatives of
    derivatives work) or :data:`kernels` (the raw kernels: the first-order
    fast path, performing nothing)."""

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"<ops {self._name}: {len(vars(self)) - 1} operations>"

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...


recordable = OpNamespace("recordable")
kernels = OpNamespace("kernels")
