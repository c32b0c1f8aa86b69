"""The transforms: grad, value_and_grad, vjp, jvp, and those built on them."""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import numpy as np

from ..errors import KinaTypeError, ValidationError
from .forward import JVPTrace
from .pytree import flatten, has_tensor, leaf_rebuild
from .tape import Tape, as_input, is_complex
from .tensor import Tensor, _lift, _plain, _raw, _shape, array_module

__all__ = ["grad", "value_and_grad", "vjp", "jvp", "jacobian", "jacfwd", "jacrev", "hessian", "hvp",
           "elementwise_grad"]

#: An argument position, or a tuple of them (negative ones count from the end).
Argnums = Union[int, Sequence[int]]

_ndarray = np.ndarray


def _like(value, like):
    """A derivative (one level in) returned as the kind of thing ``like`` was."""
    if value.__class__ is _ndarray and like.__class__ is _ndarray:
        return value            # the common leaf, as the checks below would return it
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


def _describe(v):
    return f"{type(v).__name__} {v!r}" if isinstance(v, (bool, str, type(None))) \
        else type(v).__name__


def check_real_output(v: Any, what: str) -> None:
    """``v`` must be a real floating array, Tensor or number; else KinaTypeError."""
    raw = _raw(v) if v.__class__ is Tensor else v
    dtype: Any
    if isinstance(raw, (bool, np.bool_)):
        dtype = np.dtype(bool)
    elif isinstance(raw, float):
        return
    elif isinstance(raw, (int, complex)):
        dtype = np.asarray(raw).dtype
    else:
        dtype = getattr(raw, "dtype", None)
        if dtype is None or not hasattr(raw, "shape"):
            raise KinaTypeError(f"{what} must be a real floating array or Tensor, got "
                                f"{_describe(v)}")
    if dtype.kind == "c":
        raise KinaTypeError(f"{what} is complex; kina_fx.autograd does not differentiate "
                            "complex numbers (use real and imaginary parts separately)")
    if dtype.kind != "f":
        raise KinaTypeError(f"{what} must be real floating point, got dtype {dtype} "
                            "(booleans and integers have no derivative)")


def _check_scalar_output(out):
    if out.__class__ is Tensor:
        raw = _raw(out)
        if raw.__class__ is _ndarray and raw.dtype.kind == "f" and raw.shape == ():
            return              # the common output, as the checks below would pass it
    check_real_output(out, "grad's function output")
    shape = _shape(_raw(out))
    if shape != ():
        raise KinaTypeError(
            f"grad needs a scalar output (shape ()), got shape {tuple(shape)}; index it or "
            "sum it to a scalar, or use vjp/jacobian for array outputs")


def _watched(tape, tree):
    """``((leaves, rebuild, boxes), boxed)``: ``tree``'s leaves, each watched
    by ``tape`` (``boxes``), and the tree rebuilt with the boxes."""
    if tree.__class__ is _ndarray:      # the common argument: one leaf, no tree to rebuild
        box = tape._watch(tree)
        return ([tree], leaf_rebuild, [box]), box
    leaves, rebuild = flatten(tree)
    boxes = [tape._watch(leaf) for leaf in leaves]
    return (leaves, rebuild, boxes), rebuild(boxes)


def _gradients(tape, structs, target, seeds=None):
    """The gradient of ``target`` (``seeds``: its cotangents) with respect to
    each watched tree of ``structs`` (see :func:`_watched`), in its shape."""
    gs = tape.gradient(target, [b for _, _, boxes in structs for b in boxes], seeds)
    results, k = [], 0
    for leaves, rebuild, boxes in structs:
        n = len(boxes)
        results.append(rebuild([_like(g, leaf) for g, leaf in zip(gs[k:k + n], leaves)]))
        k += n
    return results


def value_and_grad(f: Callable, argnums: Argnums = 0, has_aux: bool = False) -> Callable:
    """``f``'s value and its gradient with respect to argument(s) ``argnums``.

    ``f`` must return a real floating scalar: a 0-d array or Tensor or a
    Python float (``(scalar, aux)`` with ``has_aux``); anything else -- None,
    a bool, a string, a list, an array of shape (1,) -- is a
    ``KinaTypeError`` (a ``TypeError``).  Arguments may be pytrees of
    arrays/scalars/Tensors; the gradient has the same structure, with arrays
    for arrays, floats for floats, Tensors for Tensors.
    """
    positions: dict = {}        # number of arguments -> _argnums's answer

    def vg(*args, **kwargs):
        plan = positions.get(len(args))
        if plan is None:
            plan = positions[len(args)] = _argnums(argnums, len(args))
        single, nums = plan
        args = list(args)
        wrap = any(has_tensor(a) for a in args)
        tape = Tape()
        structs = []
        with tape:
            for n in nums:
                struct, args[n] = _watched(tape, args[n])
                structs.append(struct)
            res = f(*args, **kwargs)
        if has_aux:
            if not isinstance(res, (tuple, list)) or len(res) != 2:
                raise KinaTypeError(
                    "has_aux=True needs the function to return a pair (output, aux), got "
                    f"{_describe(res)}" + (f" of length {len(res)}"
                                          if isinstance(res, (tuple, list)) else ""))
            out, aux = res
        else:
            out, aux = res, None
        _check_scalar_output(out)
        results = _gradients(tape, structs, out)
        g = results[0] if single else tuple(results)
        value = _output(_unbox(out, tape), wrap)
        if has_aux:
            aux_leaves, aux_rebuild = flatten(aux)
            aux = aux_rebuild([_output(_unbox(a, tape), wrap) for a in aux_leaves])
            return (value, aux), g
        return value, g
    vg.__name__ = f"value_and_grad({getattr(f, '__name__', 'f')})"
    return vg


def grad(f: Callable, argnums: Argnums = 0, has_aux: bool = False) -> Callable:
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


def vjp(f: Callable, *primals: Any) -> tuple[Any, Callable[[Any], tuple]]:
    """``(f(*primals), vjp_fn)``; ``vjp_fn(cotangent)`` (same structure as the
    output) returns a tuple with one cotangent per primal.  ``vjp_fn`` may be
    called any number of times.  Output leaves must be real floating."""
    wrap = any(has_tensor(p) for p in primals)
    tape = Tape()
    structs = []
    args = []
    with tape:
        for p in primals:
            struct, boxed = _watched(tape, p)
            structs.append(struct)
            args.append(boxed)
        res = f(*args)
    out_leaves, out_rebuild = flatten(res)
    for v in out_leaves:
        check_real_output(v, "vjp's function output")
    out = out_rebuild([_output(_unbox(v, tape), wrap) for v in out_leaves])

    def vjp_fn(cotangent):
        ct_leaves, _ = flatten(cotangent)
        if len(ct_leaves) != len(out_leaves):
            raise ValidationError(f"vjp_fn got {len(ct_leaves)} cotangent leaves for "
                                  f"{len(out_leaves)} outputs")
        seeds = []
        for c, o in zip(ct_leaves, out_leaves):
            c = _lift(c) if c.__class__ is Tensor else c
            if is_complex(c):
                raise KinaTypeError("vjp_fn: complex cotangents are not supported")
            v = _raw(o)
            if not hasattr(c, "shape"):
                c = array_module(v).asarray(c, dtype=getattr(v, "dtype", None))
            if tuple(_shape(c)) != tuple(_shape(v)):
                raise ValidationError(f"vjp_fn: a cotangent of shape {tuple(_shape(c))} for "
                                      f"an output of shape {tuple(_shape(v))}")
            seeds.append(c)
        return tuple(_gradients(tape, structs, list(out_leaves), seeds))
    return out, vjp_fn


def jvp(f: Callable, primals: Sequence, tangents: Sequence) -> tuple[Any, Any]:
    """Forward mode: ``(f(*primals), J @ tangents)``; ``primals`` and ``tangents``
    are tuples (or lists) of the same structure."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise ValidationError("jvp takes primals and tangents as tuples")
    if len(primals) != len(tangents):
        raise ValidationError("jvp: primals and tangents differ in length")
    wrap = any(has_tensor(p) for p in primals)
    trace = JVPTrace()
    args = []
    with trace:
        for p, t in zip(primals, tangents):
            pl, rebuild = flatten(p)
            tl, _ = flatten(t)
            if len(pl) != len(tl):
                raise ValidationError("jvp: a tangent's structure differs from its primal's")
            duals = []
            for pv, tv in zip(pl, tl):
                pv = as_input(pv)
                tv = _lift(tv) if tv.__class__ is Tensor else tv
                if is_complex(tv):
                    raise KinaTypeError("jvp: complex tangents are not supported")
                if not hasattr(tv, "shape"):
                    tv = array_module(_raw(pv)).asarray(tv, dtype=_raw(pv).dtype)
                if tuple(_shape(tv)) != tuple(_shape(_raw(pv))):
                    raise ValidationError(
                        f"jvp: a tangent of shape {tuple(_shape(tv))} for a primal of shape "
                        f"{tuple(_shape(_raw(pv)))}")
                duals.append(trace.dual(pv, tv))
            args.append(rebuild(duals))
        res = f(*args)
    leaves, rebuild = flatten(res)
    outs, tans = [], []
    for v in leaves:
        check_real_output(v, "jvp's function output")
        if v.__class__ is Tensor and v._trace is trace:
            p, t = v._value, v._tangent
        else:
            p, t = v, None
        if t is None:
            rv = _raw(p)
            t = array_module(rv).zeros(_shape(rv), dtype=getattr(rv, "dtype", None))
        outs.append(_output(p, wrap))
        tans.append(_output(t, wrap))
    return rebuild(outs), rebuild(tans)


# --- built on vjp and jvp -------------------------------------------------------------


def _selected(f, args, nums):
    """``f`` as a function of the arguments at positions ``nums`` only."""
    def g(*chosen):
        full = list(args)
        for n, v in zip(nums, chosen):
            full[n] = v
        return f(*full)
    return g


def _one_hot(like, index):
    v = _raw(like) if like.__class__ is Tensor else like
    v = v if hasattr(v, "shape") else np.asarray(v, dtype=np.float64)
    z = array_module(v).zeros(v.shape, dtype=v.dtype if v.dtype.kind == "f" else np.float64)
    if index is not None:
        z[index] = 1
    return z


def _block(parts, out_shape, in_shape, axis):
    """Jacobian entries ``parts`` (one per element of the axis being swept)
    assembled differentiably into an array of shape ``out_shape + in_shape``."""
    from .functions import array
    from .ops_core import reshape, stack
    full = tuple(out_shape) + tuple(in_shape)
    if not parts:
        return np.zeros(full)
    return reshape(stack([array(p) for p in parts], axis), full)


def jacobian(f: Callable, argnums: Argnums = 0, mode: str = "reverse") -> Callable:
    """The Jacobian of ``f`` with respect to argument(s) ``argnums``.

    For an output leaf of shape ``S`` and an input leaf of shape ``T`` the block
    has shape ``S + T`` (``J[s][t] = d out[s] / d in[t]``).  Outputs and inputs may
    be pytrees: the result has the output's structure, with, at each output
    leaf, the input's structure (a tuple of them for a tuple ``argnums``).
    ``mode="reverse"`` runs one vjp per output element (JAX's ``jacrev``),
    ``mode="forward"`` one jvp per input element (``jacfwd``); both compose
    with every transform (``hessian`` is forward over reverse)."""
    if mode not in ("reverse", "forward"):
        raise ValidationError(f"jacobian: mode must be 'reverse' or 'forward', not {mode!r}")

    def jac(*args):
        single, nums = _argnums(argnums, len(args))
        g = _selected(f, args, nums)
        chosen = [args[n] for n in nums]
        in_structs = [flatten(c) for c in chosen]
        in_leaves = [leaf for leaves, _ in in_structs for leaf in leaves]
        in_shapes = [tuple(_shape(_raw(as_input(leaf)))) for leaf in in_leaves]
        if mode == "reverse":
            out, vjp_fn = vjp(g, *chosen)
            out_leaves, out_rebuild = flatten(out)
            out_shapes = [tuple(_shape(_raw(o))) for o in out_leaves]
            rows = [[[] for _ in in_leaves] for _ in out_leaves]
            for k, shape in enumerate(out_shapes):
                for index in np.ndindex(*shape):
                    cts = [_one_hot(o, index if j == k else None)
                           for j, o in enumerate(out_leaves)]
                    grads = vjp_fn(out_rebuild(cts))
                    flat = [leaf for gr in grads for leaf in flatten(gr)[0]]
                    for m, gl in enumerate(flat):
                        rows[k][m].append(gl)
            blocks = [[_block(rows[k][m], out_shapes[k], in_shapes[m], 0)
                       for m in range(len(in_leaves))] for k in range(len(out_leaves))]
        else:
            cols = None
            out_rebuild = out_shapes = None
            for m, leaf in enumerate(in_leaves):
                for index in np.ndindex(*in_shapes[m]):
                    tangents = [_one_hot(as_input(x), index if j == m else None)
                                for j, x in enumerate(in_leaves)]
                    k0 = 0
                    tan_trees = []
                    for leaves, rebuild in in_structs:
                        tan_trees.append(rebuild(tangents[k0:k0 + len(leaves)]))
                        k0 += len(leaves)
                    _, t_out = jvp(g, tuple(chosen), tuple(tan_trees))
                    t_leaves, out_rebuild = flatten(t_out)
                    if cols is None:
                        out_shapes = [tuple(_shape(_raw(t))) for t in t_leaves]
                        cols = [[[] for _ in in_leaves] for _ in t_leaves]
                    for k, t in enumerate(t_leaves):
                        cols[k][m].append(t)
            if cols is None:        # no input elements at all: one evaluation for shapes
                out_leaves, out_rebuild = flatten(g(*chosen))
                out_shapes = [tuple(_shape(_raw(o))) for o in out_leaves]
                cols = [[[] for _ in in_leaves] for _ in out_leaves]
            blocks = [[_block(cols[k][m], out_shapes[k], in_shapes[m], len(out_shapes[k]))
                       for m in range(len(in_leaves))] for k in range(len(out_shapes))]
        per_out = []
        for k in range(len(blocks)):
            trees, m0 = [], 0
            for leaves, rebuild in in_structs:
                trees.append(rebuild(blocks[k][m0:m0 + len(leaves)]))
                m0 += len(leaves)
            per_out.append(trees[0] if single else tuple(trees))
        return out_rebuild(per_out)
    jac.__name__ = f"jacobian({getattr(f, '__name__', 'f')})"
    return jac


def jacfwd(f: Callable, argnums: Argnums = 0) -> Callable:
    """``jacobian(f, argnums, mode="forward")``."""
    return jacobian(f, argnums, "forward")


def jacrev(f: Callable, argnums: Argnums = 0) -> Callable:
    """``jacobian(f, argnums, mode="reverse")``."""
    return jacobian(f, argnums, "reverse")


def hessian(f: Callable, argnums: Argnums = 0) -> Callable:
    """The Hessian of scalar-valued ``f``: forward-mode Jacobian of its reverse-mode
    gradient; shape ``in.shape + in.shape`` (blocks for a tuple ``argnums``)."""
    return jacobian(jacobian(f, argnums, "reverse"), argnums, "forward")


def hvp(f: Callable, primals: Sequence, tangents: Sequence) -> Any:
    """The Hessian-vector product of scalar-valued ``f`` at ``primals`` along
    ``tangents`` (tuples of the same structure), forward over reverse without
    forming the Hessian: one value for one primal, else a tuple."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise ValidationError("hvp takes primals and tangents as tuples")
    nums = 0 if len(primals) == 1 else tuple(range(len(primals)))
    return jvp(grad(f, argnums=nums), tuple(primals), tuple(tangents))[1]


def elementwise_grad(f: Callable, argnums: Argnums = 0) -> Callable:
    """HIPS autograd's ``elementwise_grad``: the vjp of ``f`` with a cotangent of
    ones, i.e. the gradient of ``sum(f(x))``: each element's derivative when
    ``f`` acts elementwise (its Jacobian is diagonal)."""
    def eg(*args):
        single, nums = _argnums(argnums, len(args))
        out, vjp_fn = vjp(_selected(f, args, nums), *[args[n] for n in nums])
        leaves, rebuild = flatten(out)
        grads = vjp_fn(rebuild([array_module(_raw(o)).ones(_shape(_raw(o)),
                                                           dtype=_raw(o).dtype)
                                for o in leaves]))
        return grads[0] if single else grads
    eg.__name__ = f"elementwise_grad({getattr(f, '__name__', 'f')})"
    return eg
