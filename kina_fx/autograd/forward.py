"""Forward mode: a handler propagating tagged dual numbers.

A jvp trace's boxes carry a primal (``_value``, one level out) and a tangent
(``_tangent``; None is a symbolic zero).  Its clause for a primitive computes
the primal by performing the primitive one level out and the tangent with the
primitive's jvp rules, written with the recordable operations so enclosing
traces see them (reverse over forward, forward over forward).
"""
from __future__ import annotations

from typing import Any

from ..errors import KinaTypeError
from ..handlers import Handler
from ..handlers import perform
from .primitives import PRIMITIVES
from .tape import (BACKWARD_OBSERVED, COMPLEX_REFUSAL, _Pool, _Recorder, _tags, _yes,
                   extra_clauses, is_complex)
from .tensor import Tensor, _box, _lift_operand, recordable

__all__ = ["JVPTrace"]


class JVPTrace:
    """Forward-mode trace: boxes carry a primal and a tangent (None: zero)."""

    def __init__(self):
        self.tag = next(_tags)
        self._live = False
        self._handler: Any = None

    def __repr__(self):
        return f"<JVPTrace {self.tag}{' live' if self._live else ''}>"

    def __enter__(self):
        return _jvp_pool.enter(self)

    def __exit__(self, *exc: Any) -> None:
        _jvp_pool.exit(self, exc)

    def dual(self, primal, tangent):
        """A box of this trace: ``primal`` (one level out) with ``tangent``."""
        t = _box(primal, self, -1)
        t._tangent = tangent
        return t


def _new_jvp_handler():
    rec = _Recorder()
    fun = {p.effect: _jvp_clause(rec, p) for p in PRIMITIVES.values()}
    for eff, (_, make_jvp) in extra_clauses().items():
        fun[eff] = make_jvp(rec)
    fun[BACKWARD_OBSERVED] = _yes
    return Handler(fun=fun), rec


_jvp_pool = _Pool(_new_jvp_handler)


def _mine(trace, x):
    """(inner value, tangent or None, whether x is a dual of ``trace``)."""
    if x.__class__ is Tensor:
        if x._trace is not trace and (x._trace is None or not x._trace._live):
            x = _lift_operand(x, trace)
        if x.__class__ is Tensor and x._trace is trace:
            return x._value, x._tangent, True
    return x, None, False


def _jvp_clause(rec, prim):
    eff, rule, nin, sequence = prim.effect, prim.jvp, prim.nin, prim.sequence

    def clause(*args):
        trace = rec.tape
        inner = list(args)
        tangents = [None] * nin
        mine = False
        constants = []
        for k in range(nin):
            if sequence:
                parts = [_mine(trace, x) for x in args[k]]
                inner[k] = tuple(v for v, _, _ in parts)
                tangents[k] = tuple(t for _, t, _ in parts)
                mine = mine or any(m for _, _, m in parts)
                constants.extend(v for v, _, m in parts if not m)
            else:
                inner[k], tangents[k], m = _mine(trace, args[k])
                mine = mine or m
                if not m:
                    constants.append(inner[k])
        out = perform(eff, *inner)
        if not mine or rule is None:
            return out
        if sequence:
            live = any(t is not None for t in tangents[0])
        else:
            live = any(t is not None for t in tangents)
        if not live:
            return out
        if any(is_complex(c) for c in constants):
            raise KinaTypeError(f"{COMPLEX_REFUSAL} (a complex operand of {prim.name} "
                                "meets a traced value)")
        tout = rule(recordable, out, tuple(inner[:nin]), tuple(tangents), tuple(inner[nin:]))
        return trace.dual(out, tout)
    return clause
