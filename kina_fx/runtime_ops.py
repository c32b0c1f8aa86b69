"""The runtime's op table: every ``_mlir_ciface_runtime_*`` compute export, defined once.

A row (:class:`RuntimeOp`) says everything about one export:

* its C signature -- memref operands, outputs first, then ``int32_t``
  parameters.  The C ABI's table (:mod:`kina_fx.ffi.exports`) makes one export
  row of each op row, from which the C wrappers, the prototypes in
  ``kina_fx.h``, the cffi declarations and the tables of ``docs/abi.md`` are
  generated;
* its kernel: a :mod:`kina_fx.gpu_ops` function, the one NumPy/CuPy code path
  that also computes autograd's primitive of the same name;
* ``check``: the validation that gives the output's shape (run before anything
  is written, by the kernel on the untaped path and by tapes), built on the
  shape rules of :mod:`kina_fx.gpu_ops`;
* its effect, ``Effect("kina.runtime.<name>")``, which the export performs on
  the calling fiber's handler stack with the operands as arrays (NumPy or
  CuPy views of the caller's memory) and the parameters as ints.  Its
  ``default`` -- what answers when no handler does -- runs the kernel into
  the output buffer, so an untaped call computes exactly as before;
* ``primitive``: the name of the :mod:`kina_fx.autograd` primitive that
  computes the op on a tape (:mod:`kina_fx.autograd.memory`), so the same
  VJP/JVP rules that differentiate Python code differentiate compiled code;
  ``primitive_args`` maps the export's arguments to the primitive's.  The
  copies are :data:`IDENTITY`; an op with no derivative (None) is refused by
  tapes rather than recorded wrongly.

This module sits with the ops layer (memref -> ops), below autograd: it names
primitives by string and never imports autograd; :meth:`RuntimeOp.differentiate`
is given the autograd namespace by its caller.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import collectives, gpu_ops, kernel_threads
from .errors import UnimplementedError, ValidationError
from .handlers import Effect

F32, F16, I64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)

#: ``primitive`` of the ops that a tape records as the identity (the copies).
IDENTITY = "identity"

#: ``axis`` meaning "all axes" in the reduction exports (``KINA_ALL_AXES`` in kina_fx.h).
ALL_AXES = gpu_ops.ALL_AXES


@dataclass(frozen=True)
class Operand:
    """A memref argument: its C parameter name and element type."""

    name: str
    dtype: np.dtype = F32

    @property
    def differentiable(self) -> bool:
        return self.dtype.kind == "f"


def as_given(*args):
    """The default ``primitive_args``: the export's arguments, as they are."""
    return args


@dataclass(frozen=True)
class RuntimeOp:
    """One row of the table (see the module docstring)."""

    name: str
    export: str
    output: Operand
    inputs: tuple
    params: tuple                     # names of int32_t parameters, in C order
    kernel: Callable                  # kernel(out, *inputs, *params): writes out
    check: Callable                   # check(*inputs, *params) -> output shape, or ValidationError
    primitive: str | None             # the autograd primitive computing it (IDENTITY, None: see below)
    doc: str
    primitive_args: Callable = as_given    # (*inputs, *params) -> the primitive's arguments
    seed: bool = False                # one of the specification's exports: [stable]
    # Whether the NumPy kernel reads every input before writing ``out`` however
    # they overlap (ufuncs, matmul, take, and kernels that build their result
    # before assigning it).  Others get overlapping inputs copied first.
    overlap_safe: bool = True
    # Whether ``check`` reads only the operands' shapes and the parameters
    # (not their values, as gather's index range does): its verdict is then
    # memoised per shapes (check_output), since a tape checks every call.
    check_by_shape: bool = False
    # The NumPy function the kernel comes down to on small NumPy operands:
    # the default computes ``direct(*inputs, out=out)`` on every call that
    # :meth:`calls_direct` admits.  The C exports' fast path then calls it
    # straight from C (docs/abi.md, "Fast paths").  None: no such function.
    direct: Callable | None = None
    effect: Effect = field(init=False, compare=False)
    _passed: dict = field(init=False, compare=False, repr=False, default_factory=dict)

    def __post_init__(self):
        effect = Effect("kina.runtime." + self.name)
        effect.default = _memmove_default(self.kernel, self.check_output, len(self.inputs),
                                          self.overlap_safe)
        object.__setattr__(self, "effect", effect)

    @property
    def operands(self) -> tuple:
        return (self.output,) + self.inputs

    def check_output(self, out, *args) -> None:
        """Validate the call (shapes, parameters, index ranges) before anything is written."""
        key = None
        if self.check_by_shape:
            if len(args) == 2 and len(self.inputs) == 2:       # the binary ops and matmul
                key = (out.shape, args[0].shape, args[1].shape)
            else:
                n = len(self.inputs)
                key = (out.shape,) + tuple([a.shape for a in args[:n]]) + args[n:]
            if key in self._passed:
                return
        shape = self.check(*args)
        if tuple(out.shape) != tuple(shape):
            raise ValidationError(f"{self.name}: out has shape {tuple(out.shape)}, "
                                  f"expected {tuple(shape)}")
        if key is not None:
            if len(self._passed) >= 1024:
                self._passed.clear()
            self._passed[key] = True

    def calls_direct(self, out, *inputs) -> bool:
        """Whether this op's default, called on these NumPy arrays, computes
        exactly ``direct(*inputs, out=out)``: a valid call (the check passes),
        no parameters, and none of the kernels' special cases (an operand of
        size 0, an output of rank 0, arrays large enough for the threaded row
        blocks).  A property of the operands' shapes alone, so the C fast path
        remembers it per shapes."""
        if self.direct is None or self.params or len(inputs) != len(self.inputs):
            return False
        if out.__class__ is not np.ndarray or any(a.__class__ is not np.ndarray for a in inputs):
            return False
        try:
            shape = self.check(*inputs)
        except ValidationError:
            return False
        sizes = [a.size for a in inputs]
        return (tuple(out.shape) == tuple(shape) and out.ndim > 0 and min(sizes) > 0
                and max(sizes) < kernel_threads.PARALLEL_MIN_ELEMENTS)

    def differentiate(self, autograd, *args):
        """The op computed by its primitive of ``autograd`` (the :mod:`kina_fx.autograd`
        namespace) on ``args`` (inputs as Tensors or arrays, then the int parameters).

        :data:`IDENTITY`: the output is the first input (the copies).  None: the op
        has no derivative, and a tape refuses it rather than record a wrong one."""
        if self.primitive == IDENTITY:
            return args[0]
        if self.primitive is None:
            raise UnimplementedError(f"{self.export} has no derivative: a tape cannot record it")
        return getattr(autograd, self.primitive)(*self.primitive_args(*args))


def _memmove_default(kernel, check_output, n, numpy_overlap_safe):
    """The effect's default: the kernel, with memmove semantics (docs/abi.md):
    an input that may share memory with ``out`` is copied first, unless the
    kernel is known to handle that (NumPy only: CuPy promises nothing).  The
    call is validated before that copy (docs/abi.md, "Check order"): an
    invalid one must neither allocate nor read the caller's memory."""
    ndarray = np.ndarray

    def default(out, *args):
        if numpy_overlap_safe and out.__class__ is ndarray:
            return kernel(out, *args)
        xp = gpu_ops.array_module(out)
        inputs = args[:n]
        if any(gpu_ops.may_overlap(out, a, xp) for a in inputs):
            check_output(out, *args)
            inputs = [gpu_ops.apart_from((out,), a, xp) for a in inputs]
        return kernel(out, *inputs, *args[n:])
    return default


# ---- checks: the output shape of a valid call (the rules live in gpu_ops) ---------

def _same_shape(x, *params):
    return x.shape


def _broadcast(name):
    return lambda a, b: gpu_ops.broadcast_shape(a.shape, b.shape, name)


def _reduction_check(name):
    return lambda x, axis, keepdims: gpu_ops.check_reduction(name, x, axis, keepdims)[2]


def _axis_check(name):
    def check(x, axis):
        gpu_ops.normalize_axis(axis, x.ndim)
        return x.shape
    return check


def _transpose_check(x, perm):
    if perm.ndim != 1 or perm.shape[0] != x.ndim:
        raise ValidationError(f"transpose: perm must have shape ({x.ndim},), not {tuple(perm.shape)}")
    return gpu_ops.transpose_shape(x.shape, perm.tolist())[1]


def _matmul_check(a, b):
    return gpu_ops.matmul_shape(a.shape, b.shape)


def _gather_check(values, indices):
    shape = gpu_ops.gather_shape(values, indices)
    gpu_ops.check_gather_indices(values, indices)
    return shape


def _cross_entropy_check(logits, labels):
    gpu_ops.check_cross_entropy(logits, labels)
    return ()


def _repeat_check(x, axis, reps):
    return gpu_ops.repeat_interleave_shape(x.shape, reps, axis)[1]


def _copy_check(src, *params):
    return src.shape


# ---- kernels with the export's argument order (out first) ------------------------

def _unary_kernel(fn):
    return lambda out, x: fn(x, out=out)


def _binary_kernel(fn):
    return lambda out, a, b: fn(a, b, out=out)


def _reduction_kernel(fn):
    return lambda out, x, axis, keepdims: fn(x, axis, keepdims, out=out)


def _copy_kernel(out, src):
    if tuple(out.shape) != tuple(src.shape):
        raise ValidationError(f"copy: dst shape {tuple(out.shape)} differs from src shape {tuple(src.shape)}")
    out[...] = src
    return out


def _copy_to_device_kernel(out, src, device):
    return _copy_kernel(out, src)


# ---- collectives: on the group in scope (kina_fx.collectives) ---------------------

def _all_reduce_check(x, op):
    collectives.op_of_code(op)
    return x.shape


def _broadcast_check(x, root):
    if root < 0:
        raise ValidationError(f"broadcast: root {root} out of range (ranks are >= 0)")
    return x.shape


def _into(out, shape, name):
    if tuple(out.shape) != tuple(shape):
        raise ValidationError(f"{name}: out has shape {tuple(out.shape)}, expected {tuple(shape)}")


def _all_reduce_kernel(out, x, op):
    _into(out, _all_reduce_check(x, op), "all_reduce")
    out[...] = collectives.current_group().all_reduce(x, collectives.op_of_code(op))
    return out


def _broadcast_kernel(out, x, root):
    _into(out, _broadcast_check(x, root), "broadcast")
    out[...] = collectives.current_group().broadcast(x, root)
    return out


# ---- the primitives' arguments, from the export's -----------------------------

def _reduction_args(x, axis, keepdims):
    return x, None if axis == ALL_AXES else axis, bool(keepdims)


def _transpose_args(x, perm):
    return x, tuple(int(p) for p in perm.tolist())


def _repeat_interleave_args(x, axis, reps):
    return x, reps, axis


# ---- the table -----------------------------------------------------------------

X, A, B = Operand("x"), Operand("a"), Operand("b")
OUT = Operand("out")


def _unary(name, doc, direct=None):
    return RuntimeOp(name, f"_mlir_ciface_runtime_{name}_f32", OUT, (X,), (),
                     _unary_kernel(getattr(gpu_ops, name)), _same_shape, name, doc, check_by_shape=True,
                     direct=direct)


def _binary(name, kernel_name, doc, direct):
    return RuntimeOp(name, f"_mlir_ciface_runtime_{name}_f32", OUT, (A, B), (),
                     _binary_kernel(getattr(gpu_ops, kernel_name)), _broadcast(name), name, doc,
                     check_by_shape=True, direct=direct)


def _reduction(name, doc):
    return RuntimeOp(name, f"_mlir_ciface_runtime_{name}_f32", OUT, (X,), ("axis", "keepdims"),
                     _reduction_kernel(getattr(gpu_ops, "reduce_" + name)), _reduction_check(name),
                     name, doc, primitive_args=_reduction_args, check_by_shape=True)


RUNTIME_OPS: tuple = (
    # The specification's exports (names kept exactly).
    RuntimeOp("copy_to_device_f32", "_mlir_ciface_runtime_copy_to_device_f32", Operand("dst"),
              (Operand("src"),), ("device",), _copy_to_device_kernel, _copy_check, IDENTITY,
              "dst = src on device ordinal `device` (0 on the CPU backend)", seed=True,
              overlap_safe=False, check_by_shape=True),
    RuntimeOp("copy_to_device_f16", "_mlir_ciface_runtime_copy_to_device_f16", Operand("dst", F16),
              (Operand("src", F16),), ("device",), _copy_to_device_kernel, _copy_check, IDENTITY,
              "dst = src (float16) on device ordinal `device`", seed=True, overlap_safe=False,
              check_by_shape=True),
    RuntimeOp("copy_to_host_f32", "_mlir_ciface_runtime_copy_to_host_f32", Operand("dst"),
              (Operand("src"),), (), _copy_kernel, _copy_check, IDENTITY,
              "dst = src, into host-visible memory", seed=True, overlap_safe=False, check_by_shape=True),
    RuntimeOp("matmul", "_mlir_ciface_runtime_gpu_matmul_f32", OUT, (A, B), (),
              lambda out, a, b: gpu_ops.matmul(a, b, out), _matmul_check, "matmul",
              "out = a @ b (NumPy matmul rules, batched)", seed=True, check_by_shape=True,
              direct=np.matmul),
    RuntimeOp("gather", "_mlir_ciface_runtime_gpu_gather_f32", OUT,
              (Operand("values"), Operand("indices", I64)), (),
              lambda out, values, indices: gpu_ops.gather(values, indices, out), _gather_check,
              "gather", "out = values[indices] (rows; indices in [0, rows), never wrapped)", seed=True),
    RuntimeOp("softmax", "_mlir_ciface_runtime_gpu_softmax_f32", OUT, (X,), ("axis",),
              lambda out, x, axis: gpu_ops.softmax(x, axis, out), _axis_check("softmax"), "softmax",
              "out = softmax(x) along `axis`", seed=True, check_by_shape=True),
    RuntimeOp("repeat_interleave", "_mlir_ciface_runtime_gpu_repeat_interleave_f32", OUT, (X,),
              ("axis", "reps"), lambda out, x, axis, reps: gpu_ops.repeat_interleave(x, reps, axis, out),
              _repeat_check, "repeat_interleave",
              "each element of x repeated `reps` times along `axis` (torch semantics)",
              primitive_args=_repeat_interleave_args, seed=True, overlap_safe=False,
              check_by_shape=True),
    # The differentiable network's ops.
    _unary("neg", "out = -x"),
    _unary("exp", "out = exp(x)", np.exp),
    _unary("log", "out = log(x)", np.log),
    _unary("tanh", "out = tanh(x)", np.tanh),
    _unary("sigmoid", "out = 1 / (1 + exp(-x))"),
    _unary("relu", "out = max(x, 0)", gpu_ops.numpy_relu),
    _binary("add", "add", "out = a + b (NumPy broadcasting)", np.add),
    _binary("sub", "sub", "out = a - b (NumPy broadcasting)", np.subtract),
    _binary("mul", "mul", "out = a * b (NumPy broadcasting)", np.multiply),
    _binary("div", "div", "out = a / b (NumPy broadcasting)", np.divide),
    _binary("pow", "power", "out = a ** b (NumPy broadcasting)", np.power),
    _reduction("sum", "out = sum of x over `axis` (KINA_ALL_AXES: all), `keepdims` 0/1"),
    _reduction("mean", "out = mean of x over `axis` (KINA_ALL_AXES: all), `keepdims` 0/1"),
    _reduction("max", "out = max of x over `axis` (KINA_ALL_AXES: all), `keepdims` 0/1"),
    RuntimeOp("transpose", "_mlir_ciface_runtime_transpose_f32", OUT, (X, Operand("perm", I64)), (),
              lambda out, x, perm: gpu_ops.transpose(x, perm.tolist(), out), _transpose_check,
              "transpose", "out = x with axes permuted: out.shape[i] = x.shape[perm[i]]",
              primitive_args=_transpose_args, overlap_safe=False),
    RuntimeOp("log_softmax", "_mlir_ciface_runtime_log_softmax_f32", OUT, (X,), ("axis",),
              lambda out, x, axis: gpu_ops.log_softmax(x, axis, out), _axis_check("log_softmax"),
              "log_softmax", "out = log(softmax(x)) along `axis`", check_by_shape=True),
    RuntimeOp("cross_entropy", "_mlir_ciface_runtime_cross_entropy_f32", OUT,
              (Operand("logits"), Operand("labels", I64)), (),
              lambda out, logits, labels: gpu_ops.cross_entropy(logits, labels, out),
              _cross_entropy_check, "cross_entropy",
              "out (rank 0) = mean over samples of -log_softmax(logits)[label], classes last"),
    # The collectives (kina_fx.collectives): on the group in scope, one process by default.
    RuntimeOp("all_reduce", "_mlir_ciface_runtime_all_reduce_f32", OUT, (X,), ("op",),
              _all_reduce_kernel, _all_reduce_check, "all_reduce",
              "out = `op` of every process's x, elementwise (KINA_REDUCE_SUM, _MEAN, _MAX, _MIN); "
              "a copy of x on one process",
              primitive_args=lambda x, op: (x, collectives.op_of_code(op))),
    RuntimeOp("broadcast", "_mlir_ciface_runtime_broadcast_f32", OUT, (X,), ("root",),
              _broadcast_kernel, _broadcast_check, "broadcast",
              "out = process `root`'s x (every process passes x of that shape); a copy of x on "
              "one process"),
)

BY_NAME = {op.name: op for op in RUNTIME_OPS}
BY_EXPORT = {op.export: op for op in RUNTIME_OPS}


def effect_of(name: str) -> Effect:
    """The effect a runtime op performs, by op name (``"matmul"``) or export name."""
    op = BY_NAME.get(name) or BY_EXPORT.get(name)
    if op is None:
        raise ValidationError(f"no runtime op named {name!r}")
    return op.effect
