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
  and a ``linalg`` operation that has it among its ``ins``;
* a call of a function of the same module whose parameter there is itself
  read-only (and whose name is none libkina_fx.so could export: ``kina_``,
  ``runtime_``, ``_mlir_ciface_``), or of a runtime op
  (:data:`kina_fx.runtime_ops.RUNTIME_OPS`, declared with
  ``llvm.emit_c_interface`` and the export's own signature, not defined in
  the module) with it as an input: the op writes only its output.

Any other use -- a store, a ``linalg`` output, a call of any other
function, a branch or loop argument, a returned or yielded value, a pointer
taken out of it -- and the argument is not read-only.  And every function
the export runs must be plain (:data:`_PLAIN_OPS`, :func:`_runs_plain`):
code that does not take the argument can still write it through what the
registers hold.  A function whose C interface takes a result pointer first,
or a parameter a C declaration cannot spell, gets no verdict, and a module
whose text this reading cannot fully account for gets none at all
(:func:`_parse`).  What no proof of this kind sees is memory-unsafe code
(a store outside the allocation it indexes: a view reaching outside its
memref, an index out of bounds, an allocation whose byte size overflows),
which can write any memory of the process, copied arguments or not.
docs/autograd-abi.md says it all in prose.
"""
from __future__ import annotations

import re

import numpy as np

from .runtime_ops import RUNTIME_OPS

__all__ = ["SYMBOL", "read_only_arguments", "encode", "decode"]

#: The symbol of the shared object that holds the verdicts: a NUL-terminated
#: string of :func:`encode`'s lines, one per ``_mlir_ciface_`` export proven.
SYMBOL = "kina_fx_read_only_arguments"

_VIEWS = frozenset({"memref.cast", "memref.subview", "memref.reinterpret_cast",
                    "memref.collapse_shape", "memref.expand_shape", "memref.transpose"})
_READS = frozenset({"memref.load", "memref.dim", "memref.rank", "affine.load"})
_CIFACE = "_mlir_ciface_"
#: names libkina_fx.so exports begin so (a function of the module named so may not be the one called)
_LIBRARY_PREFIXES = ("kina_", "runtime_", _CIFACE)
#: functions the lowering itself calls (allocation, copies): a module must not define them
_LOWERING_CALLS = frozenset({"malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
                             "memcpy", "memmove", "memset", "memcmp", "bcmp", "__memcpy_chk",
                             "__memmove_chk", "__memset_chk", "memrefCopy", "_mlir_memref_to_llvm_alloc",
                             "_mlir_memref_to_llvm_aligned_alloc", "_mlir_memref_to_llvm_free"})
#: What the functions a proven export runs may contain: operations that lower
#: to inline code (or to malloc/free, which a module may not define), no
#: calls but of the module's own functions and of runtime ops, no pointers.
_PLAIN_OPS = frozenset(
    [f"arith.{n}" for n in (
        "constant", "addi", "subi", "muli", "divsi", "divui", "remsi", "remui", "ceildivsi",
        "floordivsi", "andi", "ori", "xori", "shli", "shrsi", "shrui", "cmpi", "cmpf", "select",
        "addf", "subf", "mulf", "divf", "negf", "maximumf", "minimumf", "maxnumf", "minnumf",
        "maxsi", "minsi", "maxui", "minui", "index_cast", "index_castui", "sitofp", "uitofp",
        "fptosi", "fptoui", "extsi", "extui", "trunci", "extf", "truncf")]
    + [f"memref.{n}" for n in (
        "alloc", "alloca", "dealloc", "load", "store", "dim", "rank", "cast", "subview",
        "reinterpret_cast", "collapse_shape", "expand_shape", "transpose")]
    + [f"scf.{n}" for n in ("for", "if", "yield", "while", "condition", "execute_region")]
    + ["cf.br", "cf.cond_br", "func.call", "func.return", "linalg.generic", "linalg.yield",
       "linalg.index", "linalg.fill", "linalg.matmul"]
    + [f"affine.{n}" for n in ("for", "if", "load", "store", "apply", "yield", "min", "max")])
#: types whose arithmetic may lower to library calls (half and wide types), or
#: that the C interface passes in other registers than a C declaration says
_UNPLAIN_TYPES = re.compile(r'(?<![\w.$-])(?:bf16|f16|f80|f128|complex|vector|tensor|i(?:6[5-9]|[7-9]\d|\d{3,}))\b')
#: parameter types a cffi declaration passes one for one
_DECLARABLE = re.compile(r'(?:memref<.*>|i(?:[1-9]|[1-5]\d|6[0-4])|index|f32|f64)$')
_MLIR_TYPE = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int64): "i64"}
#: runtime export, as MLIR calls it -> (its declared parameter types, exactly; memref operands first,
#: the output first of them): the op writes its output only
_RUNTIME = {op.export[len(_CIFACE):]: (tuple(f"memref<*x{_MLIR_TYPE[o.dtype]}>" for o in op.operands)
                                       + ("i32",) * len(op.params), 1 + len(op.inputs))
            for op in RUNTIME_OPS}

# Every pattern below reads a line's skeleton: its string literals replaced
# by "#k" (k: their index in the line), so no text inside a string can look
# like structure.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r'[A-Za-z_][\w.$-]*$')
_FUNC = re.compile(r'^\s*"#0"\(\) <\{')
_SYM_NAME = re.compile(r'(?<![\w.$-])sym_name = "#(\d+)"')
_ARG_ATTRS = re.compile(r'(?<![\w.$-])(?:arg_attrs|res_attrs) = ')
_FUNCTION_TYPE = re.compile(r'(?<![\w.$-])function_type = ')
_C_INTERFACE = re.compile(r'(?<![\w.$-])llvm\.emit_c_interface(?![\w.$-])')
_BLOCK = re.compile(r'^\s*\^[\w.$-]+(?:\(([^"]*)\))?:\s*(?://.*)?$')
_VALUES = r'%[\w.$-]+(?::\d+)?(?:, %[\w.$-]+(?::\d+)?)*'
_OP = re.compile(r'^\s*(?:(' + _VALUES + r') = )?"#0"\(((?:%[\w.$#-]+(?:, %[\w.$#-]+)*)?)\)(.*)$')
_VALUE = re.compile(r'%[\w.$-]+')
_CALLEE = re.compile(r'(?<![\w.$-])callee = @([A-Za-z_][\w.$-]*)(?=[,}])')
_CLOSING = re.compile(r'^\s*\}\)(?: \{([^{}]*)\})? : \(\) -> \(\)\s*$')
_SEGMENTS = re.compile(r'(?<![\w.$-])operandSegmentSizes = array<i32: ([\d, ]+)>')


class _Function:
    def __init__(self, name):
        self.name = name
        self.params: list = []
        self.ops: list = []        # (name, results, operands, rest of the line's skeleton)
        self.has_body = False
        self.c_interface = False
        self.arg_types: tuple = ()
        self.results: tuple = ()
        self.plain = True          # only _PLAIN_OPS, no _UNPLAIN_TYPES


class _Unreadable(Exception):
    """A line of the module this reading does not account for: nothing is proven."""


def _skeleton(line: str) -> tuple:
    strings: list = []

    def placeholder(m):
        strings.append(m.group(0)[1:-1])
        return f'"#{len(strings) - 1}"'
    return _STRING.sub(placeholder, line), strings


def _scan(text: str):
    """``(index, character, bracket depth before it)`` along ``text``; the
    ``>`` of an arrow ``->`` is no bracket."""
    depth = 0
    for k, c in enumerate(text):
        if c == ">" and k and text[k - 1] == "-":
            continue
        yield k, c, depth
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket group opening at ``text[start]``."""
    for k, c, depth in _scan(text[start:]):
        if c in ")]}>" and depth == 1:
            return start + k + 1
    raise _Unreadable(text)


def _split_top(text: str) -> tuple:
    """``text``'s comma-separated items at bracket depth 0, stripped."""
    cuts = [k for k, c, depth in _scan(text) if c == "," and depth == 0]
    items = [text[a + 1:b].strip() for a, b in zip([-1] + cuts, cuts + [len(text)])]
    return tuple(items) if items != [""] else ()


def _signature(skeleton: str) -> tuple:
    """``(parameter types, result types)`` of a func.func header's ``function_type``."""
    m = _FUNCTION_TYPE.search(skeleton)
    if m is None or skeleton[m.end()] != "(":
        raise _Unreadable(skeleton)
    end = _balanced(skeleton, m.end())
    params = _split_top(skeleton[m.end() + 1:end - 1])
    rest = skeleton[end:]
    if not rest.startswith(" -> "):
        raise _Unreadable(skeleton)
    rest = rest[4:]
    if rest.startswith("("):
        return params, _split_top(rest[1:_balanced(rest, 0) - 1])
    for k, c, depth in _scan(rest):         # one type, up to a comma or the end of the properties
        if depth == 0 and (c == "," or rest.startswith("}>", k)):
            return params, (rest[:k].strip(),)
    raise _Unreadable(skeleton)


def _parse(text: str) -> dict:
    """Functions by name, from MLIR's generic form (``--mlir-print-op-generic``).

    Raises :class:`_Unreadable` where the text is not what this reading
    accounts for: a line with a value (``%``) that is neither an operation
    nor a block header, or outside every function; a string anywhere in a
    function body but an operation's name; a quoted symbol; argument or
    result attributes; a nested module; two functions of one name, or one
    named as a C interface wrapper or a function the lowering calls."""
    functions: dict = {}
    current = None
    depth = 0
    modules = 0
    for line in text.splitlines():
        skeleton, strings = _skeleton(line)
        if '@"#' in skeleton:
            raise _Unreadable(line)                 # a quoted symbol
        if strings and strings[0] == "builtin.module" and skeleton.lstrip().startswith('"#0"('):
            modules += 1
            if modules > 1:
                raise _Unreadable(line)             # a nested module
        if current is None and _FUNC.match(skeleton) and strings[0] == "func.func":
            names = _SYM_NAME.findall(skeleton)
            if len(names) != 1 or _ARG_ATTRS.search(skeleton) or not _plain_properties(skeleton):
                raise _Unreadable(line)
            name = strings[int(names[0])]
            if (not _NAME.match(name) or name in functions or name.startswith(_CIFACE)
                    or name in _LOWERING_CALLS):
                raise _Unreadable(line)
            current = functions[name] = _Function(name)
            current.arg_types, current.results = _signature(skeleton)
            depth = skeleton.count("({") - skeleton.count("})")
            current.c_interface = bool(_C_INTERFACE.search(skeleton))
            if depth <= 0:
                current = None
            continue
        if current is None:
            if "%" in skeleton:
                raise _Unreadable(line)
            continue
        depth += skeleton.count("({") - skeleton.count("})")
        if depth <= 0:                      # the function's closing line
            # Its attributes: none but llvm.emit_c_interface (no linkage, no
            # passthrough: what is compiled is the body read here).
            closing = _CLOSING.match(skeleton)
            if closing is None or (closing.group(1) or "llvm.emit_c_interface") != "llvm.emit_c_interface":
                raise _Unreadable(line)
            current.c_interface = current.c_interface or closing.group(1) is not None
            current = None
            continue
        b = _BLOCK.match(skeleton)
        if b and not strings:
            if not current.has_body:
                current.params = _VALUE.findall(b.group(1) or "")    # the entry block's arguments
                current.has_body = True
            continue
        op = _OP.match(skeleton)
        if op and len(strings) == 1 and _NAME.match(strings[0]):
            current.has_body = True
            if strings[0] not in _PLAIN_OPS or _UNPLAIN_TYPES.search(skeleton):
                current.plain = False
            current.ops.append((strings[0], _VALUE.findall(op.group(1) or ""),
                                _VALUE.findall(op.group(2)), op.group(3)))
        elif "%" in skeleton or strings:
            raise _Unreadable(line)
    return functions


def _plain_properties(skeleton: str) -> bool:
    """Whether a func.func header's properties are its type, name and visibility only."""
    start = skeleton.index("<{")
    keys = {item.split(" = ")[0] for item in _split_top(skeleton[start + 2:_balanced(skeleton, start + 1) - 1])}
    return keys <= {"function_type", "sym_name", "sym_visibility"}


def _reads_only(functions: dict, fn: "_Function", index: int, proving: set) -> bool:
    """Whether ``fn`` only reads its parameter ``index`` (module docstring);
    asked only of functions :func:`_runs_plain` accepted."""
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
            segments = _SEGMENTS.findall(rest)
            if len(segments) != 1:
                return False
            n_ins = int(segments[0].split(",")[0])
            if any(k >= n_ins for k in uses):
                return False
        elif name == "func.call":
            # _runs_plain vetted the callee: a runtime op or a plain function of the module
            target = _callee(functions, rest)
            if target is None:
                return False
            if _is_runtime_op(target):
                if any(k == 0 or k >= _RUNTIME[target.name][1] for k in uses):
                    return False            # the output, or past the memref operands
            elif not all(_reads_only(functions, target, k, proving) for k in uses):
                return False
        else:
            return False
    return True


def _is_runtime_op(fn: "_Function") -> bool:
    """A declaration of a runtime export with that export's own signature."""
    return (not fn.has_body and fn.name in _RUNTIME and fn.c_interface
            and (fn.arg_types, fn.results) == (_RUNTIME[fn.name][0], ("i32",)))


def _runs_plain(functions: dict, fn: "_Function") -> bool:
    """Whether every function ``fn`` may run is plain (:data:`_PLAIN_OPS`):
    the module's own functions it calls, in turn, and runtime ops.  Code it
    runs that does not take the argument can still write it, through what the
    registers hold (an indirect call, a function declared with the wrong
    signature)."""
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if f.name in seen:
            continue
        seen.add(f.name)
        if not f.plain:
            return False
        for name, _, _, rest in f.ops:
            if name != "func.call":
                continue
            target = _callee(functions, rest)
            # a function of the module, unless named as libkina_fx.so's symbols
            # are (loaded first, the library's may be the one the call reaches)
            if target is None or not (_is_runtime_op(target) or (
                    target.has_body and not target.name.startswith(_LIBRARY_PREFIXES))):
                return False
            todo.append(target)
    return True


def _callee(functions: dict, rest: str):
    """The function a ``func.call`` names (the rest of its line), or None."""
    callee = _CALLEE.findall(rest)
    return functions.get(callee[0]) if len(callee) == 1 else None


def read_only_arguments(generic_text: str) -> dict:
    """``{"_mlir_ciface_<fn>": (number of parameters, (i, ...))}``: for each
    function with a C interface that the proof covers, the positions of the
    arguments it only reads.  ``generic_text`` is the module in MLIR's
    generic form."""
    try:
        functions = _parse(generic_text)
    except _Unreadable:
        return {}
    out = {}
    for fn in functions.values():
        # A C interface of a function returning a memref or several values
        # takes a result pointer first, and a parameter no C declaration can
        # spell (a vector) moves the others: its positions are not the MLIR ones.
        if (fn.c_interface and fn.has_body
                and (fn.results == () or (len(fn.results) == 1 and _DECLARABLE.match(fn.results[0])
                                          and not fn.results[0].startswith("memref")))
                and all(_DECLARABLE.match(t) for t in fn.arg_types) and len(fn.arg_types) == len(fn.params)
                and _runs_plain(functions, fn)):
            out[_CIFACE + fn.name] = (len(fn.params), tuple(
                i for i in range(len(fn.params)) if _reads_only(functions, fn, i, set())))
    return out


def encode(verdicts: dict) -> str:
    """The text :data:`SYMBOL` holds: ``name:number of parameters:i,j,...`` lines."""
    return "".join(f"{name}:{n}:{','.join(map(str, sorted(ix)))}\n"
                   for name, (n, ix) in sorted(verdicts.items()))


def decode(text: str) -> dict:
    """:func:`encode`'s inverse, the positions as a frozenset."""
    out = {}
    for line in text.splitlines():
        name, n, ix = line.split(":")
        out[name] = (int(n), frozenset(int(i) for i in ix.split(",") if i))
    return out
