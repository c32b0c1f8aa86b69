"""Autograd tapes built on algebraic effects: grad, vjp, jvp and their nestings.

The whole design in a few lines (``docs/autograd.md`` has the long version):

* Every differentiable primitive (``mul``, ``exp``, ``matmul``, ...) is an
  :class:`~kina_fx.handlers.Effect`, defined once in the op table
  (:mod:`.primitives`, the registry; the ops in :mod:`.ops_core` and
  ``ops_*.py``: kernel and derivative rules side by side).  Its
  ``default`` -- what answers when no handler does -- runs the kernel with
  the array module of its inputs (NumPy on the CPU, CuPy on a GPU).
* A :class:`Tape` (:mod:`.tape`) is a handler of tail-resumptive ``fun``
  clauses that records the primitives applied to its own boxes; forward mode
  (:mod:`.forward`) is a handler propagating dual numbers.  Boxes are
  :class:`Tensor` objects tagged with the trace that made them, so nested
  derivatives never confuse their perturbations.
* Backward rules are written with the operations themselves, so when an
  outer trace is live the backward pass is recorded by it (grad of grad, jvp
  of grad); otherwise the same rules run on the raw kernels and perform no
  effects (:data:`BACKWARD_OBSERVED`).
* NumPy functions applied to Tensors are differentiated when they have a
  rule and refused with a ``TypeError`` otherwise (:mod:`.numpy_protocol`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .tensor import Tensor, is_traced, kernels, recordable
from .primitives import NUMPY_RULES, PRIMITIVES, Primitive, effect_of, numpy_rule, op
from . import ops_core
if TYPE_CHECKING:     # type checkers do not apply class decorators: the ops' signatures
    from ._op_signatures import *  # noqa: F401,F403
else:
    from .ops_core import *  # noqa: F401,F403
from . import numpy_protocol  # noqa: F401  (installs Tensor.__array_ufunc__/__array_function__)
from .functions import array, dot, flatten, ravel, squeeze
from . import ops_collective, ops_linalg, ops_math, ops_shape
if not TYPE_CHECKING:   # (their ops' signatures are in _op_signatures.pyi too)
    from .ops_collective import *  # noqa: F401,F403
    from .ops_linalg import *  # noqa: F401,F403
    from .ops_math import *  # noqa: F401,F403
    from .ops_shape import *  # noqa: F401,F403
from .tape import BACKWARD_OBSERVED, Tape, observe_backward
from .custom import custom_jvp, custom_vjp, defjvp, defvjp, primitive
from .transforms import (elementwise_grad, grad, hessian, hvp, jacfwd, jacobian, jacrev, jvp,
                         value_and_grad, vjp)

__all__ = [
    "Tensor", "Tape", "grad", "value_and_grad", "vjp", "jvp",
    "dot", "ravel", "flatten", "squeeze", "array",
    "PRIMITIVES", "NUMPY_RULES", "Primitive", "op", "numpy_rule", "effect_of",
    "BACKWARD_OBSERVED", "observe_backward", "is_traced", "kernels", "recordable",
    "custom_vjp", "custom_jvp", "primitive", "defvjp", "defjvp",
    "jacobian", "jacfwd", "jacrev", "hessian", "hvp", "elementwise_grad",
] + (ops_core.__all__ + ops_math.__all__ + ops_linalg.__all__ + ops_shape.__all__
     + ops_collective.__all__)
