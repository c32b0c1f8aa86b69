"""The op registry, and the core ops.

An op is one block: a class body holding its kernel, its reverse-mode rule(s)
and its forward-mode rule(s) side by side, registered with :func:`op`::

    @op(numpy=np.tanh, methods=("tanh",), elementwise=True,
        sample=samples.elementwise(), reference=lambda np, x: np.tanh(x))
    class tanh:
        "Elementwise hyperbolic tangent."
        kernel = xp_kernel("tanh")                      # or any def kernel(x): ...
        def vjp_x(o, g, out, x):                        # cotangent of x
            return o.mul(g, o.sub(1.0, o.mul(out, out)))
        def jvp_x(o, t, out, x):                        # tangent of out from x's
            return o.mul(t, o.sub(1.0, o.mul(out, out)))

The decorator builds everything else from that block, so nothing is kept in
step by hand: the :class:`Primitive` row of :data:`PRIMITIVES` (with its
:class:`~kina_fx.handlers.Effect`, whose default runs the kernel), the public
function (``tanh`` above is that function once decorated), the entries of the
two operation namespaces rules are written against (``o``:
:data:`~kina_fx.autograd.tensor.recordable` and
:data:`~kina_fx.autograd.tensor.kernels`), the ``Tensor`` operators and
methods, and the NumPy functions that dispatch to the op on a Tensor
(:data:`NUMPY_RULES`).  ``docs/autograd.md`` ("How to add an op") has the rules
for writing a block; ``python -m kina_fx.autograd.optable`` prints the table.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable
import math
import operator as _operator

import numpy as np

from .. import gpu_ops
from ..errors import KinaTypeError, ValidationError
from ..handlers import Effect, perform
from . import samples
from .tensor import (Tensor, _as_array, _plain, _raw, _shape, array_module, is_traced,
                     kernels, recordable)

__all__ = ["op", "Primitive", "PRIMITIVES", "NUMPY_RULES", "COMPOSITES", "effect_of",
           "numpy_rule", "xp_kernel", "registry_generation"]

_ndarray = np.ndarray
_pymax = max
_pysum = sum

#: name -> Primitive: the op table.
PRIMITIVES: dict = {}

#: NumPy function or ufunc -> the kina_fx function that differentiates it.
#: Filled by ``op(numpy=...)`` and :func:`numpy_rule`; consulted by
#: ``Tensor.__array_ufunc__`` / ``__array_function__``.
NUMPY_RULES: dict = {}

#: name -> function: composites (functions of primitives, no rules of their
#: own) registered by :func:`numpy_rule` with a sample domain.
COMPOSITES: dict = {}

_generation = 0


def registry_generation() -> int:
    """Bumped by every registration: traces pool handlers built from the table
    and rebuild them when it changes."""
    return _generation


def bump_generation() -> None:
    """Mark the table changed (pooled trace handlers are rebuilt)."""
    global _generation
    _generation += 1


class Primitive:
    """One row of the op table.

    * ``effect``: performed as ``perform(effect, *arrays, *params)``; its
      default runs ``kernel``.
    * ``nin`` array inputs (for a ``sequence`` op: one input, a tuple of
      arrays), then ``nparams`` static parameters.  ``diff[k]``: whether input
      ``k`` is differentiable.
    * ``kernel(*arrays, *params)``: raw NumPy/CuPy arrays in, raw array out.
    * ``vjp_rules[k](o, g, out, *arrays, *params)``: the cotangent of input
      ``k`` (None for a constant input); for a sequence op
      ``vjp_rules[0](o, g, out, i, xs, *params)`` is element ``i``'s.
    * ``jvp_rules[k](o, t, out, *arrays, *params)``: the part of the output's
      tangent coming from input ``k``'s tangent ``t`` (they are summed).
    * ``vjp(o, g, out, arrays, params, ids)`` and ``jvp(o, out, arrays,
      tangents, params)``: the same rules for all inputs at once (``ids[k] <
      0`` and ``tangents[k] is None`` mark inputs not needed).
    """

    __slots__ = ("name", "effect", "nin", "nparams", "diff", "kernel", "raw", "vjp_rules",
                 "jvp_rules", "vjp", "jvp", "elementwise", "sequence", "linear", "numpy",
                 "operator", "methods", "sample", "reference", "public", "doc", "module")

    def __repr__(self):
        return f"<Primitive {self.name}>"


def effect_of(name: str) -> Effect:
    """The effect of the primitive called ``name`` (e.g. ``"matmul"``)."""
    return PRIMITIVES[name].effect


# --- kernels ------------------------------------------------------------------


def xp_kernel(name: str) -> Callable:
    """A kernel that is the array module's function ``name`` (``np.tanh`` on
    NumPy arrays, ``cupy.tanh`` on CuPy arrays).  It also unwraps Tensors, so
    it serves as its effect's default without a wrapper frame."""
    np_fn = getattr(np, name)

    def kernel(x):
        if x.__class__ is Tensor:
            x = _raw(x)
        if x.__class__ is _ndarray:
            return np_fn(x)
        return getattr(array_module(x), name)(x)
    kernel.__name__ = kernel.__qualname__ = f"{name}_kernel"
    return _unwrapping(kernel)


def _unwrapping(kernel):
    """Mark a kernel that unwraps Tensors itself: it is its effect's default
    without a wrapper frame (the hottest kernels)."""
    setattr(kernel, "unwraps", True)
    return kernel


# The arithmetic kernels spell the operator out (one bytecode, no call); NumPy
# and CuPy arrays implement them.
@_unwrapping
def _add_kernel(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a + b


@_unwrapping
def _sub_kernel(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a - b


@_unwrapping
def _mul_kernel(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a * b


@_unwrapping
def _div_kernel(a, b):
    if a.__class__ is Tensor:
        a = _raw(a)
    if b.__class__ is Tensor:
        b = _raw(b)
    return a / b


def _default_for(kernel, nin, sequence):
    """The effect's default: strip leftover wrappers (plain Tensors, boxes of
    finished traces), run the kernel."""
    if getattr(kernel, "unwraps", False):
        return kernel

    def default_sequence(xs, *params):
        return kernel(tuple(_raw(x) for x in xs), *params)

    def default_unary(x, *params):
        if x.__class__ is Tensor:
            x = _raw(x)
        return kernel(x, *params)

    def default_binary(a, b, *params):
        if a.__class__ is Tensor:
            a = _raw(a)
        if b.__class__ is Tensor:
            b = _raw(b)
        return kernel(a, b, *params)

    def default(*args):
        return kernel(*[_raw(a) for a in args])
    if sequence:
        return default_sequence
    return default_unary if nin == 1 else default_binary if nin == 2 else default


# --- public functions -----------------------------------------------------------


def _is_seq(v):
    return v.__class__ is list or v.__class__ is tuple


def _public_unary(eff):
    def fn(x):
        if x.__class__ is not Tensor:
            if x.__class__ is not list and x.__class__ is not tuple:
                return perform(eff, x)
            x = _as_array(x)
        r = perform(eff, x)
        return r if r.__class__ is Tensor or x.__class__ is not Tensor else _plain(r)
    return fn


def _public_binary(eff):
    def fn(a, b):
        if a.__class__ is list or a.__class__ is tuple:
            a = _as_array(a)
        if b.__class__ is list or b.__class__ is tuple:
            b = _as_array(b)
        r = perform(eff, a, b)
        if r.__class__ is Tensor or (a.__class__ is not Tensor and b.__class__ is not Tensor):
            return r
        return _plain(r)
    return fn


def _public_general(prim, prepare):
    eff, nin, sequence, name = prim.effect, prim.nin, prim.sequence, prim.name

    def fn(*args, **kwargs):
        if prepare is not None:
            args = prepare(*args, **kwargs)
        elif kwargs or len(args) != nin:
            raise TypeError(f"{name}() takes {nin} array arguments, got {len(args)}"
                            + (f" and keywords {sorted(kwargs)}" if kwargs else ""))
        traced = False
        if sequence:
            xs = args[0]
            if not isinstance(xs, (list, tuple)):
                raise KinaTypeError(f"{name} takes a sequence of arrays, not "
                                    f"{type(xs).__name__}")
            xs = tuple(_as_array(x) for x in xs)
            traced = any(x.__class__ is Tensor for x in xs)
            args = (xs,) + tuple(args[1:])
        else:
            arrays = []
            for a in args[:nin]:
                if _is_seq(a):
                    a = _as_array(a)
                traced = traced or a.__class__ is Tensor
                arrays.append(a)
            args = tuple(arrays) + tuple(args[nin:])
        r = perform(eff, *args)
        return r if r.__class__ is Tensor or not traced else _plain(r)
    return fn


def _operator_methods(eff):
    def forward(self, other):
        c = other.__class__
        if c is not float and (c is list or c is tuple):
            other = _as_array(other)
        r = perform(eff, self, other)
        return r if r.__class__ is Tensor else _plain(r)

    def reflected(self, other):
        c = other.__class__
        if c is not float and (c is list or c is tuple):
            other = _as_array(other)
        r = perform(eff, other, self)
        return r if r.__class__ is Tensor else _plain(r)
    return forward, reflected


def _unary_operator(eff):
    def method(self):
        r = perform(eff, self)
        return r if r.__class__ is Tensor else _plain(r)
    return method


# --- rules for all inputs at once -------------------------------------------------


def _joint_vjp(rules):
    def vjp(o, g, out, arrays, params, ids):
        args = tuple(arrays) + tuple(params)
        return [None if ids[k] < 0 or rule is None else rule(o, g, out, *args)
                for k, rule in enumerate(rules)]
    return vjp


def _joint_vjp_sequence(rule):
    def vjp(o, g, out, arrays, params, ids):
        xs = arrays[0]
        return [None if ids[i] < 0 else rule(o, g, out, i, xs, *params)
                for i in range(len(xs))]
    return vjp


def _joint_jvp(rules, elementwise):
    def jvp(o, out, arrays, tangents, params):
        args = tuple(arrays) + tuple(params)
        r = None
        for rule, t in zip(rules, tangents):
            if t is None or rule is None:
                continue
            c = rule(o, t, out, *args)
            r = c if r is None else o.add(r, c)
        if elementwise and r is not None and _shape(r) != _shape(out):
            r = o.broadcast_to(r, _shape(out))
        return r
    return jvp


def _joint_jvp_sequence(rule):
    def jvp(o, out, arrays, tangents, params):
        xs, ts = arrays[0], tangents[0]
        r = None
        for i, t in enumerate(ts):
            if t is None:
                continue
            c = rule(o, t, out, i, xs, *params)
            r = c if r is None else o.add(r, c)
        return r
    return jvp


def _zeros_like(x):
    v = _raw(x)
    return array_module(v).zeros(_shape(v), dtype=getattr(v, "dtype", np.float64))


def _linear_jvp(name, k):
    """The jvp of an op linear in its input ``k``: the op applied to the tangent."""
    def jvp(o, t, out, *args):
        return getattr(o, name)(*args[:k], t, *args[k + 1:])
    return jvp


def _linear_jvp_sequence(name):
    def jvp(o, out, arrays, tangents, params):
        xs, ts = arrays[0], tangents[0]
        if all(t is None for t in ts):
            return None
        filled = [_zeros_like(x) if t is None else t for x, t in zip(xs, ts)]
        return getattr(o, name)(filled, *params)
    return jvp


# --- the decorator ------------------------------------------------------------------


def _as_tuple(v):
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


def op(name: str | None = None, *, numpy: Any = (), operator: str | None = None,
       methods: Any = (), elementwise: bool = False, raw: Callable | None = None,
       constant: Any = (), sequence: bool = False, linear: bool = False,
       sample: Callable | None = None, reference: Callable | None = None) -> Callable:
    """Register the op defined by the decorated class body; returns its public function.

    The class body defines (see ``docs/autograd.md``, "How to add an op"):

    * ``kernel(*arrays, *params)`` -- required.  Raw NumPy/CuPy arrays in (use
      ``array_module(x)`` for the module), a raw array out.  Array inputs come
      first; every input with a rule, or named in ``constant``, is one.
    * ``vjp_<input>(o, g, out, *kernel_args)`` -- the cotangent of that input
      given the output's cotangent ``g``, written with the operations of ``o``
      (``o.mul``, ``o.sum``, ...) so the rule works raw and recorded.
    * ``jvp_<input>(o, t, out, *kernel_args)`` -- the output tangent's part
      from that input's tangent ``t``; or ``linear=True`` for an op linear in
      its one differentiable input (the jvp is the op applied to ``t``).
    * ``prepare(<public signature>) -> (*arrays, *params)`` -- required when
      the op has parameters: checks and normalises the public call (the public
      function has this signature; it must also accept the kernel's own
      arguments positionally, as the rules call ``o.<name>(*kernel_args)``).
    * ``method(self, ...)`` -- optional, installed as ``Tensor.<name>``.

    Decorator arguments: ``name`` (default: the class name); ``numpy``: NumPy
    function(s)/ufunc(s) the op differentiates on Tensors; ``operator``:
    ``"add"`` installs ``Tensor.__add__`` and ``__radd__``, ``"neg"``
    ``__neg__``; ``methods``: Tensor methods that are the public function;
    ``elementwise``: NumPy broadcasting over the array inputs (tangents are
    broadcast to the output); ``raw``: the function for the raw namespace
    (default: the kernel); ``constant``: non-differentiable array inputs;
    ``sequence``: the one array input is a sequence of arrays (rules get the
    element index ``i`` before the sequence); ``sample``: a sample domain
    (:mod:`kina_fx.autograd.samples`) the generic tests draw inputs from;
    ``reference``: ``reference(np_like, *args, **kwargs)`` computing the op
    with NumPy-like functions (the tests run it under HIPS autograd as an oracle).
    """
    def register(spec):
        opname = name or spec.__name__
        if opname in PRIMITIVES:
            raise ValidationError(f"an op called {opname!r} is already registered")
        body = vars(spec)
        kernel = body.get("kernel")
        if kernel is None:
            raise ValidationError(f"op {opname}: the block defines no kernel")
        params = list(inspect.signature(kernel).parameters)
        rules = {k[4:]: v for k, v in body.items() if k.startswith(("vjp_", "jvp_"))}
        vjps = {k[4:]: v for k, v in body.items() if k.startswith("vjp_")}
        jvps = {k[4:]: v for k, v in body.items() if k.startswith("jvp_")}
        consts = set(_as_tuple(constant))
        inputs = []
        for p in params:
            if p in rules or p in consts:
                inputs.append(p)
            else:
                break
        stray = (set(rules) | consts) - set(inputs)
        if stray:
            raise ValidationError(f"op {opname}: rules or constants for {sorted(stray)}, which "
                                  f"are not leading kernel arguments {params}")
        if not inputs:
            raise ValidationError(f"op {opname}: no array inputs (give rules or constant=)")
        if sequence and len(inputs) != 1:
            raise ValidationError(f"op {opname}: a sequence op has one (sequence) input")
        diff = tuple(p in vjps for p in inputs)
        ndiff = _pysum(diff)
        if linear and ndiff != 1:
            raise ValidationError(f"op {opname}: linear=True needs one differentiable input")
        for p in inputs:
            if p in vjps and p not in jvps and not linear:
                raise ValidationError(f"op {opname}: vjp_{p} without jvp_{p}")
            if p in jvps and p not in vjps:
                raise ValidationError(f"op {opname}: jvp_{p} without vjp_{p}")
        prepare = body.get("prepare")
        nin = len(inputs)
        nparams = len(params) - nin
        if nparams and prepare is None:
            raise ValidationError(f"op {opname}: an op with parameters defines prepare()")

        p = Primitive()
        p.name = opname
        p.effect = Effect("kina_fx.autograd." + opname)
        p.nin, p.nparams, p.diff = nin, nparams, diff
        p.kernel = kernel
        p.raw = raw if raw is not None else kernel
        p.elementwise, p.sequence, p.linear = bool(elementwise), bool(sequence), bool(linear)
        p.vjp_rules = tuple(vjps.get(i) for i in inputs)
        if linear:
            k = diff.index(True)
            jvp_rules = [None] * nin
            jvp_rules[k] = _linear_jvp(opname, k)
            p.jvp_rules = tuple(jvp_rules)
        else:
            p.jvp_rules = tuple(jvps.get(i) for i in inputs)
        if sequence:
            p.vjp = _joint_vjp_sequence(p.vjp_rules[0]) if diff[0] else None
            if linear:
                p.jvp = _linear_jvp_sequence(opname)
            else:
                p.jvp = _joint_jvp_sequence(p.jvp_rules[0]) if diff[0] else None
        else:
            p.vjp = _joint_vjp(p.vjp_rules) if ndiff else None
            p.jvp = _joint_jvp(p.jvp_rules, p.elementwise) if ndiff else None
        p.numpy = _as_tuple(numpy)
        p.operator = operator
        p.methods = _as_tuple(methods)
        p.sample, p.reference = sample, reference
        p.doc = inspect.cleandoc(spec.__doc__ or "")
        p.module = spec.__module__
        setattr(p.effect, "default", _default_for(kernel, nin, sequence))

        if prepare is None and not sequence and nin == 1:
            public = _public_unary(p.effect)
        elif prepare is None and not sequence and nin == 2:
            public = _public_binary(p.effect)
        else:
            public = _public_general(p, prepare)
        public.__name__ = public.__qualname__ = opname
        public.__doc__ = p.doc
        public.__module__ = spec.__module__
        public.__signature__ = inspect.signature(prepare or kernel)
        public.primitive = p
        p.public = public

        for fn in p.numpy:
            numpy_rule(fn)(public)
        setattr(recordable, opname, public)
        setattr(kernels, opname, p.raw)
        if operator in ("neg",):
            Tensor.__neg__ = _unary_operator(p.effect)
        elif operator is not None:
            fwd, rev = _operator_methods(p.effect)
            setattr(Tensor, f"__{operator}__", fwd)
            setattr(Tensor, f"__r{operator}__", rev)
        for m in p.methods:
            setattr(Tensor, m, public)
        if "method" in body:
            setattr(Tensor, opname, body["method"])
        PRIMITIVES[opname] = p
        bump_generation()
        return public
    return register


def numpy_rule(*numpy_functions: Callable, sample: Callable | None = None,
               reference: Callable | None = None) -> Callable[[Callable], Callable]:
    """Decorator: ``fn`` differentiates these NumPy functions/ufuncs on Tensors
    (``np.ravel(t)`` calls ``fn(t)``).  For functions written with other ops
    (composites); a primitive declares ``op(numpy=...)`` instead.  With
    ``sample=`` (and ``reference=``, as for :func:`op`) the composite is a row
    of :data:`COMPOSITES`, which the generic tests check like the primitives."""
    def register(fn):
        for f in numpy_functions:
            if f in NUMPY_RULES and NUMPY_RULES[f] is not fn:
                raise ValidationError(f"numpy.{f.__name__} already has a rule: "
                                      f"{NUMPY_RULES[f].__name__}")
            NUMPY_RULES[f] = fn
        if sample is not None:
            fn.sample, fn.reference = sample, reference
            COMPOSITES[fn.__name__] = fn
        return fn
    return register


# --- shared helpers for rules ---------------------------------------------------------


def unbroadcast(o: Any, ct: Any, shape: tuple) -> Any:
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


def norm_axes(axis, ndim):
    """``axis`` (None, int or sequence) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    axes = tuple(sorted(gpu_ops.normalize_axis(int(a), ndim) for a in axis))
    if len(set(axes)) != len(axes):
        raise ValidationError(f"repeated axis in {axis}")
    return axes


def axis_param(axis):
    """An ``axis`` argument as a canonical parameter: None, an int or a tuple."""
    if axis is None or isinstance(axis, (int, np.integer)):
        return None if axis is None else int(axis)
    return tuple(int(a) for a in axis)


def expand_back(o, g, shape, axis, keepdims):
    """``g`` (a reduction's cotangent) broadcast back to the input ``shape``."""
    if not keepdims:
        axes = norm_axes(axis, len(shape))
        g = o.reshape(g, tuple(1 if i in axes else s for i, s in enumerate(shape)))
    return o.broadcast_to(g, shape)


def _dtype_of(v):
    return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype


def _reference_onehot(labels, classes):
    return (np.asarray(labels)[..., None] == np.arange(classes)).astype(np.float64)


# =====================================================================================
# The core ops.  Each block: kernel, reverse rule(s), forward rule(s), sample domain.
# =====================================================================================

# --- arithmetic -----------------------------------------------------------------------


@op(numpy=np.add, operator="add", elementwise=True, raw=_operator.add,
    sample=samples.elementwise("real", "real"), reference=lambda np, a, b: a + b)
class add:
    """``a + b`` with NumPy broadcasting; cotangents are summed over broadcast axes."""
    kernel = _add_kernel

    def vjp_a(o, g, out, a, b):
        return g if g.shape == a.shape else unbroadcast(o, g, a.shape)

    def vjp_b(o, g, out, a, b):
        return g if g.shape == b.shape else unbroadcast(o, g, b.shape)

    def jvp_a(o, t, out, a, b):
        return t

    def jvp_b(o, t, out, a, b):
        return t


@op(numpy=np.subtract, operator="sub", elementwise=True, raw=_operator.sub,
    sample=samples.elementwise("real", "real"), reference=lambda np, a, b: a - b)
class sub:
    """``a - b`` with NumPy broadcasting."""
    kernel = _sub_kernel

    def vjp_a(o, g, out, a, b):
        return g if g.shape == a.shape else unbroadcast(o, g, a.shape)

    def vjp_b(o, g, out, a, b):
        return unbroadcast(o, o.neg(g), b.shape)

    def jvp_a(o, t, out, a, b):
        return t

    def jvp_b(o, t, out, a, b):
        return o.neg(t)


@op(numpy=np.multiply, operator="mul", elementwise=True, raw=_operator.mul,
    sample=samples.elementwise("real", "real"), reference=lambda np, a, b: a * b)
class mul:
    """``a * b`` with NumPy broadcasting."""
    kernel = _mul_kernel

    def vjp_a(o, g, out, a, b):
        ct = o.mul(g, b)
        return ct if ct.shape == a.shape else unbroadcast(o, ct, a.shape)

    def vjp_b(o, g, out, a, b):
        ct = o.mul(g, a)
        return ct if ct.shape == b.shape else unbroadcast(o, ct, b.shape)

    def jvp_a(o, t, out, a, b):
        return o.mul(t, b)

    def jvp_b(o, t, out, a, b):
        return o.mul(a, t)


@op(numpy=(np.true_divide,), operator="truediv", elementwise=True, raw=_operator.truediv,
    sample=samples.elementwise("real", "away_from_zero"), reference=lambda np, a, b: a / b)
class div:
    """``a / b`` with NumPy broadcasting."""
    kernel = _div_kernel

    def vjp_a(o, g, out, a, b):
        return unbroadcast(o, o.div(g, b), a.shape)

    def vjp_b(o, g, out, a, b):
        return unbroadcast(o, o.neg(o.div(o.mul(g, out), b)), b.shape)

    def jvp_a(o, t, out, a, b):
        return o.div(t, b)

    def jvp_b(o, t, out, a, b):
        return o.neg(o.div(o.mul(t, out), b))


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
            x = _raw(x)
        if p.__class__ is Tensor:
            p = _raw(p)
        return x ** p
    _unwrapping(kernel)

    def vjp_x(o, g, out, x, p):
        return unbroadcast(o, o.mul(g, _pow_dx(o, x, p)), _shape(x))

    def vjp_p(o, g, out, x, p):
        return unbroadcast(o, o.mul(o.mul(g, out), _log_base(o, x)), _shape(p))

    def jvp_x(o, t, out, x, p):
        return o.mul(t, _pow_dx(o, x, p))

    def jvp_p(o, t, out, x, p):
        return o.mul(o.mul(t, out), _log_base(o, x))


@op(numpy=np.negative, operator="neg", elementwise=True, raw=_operator.neg, linear=True,
    sample=samples.elementwise(), reference=lambda np, x: -x)
class neg:
    """``-x``."""
    def kernel(x):
        if x.__class__ is Tensor:
            x = _raw(x)
        return -x
    _unwrapping(kernel)

    def vjp_x(o, g, out, x):
        return o.neg(g)


# --- elementwise functions ---------------------------------------------------------------


@op(numpy=np.exp, methods=("exp",), elementwise=True, sample=samples.elementwise(),
    reference=lambda np, x: np.exp(x))
class exp:
    """Elementwise ``e**x``."""
    kernel = xp_kernel("exp")

    def vjp_x(o, g, out, x):
        return o.mul(g, out)

    def jvp_x(o, t, out, x):
        return o.mul(t, out)


@op(numpy=np.log, methods=("log",), elementwise=True, sample=samples.elementwise("positive"),
    reference=lambda np, x: np.log(x))
class log:
    """Elementwise natural logarithm."""
    kernel = xp_kernel("log")

    def vjp_x(o, g, out, x):
        return o.div(g, x)

    def jvp_x(o, t, out, x):
        return o.div(t, x)


@op(numpy=np.tanh, methods=("tanh",), elementwise=True, sample=samples.elementwise(),
    reference=lambda np, x: np.tanh(x))
class tanh:
    """Elementwise hyperbolic tangent."""
    kernel = xp_kernel("tanh")

    def vjp_x(o, g, out, x):
        return o.mul(g, o.sub(1.0, o.mul(out, out)))

    def jvp_x(o, t, out, x):
        return o.mul(t, o.sub(1.0, o.mul(out, out)))


@op(elementwise=True, sample=samples.elementwise(),
    reference=lambda np, x: 1.0 / (1.0 + np.exp(-x)))
class sigmoid:
    """Elementwise logistic function ``1 / (1 + exp(-x))`` (the runtime's
    kernel: SciPy's/CuPy's ``expit`` when installed)."""
    def kernel(x):
        if x.__class__ is Tensor:
            x = _raw(x)
        return gpu_ops.sigmoid(x)
    _unwrapping(kernel)

    def vjp_x(o, g, out, x):
        return o.mul(g, o.mul(out, o.sub(1.0, out)))

    def jvp_x(o, t, out, x):
        return o.mul(t, o.mul(out, o.sub(1.0, out)))


def _positive_mask(x):
    # A constant at every level: the derivative of a mask is zero.
    return _raw(x) > 0


@op(elementwise=True, sample=samples.elementwise("away_from_zero"),
    reference=lambda np, x: np.maximum(x, 0.0))
class relu:
    """Elementwise ``max(x, 0)`` (derivative 0 at 0)."""
    def kernel(x):
        if x.__class__ is Tensor:
            x = _raw(x)
        return (np if x.__class__ is _ndarray else array_module(x)).maximum(x, 0)
    _unwrapping(kernel)

    def vjp_x(o, g, out, x):
        return o.mul(g, _positive_mask(x))

    def jvp_x(o, t, out, x):
        return o.mul(t, _positive_mask(x))


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
        if dtype.kind == "c" and _is_traced(x):
            raise KinaTypeError(COMPLEX_REFUSAL + " (cast to a complex dtype)")
        return x, dtype

    def vjp_x(o, g, out, x, dtype):
        return o.cast(g, _dtype_of(x))


COMPLEX_REFUSAL = ("kina_fx.autograd does not differentiate complex numbers: use real and "
                    "imaginary parts as separate real arrays")


def _is_traced(v):
    return is_traced(v)


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


@op(numpy=np.matmul, operator="matmul", sample=_sample_matmul,
    reference=lambda np, a, b: np.matmul(a, b))
class matmul:
    """``a @ b`` with NumPy's rules (1-D operands, batched for rank >= 3).  A
    scalar operand is a ValidationError (use ``mul``)."""
    def kernel(a, b):
        return gpu_ops.matmul(a, b)     # its shape rule, gpu_ops.matmul_shape, refuses scalars

    def vjp_a(o, g, out, a, b):
        a_shape = a.shape
        g, a, b = _promote_for_matmul(o, g, a, b)
        ga = o.matmul(g, _swap_last(o, b))
        if ga.shape != a.shape:
            ga = unbroadcast(o, ga, a.shape)
        return ga if ga.shape == a_shape else o.reshape(ga, a_shape)

    def vjp_b(o, g, out, a, b):
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


def _reduction_prepare(x, axis=None, keepdims=False):
    return x, axis_param(axis), bool(keepdims)


@op(numpy=np.sum, methods=("sum",), linear=True, sample=samples.reduction(empty=True),
    reference=lambda np, x, axis=None, keepdims=False: np.sum(x, axis=axis, keepdims=keepdims))
class sum:
    """Sum over ``axis`` (None: all; an int or a tuple, negative allowed)."""
    kernel = _reduce_kernel("sum", np.sum)
    prepare = _reduction_prepare

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
    prepare = _reduction_prepare

    def vjp_x(o, g, out, x, axis, keepdims):
        shape = x.shape
        return o.div(expand_back(o, g, shape, axis, keepdims), _count(shape, axis))


def _max_weights(x, out, axis, keepdims):
    """Raw weights: 1/count on the arg-max positions, 0 elsewhere (a constant)."""
    rx, ro = _raw(x), _raw(out)
    xp = array_module(rx)
    if not keepdims:
        axes = norm_axes(axis, rx.ndim)
        ro = xp.reshape(ro, tuple(1 if i in axes else s for i, s in enumerate(rx.shape)))
    mask = (rx == ro).astype(rx.dtype)
    return mask / mask.sum(axis=axis, keepdims=True)


@op(numpy=(np.max, np.amax), methods=("max",), sample=samples.reduction(),
    reference=lambda np, x, axis=None, keepdims=False: np.max(x, axis=axis, keepdims=keepdims))
class max:
    """Maximum over ``axis``; tied maxima share the gradient equally."""
    kernel = _reduce_kernel("max", np.max)
    prepare = _reduction_prepare

    def vjp_x(o, g, out, x, axis, keepdims):
        return o.mul(expand_back(o, g, x.shape, axis, keepdims),
                     _max_weights(x, out, axis, keepdims))

    def jvp_x(o, t, out, x, axis, keepdims):
        return o.sum(o.mul(t, _max_weights(x, out, axis, keepdims)), axis, keepdims)


# --- shapes ------------------------------------------------------------------------------


def _sample_reshape(draw):
    shape = draw.shape()
    size = math.prod(shape)
    target = draw.choice([(size,), (1, size), (size, 1), (-1,), (1, -1, 1)])
    return [draw.array(shape)], {"shape": target}


def _resolve_shape(x, shape):
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if -1 in shape:
        total = math.prod(_shape(_raw(x)))
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(total // known if known and s == -1 else s for s in shape)
    return shape


@op(numpy=np.reshape, linear=True, sample=_sample_reshape,
    reference=lambda np, x, shape: np.reshape(x, shape))
class reshape:
    """``x`` with a new shape (one ``-1`` allowed)."""
    def kernel(x, shape):
        try:
            return x.reshape(shape)
        except AttributeError:
            return np.reshape(x, shape)

    def prepare(x, shape):
        return x, _resolve_shape(x, shape)

    def vjp_x(o, g, out, x, shape):
        return o.reshape(g, _shape(x))

    def method(self, *shape):
        """``t.reshape(2, 3)`` or ``t.reshape((2, 3))``."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return recordable.reshape(self, shape)


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


@op(sample=samples.along_axis(), reference=_softmax_reference)
class softmax:
    """Numerically stable softmax along ``axis``."""
    def kernel(x, axis):
        return gpu_ops.softmax(x, axis)

    def prepare(x, axis=-1):
        return x, int(axis)

    def vjp_x(o, g, out, x, axis):
        gy = o.mul(g, out)
        return o.sub(gy, o.mul(out, o.sum(gy, axis, True)))

    def jvp_x(o, t, out, x, axis):
        ty = o.mul(t, out)
        return o.sub(ty, o.mul(out, o.sum(ty, axis, True)))


@op(sample=samples.along_axis(), reference=_log_softmax_reference)
class log_softmax:
    """Numerically stable log-softmax along ``axis``."""
    def kernel(x, axis):
        return gpu_ops.log_softmax(x, axis)

    def prepare(x, axis=-1):
        return x, int(axis)

    def vjp_x(o, g, out, x, axis):
        return o.sub(g, o.mul(o.exp(out), o.sum(g, axis, True)))

    def jvp_x(o, t, out, x, axis):
        return o.sub(t, o.sum(o.mul(o.exp(out), t), axis, True))


def _one_hot(labels, like):
    xp = array_module(like)
    labels = xp.asarray(_raw(labels))
    return (labels[..., None] == xp.arange(like.shape[-1])).astype(like.dtype)


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

    def vjp_a(o, g, out, cond, a, b):
        return unbroadcast(o, o.where(_raw(cond), g, 0.0), _shape(a))

    def vjp_b(o, g, out, cond, a, b):
        return unbroadcast(o, o.where(_raw(cond), 0.0, g), _shape(b))

    def jvp_a(o, t, out, cond, a, b):
        return o.where(_raw(cond), t, 0.0)

    def jvp_b(o, t, out, cond, a, b):
        return o.where(_raw(cond), 0.0, t)


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
        if not isinstance(xs, (list, tuple)) or not xs:
            raise ValidationError("stack needs a non-empty sequence of arrays")
        return xs, _operator.index(axis)

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
        if not isinstance(xs, (list, tuple)) or not xs:
            raise ValidationError("concatenate needs a non-empty sequence of arrays")
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


def _sample_clip(draw):
    sx, slo, shi = draw.broadcastable(3)
    x = draw.array(sx)
    lo = draw.choice([None, -0.5, "array"])
    hi = draw.choice([None, 0.7, "array"])
    if lo == "array":
        lo = np.asarray(draw.array(slo) - 0.6)
    if hi == "array":
        hi = np.asarray(draw.array(shi) + 0.8)
    return [x, lo, hi], {}


@op(numpy=np.clip, elementwise=True, sample=_sample_clip,
    reference=lambda np, x, a_min=None, a_max=None: np.minimum(
        np.maximum(x, -np.inf if a_min is None else a_min), np.inf if a_max is None else a_max))
class clip:
    """``minimum(maximum(x, a_min), a_max)`` (a bound may be None).  Each
    output element's gradient goes to the input it was taken from (``x`` on
    the boundary), so the bounds are differentiable too."""
    def kernel(x, a_min, a_max):
        return array_module(x, a_min, a_max).minimum(
            array_module(x, a_min).maximum(x, a_min), a_max)

    def prepare(x, a_min=None, a_max=None):
        return (x, -math.inf if a_min is None else a_min,
                math.inf if a_max is None else a_max)

    def vjp_x(o, g, out, x, a_min, a_max):
        return unbroadcast(o, o.mul(g, _clip_masks(x, a_min, a_max)[0]), _shape(x))

    def vjp_a_min(o, g, out, x, a_min, a_max):
        return unbroadcast(o, o.mul(g, _clip_masks(x, a_min, a_max)[1]), _shape(a_min))

    def vjp_a_max(o, g, out, x, a_min, a_max):
        return unbroadcast(o, o.mul(g, _clip_masks(x, a_min, a_max)[2]), _shape(a_max))

    def jvp_x(o, t, out, x, a_min, a_max):
        return o.mul(t, _clip_masks(x, a_min, a_max)[0])

    def jvp_a_min(o, t, out, x, a_min, a_max):
        return o.mul(t, _clip_masks(x, a_min, a_max)[1])

    def jvp_a_max(o, t, out, x, a_min, a_max):
        return o.mul(t, _clip_masks(x, a_min, a_max)[2])
