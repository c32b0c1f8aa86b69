"""Which memref arguments of an MLIR function the function only reads.

A compiled call under a tape passes each traced argument as a copy, and
compares the copy with the Tensor's value when a recorded op reads it
(:mod:`kina_fx.compiled`, "Gradients"): compiled code that writes its
argument must not change the Tensor, and a buffer a loop rewrote must not be
differentiated as the argument.  Neither is needed for an argument that the
code provably never writes.  :func:`read_only_arguments` proves it from the
module itself, for the lowering :func:`kina_fx.compiled.compile_mlir` runs,
and ``compile_mlir`` stores the answer in the shared object it builds
(:data:`SYMBOL`), where :func:`kina_fx.compiled.load` finds it.

The proof follows each argument through the function's operations (MLIR's
generic form, ``mlir-opt --mlir-print-op-generic``) and accepts only uses
that cannot write it:

* views of it -- ``memref.cast``, ``subview``, ``reinterpret_cast``,
  ``collapse_shape``, ``expand_shape``, ``transpose`` -- are followed in turn;
* reads: ``memref.load``, ``memref.dim``, ``memref.rank``, ``affine.load``,
  ``vector.load``, ``vector.transfer_read``, ``memref.copy`` from it, and a
  ``linalg`` operation that has it among its ``ins``;
* a call of a function of the same module whose parameter there is itself
  read-only (and whose name is none libkina_fx.so could export: ``kina_``,
  ``runtime_``, ``_mlir_ciface_``), or of a runtime op (:data:`kina_fx.runtime_ops.RUNTIME_OPS`,
  declared with ``llvm.emit_c_interface``, not defined in the module) with it
  as an input: the op writes only its output.

Any other use -- a store, a ``linalg`` output, a copy's target, a call of
any other function, a branch or loop argument, a returned or yielded value,
a pointer taken out of it -- and the argument is not read-only.  What the
proof cannot see is undefined behaviour in MLIR itself (a view whose
offset or sizes reach outside the memref it came from, then written).
"""
from __future__ import annotations

import re

from .runtime_ops import RUNTIME_OPS

__all__ = ["SYMBOL", "read_only_arguments", "encode", "decode"]

#: The symbol of the shared object that holds the verdicts: a NUL-terminated
#: string of ``name:i,j,...`` lines, one per ``_mlir_ciface_`` export.
SYMBOL = "kina_fx_read_only_arguments"

_VIEWS = frozenset({"memref.cast", "memref.subview", "memref.reinterpret_cast",
                    "memref.collapse_shape", "memref.expand_shape", "memref.transpose"})
_READS = frozenset({"memref.load", "memref.dim", "memref.rank", "affine.load", "vector.load",
                    "vector.transfer_read"})
_CIFACE = "_mlir_ciface_"
#: names libkina_fx.so exports begin so (a function of the module named so may not be the one called)
_LIBRARY_PREFIXES = ("kina_", "runtime_", _CIFACE)
#: runtime export (as MLIR calls it) -> the number of its memref operands; the first is the output
_RUNTIME = {op.export[len(_CIFACE):]: 1 + len(op.inputs) for op in RUNTIME_OPS}

_FUNC = re.compile(r'^\s*"func\.func"\(\) <\{.*?sym_name = "([^"]+)"')
_BLOCK = re.compile(r'^\s*\^[\w.$-]+(?:\((.*)\))?:\s*(?://.*)?$')
_OP = re.compile(r'^\s*(?:(.+?) = )?"([\w.$-]+)"\(([^)]*)\)(.*)$')
_VALUE = re.compile(r'%[\w.$-]+')
_CALLEE = re.compile(r'callee = @([\w.$-]+)')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SEGMENTS = re.compile(r'operandSegmentSizes = array<i32: ([\d, ]+)>')


class _Function:
    def __init__(self, name):
        self.name = name
        self.params: list = []
        self.ops: list = []        # (name, results, operands, rest of the line)
        self.has_body = False
        self.c_interface = False


class _Unreadable(Exception):
    """A line of the module this reading does not account for: nothing is proven."""


def _parse(text: str) -> dict:
    """Functions by name, from MLIR's generic form (``--mlir-print-op-generic``).

    Raises :class:`_Unreadable` for a line with a value (``%``) that is
    neither an operation nor a block header, or outside every function: the
    reading of the text would then not be the whole of its operations."""
    functions: dict = {}
    current = None
    depth = 0
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m and current is None:
            current = functions[m.group(1)] = _Function(m.group(1))
            depth = line.count("({") - line.count("})")
            current.c_interface = "llvm.emit_c_interface" in line
            if depth <= 0:
                current = None
            continue
        if current is None:
            if _has_value(line):
                raise _Unreadable(line)
            continue
        depth += line.count("({") - line.count("})")
        if depth <= 0:                      # the function's closing line
            current.c_interface = current.c_interface or "llvm.emit_c_interface" in line
            current = None
            continue
        b = _BLOCK.match(line)
        if b:
            names = _VALUE.findall(b.group(1) or "")
            if not current.has_body:
                current.params = names      # the entry block's arguments
                current.has_body = True
            continue
        op = _OP.match(line)
        if op:
            current.has_body = True
            results = _VALUE.findall(op.group(1) or "")
            current.ops.append((op.group(2), results, _VALUE.findall(op.group(3)), op.group(4)))
        elif _has_value(line):
            raise _Unreadable(line)
    return functions


def _has_value(line: str) -> bool:
    return "%" in _STRING.sub('""', line)


def _reads_only(functions: dict, fn: "_Function", index: int, proving: set) -> bool:
    """Whether ``fn`` only reads its parameter ``index`` (module docstring)."""
    if not fn.has_body or index >= len(fn.params):
        return False
    key = (fn.name, index)
    if key in proving:                      # recursion: not proven
        return False
    proving = proving | {key}
    aliases = {fn.params[index]}
    grew = True
    while grew:                             # views may be defined after their first use in the text
        grew = False
        for name, results, operands, _ in fn.ops:
            if name in _VIEWS and operands and operands[0] in aliases:
                for r in results:
                    if r not in aliases:
                        aliases.add(r)
                        grew = True
    for name, results, operands, rest in fn.ops:
        uses = [k for k, v in enumerate(operands) if v.split("#")[0] in aliases]
        if not uses:
            continue
        if name in _VIEWS:
            if uses != [0]:
                return False
        elif name in _READS:
            continue
        elif name.startswith("linalg."):
            seg = _SEGMENTS.search(rest)
            if seg is None:
                return False
            n_ins = int(seg.group(1).split(",")[0])
            if any(k >= n_ins for k in uses):
                return False
        elif name == "memref.copy":
            if uses != [0]:                 # the source only
                return False
        elif name == "func.call":
            callee = _CALLEE.search(rest)
            target = functions.get(callee.group(1)) if callee else None
            if target is None:
                return False
            if target.has_body:
                # this module's own function, unless the runtime library's
                # symbol of that name (loaded first) is the one the call reaches
                if target.name.startswith(_LIBRARY_PREFIXES) or not all(
                        _reads_only(functions, target, k, proving) for k in uses):
                    return False
            elif target.name in _RUNTIME and target.c_interface:
                if any(k == 0 or k >= _RUNTIME[target.name] for k in uses):
                    return False
            else:
                return False
        else:
            return False
    return True


def read_only_arguments(generic_text: str) -> dict:
    """``{"_mlir_ciface_<fn>": (i, ...)}``: for each function with a C
    interface, the positions of the arguments it only reads.  ``generic_text``
    is the module in MLIR's generic form."""
    try:
        functions = _parse(generic_text)
    except _Unreadable:
        return {}
    out = {}
    for fn in functions.values():
        if fn.c_interface and fn.has_body:
            out[_CIFACE + fn.name] = tuple(i for i in range(len(fn.params))
                                           if _reads_only(functions, fn, i, set()))
    return out


def encode(verdicts: dict) -> str:
    """The text :data:`SYMBOL` holds."""
    return "".join(f"{name}:{','.join(map(str, sorted(ix)))}\n" for name, ix in sorted(verdicts.items()))


def decode(text: str) -> dict:
    """:func:`encode`'s inverse."""
    out = {}
    for line in text.splitlines():
        name, _, ix = line.partition(":")
        out[name] = frozenset(int(i) for i in ix.split(",") if i)
    return out
