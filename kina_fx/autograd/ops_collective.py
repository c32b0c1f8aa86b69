"""Differentiable collectives: all_reduce, broadcast, all_gather, reduce_scatter.

Each is an op of the table (``docs/autograd.md``, "How to add an op") whose
kernel runs on a :class:`kina_fx.collectives.Group`.  The public function
takes the group in scope at the call (it performs
:data:`kina_fx.collectives.GROUP`) unless one is given, and the group is a
parameter of the recorded op: the backward pass communicates on the group the
forward pass used, even after the ``with dist.mpi()`` block has ended.

The rules are SPMD transposes, as JAX's ``psum`` (``docs/distributed.md``):
every process runs the same program on its own data, and the derivative is
that of the global function of all the processes' inputs.  With ``N`` the
world size and ``g`` each process's output cotangent:

* ``all_reduce(x, "sum")``: cotangent ``all_reduce(g, "sum")``; ``"mean"``:
  ``all_reduce(g, "mean")``; ``"max"``/``"min"``: ``all_reduce(g, "sum")`` on
  the processes holding the extremum, shared equally between tied processes
  (as ``max`` shares between tied elements), zero elsewhere.
* ``broadcast(x, root)``: ``all_reduce(g, "sum")`` on ``root``, zero elsewhere.
* ``all_gather(x)`` and ``reduce_scatter(x, "sum")`` are each other's
  transpose (``"mean"``: divided by ``N``).

Backward passes run collectives too, so every process must differentiate the
same graph (the same program), as it must run the same forward collectives.
"""
from __future__ import annotations

from .. import collectives
from ..collectives import OPS, check_op, current_group
from ..errors import KinaTypeError
from .primitives import op
from .tensor import _as_array, _raw

__all__ = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"]


def _group(group):
    if group is None:
        return current_group()
    if not isinstance(group, collectives.Group):
        raise KinaTypeError(f"group must be a kina_fx.collectives.Group, not {group!r}")
    return group


def _extremum_weights(x, out, group):
    """Raw weights of the max/min rule: 1/(number of processes holding the
    extremum) where this process holds it, 0 elsewhere (a constant)."""
    rx, ro = _raw(x), _raw(out)
    mask = (rx == ro).astype(rx.dtype)
    return mask / group.all_reduce(mask, "sum")


def _sample_reduce(draw):
    return [draw.array(draw.shape())], {"op": draw.choice(OPS)}


def _sample_array(draw):
    return [draw.array(draw.shape())], {}


def _sample_scatter(draw):
    return [draw.array((1,) + draw.shape(max_dims=2))], {"op": draw.choice(("sum", "mean"))}


@op(sample=_sample_reduce, reference=lambda np, x, op="sum", group=None: x * 1.0)
class all_reduce:
    """``op`` (``"sum"``, ``"mean"``, ``"max"``, ``"min"``) of ``x`` over the
    processes of ``group`` (default: the group in scope), elementwise."""
    def kernel(x, op, group):
        return group.all_reduce(x, op)

    def prepare(x, op="sum", group=None):
        return _as_array(x), check_op(op), _group(group)

    def vjp_x(o, g, out, x, op, group):
        if op == "sum" or op == "mean":
            return o.all_reduce(g, op, group)
        return o.mul(o.all_reduce(g, "sum", group), _extremum_weights(x, out, group))

    def jvp_x(o, t, out, x, op, group):
        if op == "sum" or op == "mean":
            return o.all_reduce(t, op, group)
        return o.all_reduce(o.mul(t, _extremum_weights(x, out, group)), "sum", group)


@op(linear=True, sample=_sample_array, reference=lambda np, x, root=0, group=None: x * 1.0)
class broadcast:
    """Process ``root``'s ``x`` on every process of ``group`` (every process
    passes an ``x`` of that shape and dtype; only root's values are used)."""
    def kernel(x, root, group):
        return group.broadcast(x, root)

    def prepare(x, root=0, group=None):
        return _as_array(x), root, _group(group)

    def vjp_x(o, g, out, x, root, group):
        total = o.all_reduce(g, "sum", group)
        return total if group.rank == root else o.mul(total, 0.0)


@op(linear=True, sample=_sample_array, reference=lambda np, x, group=None: np.expand_dims(x, 0))
class all_gather:
    """Every process's ``x`` stacked in rank order: shape ``(world_size, *x.shape)``."""
    def kernel(x, group):
        return group.all_gather(x)

    def prepare(x, group=None):
        return _as_array(x), _group(group)

    def vjp_x(o, g, out, x, group):
        return o.reduce_scatter(g, "sum", group)


@op(linear=True, sample=_sample_scatter, reference=lambda np, x, op="sum", group=None: x[0] * 1.0)
class reduce_scatter:
    """Row ``rank`` of the ``op`` (``"sum"`` or ``"mean"``) over the processes of
    each one's ``x`` (leading dimension: the world size); transpose of ``all_gather``."""
    def kernel(x, op, group):
        return group.reduce_scatter(x, op)

    def prepare(x, op="sum", group=None):
        return _as_array(x), op, _group(group)

    def vjp_x(o, g, out, x, op, group):
        gathered = o.all_gather(g, group)
        return gathered if op == "sum" else o.mul(gathered, 1.0 / group.size)
