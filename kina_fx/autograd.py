"""Autograd tapes built on algebraic effects: grad, vjp, jvp and their nestings.

The whole design in a few lines (``docs/autograd.md`` has the long version):

* Every differentiable primitive (``mul``, ``exp``, ``matmul``, ...) is an
  :class:`~kina_fx.handlers.Effect`.  Its ``default`` -- what answers when no
  handler does -- computes the value with the array module of its inputs
  (NumPy on the CPU, CuPy on a GPU), so both backends share one kernel.
* A :class:`Tape` is a handler of ``fun`` (tail-resumptive) clauses.  Its
  clause for a primitive looks at the arguments: if none is one of *its own*
  boxes it just performs the primitive again (outer handlers see it, nothing
  is recorded).  Otherwise it unwraps its boxes, performs the primitive on the
  inner values (an enclosing tape records *that*), records one node and answers
  with a new box.  No fiber switch on the hot path.
* Boxes are :class:`Tensor` objects tagged with the trace that made them.
  Every ``grad``/``vjp``/``jvp`` call is its own handler instance with its own
  tag, so nested derivatives never confuse their perturbations.
* ``Tape.gradient`` walks the recorded nodes backwards in a plain loop.  Each
  node's backward rule is written with the primitives themselves, so when an
  outer trace is live the backward pass is recorded by it (grad of grad, jvp of
  grad).  When nobody outside asks to see the backward pass (see
  :data:`BACKWARD_OBSERVED`) the same rules run on the raw kernels: the
  first-order fast path performs no effects at all.
* :func:`jvp` is forward mode: its own handler propagating tagged dual numbers.
"""
from __future__ import annotations

import builtins
import itertools
import math
import operator as _operator

import numpy as np

from . import gpu_ops
from .errors import KinaTypeError, ValidationError
from .handlers import Effect, Handler, perform

__all__ = [
    "Tensor", "Tape", "grad", "value_and_grad", "vjp", "jvp",
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "tanh", "sigmoid", "relu",
    "matmul", "sum", "mean", "max", "reshape", "transpose", "broadcast_to", "gather",
    "softmax", "log_softmax", "cross_entropy", "repeat_interleave", "where",
    "stop_gradient", "cast", "getitem",
    "PRIMITIVES", "effect_of", "BACKWARD_OBSERVED", "observe_backward",
]

_array_module = gpu_ops.array_module
_ndarray = np.ndarray
_new = object.__new__
_pysum = builtins.sum
_pymax = builtins.max


# --- Tensor -----------------------------------------------------------------


class Tensor:
    """An array (NumPy or CuPy) that autograd transforms can trace.

    ``Tensor(data)`` wraps an array (lists and scalars become NumPy arrays).
    Inside ``grad``/``vjp``/``jvp``/``Tape`` the values a function sees are
    Tensors too: *boxes* that belong to one trace (``_trace``) and hold the
    value one level further out (``_value``: an array, or a box of an
    enclosing trace).  Operators dispatch to the primitives of this module.
    """

    __slots__ = ("_value", "_trace", "_id", "_tangent", "__weakref__")
    __array_ufunc__ = None          # ndarray <op> Tensor defers to Tensor's reflected op
    __array_priority__ = 1000

    def __init__(self, data, dtype=None):
        if data.__class__ is Tensor:
            data = _raw(data)
        xp = _array_module(data)
        self._value = xp.asarray(data, dtype=dtype)
        self._trace = None
        self._id = -1

    # -- array-like surface --
    @property
    def shape(self):
        return _raw(self).shape

    @property
    def dtype(self):
        return _raw(self).dtype

    @property
    def ndim(self):
        return _raw(self).ndim

    @property
    def size(self):
        return _raw(self).size

    @property
    def T(self):
        return transpose(self)

    @property
    def data(self):
        """The backend array (NumPy or CuPy) under every level of tracing."""
        return _raw(self)

    def numpy(self):
        """The value as a NumPy array (copied from the device for CuPy)."""
        v = _raw(self)
        if isinstance(v, np.ndarray) or np.isscalar(v):
            return np.asarray(v)
        return v.get()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __len__(self):
        return len(_raw(self))

    def __float__(self):
        return float(_raw(self))

    def __int__(self):
        return int(_raw(self))

    def __bool__(self):
        return bool(_raw(self))

    def __repr__(self):
        level = "" if self._trace is None else f", traced by {self._trace!r}"
        return f"Tensor({_raw(self)!r}{level})"

    def item(self):
        return _raw(self).item()

    # -- operators --
    def __add__(self, other):
        r = perform(_ADD, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def __radd__(self, other):
        r = perform(_ADD, other, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __sub__(self, other):
        r = perform(_SUB, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def __rsub__(self, other):
        r = perform(_SUB, other, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __mul__(self, other):
        r = perform(_MUL, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def __rmul__(self, other):
        r = perform(_MUL, other, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __truediv__(self, other):
        r = perform(_DIV, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def __rtruediv__(self, other):
        r = perform(_DIV, other, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __pow__(self, other):
        r = perform(_POW, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def __rpow__(self, other):
        r = perform(_POW, other, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __matmul__(self, other):
        r = perform(_MATMUL, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def __rmatmul__(self, other):
        r = perform(_MATMUL, other, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __neg__(self):
        r = perform(_NEG, self)
        return r if r.__class__ is Tensor else _plain(r)

    def __pos__(self):
        return self

    def __getitem__(self, index):
        return getitem(self, index)

    # Comparisons are not differentiable: they answer raw boolean arrays.
    def __lt__(self, other):
        return _raw(self) < _raw(other)

    def __le__(self, other):
        return _raw(self) <= _raw(other)

    def __gt__(self, other):
        return _raw(self) > _raw(other)

    def __ge__(self, other):
        return _raw(self) >= _raw(other)

    # -- method spellings of the primitives --
    def sum(self, axis=None, keepdims=False):
        return sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return max(self, axis, keepdims)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]
        return reshape(self, shape)

    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], int):
            axes = axes[0]
        return transpose(self, axes or None)

    def exp(self):
        return exp(self)

    def log(self):
        return log(self)

    def tanh(self):
        return tanh(self)

    def astype(self, dtype):
        return cast(self, dtype)


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


def _unary(effect, x):
    """Perform a one-input primitive: ``_out(r, x)`` without the varargs, as
    these are the hottest primitives of a traced chain."""
    r = perform(effect, x)
    return r if r.__class__ is Tensor or x.__class__ is not Tensor else _plain(r)


def _lift(v):
    """Drop wrappers that no live trace owns: plain Tensors and the boxes of
    traces that have finished.  The result is a raw value or a live box."""
    while v.__class__ is Tensor:
        tr = v._trace
        if tr is not None and tr._live:
            return v
        v = v._value
    return v


def _out(r, *inputs):
    """A primitive's result, a Tensor when a Tensor went in (arrays for arrays)."""
    if r.__class__ is Tensor:
        return r
    for a in inputs:
        if a.__class__ is Tensor:
            return _plain(r)
    return r


def _norm_axes(axis, ndim):
    """``axis`` (None, int or sequence) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted(gpu_ops.normalize_axis(int(a), ndim) for a in axis))


def _axis_param(axis):
    if axis is None or isinstance(axis, (int, np.integer)):
        return None if axis is None else int(axis)
    return tuple(int(a) for a in axis)


# --- primitives: kernels, backward (vjp) and forward (jvp) rules ------------
#
# A primitive is performed as ``perform(effect, *arrays, *params)``: ``nin``
# array arguments, then static parameters (axes, shapes, indices).
#
# * ``kernel(*arrays, *params)`` computes on raw arrays with the inputs' array
#   module (NumPy or CuPy); it is the effect's default.
# * ``vjp(o, g, out, args, params, ids)`` returns one cotangent per array
#   argument (None where not needed: ``ids[k] < 0``).  Unary primitives have
#   ``vjp(o, g, out, x, params)`` returning the one cotangent; binary ones may
#   give a pair of one-sided rules ``(o, g, out, a, b) -> cotangent``.  ``o`` is
#   the namespace of operations to use: the primitives themselves (recordable:
#   higher order) or the raw kernels (first-order fast path); the rule is
#   written once.
# * ``jvp(o, out, args, tangents, params)`` returns the output tangent; a
#   tangent of None is a symbolic zero.


class Primitive:
    """One row of the primitive table."""

    __slots__ = ("name", "effect", "nin", "diff", "kernel", "vjp", "vjp_sides", "jvp")

    def __init__(self, name, nin, kernel, vjp, jvp, diff=None, unwraps=False):
        self.name = name
        self.effect = Effect("kina_fx.autograd." + name)
        self.nin = nin
        self.diff = tuple(diff) if diff is not None else (True,) * nin
        self.kernel = kernel
        self.vjp = vjp
        self.vjp_sides = None
        if nin == 2 and self.diff == (True, True):
            self.vjp, self.vjp_sides = _binary_rules(vjp)
        self.jvp = jvp
        # Kernels that strip Tensor wrappers themselves serve as the default.
        self.effect.default = kernel if unwraps else _make_default(kernel, nin)

    def __repr__(self):
        return f"<Primitive {self.name}>"


def _binary_rules(vjp):
    """(pair rule, (rule for a alone, rule for b alone)) of a binary primitive.

    ``vjp`` is either a pair of one-sided rules ``(o, g, out, a, b) ->
    cotangent`` or one rule for both sides; the tape records a one-sided node
    when only one operand is traced (``y * 1.5``), the common case."""
    if isinstance(vjp, tuple):
        rule_a, rule_b = vjp

        def both(o, g, out, args, params, ids):
            a, b = args
            return (rule_a(o, g, out, a, b) if ids[0] >= 0 else None,
                    rule_b(o, g, out, a, b) if ids[1] >= 0 else None)
        return both, vjp

    def rule_a(o, g, out, a, b):
        return vjp(o, g, out, (a, b), (), (0, -1))[0]

    def rule_b(o, g, out, a, b):
        return vjp(o, g, out, (a, b), (), (-1, 0))[1]
    return vjp, (rule_a, rule_b)


def _make_default(kernel, nin):
    # Answers the effect when no handler does: strip any leftover wrappers
    # (plain Tensors, boxes of finished traces) and run the kernel.
    if nin == 1:
        def default(x, *params):
            if x.__class__ is Tensor:
                x = _raw(x)
            return kernel(x, *params)
    elif nin == 2:
        def default(a, b, *params):
            if a.__class__ is Tensor:
                a = _raw(a)
            if b.__class__ is Tensor:
                b = _raw(b)
            return kernel(a, b, *params)
    else:
        def default(*args):
            return kernel(*[_raw(a) for a in args])
    return default


PRIMITIVES: dict = {}


def _prim(name, nin, kernel, vjp, jvp, diff=None, unwraps=False):
    p = Primitive(name, nin, kernel, vjp, jvp, diff, unwraps)
    PRIMITIVES[name] = p
    return p


def effect_of(name) -> Effect:
    """The effect of the primitive called ``name`` (e.g. ``"matmul"``)."""
    return PRIMITIVES[name].effect


def _unbroadcast(o, ct, shape):
    """Sum ``ct`` down to ``shape`` (undo NumPy broadcasting)."""
    cshape = ct.shape
    if cshape == shape:
        return ct
    lead = len(cshape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, s in enumerate(shape) if s == 1 and cshape[i + lead] != 1)
    if axes:
        ct = o.sum(ct, axes, True)
    return o.reshape(ct, shape) if ct.shape != shape else ct


def _bcast(o, t, shape):
    """Broadcast a tangent to ``shape`` (the output's)."""
    return t if t.shape == shape else o.broadcast_to(t, shape)


def _shape(v):
    return v.shape if hasattr(v, "shape") else ()


# add
def _add_k(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a + b


def _add_vjp_a(o, g, out, a, b):
    return g if g.shape == a.shape else _unbroadcast(o, g, a.shape)


def _add_vjp_b(o, g, out, a, b):
    return g if g.shape == b.shape else _unbroadcast(o, g, b.shape)


def _add_jvp(o, out, args, ts, params):
    ta, tb = ts
    if ta is None:
        return _bcast(o, tb, out.shape)
    if tb is None:
        return _bcast(o, ta, out.shape)
    return _bcast(o, o.add(ta, tb), out.shape)


_ADD = _prim("add", 2, _add_k, (_add_vjp_a, _add_vjp_b), _add_jvp, unwraps=True).effect


# sub
def _sub_k(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a - b


def _sub_vjp_b(o, g, out, a, b):
    return _unbroadcast(o, o.neg(g), b.shape)


def _sub_jvp(o, out, args, ts, params):
    ta, tb = ts
    if tb is None:
        return _bcast(o, ta, out.shape)
    if ta is None:
        return _bcast(o, o.neg(tb), out.shape)
    return _bcast(o, o.sub(ta, tb), out.shape)


_SUB = _prim("sub", 2, _sub_k, (_add_vjp_a, _sub_vjp_b), _sub_jvp, unwraps=True).effect


# mul
def _mul_k(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a * b


def _mul_vjp_a(o, g, out, a, b):
    ct = o.mul(g, b)
    return ct if ct.shape == a.shape else _unbroadcast(o, ct, a.shape)


def _mul_vjp_b(o, g, out, a, b):
    ct = o.mul(g, a)
    return ct if ct.shape == b.shape else _unbroadcast(o, ct, b.shape)


def _mul_jvp(o, out, args, ts, params):
    a, b = args
    ta, tb = ts
    r = None
    if ta is not None:
        r = o.mul(ta, b)
    if tb is not None:
        r = o.mul(a, tb) if r is None else o.add(r, o.mul(a, tb))
    return _bcast(o, r, out.shape)


_MUL = _prim("mul", 2, _mul_k, (_mul_vjp_a, _mul_vjp_b), _mul_jvp, unwraps=True).effect


# div
def _div_k(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a / b


def _div_vjp_a(o, g, out, a, b):
    return _unbroadcast(o, o.div(g, b), a.shape)


def _div_vjp_b(o, g, out, a, b):
    return _unbroadcast(o, o.neg(o.div(o.mul(g, out), b)), b.shape)


def _div_jvp(o, out, args, ts, params):
    a, b = args
    ta, tb = ts
    r = None
    if ta is not None:
        r = o.div(ta, b)
    if tb is not None:
        s = o.div(o.mul(tb, out), b)
        r = o.neg(s) if r is None else o.sub(r, s)
    return _bcast(o, r, out.shape)


_DIV = _prim("div", 2, _div_k, (_div_vjp_a, _div_vjp_b), _div_jvp, unwraps=True).effect


# pow
def _pow_k(x, p):
    if x.__class__ is Tensor:
        x = _raw(x)
    if p.__class__ is Tensor:
        p = _raw(p)
    return x ** p


def _pow_dx(o, x, p):
    # d(x**p)/dx = p * x**(p-1), written so that p = 0, 1, 2 stay exact.
    if isinstance(p, (int, float)):
        if p == 0:
            return o.mul(x, 0.0)
        if p == 1:
            return o.add(o.mul(x, 0.0), 1.0)
        if p == 2:
            return o.mul(x, 2.0)
        return o.mul(p, o.pow(x, p - 1))
    return o.mul(p, o.pow(x, o.sub(p, 1)))


def _pow_vjp(o, g, out, args, params, ids):
    x, p = args
    return (_unbroadcast(o, o.mul(g, _pow_dx(o, x, p)), x.shape) if ids[0] >= 0 else None,
            _unbroadcast(o, o.mul(o.mul(g, out), o.log(x)), p.shape) if ids[1] >= 0 else None)


def _pow_jvp(o, out, args, ts, params):
    x, p = args
    tx, tp = ts
    r = None
    if tx is not None:
        r = o.mul(tx, _pow_dx(o, x, p))
    if tp is not None:
        s = o.mul(o.mul(tp, out), o.log(x))
        r = s if r is None else o.add(r, s)
    return _bcast(o, r, out.shape)


_POW = _prim("pow", 2, _pow_k, _pow_vjp, _pow_jvp, unwraps=True).effect


# neg
def _neg_k(x):
    if x.__class__ is Tensor:
        x = _raw(x)
    return -x


def _neg_vjp(o, g, out, x, params):
    return o.neg(g)


def _neg_jvp(o, out, args, ts, params):
    return o.neg(ts[0])


_NEG = _prim("neg", 1, _neg_k, _neg_vjp, _neg_jvp, unwraps=True).effect


# exp
def _exp_k(x):
    if x.__class__ is Tensor:
        x = _raw(x)
    return (np if x.__class__ is _ndarray else _array_module(x)).exp(x)


def _exp_vjp(o, g, out, x, params):
    return o.mul(g, out)


def _exp_jvp(o, out, args, ts, params):
    return o.mul(ts[0], out)


_EXP = _prim("exp", 1, _exp_k, _exp_vjp, _exp_jvp, unwraps=True).effect


# log
def _log_k(x):
    if x.__class__ is Tensor:
        x = _raw(x)
    return (np if x.__class__ is _ndarray else _array_module(x)).log(x)


def _log_vjp(o, g, out, x, params):
    return o.div(g, x)


def _log_jvp(o, out, args, ts, params):
    return o.div(ts[0], args[0])


_LOG = _prim("log", 1, _log_k, _log_vjp, _log_jvp, unwraps=True).effect


# tanh
def _tanh_k(x):
    if x.__class__ is Tensor:
        x = _raw(x)
    return (np if x.__class__ is _ndarray else _array_module(x)).tanh(x)


def _tanh_vjp(o, g, out, x, params):
    return o.mul(g, o.sub(1.0, o.mul(out, out)))


def _tanh_jvp(o, out, args, ts, params):
    return o.mul(ts[0], o.sub(1.0, o.mul(out, out)))


_TANH = _prim("tanh", 1, _tanh_k, _tanh_vjp, _tanh_jvp, unwraps=True).effect


# sigmoid
def _sigmoid_k(x):
    if x.__class__ is Tensor:
        x = _raw(x)
    xp = np if x.__class__ is _ndarray else _array_module(x)
    expit = _expit(xp)
    if expit is not None:
        return expit(x)
    # 0.5 * (1 + tanh(x/2)): no overflow for large |x|.
    return 0.5 + 0.5 * xp.tanh(0.5 * x)


_expit_cache = {}


def _expit(xp):
    """SciPy's (or CuPy's) one-kernel logistic function when installed, else None."""
    try:
        return _expit_cache[xp]
    except KeyError:
        pass
    fn = None
    try:
        if xp is np:
            from scipy.special import expit as fn
        else:
            from cupyx.scipy.special import expit as fn
    except Exception:
        fn = None
    _expit_cache[xp] = fn
    return fn


def _sigmoid_vjp(o, g, out, x, params):
    return o.mul(g, o.mul(out, o.sub(1.0, out)))


def _sigmoid_jvp(o, out, args, ts, params):
    return o.mul(ts[0], o.mul(out, o.sub(1.0, out)))


_SIGMOID = _prim("sigmoid", 1, _sigmoid_k, _sigmoid_vjp, _sigmoid_jvp, unwraps=True).effect


# relu
def _relu_k(x):
    if x.__class__ is Tensor:
        x = _raw(x)
    return (np if x.__class__ is _ndarray else _array_module(x)).maximum(x, 0)


def _relu_mask(x):
    # A constant at every level: the derivative of a mask is zero.
    return _raw(x) > 0


def _relu_vjp(o, g, out, x, params):
    return o.mul(g, _relu_mask(x))


def _relu_jvp(o, out, args, ts, params):
    return o.mul(ts[0], _relu_mask(args[0]))


_RELU = _prim("relu", 1, _relu_k, _relu_vjp, _relu_jvp, unwraps=True).effect


# cast
def _cast_k(x, dtype):
    return x.astype(dtype) if hasattr(x, "astype") else np.asarray(x, dtype=dtype)


def _cast_vjp(o, g, out, x, params):
    return o.cast(g, x.dtype)


def _cast_jvp(o, out, args, ts, params):
    return o.cast(ts[0], params[0])


_CAST = _prim("cast", 1, _cast_k, _cast_vjp, _cast_jvp).effect


# matmul
def _matmul_k(a, b):
    return gpu_ops.matmul(a, b)


def _swap_last(o, x):
    nd = len(x.shape)
    if nd < 2:
        return x
    axes = tuple(range(nd - 2)) + (nd - 1, nd - 2)
    return o.transpose(x, axes)


def _matmul_vjp(o, g, out, args, params, ids):
    a, b = args
    a_shape, b_shape = a.shape, b.shape
    # Promote 1-D operands as NumPy does, so the 2-D rules apply.
    if len(a_shape) == 1:
        a = o.reshape(a, (1,) + a_shape)
        g = o.reshape(g, g.shape[:-1] + (1,) + g.shape[-1:])
    if len(b_shape) == 1:
        b = o.reshape(b, b_shape + (1,))
        g = o.reshape(g, g.shape + (1,))
    ga = gb = None
    if ids[0] >= 0:
        ga = o.matmul(g, _swap_last(o, b))
        ga = _unbroadcast(o, ga, a.shape) if len(ga.shape) > 2 or len(a.shape) < len(ga.shape) \
            else ga
        if ga.shape != a_shape:
            ga = o.reshape(_unbroadcast(o, ga, a.shape), a_shape)
    if ids[1] >= 0:
        gb = o.matmul(_swap_last(o, a), g)
        if gb.shape != b.shape:
            gb = _unbroadcast(o, gb, b.shape)
        if gb.shape != b_shape:
            gb = o.reshape(gb, b_shape)
    return ga, gb


def _matmul_jvp(o, out, args, ts, params):
    a, b = args
    ta, tb = ts
    r = None
    if ta is not None:
        r = o.matmul(ta, b)
    if tb is not None:
        s = o.matmul(a, tb)
        r = s if r is None else o.add(r, s)
    return _bcast(o, r, out.shape)


_MATMUL = _prim("matmul", 2, _matmul_k, _matmul_vjp, _matmul_jvp).effect


# sum
def _sum_k(x, axis=None, keepdims=False):
    try:        # the array's own method: no Python-level NumPy wrapper
        return x.sum(axis=axis, keepdims=keepdims)
    except AttributeError:      # a Python scalar
        return np.sum(x, axis=axis, keepdims=keepdims)


def _expand_back(o, g, shape, axis, keepdims):
    """``g`` (a reduction's cotangent) broadcast back to the input ``shape``."""
    if not keepdims:
        axes = _norm_axes(axis, len(shape))
        kshape = tuple(1 if i in axes else s for i, s in enumerate(shape))
        g = o.reshape(g, kshape)
    return o.broadcast_to(g, shape)


def _sum_vjp(o, g, out, x, params):
    return _expand_back(o, g, x.shape, *params)


def _sum_jvp(o, out, args, ts, params):
    return o.sum(ts[0], *params)


_SUM = _prim("sum", 1, _sum_k, _sum_vjp, _sum_jvp).effect


# mean
def _count(shape, axis):
    return math.prod(shape[i] for i in _norm_axes(axis, len(shape)))


def _mean_k(x, axis=None, keepdims=False):
    try:        # the array's own method: no Python-level NumPy wrapper
        return x.mean(axis=axis, keepdims=keepdims)
    except AttributeError:      # a Python scalar
        return np.mean(x, axis=axis, keepdims=keepdims)


def _mean_vjp(o, g, out, x, params):
    shape = x.shape
    return o.div(_expand_back(o, g, shape, *params), _count(shape, params[0]))


def _mean_jvp(o, out, args, ts, params):
    return o.mean(ts[0], *params)


_MEAN = _prim("mean", 1, _mean_k, _mean_vjp, _mean_jvp).effect


# max (ties share the gradient equally)
def _max_k(x, axis=None, keepdims=False):
    try:        # the array's own method: no Python-level NumPy wrapper
        return x.max(axis=axis, keepdims=keepdims)
    except AttributeError:      # a Python scalar
        return np.max(x, axis=axis, keepdims=keepdims)


def _max_weights(x, out, axis, keepdims):
    """Raw weights: 1/count on the arg-max positions, 0 elsewhere (a constant)."""
    rx = _raw(x)
    ro = _raw(out)
    xp = _array_module(rx)
    if not keepdims:
        axes = _norm_axes(axis, rx.ndim)
        ro = xp.reshape(ro, tuple(1 if i in axes else s for i, s in enumerate(rx.shape)))
    mask = (rx == ro).astype(rx.dtype)
    return mask / mask.sum(axis=axis, keepdims=True)


def _max_vjp(o, g, out, x, params):
    w = _max_weights(x, out, *params)
    return o.mul(_expand_back(o, g, x.shape, *params), w)


def _max_jvp(o, out, args, ts, params):
    w = _max_weights(args[0], out, *params)
    return o.sum(o.mul(ts[0], w), *params)


_MAX = _prim("max", 1, _max_k, _max_vjp, _max_jvp).effect


# reshape
def _reshape_k(x, shape):
    try:
        return x.reshape(shape)
    except AttributeError:
        return np.reshape(x, shape)


def _reshape_vjp(o, g, out, x, params):
    return o.reshape(g, x.shape)


def _reshape_jvp(o, out, args, ts, params):
    return o.reshape(ts[0], out.shape)


_RESHAPE = _prim("reshape", 1, _reshape_k, _reshape_vjp, _reshape_jvp).effect


# transpose
def _transpose_k(x, axes=None):
    try:
        return x.transpose(axes)
    except AttributeError:
        return np.transpose(x, axes)


def _transpose_vjp(o, g, out, x, params):
    axes = params[0]
    inv = None if axes is None else tuple(np.argsort(axes))
    return o.transpose(g, inv)


def _transpose_jvp(o, out, args, ts, params):
    return o.transpose(ts[0], params[0])


_TRANSPOSE = _prim("transpose", 1, _transpose_k, _transpose_vjp, _transpose_jvp).effect


# broadcast_to
def _broadcast_to_k(x, shape):
    return _array_module(x).broadcast_to(x, shape)


def _broadcast_to_vjp(o, g, out, x, params):
    return _unbroadcast(o, g, x.shape)


def _broadcast_to_jvp(o, out, args, ts, params):
    return o.broadcast_to(ts[0], params[0])


_BROADCAST_TO = _prim("broadcast_to", 1, _broadcast_to_k, _broadcast_to_vjp,
                      _broadcast_to_jvp).effect


# getitem (NumPy indexing; the index is a parameter) and its transpose index_add
def _getitem_k(x, index):
    return x[index]


def _getitem_vjp(o, g, out, x, params):
    return o.index_add(g, params[0], x.shape)


def _getitem_jvp(o, out, args, ts, params):
    return o.getitem(ts[0], params[0])


_GETITEM = _prim("getitem", 1, _getitem_k, _getitem_vjp, _getitem_jvp).effect


def _index_add_k(g, index, shape):
    """zeros(shape) with ``g`` added at ``index`` (repeated indices accumulate)."""
    xp = _array_module(g)
    z = xp.zeros(shape, dtype=getattr(g, "dtype", None))
    if xp is np:
        np.add.at(z, index, g)
    else:  # CuPy
        import cupyx
        cupyx.scatter_add(z, index, g)
    return z


def _index_add_vjp(o, g, out, x, params):
    return o.getitem(g, params[0])


def _index_add_jvp(o, out, args, ts, params):
    return o.index_add(ts[0], *params)


_INDEX_ADD = _prim("index_add", 1, _index_add_k, _index_add_vjp, _index_add_jvp).effect


# gather (rows of values picked by integer indices, as in the runtime ABI)
def _gather_k(values, indices):
    return gpu_ops.gather(values, indices)


def _gather_vjp(o, g, out, args, params, ids):
    values, indices = args
    return (o.index_add(g, _raw(indices), values.shape), None)


def _gather_jvp(o, out, args, ts, params):
    return o.gather(ts[0], _raw(args[1]))


_GATHER = _prim("gather", 2, _gather_k, _gather_vjp, _gather_jvp, diff=(True, False)).effect


# softmax / log_softmax
def _softmax_k(x, axis):
    return gpu_ops.softmax(x, axis)


def _softmax_vjp(o, g, out, x, params):
    gy = o.mul(g, out)
    return o.sub(gy, o.mul(out, o.sum(gy, params[0], True)))


def _softmax_jvp(o, out, args, ts, params):
    ty = o.mul(ts[0], out)
    return o.sub(ty, o.mul(out, o.sum(ty, params[0], True)))


_SOFTMAX = _prim("softmax", 1, _softmax_k, _softmax_vjp, _softmax_jvp).effect


def _log_softmax_k(x, axis):
    return gpu_ops.log_softmax(x, axis)


def _log_softmax_vjp(o, g, out, x, params):
    return o.sub(g, o.mul(o.exp(out), o.sum(g, params[0], True)))


def _log_softmax_jvp(o, out, args, ts, params):
    t = ts[0]
    return o.sub(t, o.sum(o.mul(o.exp(out), t), params[0], True))


_LOG_SOFTMAX = _prim("log_softmax", 1, _log_softmax_k, _log_softmax_vjp,
                     _log_softmax_jvp).effect


# cross_entropy: mean over samples of -log softmax(logits)[label], classes on the last axis
def _one_hot(labels, like):
    xp = _array_module(like)
    labels = xp.asarray(_raw(labels))
    c = like.shape[-1]
    return (labels[..., None] == xp.arange(c)).astype(like.dtype)


def _cross_entropy_k(logits, labels):
    xp = _array_module(logits)
    labels = xp.asarray(labels)
    if labels.shape != logits.shape[:-1]:
        raise ValidationError(
            f"cross_entropy: labels of shape {labels.shape} for logits {logits.shape}")
    lsm = gpu_ops.log_softmax(logits, -1)
    c = logits.shape[-1]
    flat = lsm.reshape(-1, c)
    n = flat.shape[0]
    picked = flat[xp.arange(n), labels.reshape(-1)]
    return -(picked.sum() / _pymax(n, 1))


def _cross_entropy_vjp(o, g, out, args, params, ids):
    logits, labels = args
    n = _pymax(1, math.prod(logits.shape[:-1]))
    diff = o.sub(o.softmax(logits, -1), _one_hot(labels, _raw(logits)))
    return (o.mul(diff, o.div(g, n)), None)


def _cross_entropy_jvp(o, out, args, ts, params):
    logits, labels = args
    n = _pymax(1, math.prod(logits.shape[:-1]))
    diff = o.sub(o.softmax(logits, -1), _one_hot(labels, _raw(logits)))
    return o.div(o.sum(o.mul(diff, ts[0]), None, False), n)


_CROSS_ENTROPY = _prim("cross_entropy", 2, _cross_entropy_k, _cross_entropy_vjp,
                       _cross_entropy_jvp, diff=(True, False)).effect


# repeat_interleave
def _repeat_interleave_k(x, repeats, axis):
    return gpu_ops.repeat_interleave(x, repeats, axis)


def _repeat_interleave_vjp(o, g, out, x, params):
    repeats, axis = params
    shape = x.shape
    ax = gpu_ops.normalize_axis(axis, len(shape))
    g = o.reshape(g, shape[:ax] + (shape[ax], repeats) + shape[ax + 1:])
    return o.sum(g, ax + 1, False)


def _repeat_interleave_jvp(o, out, args, ts, params):
    return o.repeat_interleave(ts[0], *params)


_REPEAT_INTERLEAVE = _prim("repeat_interleave", 1, _repeat_interleave_k,
                           _repeat_interleave_vjp, _repeat_interleave_jvp).effect


# where (the condition is not differentiable)
def _where_k(cond, a, b):
    return _array_module(cond, a, b).where(cond, a, b)


def _where_vjp(o, g, out, args, params, ids):
    cond, a, b = args
    c = _raw(cond)
    return (None,
            _unbroadcast(o, o.where(c, g, 0), a.shape) if ids[1] >= 0 else None,
            _unbroadcast(o, o.where(c, 0, g), b.shape) if ids[2] >= 0 else None)


def _where_jvp(o, out, args, ts, params):
    c = _raw(args[0])
    _, ta, tb = ts
    return _bcast(o, o.where(c, 0 if ta is None else ta, 0 if tb is None else tb), out.shape)


_WHERE = _prim("where", 3, _where_k, _where_vjp, _where_jvp, diff=(False, True, True)).effect


# stop_gradient: every trace answers with the value one level in (see _stop_clause)
def _stop_gradient_k(x):
    return x


_STOP_GRADIENT = _prim("stop_gradient", 1, _stop_gradient_k, None, None).effect


# --- the two operation namespaces the rules run on ---------------------------


class _Kernels:
    """Raw kernels: the first-order fast path (no effects performed)."""

    # Arithmetic: the operators themselves (C functions, no Python frame);
    # NumPy and CuPy arrays both implement them.
    add = _operator.add
    sub = _operator.sub
    mul = _operator.mul
    div = _operator.truediv
    pow = _operator.pow
    neg = _operator.neg
    exp = staticmethod(_exp_k)
    log = staticmethod(_log_k)
    tanh = staticmethod(_tanh_k)
    cast = staticmethod(_cast_k)
    matmul = staticmethod(_matmul_k)
    reshape = staticmethod(_reshape_k)
    transpose = staticmethod(_transpose_k)
    broadcast_to = staticmethod(_broadcast_to_k)
    getitem = staticmethod(_getitem_k)
    index_add = staticmethod(_index_add_k)
    gather = staticmethod(_gather_k)
    softmax = staticmethod(_softmax_k)
    repeat_interleave = staticmethod(_repeat_interleave_k)
    where = staticmethod(_where_k)

    sum = staticmethod(_sum_k)
    mean = staticmethod(_mean_k)


class _Primitives:
    """The performing primitives: every operation is visible to outer handlers."""

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return sum(x, axis, keepdims)

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return mean(x, axis, keepdims)


# --- public primitive functions ----------------------------------------------


def add(a, b):
    """``a + b`` with NumPy broadcasting."""
    r = perform(_ADD, a, b)
    if r.__class__ is Tensor or (a.__class__ is not Tensor and b.__class__ is not Tensor):
        return r
    return _plain(r)


def sub(a, b):
    """``a - b`` with NumPy broadcasting."""
    r = perform(_SUB, a, b)
    if r.__class__ is Tensor or (a.__class__ is not Tensor and b.__class__ is not Tensor):
        return r
    return _plain(r)


def mul(a, b):
    """``a * b`` with NumPy broadcasting."""
    r = perform(_MUL, a, b)
    if r.__class__ is Tensor or (a.__class__ is not Tensor and b.__class__ is not Tensor):
        return r
    return _plain(r)


def div(a, b):
    """``a / b`` with NumPy broadcasting."""
    r = perform(_DIV, a, b)
    if r.__class__ is Tensor or (a.__class__ is not Tensor and b.__class__ is not Tensor):
        return r
    return _plain(r)


def pow(x, p):
    """``x ** p`` with NumPy broadcasting (``p`` may be traced too)."""
    return _out(perform(_POW, x, p), x, p)


def neg(x):
    """``-x``."""
    return _unary(_NEG, x)


def exp(x):
    """Elementwise ``e**x``."""
    return _unary(_EXP, x)


def log(x):
    """Elementwise natural logarithm."""
    return _unary(_LOG, x)


def tanh(x):
    """Elementwise hyperbolic tangent."""
    return _unary(_TANH, x)


def sigmoid(x):
    """Elementwise logistic function ``1 / (1 + exp(-x))``."""
    return _unary(_SIGMOID, x)


def relu(x):
    """Elementwise ``max(x, 0)`` (gradient 0 at 0)."""
    return _unary(_RELU, x)


def cast(x, dtype):
    """``x.astype(dtype)``; the gradient is cast back to ``x``'s dtype."""
    return _out(perform(_CAST, x, np.dtype(dtype)), x)


def matmul(a, b):
    """``a @ b`` with NumPy's rules (1-D operands, batched for rank >= 3)."""
    return _out(perform(_MATMUL, a, b), a, b)


def sum(x, axis=None, keepdims=False):
    """Sum over ``axis`` (None: all; int or tuple, negative allowed)."""
    return _out(perform(_SUM, x, _axis_param(axis), bool(keepdims)), x)


def mean(x, axis=None, keepdims=False):
    """Mean over ``axis`` (None: all; int or tuple, negative allowed)."""
    return _out(perform(_MEAN, x, _axis_param(axis), bool(keepdims)), x)


def max(x, axis=None, keepdims=False):
    """Maximum over ``axis``; tied maxima share the gradient equally."""
    return _out(perform(_MAX, x, _axis_param(axis), bool(keepdims)), x)


def reshape(x, shape):
    """``x`` with a new shape (one ``-1`` allowed)."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if -1 in shape:
        total = math.prod(_shape(_raw(x)))
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(total // known if known and s == -1 else s for s in shape)
    return _out(perform(_RESHAPE, x, shape), x)


def transpose(x, axes=None):
    """Permute axes (reverse them when ``axes`` is None)."""
    if axes is not None:
        nd = len(_shape(_raw(x)))
        axes = tuple(gpu_ops.normalize_axis(int(a), nd) for a in axes)
    return _out(perform(_TRANSPOSE, x, axes), x)


def broadcast_to(x, shape):
    """``x`` broadcast to ``shape``; the gradient sums over the broadcast axes."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return _out(perform(_BROADCAST_TO, x, tuple(int(s) for s in shape)), x)


def _raw_index(index):
    if isinstance(index, tuple):
        return tuple(_raw(i) for i in index)
    if isinstance(index, list):
        return np.asarray([_raw(i) for i in index])
    return _raw(index)


def getitem(x, index):
    """``x[index]`` with NumPy indexing (basic and advanced)."""
    return _out(perform(_GETITEM, x, _raw_index(index)), x)


def index_add(g, index, shape):
    """zeros(``shape``) with ``g`` added at ``index``: the transpose of ``getitem``."""
    return _out(perform(_INDEX_ADD, g, _raw_index(index), tuple(shape)), g)


def gather(values, indices):
    """Rows of ``values`` picked by integer ``indices`` (shape ``indices.shape +
    values.shape[1:]``); out-of-range indices are a ValidationError."""
    return _out(perform(_GATHER, values, indices), values)


def softmax(x, axis=-1):
    """Numerically stable softmax along ``axis``."""
    return _out(perform(_SOFTMAX, x, int(axis)), x)


def log_softmax(x, axis=-1):
    """Numerically stable log-softmax along ``axis``."""
    return _out(perform(_LOG_SOFTMAX, x, int(axis)), x)


def cross_entropy(logits, labels):
    """Mean over samples of ``-log_softmax(logits)[label]``: ``logits`` is
    ``(..., classes)``, ``labels`` integer class indices of shape ``(...)``."""
    return _out(perform(_CROSS_ENTROPY, logits, labels), logits)


def repeat_interleave(x, repeats, axis):
    """Each element repeated ``repeats`` times along ``axis`` (torch semantics)."""
    return _out(perform(_REPEAT_INTERLEAVE, x, int(repeats), int(axis)), x)


def where(cond, a, b):
    """``a`` where ``cond`` else ``b`` (broadcasting); ``cond`` gets no gradient."""
    return _out(perform(_WHERE, cond, a, b), a, b)


def stop_gradient(x):
    """``x`` as a constant for every enclosing ``grad``/``vjp``/``jvp``/``Tape``."""
    return _out(perform(_STOP_GRADIENT, x), x)


for _name, _fn in [("add", add), ("sub", sub), ("mul", mul), ("div", div), ("pow", pow),
                   ("neg", neg), ("exp", exp), ("log", log), ("tanh", tanh),
                   ("cast", cast), ("matmul", matmul), ("reshape", reshape),
                   ("transpose", transpose), ("broadcast_to", broadcast_to),
                   ("getitem", getitem), ("index_add", index_add), ("gather", gather),
                   ("softmax", softmax), ("repeat_interleave", repeat_interleave),
                   ("where", where)]:
    setattr(_Primitives, _name, staticmethod(_fn))
del _name, _fn


# --- observing the backward pass ---------------------------------------------

#: Performed once per backward pass.  Its default answers False: nobody outside
#: wants to see the pass, which then runs on the raw kernels (fast path).  Live
#: tapes and jvp traces answer True (their values may flow through the pass:
#: that is how grad of grad works), and so does :func:`observe_backward`.
BACKWARD_OBSERVED = Effect("kina_fx.autograd.backward_observed")
BACKWARD_OBSERVED.default = lambda: False


def _yes():
    return True


def observe_backward():
    """A handler making backward passes perform their primitives, so handlers
    installed around it (op loggers, FLOP counters, casts) see them too::

        with Handler(fun={effect_of("matmul"): count}), observe_backward():
            g = grad(loss)(w)
    """
    return Handler(fun={BACKWARD_OBSERVED: _yes})


def _ops_for_backward():
    return _Primitives if perform(BACKWARD_OBSERVED) else _Kernels


# --- the tape: a handler that records ------------------------------------------


_tags = itertools.count(1)


class Tape:
    """A reverse-mode trace.  Use it directly or through :func:`grad`/:func:`vjp`::

        with Tape() as t:
            x = t.watch(x0)
            y = (x * x).sum()
        dx, = t.gradient(y, [x])

    While the ``with`` block runs, the tape's handler intercepts every
    primitive; ops on its own boxes are recorded, the rest pass through.
    """

    def __init__(self, name=None):
        self.tag = next(_tags)
        self.name = name or f"tape{self.tag}"
        self._nodes = []         # (rule, out_id, in_ids, u, v, out_value): see _backward
        self._n = 0              # ids handed out so far
        self._leaves = {}        # id -> (name or None, value), for watched values
        self._live = False
        self._handler = None

    def __repr__(self):
        return f"<Tape {self.name} nodes={len(self._nodes)}{' live' if self._live else ''}>"

    # -- recording --
    def __enter__(self):
        if self._live:
            raise ValidationError(f"{self!r} is already recording")
        # Handlers are pooled: building one (a clause per primitive) costs more
        # than a small function's whole forward pass.  A pooled handler's
        # clauses read the tape from its _Recorder, so a box of an earlier
        # tape never passes for one of this tape (boxes name their Tape).
        if _tape_handlers:
            handler, rec = _tape_handlers.pop()
        else:
            handler, rec = _new_tape_handler()
        rec.tape = self
        handler.__enter__()
        self._handler = (handler, rec)
        self._live = True
        return self

    def __exit__(self, *exc):
        self._live = False
        handler, rec = self._handler
        self._handler = None
        handler.__exit__(*exc)
        rec.tape = None
        if len(_tape_handlers) < 64:
            _tape_handlers.append((handler, rec))
        return False

    def watch(self, x, name=None):
        """A box of this tape for ``x`` (array, scalar or Tensor): the values
        gradients can be taken with respect to.

        A plain (untraced) Tensor is watched in place, as TensorFlow's
        ``tape.watch(x)``: ``x`` itself becomes the box (and goes back to
        acting as a plain Tensor when the tape finishes).  Arrays and scalars
        get a new box, which is returned."""
        if x.__class__ is Tensor and self._live and (x._trace is None or not x._trace._live):
            v = _lift(x)
            if v.__class__ is not Tensor:          # plain all the way down: adopt
                _as_input(v)                       # (type checks)
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
        x = _as_input(x)
        i = self._n
        self._n = i + 1
        self._leaves[i] = (name, x)
        return _box(x, self, i)

    # -- the backward pass --
    def gradient(self, target, sources, output_gradients=None):
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
            if t.__class__ is not Tensor or t._trace is not self:
                continue          # a constant target: contributes nothing
            if s is None:
                v = _raw(t)
                s = _array_module(v).ones(_shape(v), dtype=getattr(v, "dtype", None))
            elif s.__class__ is Tensor:
                s = _lift(s)
            j = t._id
            grads[j] = s if grads[j] is None else add(grads[j], s)
        self._backward(grads, _ops_for_backward())
        out = []
        for x in srcs:
            if x.__class__ is not Tensor or x._trace is not self:
                raise ValidationError("gradient sources must be boxes of this tape "
                                      "(values returned by tape.watch or made on it)")
            g = grads[x._id]
            if g is None:
                v = _raw(x)
                g = _array_module(v).zeros(_shape(v), dtype=getattr(v, "dtype", None))
            out.append(g)
        return out[0] if single else out

    def _backward(self, grads, o):
        # A plain loop over the recorded nodes, newest first.  A node is
        # (rule, out_id, in_ids, u, v, out).  One-input nodes -- unary
        # primitives (u, v = x, params) and binary ones with one traced operand
        # (u, v = a, b) -- have an int ``in_ids`` and ``rule(o, g, out, u, v)``
        # returns its cotangent; the others have a tuple of ids (-1: constant),
        # u, v = args, params, and ``rule(o, g, out, args, params, ids)``.
        for rule, oid, ids, u, v, out in reversed(self._nodes):
            g = grads[oid]
            if g is None:
                continue
            if ids.__class__ is int:
                ct = rule(o, g, out, u, v)
                prev = grads[ids]
                grads[ids] = ct if prev is None else o.add(prev, ct)
                continue
            for j, ct in zip(ids, rule(o, g, out, u, v, ids)):
                if j >= 0 and ct is not None:
                    prev = grads[j]
                    grads[j] = ct if prev is None else o.add(prev, ct)

    # -- drawing --
    def to_dot(self, name="tape"):
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
        for k, (rule, oid, ids, args, params, out) in enumerate(self._nodes):
            pname = _RULE_NAMES.get(rule, "?")
            lines.append(f"  op{k} [label=\"{pname}\", shape=box];")
            lines.append(f"  v{oid} [label=\"{label(out)}\", shape=ellipse];")
            for j in ((ids,) if ids.__class__ is int else ids):
                if j >= 0:
                    lines.append(f"  v{j} -> op{k};")
            lines.append(f"  op{k} -> v{oid};")
        lines.append("}")
        return "\n".join(lines) + "\n"


def _box(value, trace, i):
    t = _new(Tensor)
    t._value = value
    t._trace = trace
    t._id = i
    return t


def _own(tape, x):
    """(id, inner value) for an argument of a primitive seen by ``tape``."""
    if x.__class__ is Tensor:
        tr = x._trace
        if tr is tape:
            return x._id, x._value
        if tr is None or not tr._live:
            x = _lift(x)
            if x.__class__ is Tensor and x._trace is tape:
                return x._id, x._value
    return -1, x


class _Recorder:
    """What a pooled tape handler's clauses read: the tape now using it."""

    __slots__ = ("tape",)

    def __init__(self, tape=None):
        self.tape = tape


_tape_handlers = []        # pooled (Handler, _Recorder) pairs of finished tapes


def _new_tape_handler():
    if len(_tape_factories) != len(PRIMITIVES):
        _tape_factories[:] = [(p.effect, prim_clause_factory(p)) for p in PRIMITIVES.values()]
    rec = _Recorder()
    fun = {eff: make(rec) for eff, make in _tape_factories}
    fun[_STOP_GRADIENT] = _stop_clause(rec)
    fun[BACKWARD_OBSERVED] = _yes
    return Handler(fun=fun), rec


def prim_clause_factory(prim):
    """``make(rec) -> clause``, built once per primitive; a clause records on
    ``rec.tape``."""
    factory = _factories.get(prim.name)
    if factory is None:
        if prim.nin == 1 and prim.name in _ELEMENTWISE:
            factory = _elementwise_factory(prim.effect, prim.vjp)
        elif prim.nin == 1:
            factory = _unary_factory(prim.effect, prim.vjp)
        elif prim.nin == 2 and prim.diff == (True, True):
            factory = _binary_factory(prim.effect, prim.vjp, *prim.vjp_sides)
        else:
            factory = _general_factory(prim.effect, prim.vjp, prim.nin, prim.diff)
        _factories[prim.name] = factory
    return factory


_factories = {}
_tape_factories = []       # [(effect, make)] for every primitive, built on first use


_ELEMENTWISE = {"neg", "exp", "log", "tanh", "sigmoid", "relu"}   # one input, no parameters


def _elementwise_factory(eff, rule):
    def make(rec):
        def clause(x):
            if x.__class__ is Tensor:
                tape = rec.tape
                tr = x._trace
                if tr is not tape and (tr is None or not tr._live):
                    x = _lift(x)       # a plain Tensor or a finished trace's box
                    tr = x._trace if x.__class__ is Tensor else None
                if tr is tape:
                    v = x._value
                    out = perform(eff, v)
                    i = tape._n
                    tape._n = i + 1
                    tape._nodes.append((rule, i, x._id, v, (), out))
                    b = _new(Tensor)
                    b._value = out
                    b._trace = tape
                    b._id = i
                    return b
            return perform(eff, x)
        return clause
    return make


def _unary_factory(eff, rule):
    def make(rec):
        def clause(x, *params):
            if x.__class__ is Tensor:
                tape = rec.tape
                tr = x._trace
                if tr is not tape and (tr is None or not tr._live):
                    x = _lift(x)
                    tr = x._trace if x.__class__ is Tensor else None
                if tr is tape:
                    v = x._value
                    out = perform(eff, v, *params)
                    i = tape._n
                    tape._n = i + 1
                    tape._nodes.append((rule, i, x._id, v, params, out))
                    b = _new(Tensor)
                    b._value = out
                    b._trace = tape
                    b._id = i
                    return b
            return perform(eff, x, *params)
        return clause
    return make


def _binary_factory(eff, rule, rule_a, rule_b):
    def make(rec):
        def clause(a, b):
            tape = rec.tape
            ia = ib = -1
            if a.__class__ is Tensor:
                if a._trace is tape:
                    ia = a._id
                    a = a._value
                else:
                    ia, a = _own(tape, a)
            if b.__class__ is Tensor:
                if b._trace is tape:
                    ib = b._id
                    b = b._value
                else:
                    ib, b = _own(tape, b)
            out = perform(eff, a, b)
            i = tape._n
            if ib < 0:
                if ia < 0:
                    return out
                tape._nodes.append((rule_a, i, ia, a, b, out))
            elif ia < 0:
                tape._nodes.append((rule_b, i, ib, a, b, out))
            else:
                tape._nodes.append((rule, i, (ia, ib), (a, b), (), out))
            tape._n = i + 1
            r = _new(Tensor)
            r._value = out
            r._trace = tape
            r._id = i
            return r
        return clause
    return make


def _general_factory(eff, rule, nin, diff):
    def make(rec):
        def clause(*args):
            tape = rec.tape
            ids = []
            inner = list(args)
            for k in range(nin):
                i, inner[k] = _own(tape, args[k])
                ids.append(i if diff[k] else -1)
            out = perform(eff, *inner)
            if _pymax(ids) < 0:
                return out
            i = tape._n
            tape._n = i + 1
            tape._nodes.append((rule, i, tuple(ids), tuple(inner[:nin]), tuple(inner[nin:]), out))
            return _box(out, tape, i)
        return clause
    return make


def _stop_clause(rec):
    def clause(x):
        trace = rec.tape
        if x.__class__ is Tensor:
            if x._trace is trace:
                x = x._value
            elif x._trace is None or not x._trace._live:
                x = _lift(x)
                if x.__class__ is Tensor and x._trace is trace:
                    x = x._value
        return perform(_STOP_GRADIENT, x)
    return clause


_RULE_NAMES = {p.vjp: p.name for p in PRIMITIVES.values()}
_RULE_NAMES.update({r: p.name for p in PRIMITIVES.values() for r in p.vjp_sides or ()})


# --- forward mode: dual numbers ------------------------------------------------


class _JVPTrace:
    """Forward-mode trace: boxes carry a primal and a tangent (None: zero)."""

    def __init__(self):
        self.tag = next(_tags)
        self._live = False
        self._handler = None

    def __repr__(self):
        return f"<JVPTrace {self.tag}{' live' if self._live else ''}>"

    def __enter__(self):
        # Pooled handlers, as for tapes (see Tape.__enter__).
        if _jvp_handlers:
            handler, rec = _jvp_handlers.pop()
        else:
            rec = _Recorder()
            fun = {p.effect: _jvp_clause(rec, p) for p in PRIMITIVES.values()}
            fun[_STOP_GRADIENT] = _stop_clause(rec)
            fun[BACKWARD_OBSERVED] = _yes
            handler = Handler(fun=fun)
        rec.tape = self
        handler.__enter__()
        self._handler = (handler, rec)
        self._live = True
        return self

    def __exit__(self, *exc):
        self._live = False
        handler, rec = self._handler
        self._handler = None
        handler.__exit__(*exc)
        rec.tape = None
        if len(_jvp_handlers) < 64:
            _jvp_handlers.append((handler, rec))
        return False

    def dual(self, primal, tangent):
        t = _box(primal, self, -1)
        t._tangent = tangent
        return t


_jvp_handlers = []         # pooled (Handler, _Recorder) pairs of finished jvp traces


def _jvp_clause(rec, prim):
    eff = prim.effect
    rule = prim.jvp
    nin = prim.nin

    def clause(*args):
        trace = rec.tape
        inner = list(args)
        tangents = [None] * nin
        mine = False
        for k in range(nin):
            x = args[k]
            if x.__class__ is Tensor:
                if x._trace is not trace and (x._trace is None or not x._trace._live):
                    x = _lift(x)
                    inner[k] = x
                if x.__class__ is Tensor and x._trace is trace:
                    inner[k] = x._value
                    tangents[k] = x._tangent
                    mine = True
        out = perform(eff, *inner)
        if not mine:
            return out
        ins = tuple(inner[:nin])
        if all(t is None for t in tangents):
            return out
        tout = rule(_Primitives, out, ins, tuple(tangents), tuple(inner[nin:]))
        return trace.dual(out, tout)
    return clause


# --- pytrees --------------------------------------------------------------------


def _leaf_rebuild(ls):
    return ls[0]


def _has_tensor(tree):
    """Whether a pytree holds a Tensor leaf (then outputs are Tensors too)."""
    if tree.__class__ is Tensor:
        return True
    if isinstance(tree, (tuple, list)):
        return any(_has_tensor(c) for c in tree)
    if isinstance(tree, dict):
        return any(_has_tensor(c) for c in tree.values())
    return False


def _flatten(tree):
    """(leaves, rebuild): tuples, lists, dicts and None are nodes, the rest leaves."""
    cls = tree.__class__
    if cls is _ndarray or cls is Tensor or cls is float:
        return [tree], _leaf_rebuild
    if isinstance(tree, (tuple, list)):
        parts = [_flatten(c) for c in tree]
        leaves = [leaf for ls, _ in parts for leaf in ls]
        counts = [len(ls) for ls, _ in parts]
        kind = type(tree)

        def rebuild(ls):
            out, k = [], 0
            for (_, rb), n in zip(parts, counts):
                out.append(rb(ls[k:k + n]))
                k += n
            if kind is list:
                return out
            if kind is tuple:
                return tuple(out)
            return kind(*out) if hasattr(kind, "_fields") else kind(out)
        return leaves, rebuild
    if isinstance(tree, dict):
        keys = list(tree)
        leaves, rb = _flatten([tree[k] for k in keys])
        kind = type(tree)
        return leaves, lambda ls: kind(zip(keys, rb(ls)))
    if tree is None:
        return [], lambda ls: None
    return [tree], _leaf_rebuild


def _as_input(x):
    """A leaf passed to a transform, as the value its box will hold."""
    if x.__class__ is Tensor:
        return _lift(x)
    if isinstance(x, bool):
        raise KinaTypeError("cannot differentiate with respect to a bool")
    if isinstance(x, (int, float, np.generic)):
        return np.asarray(x, dtype=np.float64 if isinstance(x, int) else None)
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        if x.dtype.kind not in "fc":
            raise KinaTypeError(f"cannot differentiate with respect to dtype {x.dtype} "
                                "(use a floating-point array)")
        return x
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=np.float64)
    raise KinaTypeError(f"cannot trace a value of type {type(x).__name__}")


def _like(value, like):
    """A derivative (one level in) returned as the kind of thing ``like`` was."""
    if value.__class__ is Tensor:
        if value._trace is not None and value._trace._live:
            return value
        value = _raw(value)
    if like.__class__ is Tensor:
        return _plain(value)
    if isinstance(like, (int, float)) and not isinstance(like, bool):
        return float(value)
    if isinstance(value, np.generic) and not isinstance(like, np.generic):
        return np.asarray(value)
    return value


def _output(value, wrap):
    """A function's output leaf, one level in."""
    if value.__class__ is Tensor:
        tr = value._trace
        if tr is not None and tr._live:
            return value
        value = _raw(value)
    return _plain(value) if wrap else value


def _unbox(value, trace):
    if value.__class__ is Tensor and value._trace is trace:
        return value._value
    return value


def _argnums(argnums, nargs):
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for n in nums:
        if not -nargs <= n < nargs:
            raise ValidationError(f"argnums {argnums!r} out of range for {nargs} arguments")
    return single, tuple(n % nargs for n in nums)


# --- transforms -------------------------------------------------------------------


def value_and_grad(f, argnums=0, has_aux=False):
    """``f``'s value and its gradient with respect to argument(s) ``argnums``.

    ``f`` must return a scalar (or ``(scalar, aux)`` with ``has_aux``).  Arguments
    may be pytrees of arrays/scalars/Tensors; the gradient has the same
    structure, with arrays for arrays, floats for floats, Tensors for Tensors.
    """
    def vg(*args, **kwargs):
        single, nums = _argnums(argnums, len(args))
        args = list(args)
        wrap = any(_has_tensor(a) for a in args)
        tape = Tape()
        structs = []
        with tape:
            for n in nums:
                leaves, rebuild = _flatten(args[n])
                boxes = [tape._watch(leaf) for leaf in leaves]
                structs.append((leaves, rebuild, boxes))
                args[n] = rebuild(boxes)
            res = f(*args, **kwargs)
        out, aux = res if has_aux else (res, None)
        if _shape(_raw(out)) != ():
            raise ValidationError(
                f"grad needs a scalar output, got shape {_shape(_raw(out))}; use vjp")
        all_boxes = [b for _, _, boxes in structs for b in boxes]
        gs = tape.gradient(out, all_boxes)
        results, k = [], 0
        for leaves, rebuild, boxes in structs:
            n = len(boxes)
            results.append(rebuild([_like(g, leaf) for g, leaf in
                                    zip(gs[k:k + n], leaves)]))
            k += n
        g = results[0] if single else tuple(results)
        value = _output(_unbox(out, tape), wrap)
        if has_aux:
            aux_leaves, aux_rebuild = _flatten(aux)
            aux = aux_rebuild([_output(_unbox(a, tape), wrap) for a in aux_leaves])
            return (value, aux), g
        return value, g
    vg.__name__ = f"value_and_grad({getattr(f, '__name__', 'f')})"
    return vg


def grad(f, argnums=0, has_aux=False):
    """The gradient of scalar-valued ``f`` with respect to argument(s) ``argnums``
    (JAX conventions: an int gives one gradient, a tuple a tuple of them)."""
    vg = value_and_grad(f, argnums, has_aux)

    def g(*args, **kwargs):
        if has_aux:
            (_, aux), gr = vg(*args, **kwargs)
            return gr, aux
        return vg(*args, **kwargs)[1]
    g.__name__ = f"grad({getattr(f, '__name__', 'f')})"
    return g


def vjp(f, *primals):
    """``(f(*primals), vjp_fn)``; ``vjp_fn(cotangent)`` (same structure as the
    output) returns a tuple with one cotangent per primal.  ``vjp_fn`` may be
    called any number of times."""
    wrap = any(_has_tensor(p) for p in primals)
    tape = Tape()
    structs = []
    args = []
    with tape:
        for p in primals:
            leaves, rebuild = _flatten(p)
            boxes = [tape._watch(leaf) for leaf in leaves]
            structs.append((leaves, rebuild, boxes))
            args.append(rebuild(boxes))
        res = f(*args)
    out_leaves, out_rebuild = _flatten(res)
    out = out_rebuild([_output(_unbox(v, tape), wrap) for v in out_leaves])

    def vjp_fn(cotangent):
        ct_leaves, _ = _flatten(cotangent)
        if len(ct_leaves) != len(out_leaves):
            raise ValidationError(f"vjp_fn got {len(ct_leaves)} cotangent leaves for "
                                  f"{len(out_leaves)} outputs")
        seeds = []
        for c, o in zip(ct_leaves, out_leaves):
            c = _lift(c) if c.__class__ is Tensor else c
            v = _raw(o)
            if not hasattr(c, "shape"):
                c = _array_module(v).asarray(c, dtype=getattr(v, "dtype", None))
            seeds.append(c)
        all_boxes = [b for _, _, boxes in structs for b in boxes]
        gs = tape.gradient(list(out_leaves), all_boxes, seeds)
        results, k = [], 0
        for leaves, rebuild, boxes in structs:
            n = len(boxes)
            results.append(rebuild([_like(g, leaf) for g, leaf in
                                    zip(gs[k:k + n], leaves)]))
            k += n
        return tuple(results)
    return out, vjp_fn


def jvp(f, primals, tangents):
    """Forward mode: ``(f(*primals), J @ tangents)``; ``primals`` and ``tangents``
    are tuples (or lists) of the same structure."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise ValidationError("jvp takes primals and tangents as tuples")
    if len(primals) != len(tangents):
        raise ValidationError("jvp: primals and tangents differ in length")
    wrap = any(_has_tensor(p) for p in primals)
    trace = _JVPTrace()
    args = []
    with trace:
        for p, t in zip(primals, tangents):
            pl, rebuild = _flatten(p)
            tl, _ = _flatten(t)
            if len(pl) != len(tl):
                raise ValidationError("jvp: a tangent's structure differs from its primal's")
            duals = []
            for pv, tv in zip(pl, tl):
                pv = _as_input(pv)
                tv = _lift(tv) if tv.__class__ is Tensor else tv
                if not hasattr(tv, "shape"):
                    tv = _array_module(pv).asarray(tv, dtype=pv.dtype)
                duals.append(trace.dual(pv, tv))
            args.append(rebuild(duals))
        res = f(*args)
    leaves, rebuild = _flatten(res)
    outs, tans = [], []
    for v in leaves:
        if v.__class__ is Tensor and v._trace is trace:
            p, t = v._value, v._tangent
        else:
            p, t = v, None
        if t is None:
            rv = _raw(p)
            t = _array_module(rv).zeros(_shape(rv), dtype=getattr(rv, "dtype", None))
        outs.append(_output(p, wrap))
        tans.append(_output(t, wrap))
    return rebuild(outs), rebuild(tans)
