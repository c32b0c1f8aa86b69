"""The op registry: the table of primitives and the decorator that fills it.

An op is one block: a class body holding its kernel and its derivative
rules side by side, registered with :func:`op`::

    @op(numpy=np.tanh, methods=("tanh",), elementwise=True,
        sample=samples.elementwise(), reference=lambda np, x: np.tanh(x))
    class tanh:
        "Elementwise hyperbolic tangent."
        kernel = xp_kernel("tanh")                      # or any def kernel(x): ...
        def d_x(o, v, out, x):                          # v times d tanh(x)/dx
            return o.mul(v, o.sub(1.0, o.mul(out, out)))

An elementwise op's derivative is diagonal, hence its own transpose, so one
``d_<input>`` rule gives both modes; other ops write their reverse-mode
(``vjp_<input>``) and forward-mode (``jvp_<input>``) rules side by side.
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
The core ops are in :mod:`.ops_core`, the others in ``ops_*.py``.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

import numpy as np

from .. import gpu_ops, kernel_threads
from ..errors import ValidationError
from ..handlers import Effect, perform
from . import samples
from .tensor import (Tensor, _as_array, _operand, _plain, _raw, _shape, array_module,
                     as_sequence, kernels, recordable)

__all__ = ["op", "Primitive", "PRIMITIVES", "NUMPY_RULES", "COMPOSITES", "effect_of",
           "numpy_rule", "xp_kernel", "unwrapping", "registry_generation", "COMPLEX_REFUSAL",
           "unary_ufunc", "constant_ufunc", "unbroadcast", "norm_axes", "axis_param",
           "expand_back", "reduction_prepare", "extremum_weights", "weighted_reduction"]

_ndarray = np.ndarray
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
      arrays), named ``inputs``, then ``nparams`` static parameters.  ``diff[k]``: whether input
      ``k`` is differentiable.
    * ``kernel(*arrays, *params)``: raw NumPy/CuPy arrays in, raw array out.
    * ``vjp_rules[k](o, g, out, *arrays, *params)``: the cotangent of input
      ``k`` (None for a constant input); for a sequence op
      ``vjp_rules[0](o, g, out, i, xs, *params)`` is element ``i``'s.
    * ``unbroadcast_vjp_rules[k]``: the same, for a caller that knows input
      ``k`` has the output's shape (nothing was broadcast): an elementwise
      op's derivative rule itself, without the wrapper that sums the
      cotangent over broadcast axes.
    * ``jvp_rules[k](o, t, out, *arrays, *params)``: the part of the output's
      tangent coming from input ``k``'s tangent ``t`` (they are summed).
    * ``vjp(o, g, out, arrays, params, ids)`` and ``jvp(o, out, arrays,
      tangents, params)``: the same rules for all inputs at once (``ids[k] <
      0`` and ``tangents[k] is None`` mark inputs not needed).
    """

    __slots__ = ("name", "effect", "nin", "nparams", "diff", "kernel", "raw", "vjp_rules",
                 "unbroadcast_vjp_rules",
                 "jvp_rules", "vjp", "jvp", "elementwise", "sequence", "linear", "numpy",
                 "operator", "methods", "sample", "reference", "public", "doc", "module",
                 "inputs")

    def __repr__(self):
        return f"<Primitive {self.name}>"


def effect_of(name: str) -> Effect:
    """The effect of the primitive called ``name`` (e.g. ``"matmul"``)."""
    return PRIMITIVES[name].effect


# --- kernels ------------------------------------------------------------------


def xp_kernel(name: str) -> Callable:
    """A kernel that is the array module's function ``name`` (``np.tanh`` on
    NumPy arrays, ``cupy.tanh`` on CuPy arrays; a large NumPy array in row
    blocks on the process's cores, as the runtime's kernels: the same values).
    It also unwraps Tensors, so it serves as its effect's default without a
    wrapper frame."""
    np_fn = getattr(np, name)
    blocks = isinstance(np_fn, np.ufunc) and np_fn.nin == 1 and np_fn.nout == 1

    def kernel(x):
        if x.__class__ is Tensor:
            x = _operand(x, name)
        if x.__class__ is _ndarray:
            if blocks and x.size >= kernel_threads.PARALLEL_MIN_ELEMENTS:
                return gpu_ops.ufunc_in_blocks(np_fn, x)
            return np_fn(x)
        return getattr(array_module(x), name)(x)
    kernel.__name__ = kernel.__qualname__ = f"{name}_kernel"
    return unwrapping(kernel)


def unwrapping(kernel):
    """Mark a kernel that unwraps Tensors itself: it is its effect's default
    without a wrapper frame (the hottest kernels)."""
    setattr(kernel, "unwraps", True)
    return kernel


def _default_for(kernel, nin, sequence, diff, name):
    """The effect's default: strip leftover wrappers (plain Tensors, boxes of
    finished traces; a running trace's box in a differentiable input is
    refused: :func:`~kina_fx.autograd.tensor._operand`), run the kernel."""
    if getattr(kernel, "unwraps", False):
        return kernel
    unwrap = [(lambda v: _operand(v, name)) if d else _raw for d in diff]

    def default_sequence(xs, *params):
        return kernel(tuple(unwrap[0](x) for x in xs), *params)

    def default_unary(x, *params):
        if x.__class__ is Tensor:
            x = unwrap[0](x)
        return kernel(x, *params)

    def default_binary(a, b, *params):
        if a.__class__ is Tensor:
            a = unwrap[0](a)
        if b.__class__ is Tensor:
            b = unwrap[1](b)
        return kernel(a, b, *params)

    def default(*args):
        return kernel(*[unwrap[k](a) if k < nin else _raw(a) for k, a in enumerate(args)])
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
    inputs = prim.inputs

    def fn(*args, **kwargs):
        if not sequence:
            # lists where NumPy takes an array are arrays before prepare() reads
            # their shapes (a list has none)
            for a in args[:nin]:
                if a.__class__ is list or a.__class__ is tuple:
                    args = tuple(_as_array(a) for a in args[:nin]) + args[nin:]
                    break
            if kwargs:
                kwargs = {k: _as_array(v) if k in inputs else v for k, v in kwargs.items()}
        if prepare is not None:
            args = prepare(*args, **kwargs)
        elif kwargs or len(args) != nin:
            raise TypeError(f"{name}() takes {nin} array arguments, got {len(args)}"
                            + (f" and keywords {sorted(kwargs)}" if kwargs else ""))
        traced = False
        if sequence:
            xs = tuple(_as_array(x) for x in as_sequence(name, args[0]))
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


def _operator_method(eff, reflected):
    """``Tensor.__add__`` (``reflected``: ``__radd__``) of the op ``eff``."""
    def method(self, other):
        c = other.__class__
        if c is not float and (c is list or c is tuple):
            other = _as_array(other)
        r = perform(eff, other, self) if reflected else perform(eff, self, other)
        return r if r.__class__ is Tensor else _plain(r)
    return method


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


def _reverse_of(d, k, nin):
    """The vjp of input ``k`` of an elementwise op from its derivative rule
    ``d``: the derivative is diagonal (each output element depends on its
    own input elements), so it is its own transpose: ``d`` applied to the
    cotangent, summed over the axes input ``k`` was broadcast along."""
    if nin == 1:
        return d                          # nothing is broadcast
    if nin == 2 and k == 0:
        def vjp_a(o, g, out, a, b):
            ct = d(o, g, out, a, b)
            return ct if ct.shape == a.shape else unbroadcast(o, ct, a.shape)
        return vjp_a
    if nin == 2:
        def vjp_b(o, g, out, a, b):
            ct = d(o, g, out, a, b)
            return ct if ct.shape == b.shape else unbroadcast(o, ct, b.shape)
        return vjp_b

    def vjp(o, g, out, *args):
        ct = d(o, g, out, *args)
        shape = _shape(args[k])
        return ct if _shape(ct) == shape else unbroadcast(o, ct, shape)
    return vjp


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
    * ``d_<input>(o, v, out, *kernel_args)`` -- instead of both, for an
      ``elementwise`` op: ``v`` times the partial derivative with respect to
      that input, elementwise.  Such a derivative is diagonal, so it is its
      own transpose: the jvp is ``d`` of the tangent, the vjp ``d`` of the
      cotangent summed over the axes the input was broadcast along.
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
        vjps = {k[4:]: v for k, v in body.items() if k.startswith("vjp_")}
        jvps = {k[4:]: v for k, v in body.items() if k.startswith("jvp_")}
        derivs = {k[2:]: v for k, v in body.items() if k.startswith("d_")}
        rules = set(vjps) | set(jvps) | set(derivs)
        if derivs and not elementwise:
            raise ValidationError(f"op {opname}: d_<input> rules are for elementwise ops "
                                  "(elementwise=True): write vjp_<input> and jvp_<input>")
        twice = set(derivs) & (set(vjps) | set(jvps))
        if twice:
            raise ValidationError(f"op {opname}: d_{sorted(twice)[0]} and a vjp_/jvp_ rule "
                                  "for the same input")
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
        for k, name_k in enumerate(inputs):      # one derivative rule gives both modes
            if name_k in derivs:
                jvps[name_k] = derivs[name_k]
                vjps[name_k] = _reverse_of(derivs[name_k], k, len(inputs))
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
        p.inputs = tuple(inputs)
        p.kernel = kernel
        p.raw = raw if raw is not None else kernel
        p.elementwise, p.sequence, p.linear = bool(elementwise), bool(sequence), bool(linear)
        p.vjp_rules = tuple(vjps.get(i) for i in inputs)
        p.unbroadcast_vjp_rules = tuple(derivs[i] if i in derivs else vjps.get(i) for i in inputs)
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
        setattr(p.effect, "default", _default_for(kernel, nin, sequence, diff, opname))

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
            setattr(Tensor, f"__{operator}__", _operator_method(p.effect, False))
            setattr(Tensor, f"__r{operator}__", _operator_method(p.effect, True))
        for m in p.methods:
            setattr(Tensor, m, public)
        if "method" in body:
            setattr(Tensor, opname, body["method"])
        PRIMITIVES[opname] = p
        bump_generation()
        return public
    return register


def unary_ufunc(domain: str = "real", *, methods: Any = ()) -> Callable:
    """Register the elementwise op of one array that is the array module's
    function of the decorated function's name (``np.sin`` for ``def sin``):
    its kernel (:func:`xp_kernel`), the NumPy function it differentiates and
    its test reference.  The decorated function is the op's one derivative
    rule ``d_x(o, v, out, x)`` and its docstring the op's; ``domain`` is the
    sample domain of ``x``.  The same as the ``@op`` block::

        @op(numpy=np.sin, elementwise=True, sample=samples.elementwise(domain),
            reference=lambda np, x: np.sin(x))
        class sin:
            "<docstring>"
            kernel = xp_kernel("sin")
            def d_x(o, v, out, x): ...
    """
    def register(d_x):
        name = d_x.__name__
        spec = type(name, (), {"__doc__": d_x.__doc__, "__module__": d_x.__module__,
                               "kernel": xp_kernel(name), "d_x": d_x})
        d_x.__name__, d_x.__qualname__ = "d_x", f"{name}.d_x"     # as in the block
        return _register_ufunc(name, spec, domain, methods=methods, elementwise=True)
    return register


def constant_ufunc(name: str, doc: str, domain: str = "real") -> Callable:
    """Register the piecewise constant elementwise function ``name`` of the
    array module (``"floor"``) as an op whose derivative is 0 (its input is
    constant); returns its public function."""
    module = sys._getframe(1).f_globals["__name__"]     # the caller's, as namedtuple's
    spec = type(name, (), {"__doc__": doc, "__module__": module, "kernel": xp_kernel(name)})
    return _register_ufunc(name, spec, domain, constant=("x",))


def _register_ufunc(name, spec, domain, **kwargs):
    return op(numpy=getattr(np, name), sample=samples.elementwise(domain),
              reference=lambda xnp, x: getattr(xnp, name)(x), **kwargs)(spec)


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


def reduction_prepare(x, axis=None, keepdims=False):
    """The ``prepare`` of a reduction ``f(x, axis=None, keepdims=False)``."""
    return x, axis_param(axis), bool(keepdims)


def expand_back(o, g, shape, axis, keepdims):
    """``g`` (a reduction's cotangent) broadcast back to the input ``shape``."""
    if not keepdims:
        axes = norm_axes(axis, len(shape))
        g = o.reshape(g, tuple(1 if i in axes else s for i, s in enumerate(shape)))
    return o.broadcast_to(g, shape)


def extremum_weights(o, x, out, axis, keepdims):
    """The derivative of ``max`` or ``min`` (``out``) over ``axis`` as raw
    weights: 1/count on the positions of ``x`` equal to ``out``, 0 elsewhere
    (tied extrema share equally; a constant: masks have no derivative)."""
    rx, ro = _raw(x), _raw(out)
    if not keepdims:
        axes = norm_axes(axis, rx.ndim)
        ro = array_module(rx).reshape(
            ro, tuple(1 if i in axes else s for i, s in enumerate(rx.shape)))
    mask = (rx == ro).astype(rx.dtype)
    return mask / mask.sum(axis=axis, keepdims=True)


def weighted_reduction(weights: Callable) -> tuple:
    """The rules ``(vjp_x, jvp_x)`` of a reduction ``f(x, axis, keepdims)``
    whose derivative is ``weights(o, x, out, axis, keepdims)`` (an array of
    ``x``'s shape): the cotangent is ``g`` expanded back times the weights,
    the tangent the sum over ``axis`` of ``t`` times the weights."""
    def vjp_x(o, g, out, x, axis, keepdims):
        return o.mul(expand_back(o, g, x.shape, axis, keepdims),
                     weights(o, x, out, axis, keepdims))

    def jvp_x(o, t, out, x, axis, keepdims):
        return o.sum(o.mul(t, weights(o, x, out, axis, keepdims)), axis, keepdims)
    return vjp_x, jvp_x


#: The message of every refusal of complex numbers (casts, tapes).
COMPLEX_REFUSAL = ("kina_fx.autograd does not differentiate complex numbers: use real and "
                   "imaginary parts as separate real arrays")
