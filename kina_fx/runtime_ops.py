"""The runtime's op table: every ``_mlir_ciface_runtime_*`` compute export, defined once.

A row (:class:`RuntimeOp`) says everything about one export:

* its C signature -- memref operands, outputs first, then ``int32_t``
  parameters -- from which ``kina_fx/ffi/c/kina_runtime_ops.h`` (the C
  wrappers), the prototypes in ``kina_fx.h`` and the op table of
  ``docs/abi.md`` are generated (``python -m kina_fx.runtime_ops --write``;
  ``tests/abi/test_runtime_ops.py`` fails when they are out of date);
* its kernel: a :mod:`kina_fx.gpu_ops` function, the one NumPy/CuPy code path
  that also computes autograd's primitive of the same name;
* ``check``: the validation that gives the output's shape (run before anything
  is written, by the kernel on the untaped path and by tapes);
* its effect, ``Effect("kina.runtime.<name>")``, which the export performs on
  the calling fiber's handler stack with the operands as arrays (NumPy or
  CuPy views of the caller's memory) and the parameters as ints.  Its
  ``default`` -- what answers when no handler does -- runs the kernel into
  the output buffer, so an untaped call computes exactly as before;
* ``differentiate``: how a tape (:mod:`kina_fx.autograd.memory`) computes the op
  with :mod:`kina_fx.autograd`'s primitives, so the same VJP/JVP rules that
  differentiate Python code differentiate compiled code.

This module sits with the ops layer (memref -> ops): it imports no autograd;
``differentiate`` receives the autograd namespace as its first argument.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import gpu_ops
from .errors import ValidationError
from .handlers import Effect

F32, F16, I64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)
_DTYPE_SUFFIX = {F32: "f32", F16: "f16", I64: "i64"}

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
    differentiate: Callable | None    # differentiate(ad, *inputs, *params) -> Tensor
    doc: str
    seed: bool = False                # one of the specification's original exports
    # Whether the NumPy kernel reads every input before writing ``out`` however
    # they overlap (ufuncs, matmul, take, and kernels that build their result
    # before assigning it).  Others get overlapping inputs copied first.
    overlap_safe: bool = True
    # Whether ``check`` reads only the operands' shapes and the parameters
    # (not their values, as gather's index range does): its verdict is then
    # memoised per shapes (check_output), since a tape checks every call.
    check_by_shape: bool = False
    effect: Effect = field(init=False, compare=False)
    _passed: dict = field(init=False, compare=False, repr=False, default_factory=dict)

    def __post_init__(self):
        effect = Effect("kina.runtime." + self.name)
        effect.default = _memmove_default(self.kernel, len(self.inputs), self.overlap_safe)
        object.__setattr__(self, "effect", effect)

    @property
    def callback(self) -> str:
        """The name of the Python callback the C wrapper calls (kina_fx.ffi.ops)."""
        return "kina_py_" + self.export.removeprefix("_mlir_ciface_")

    @property
    def operands(self) -> tuple:
        return (self.output,) + self.inputs

    def c_parameters(self) -> str:
        memrefs = [f"kina_unranked_memref_t *{o.name}" for o in self.operands]
        return ", ".join(memrefs + [f"int32_t {p}" for p in self.params])

    def c_arguments(self) -> str:
        return ", ".join([o.name for o in self.operands] + list(self.params))

    def mlir_declaration(self) -> str:
        """How an MLIR module declares the export (``llvm.emit_c_interface``)."""
        types = [f"memref<*x{_DTYPE_SUFFIX[o.dtype]}>" for o in self.operands] + ["i32"] * len(self.params)
        short = self.export.removeprefix("_mlir_ciface_")
        return (f"func.func private @{short}({', '.join(types)}) -> i32 "
                "attributes {llvm.emit_c_interface}")

    def check_output(self, out, *args) -> None:
        """Validate the call (shapes, parameters, index ranges) before anything is written."""
        key = None
        if self.check_by_shape:
            n = len(self.inputs)
            key = (out.shape, *[a.shape for a in args[:n]], *args[n:])
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


def _memmove_default(kernel, n, numpy_overlap_safe):
    """The effect's default: the kernel, with memmove semantics (docs/abi.md):
    an input that may share memory with ``out`` is copied first, unless the
    kernel is known to handle that (NumPy only: CuPy promises nothing)."""
    ndarray = np.ndarray

    def default(out, *args):
        if numpy_overlap_safe and out.__class__ is ndarray:
            return kernel(out, *args)
        xp = gpu_ops.array_module(out)
        inputs = [gpu_ops.apart_from((out,), a, xp) for a in args[:n]]
        return kernel(out, *inputs, *args[n:])
    return default


# ---- checks: the output shape of a valid call ------------------------------------

def _axis_or_all(axis):
    return None if axis == ALL_AXES else axis


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
    perm = gpu_ops.check_permutation(perm.tolist(), x.ndim)
    return tuple(x.shape[p] for p in perm)


def _matmul_check(a, b):
    return gpu_ops.matmul_shape(a.shape, b.shape)


def _index_range(what, indices, limit):
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= limit:
            raise ValidationError(f"{what} {lo if lo < 0 else hi} out of range [0, {limit})")


def _gather_check(values, indices):
    if values.ndim < 1:
        raise ValidationError("gather needs values of rank >= 1")
    _index_range("gather index", indices, values.shape[0])
    return tuple(indices.shape) + tuple(values.shape[1:])


def _cross_entropy_check(logits, labels):
    gpu_ops.check_cross_entropy(logits, labels)
    return ()


def _repeat_check(x, axis, reps):
    if reps < 0:
        raise ValidationError(f"repeat_interleave needs reps >= 0, got {reps}")
    ax = gpu_ops.normalize_axis(axis, x.ndim)
    shape = list(x.shape)
    shape[ax] *= reps
    return tuple(shape)


def _copy_check(src):
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


# ---- autograd: the primitive each op is (None: the output is the input) ----------

def _same_tensor(ad, x, *params):
    return x


def _cast_f16(ad, x, *params):
    return ad.cast(x, np.float16)


# ---- the table -----------------------------------------------------------------

X, A, B = Operand("x"), Operand("a"), Operand("b")
OUT = Operand("out")


def _unary(name, doc):
    fn = getattr(gpu_ops, name)
    return RuntimeOp(name, f"_mlir_ciface_runtime_{name}_f32", OUT, (X,), (), _unary_kernel(fn),
                     _same_shape, lambda ad, x, _n=name: getattr(ad, _n)(x), doc, check_by_shape=True)


def _binary(name, kernel_name, doc):
    fn = getattr(gpu_ops, kernel_name)
    return RuntimeOp(name, f"_mlir_ciface_runtime_{name}_f32", OUT, (A, B), (), _binary_kernel(fn),
                     _broadcast(name), lambda ad, a, b, _n=name: getattr(ad, _n)(a, b), doc,
                     check_by_shape=True)


def _reduction(name, doc):
    fn = getattr(gpu_ops, "reduce_" + name)
    return RuntimeOp(name, f"_mlir_ciface_runtime_{name}_f32", OUT, (X,), ("axis", "keepdims"),
                     _reduction_kernel(fn), _reduction_check(name),
                     lambda ad, x, axis, keepdims, _n=name: getattr(ad, _n)(x, _axis_or_all(axis),
                                                                            bool(keepdims)),
                     doc, check_by_shape=True)


RUNTIME_OPS: tuple = (
    # The specification's exports (names kept exactly).
    RuntimeOp("copy_to_device_f32", "_mlir_ciface_runtime_copy_to_device_f32", Operand("dst"),
              (Operand("src"),), ("device",), _copy_to_device_kernel, lambda src, device: src.shape,
              _same_tensor, "dst = src on device ordinal `device` (0 on the CPU backend)", seed=True,
              overlap_safe=False, check_by_shape=True),
    RuntimeOp("copy_to_device_f16", "_mlir_ciface_runtime_copy_to_device_f16", Operand("dst", F16),
              (Operand("src", F16),), ("device",), _copy_to_device_kernel,
              lambda src, device: src.shape, _same_tensor,
              "dst = src (float16) on device ordinal `device`", seed=True, overlap_safe=False,
              check_by_shape=True),
    RuntimeOp("copy_to_host_f32", "_mlir_ciface_runtime_copy_to_host_f32", Operand("dst"),
              (Operand("src"),), (), _copy_kernel, _copy_check, _same_tensor,
              "dst = src, into host-visible memory", seed=True, overlap_safe=False, check_by_shape=True),
    RuntimeOp("matmul", "_mlir_ciface_runtime_gpu_matmul_f32", OUT, (A, B), (),
              lambda out, a, b: gpu_ops.matmul(a, b, out), _matmul_check,
              lambda ad, a, b: ad.matmul(a, b), "out = a @ b (NumPy matmul rules, batched)", seed=True,
              check_by_shape=True),
    RuntimeOp("gather", "_mlir_ciface_runtime_gpu_gather_f32", OUT,
              (Operand("values"), Operand("indices", I64)), (),
              lambda out, values, indices: gpu_ops.gather(values, indices, out), _gather_check,
              lambda ad, values, indices: ad.gather(values, indices),
              "out = values[indices] (rows; indices in [0, rows), never wrapped)", seed=True),
    RuntimeOp("softmax", "_mlir_ciface_runtime_gpu_softmax_f32", OUT, (X,), ("axis",),
              lambda out, x, axis: gpu_ops.softmax(x, axis, out), _axis_check("softmax"),
              lambda ad, x, axis: ad.softmax(x, axis), "out = softmax(x) along `axis`", seed=True,
              check_by_shape=True),
    RuntimeOp("repeat_interleave", "_mlir_ciface_runtime_gpu_repeat_interleave_f32", OUT, (X,),
              ("axis", "reps"), lambda out, x, axis, reps: gpu_ops.repeat_interleave(x, reps, axis, out),
              _repeat_check, lambda ad, x, axis, reps: ad.repeat_interleave(x, reps, axis),
              "each element of x repeated `reps` times along `axis` (torch semantics)", seed=True,
              overlap_safe=False, check_by_shape=True),
    # The differentiable network's ops.
    _unary("neg", "out = -x"),
    _unary("exp", "out = exp(x)"),
    _unary("log", "out = log(x)"),
    _unary("tanh", "out = tanh(x)"),
    _unary("sigmoid", "out = 1 / (1 + exp(-x))"),
    _unary("relu", "out = max(x, 0)"),
    _binary("add", "add", "out = a + b (NumPy broadcasting)"),
    _binary("sub", "sub", "out = a - b (NumPy broadcasting)"),
    _binary("mul", "mul", "out = a * b (NumPy broadcasting)"),
    _binary("div", "div", "out = a / b (NumPy broadcasting)"),
    _binary("pow", "power", "out = a ** b (NumPy broadcasting)"),
    _reduction("sum", "out = sum of x over `axis` (KINA_ALL_AXES: all), `keepdims` 0/1"),
    _reduction("mean", "out = mean of x over `axis` (KINA_ALL_AXES: all), `keepdims` 0/1"),
    _reduction("max", "out = max of x over `axis` (KINA_ALL_AXES: all), `keepdims` 0/1"),
    RuntimeOp("transpose", "_mlir_ciface_runtime_transpose_f32", OUT, (X, Operand("perm", I64)), (),
              lambda out, x, perm: gpu_ops.transpose(x, perm.tolist(), out), _transpose_check,
              lambda ad, x, perm: ad.transpose(x, tuple(int(p) for p in perm.tolist())),
              "out = x with axes permuted: out.shape[i] = x.shape[perm[i]]", overlap_safe=False),
    RuntimeOp("log_softmax", "_mlir_ciface_runtime_log_softmax_f32", OUT, (X,), ("axis",),
              lambda out, x, axis: gpu_ops.log_softmax(x, axis, out), _axis_check("log_softmax"),
              lambda ad, x, axis: ad.log_softmax(x, axis), "out = log(softmax(x)) along `axis`",
              check_by_shape=True),
    RuntimeOp("cross_entropy", "_mlir_ciface_runtime_cross_entropy_f32", OUT,
              (Operand("logits"), Operand("labels", I64)), (),
              lambda out, logits, labels: gpu_ops.cross_entropy(logits, labels, out),
              _cross_entropy_check, lambda ad, logits, labels: ad.cross_entropy(logits, labels),
              "out (rank 0) = mean over samples of -log_softmax(logits)[label], classes last"),
)

BY_NAME = {op.name: op for op in RUNTIME_OPS}
BY_EXPORT = {op.export: op for op in RUNTIME_OPS}
EFFECTS = {op.effect: op for op in RUNTIME_OPS}


def effect_of(name: str) -> Effect:
    """The effect a runtime op performs, by op name (``"matmul"``) or export name."""
    op = BY_NAME.get(name) or BY_EXPORT.get(name)
    if op is None:
        raise ValidationError(f"no runtime op named {name!r}")
    return op.effect


# ---- generated files -------------------------------------------------------------

BEGIN, END = "/* BEGIN generated by kina_fx.runtime_ops */", "/* END generated by kina_fx.runtime_ops */"
DOC_BEGIN, DOC_END = "<!-- BEGIN generated by kina_fx.runtime_ops -->", "<!-- END generated by kina_fx.runtime_ops -->"


def exports_header() -> str:
    """``kina_runtime_ops.h``: the X(...) table kina_runtime.c expands into C wrappers."""
    lines = ["/* Generated by `python -m kina_fx.runtime_ops --write` from kina_fx/runtime_ops.py:",
             " * do not edit.  X(exported name, Python callback name, (parameters), (arguments)),",
             " * one per line (build.py parses these lines).  Callbacks: kina_fx/ffi/ops.py. */",
             "#define KINA_RUNTIME_OP_EXPORTS(X) \\"]
    rows = [f"    X({op.export}, {op.callback}, ({op.c_parameters()}), ({op.c_arguments()}))"
            for op in RUNTIME_OPS]
    fast = ["/* The same exports for kina_runtime.c's definitions, with what the C fast path",
            " * (kina_fx/_speedups_c/op_calls.c) takes: F(exported name, Python callback name,",
            " * (parameters), (arguments), row of the op table, (memref operands), (0, int32",
            " * parameters)) -- the leading 0 keeps the array non-empty. */",
            "#define KINA_RUNTIME_OP_FAST_EXPORTS(F) \\"]
    fast_rows = [f"    F({op.export}, {op.callback}, ({op.c_parameters()}), ({op.c_arguments()}), {i}, "
                 f"({', '.join(o.name for o in op.operands)}), ({', '.join(['0', *op.params])}))"
                 for i, op in enumerate(RUNTIME_OPS)]
    return ("\n".join(lines) + "\n" + " \\\n".join(rows) + "\n\n" + "\n".join(fast) + "\n"
            + " \\\n".join(fast_rows) + "\n")


def header_prototypes() -> str:
    """The prototypes block of ``kina_fx.h`` (between the generated markers)."""
    out = [BEGIN]
    for op in RUNTIME_OPS:
        out.append(f"/* {'[stable]' if op.seed else '[unstable]'} {op.doc} */")
        out.append(f"int32_t {op.export}({op.c_parameters()});")
    out.append(END)
    return "\n".join(out)


def docs_table() -> str:
    """The op table of ``docs/abi.md`` (between the generated markers)."""
    rows = [DOC_BEGIN, "", "| export | operands (outputs first) | int32 parameters | computes | autograd primitive | stability |",
            "|---|---|---|---|---|---|"]
    for op in RUNTIME_OPS:
        operands = ", ".join(f"`{o.name}` {_DTYPE_SUFFIX[o.dtype]}" for o in op.operands)
        params = ", ".join(f"`{p}`" for p in op.params) or "-"
        prim = "identity" if op.differentiate is _same_tensor else f"`{op.name}`"
        rows.append(f"| `{op.export}` | {operands} | {params} | {op.doc} | {prim} | "
                    f"{'stable' if op.seed else 'unstable'} |")
    rows += ["", DOC_END]
    return "\n".join(rows)


def _replace_between(text: str, begin: str, end: str, block: str) -> str:
    i, j = text.index(begin), text.index(end) + len(end)
    return text[:i] + block + text[j:]


def generated_files(root: str) -> dict:
    """``{path: expected content}`` of every file generated from the table."""
    import os

    native = os.path.join(root, "kina_fx", "ffi", "c")
    header_path = os.path.join(native, "kina_fx.h")
    doc_path = os.path.join(root, "docs", "abi.md")
    with open(header_path) as f:
        header = f.read()
    with open(doc_path) as f:
        doc = f.read()
    return {
        os.path.join(native, "kina_runtime_ops.h"): exports_header(),
        header_path: _replace_between(header, BEGIN, END, header_prototypes()),
        doc_path: _replace_between(doc, DOC_BEGIN, DOC_END, docs_table()),
    }


def main(argv=None) -> int:
    import argparse
    import os

    parser = argparse.ArgumentParser(description="Regenerate the files derived from the runtime op table.")
    parser.add_argument("--write", action="store_true", help="write them (default: check only)")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args(argv)
    stale = []
    for path, content in generated_files(args.root).items():
        current = open(path).read() if os.path.exists(path) else None
        if current != content:
            stale.append(path)
            if args.write:
                with open(path, "w") as f:
                    f.write(content)
    for path in stale:
        print(("wrote " if args.write else "out of date: ") + path)
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
