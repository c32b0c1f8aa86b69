"""The C ABI of libkina_fx.so, one row per export: the one table everything else is made from.

Each :class:`Export` row says what a C host, the build and the docs need to
know about one exported function: its name and C signature, its stability mark
(``[stable]`` / ``[unstable]``, the specification's policy, docs/spec.md), what
it does, and who implements it -- a Python callback (``callback`` in the
``CALLBACKS`` dict of ``module``) that the library's C wrapper calls, or C code
of its own (``kina_abi_version``, ``kina_last_error``).  The copy and compute
exports are made from the rows of the runtime op table
(:data:`kina_fx.runtime_ops.RUNTIME_OPS`), one export row per op.

Generated from the table (``python -m kina_fx.ffi.exports --write``;
``tests/abi/test_exports_table.py`` fails when one is out of date):

* ``kina_fx/ffi/c/kina_exports.h`` -- the X-macro table the C sources expand:
  the wrappers of ``kina_runtime.c``, the loader's forwarders (``kina_loader.c``)
  and, through the C preprocessor, the ``extern "Python"`` declarations
  ``kina_fx/ffi/c/build.py`` gives cffi (the build cannot import this module:
  its environment has no NumPy);
* the prototypes in ``kina_fx/ffi/c/kina_fx.h``, one block per section between
  generated markers (the prose and types around them are written by hand);
* the export tables of ``docs/abi.md`` and ``docs/autograd-abi.md``.

The cffi declarations of :func:`kina_fx.ffi.load_library` (:func:`cdef`) and
the fuzzer's export table (``fuzz/gen_exports.py``) read the table directly.
Adding an export: docs/abi.md, "Adding an export".
"""
from __future__ import annotations

import os
import re
import sys
import textwrap
from dataclasses import dataclass, field

from ..runtime_ops import IDENTITY, RUNTIME_OPS, RuntimeOp

MEMREF = "kina_unranked_memref_t *"


@dataclass(frozen=True)
class Param:
    """One C parameter.  Memrefs also say their element type and whether the
    call reads them (``in``), writes them (``out``) or both (``inout``: alloc's
    descriptor, whose sizes it reads and whose pointers it writes)."""

    ctype: str
    name: str
    element: str | None = None      # memrefs: "f32", "f16", "i64" or "i32"; None: any
    role: str = "in"

    @property
    def memref(self) -> bool:
        return self.ctype == MEMREF

    def declaration(self) -> str:
        return self.ctype + ("" if self.ctype.endswith("*") else " ") + self.name


def c(declaration: str) -> Param:
    """A scalar or pointer parameter from its C declaration: ``c("int32_t *out_state")``."""
    match = re.fullmatch(r"(.*?[\s*])(\w+)", declaration.strip())
    if match is None:
        raise ValueError(f"not a C parameter declaration: {declaration!r}")
    return Param(" ".join(match.group(1).split()), match.group(2))


def memref(name: str, element: str | None = None, role: str = "in") -> Param:
    """A ``kina_unranked_memref_t *`` parameter."""
    return Param(MEMREF, name, element, role)


@dataclass(frozen=True)
class Export:
    """One exported function (see the module docstring).  Its name must match a
    pattern of kina_fx/ffi/c/exports.map (``kina_*``, ``runtime_*``,
    ``_mlir_ciface_kina_*``, ``_mlir_ciface_runtime_*``): the library exports
    nothing else."""

    name: str
    params: tuple                   # of Param; () is (void)
    stable: bool
    section: str                    # a key of SECTIONS: where it is declared and documented
    doc: str                        # the header's comment on it
    summary: str = ""               # the docs' tables (default: doc)
    callback: str | None = None     # the extern "Python" function its C wrapper calls
    module: str | None = None       # the kina_fx.ffi module whose CALLBACKS holds the callback
    fast: bool = False              # its wrapper first tries kina__fast_<name> (kina_runtime.c)
    returns: str = "int32_t"        # a status, except for the two rows written in C
    op: RuntimeOp | None = field(default=None, compare=False)   # the runtime op it exports

    @property
    def stability(self) -> str:
        return "stable" if self.stable else "unstable"

    def c_parameters(self) -> str:
        return ", ".join(p.declaration() for p in self.params) or "void"

    def c_arguments(self) -> str:
        return ", ".join(p.name for p in self.params)

    def prototype(self) -> str:
        return f"{self.returns}{'' if self.returns.endswith('*') else ' '}{self.name}({self.c_parameters()});"


#: Sections of kina_fx.h and the docs, in the header's order: key -> what it holds.
SECTIONS = {
    "library": "the library itself",
    "memref": "the memref runtime: copy and compute ops, allocation",
    "effects": "the effects C ABI",
    "tapes": "autograd tapes over memrefs",
    "mlir_tapes": "the tape ABI in the form MLIR calls (llvm.emit_c_interface)",
    "distributed": "the process group: MPI for the collectives (docs/distributed.md)",
}


# ---- the rows --------------------------------------------------------------------------

def _library_rows() -> list:
    return [
        Export("kina_abi_version", (), True, "library", returns="int32_t",
               doc="The ABI version, KINA_ABI_VERSION: major * 1000 + minor (a minor bump only "
                   "adds functions).  Never fails; needs no Python."),
        Export("kina_last_error", (), True, "library", returns="const char *",
               doc="The message of the calling thread's last failure (\"ExceptionClass: "
                   "message\", at most 1023 bytes; \"\" if none), valid until its next failure."),
    ]


def op_callback(op: RuntimeOp) -> str:
    """The Python callback of a runtime op's export (built by :mod:`kina_fx.ffi.ops`)."""
    return "kina_py_" + op.export.removeprefix("_mlir_ciface_")


#: A runtime op operand's dtype -> its element type in export names and MLIR.
ELEMENTS = {"float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32"}


def _op_row(op: RuntimeOp) -> Export:
    params = tuple(memref(o.name, ELEMENTS[o.dtype.name], "out" if i == 0 else "in")
                   for i, o in enumerate(op.operands))
    # The C fast path (kina_fx/_speedups_c/op_calls.c) serves every op but
    # those with a device ordinal to check.
    return Export(op.export, params + tuple(c(f"int32_t {p}") for p in op.params), op.seed,
                  "memref", op.doc, callback=op_callback(op), module="kina_fx.ffi.ops",
                  fast="device" not in op.params, op=op)


def _memref_rows() -> list:
    alloc = "kina_fx.ffi.alloc"
    return [_op_row(op) for op in RUNTIME_OPS] + [
        Export("_mlir_ciface_runtime_gpu_alloc_unranked",
               (memref("memref", role="inout"), c("int32_t element_size")), True, "memref",
               "Fill the nested descriptor of `memref` (sizes set, no storage) in place: "
               "allocated/aligned/offset/row-major strides of a new buffer of product(sizes) * "
               "element_size bytes; element_size must be 2, 4 or 8.",
               summary="allocate a buffer for the descriptor's sizes (managed memory on CUDA)",
               callback="kina_py_gpu_alloc_unranked", module=alloc),
        Export("runtime_gpu_free_all", (), True, "memref",
               "Free every buffer runtime_gpu_alloc_unranked returned; safe to repeat.",
               callback="kina_py_gpu_free_all", module=alloc),
    ]


def _effects_row(name, params, stable, doc, summary, fast=False) -> Export:
    return Export(name, tuple(c(p) for p in params), stable, "effects", doc, summary,
                  callback="kina_py_" + name.removeprefix("kina_"), module="kina_fx.ffi.effects",
                  fast=fast)


def _effects_rows() -> list:
    return [
        _effects_row("kina_effect_id", ("const char *name", "int32_t *out_id"), True,
                     "The id of the effect named `name` (interned: the same id as Python's "
                     "Effect(name).id).  Ids are > 0 and stable for the process.",
                     "the interned id of effect `name` (the same as Python's `Effect(name).id`; "
                     "ids > 0)"),
        _effects_row("kina_fiber_create", ("kina_fiber_fn entry", "void *arg",
                                           "const int32_t *catch_effects", "int32_t ncatch",
                                           "kina_fiber_t *out_fiber"), False,
                     "A new fiber that will run entry(arg).  It suspends to its resumer on the "
                     "`ncatch` effect ids of `catch_effects`, or on every effect that reaches it "
                     "unhandled when ncatch == 0.",
                     "a new fiber that will run `entry(arg)`"),
        _effects_row("kina_resume_fiber", ("kina_fiber_t fiber", "int64_t value",
                                           "int32_t *out_state"), True,
                     "Start a new fiber, or resume a suspended one: its pending kina_perform "
                     "returns `value`.  Runs the fiber until it suspends, finishes or fails; "
                     "*out_state (may be NULL) says which.  Returns 0, or the failure's status "
                     "(with kina_last_error) when the fiber failed or the call is invalid "
                     "(KINA_STATUS_VALIDATION: a running, finished or cancelled fiber, a stale "
                     "handle, another thread's fiber; *out_state is then left untouched).",
                     "start a new fiber or resume a suspended one (its pending `kina_perform` "
                     "returns `value`); returns when it suspends, finishes or fails", fast=True),
        _effects_row("kina_get_perform_id", ("kina_fiber_t fiber", "int32_t *out_effect"), True,
                     "The id of the effect a suspended fiber is waiting in.",
                     "the effect a suspended fiber waits in", fast=True),
        _effects_row("kina_get_perform_args", ("kina_fiber_t fiber", "int64_t *out_args",
                                               "int32_t cap", "int32_t *out_nargs"), False,
                     "The arguments of that perform: *out_nargs gets their number; out_args "
                     "(capacity `cap`) gets them, KINA_STATUS_VALIDATION if too small.",
                     "that perform's arguments", fast=True),
        _effects_row("kina_fiber_state", ("kina_fiber_t fiber", "int32_t *out_state"), False,
                     "The fiber's state (KINA_FIBER_*).",
                     "`KINA_FIBER_NEW / RUNNING / SUSPENDED / DONE / FAILED / CANCELLED`",
                     fast=True),
        _effects_row("kina_fiber_result", ("kina_fiber_t fiber", "int64_t *out_value"), False,
                     "A finished fiber's result (its entry function's return value).",
                     "a finished fiber's result", fast=True),
        _effects_row("kina_cancel_fiber", ("kina_fiber_t fiber", "int32_t *out_state"), False,
                     "Cancel a new or suspended fiber: its pending kina_perform returns "
                     "KINA_STATUS_CANCELLED (and Python code in it gets kina_fx.Cancelled, so "
                     "finally blocks run); the fiber should unwind and return.  A fiber that "
                     "performs again is cancelled again (up to 100 times), then dropped.  "
                     "*out_state (not NULL) gets the new state; a fiber that has already ended "
                     "is left as it is (status 0).",
                     "cancel a new or suspended fiber"),
        _effects_row("kina_fiber_destroy", ("kina_fiber_t fiber",), False,
                     "Free the handle (cancelling the fiber first if it is suspended).  "
                     "KINA_STATUS_VALIDATION if the fiber is running.",
                     "free the handle (cancelling a suspended fiber first)"),
        _effects_row("kina_perform", ("int32_t effect", "const int64_t *args", "int32_t nargs",
                                      "int64_t *out_value"), False,
                     "Perform effect `effect` with `nargs` arguments from C code; the handler's "
                     "answer goes to *out_value.  Returns KINA_STATUS_UNHANDLED when no handler "
                     "handles it, KINA_STATUS_CANCELLED when the fiber was cancelled while "
                     "waiting (unwind and return), or the failing handler's status.",
                     "perform from C (`nargs <= KINA_MAX_ARGS = 16`)", fast=True),
        _effects_row("kina_push_handler", ("kina_handler_fn fn", "void *ctx",
                                           "const int32_t *effects", "int32_t neffects",
                                           "kina_handler_t *out_handler"), True,
                     "Push a C handler for the `neffects` effect ids of `effects` onto the "
                     "running fiber's handler stack (the thread's root stack outside any "
                     "fiber).  `ctx` is passed back to `fn` unchanged.",
                     "push a C handler for the given effect ids on the running fiber's stack"),
        _effects_row("kina_pop_handler", ("kina_handler_t handler",), True,
                     "Pop `handler`, which must be the innermost entry of the running fiber's "
                     "handler stack (KINA_STATUS_VALIDATION otherwise); frees the handle.",
                     "pop it; it must be the innermost entry"),
    ]


def _tape_row(name, params, section, doc, summary="", callback=None) -> Export:
    return Export(name, tuple(params), False, section, doc, summary,
                  callback=callback or "kina_py_" + name.removeprefix("kina_"),
                  module="kina_fx.ffi.tapes")


def _tape_rows() -> list:
    tape = c("kina_tape_t tape")
    return [
        _tape_row("kina_tape_begin", (c("int32_t flags"), c("kina_tape_t *out_tape")), "tapes",
                  "Start recording on the calling fiber; *out_tape gets the handle.",
                  "push a recording tape on the calling fiber's stack; `flags`: "
                  "`KINA_TAPE_STRICT` (0) or `KINA_TAPE_LENIENT` (1)"),
        _tape_row("kina_tape_watch", (tape, memref("buffer"), c("int32_t dtype")), "tapes",
                  "A differentiable input: gradients can be taken with respect to it.  Its "
                  "values are copied now; floating types only (an integer buffer is "
                  "KINA_STATUS_TYPE).",
                  "make `buffer` a differentiable input (values copied now); `dtype`: "
                  "`KINA_DTYPE_F32`/`F16`"),
        _tape_row("kina_tape_constant", (tape, memref("buffer"), c("int32_t dtype")), "tapes",
                  "An input that is not differentiated (data, labels); copied now.",
                  "declare `buffer` an input that is not differentiated (copied now); "
                  "`KINA_DTYPE_F32`/`F16`/`I64`"),
        _tape_row("kina_tape_end", (tape,), "tapes",
                  "Stop recording (pops the tape, which must be the innermost handler).",
                  "stop recording: pop the tape, which must be the innermost handler"),
        _tape_row("kina_tape_backward", (tape, memref("output", "f32"), memref("cotangent", "f32")),
                  "tapes",
                  "Reverse mode from `output` (float32, produced by a recorded op or watched) "
                  "seeded with `cotangent` (float32, same shape).  Needs an ended tape; may be "
                  "repeated (each call replaces the gradients).",
                  "reverse mode from `output` (float32, produced by a recorded op or watched) "
                  "seeded with `cotangent` (float32, same shape); needs an ended tape; "
                  "repeatable, each call replaces the gradients"),
        _tape_row("kina_tape_grad", (tape, memref("watched", "f32"),
                                     memref("out_grad", "f32", "out")), "tapes",
                  "out_grad = d(output . cotangent)/d(watched) of the last backward (float32, "
                  "the watched buffer's shape).  Under an enclosing tape that is recording, "
                  "out_grad is recorded as produced by the backward pass: that is how nested "
                  "tapes give second derivatives.",
                  "`out_grad` = d(output · cotangent)/d(watched) of the last backward "
                  "(float32, the watched buffer's shape)"),
        _tape_row("kina_tape_free", (tape,), "tapes",
                  "Free the handle (ending the tape first if it is still recording).",
                  "end the tape if it still records, drop everything it holds, free the handle"),
    ] + _mlir_tape_rows()


def _mlir_tape_rows() -> list:
    handle = c("int64_t tape")

    def row(name, params, of, callback):
        return _tape_row("_mlir_ciface_kina_" + name, params, "mlir_tapes",
                         f"MLIR's @kina_{name}: {of}.", callback="kina_py_mlir_" + callback)
    return [
        row("tape_begin", (memref("out_handle", "i64", "out"), c("int32_t flags")),
            "kina_tape_begin, the handle written to element 0 of `out_handle`", "tape_begin"),
        row("tape_watch_f32", (handle, memref("buffer", "f32")),
            "kina_tape_watch(tape, buffer, KINA_DTYPE_F32)", "tape_watch_f32"),
        row("tape_constant_f32", (handle, memref("buffer", "f32")),
            "kina_tape_constant(tape, buffer, KINA_DTYPE_F32)", "tape_constant_f32"),
        row("tape_constant_i64", (handle, memref("buffer", "i64")),
            "kina_tape_constant(tape, buffer, KINA_DTYPE_I64)", "tape_constant_i64"),
        row("tape_backward_f32", (handle, memref("output", "f32"), memref("cotangent", "f32")),
            "kina_tape_backward", "tape_backward_f32"),
        row("tape_grad_f32", (handle, memref("watched", "f32"), memref("out_grad", "f32", "out")),
            "kina_tape_grad", "tape_grad_f32"),
    ]


def _distributed_row(name, params, doc, summary="") -> Export:
    return Export(name, tuple(c(p) for p in params), False, "distributed", doc, summary,
                  callback="kina_py_" + name.removeprefix("kina_"), module="kina_fx.ffi.distributed")


def _distributed_rows() -> list:
    return [
        _distributed_row("kina_distributed_init", ("int32_t flags",),
                         "Make MPI_COMM_WORLD the process group (starting MPI through mpi4py if the "
                         "host did not); flags: 0.  KINA_STATUS_UNIMPLEMENTED without mpi4py.",
                         "make `MPI_COMM_WORLD` the process group (`flags`: 0)"),
        _distributed_row("kina_distributed_finalize", (),
                         "End MPI in this process; every process calls it before exiting (the "
                         "embedded interpreter runs no exit hooks, and MPICH's mpiexec ends the job "
                         "when a process exits without it).  The process group is then one process.",
                         "end MPI here (every process, before exiting); one process from then on"),
        _distributed_row("kina_distributed_rank", ("int32_t *out_rank",),
                         "This process's rank in the group in scope.", "this process's rank"),
        _distributed_row("kina_distributed_size", ("int32_t *out_size",),
                         "The number of processes in the group in scope.", "the world size"),
        _distributed_row("kina_distributed_barrier", (),
                         "Return when every process of the group in scope has called it.",
                         "wait for every process"),
        _distributed_row("kina_distributed_abort", ("int32_t code",),
                         "End every process of the group in scope with exit status `code`, after "
                         "writing a line to stderr; returns 0 only on a group of one process.",
                         "end every process of the group (`MPI_Abort`)"),
    ]


#: Every export of libkina_fx.so, in the header's order.
EXPORTS: tuple = tuple(_library_rows() + _memref_rows() + _effects_rows() + _tape_rows()
                       + _distributed_rows())
BY_NAME = {row.name: row for row in EXPORTS}

#: The exports whose C wrapper calls a Python callback (all but the two written in C).
PYTHON_EXPORTS: tuple = tuple(row for row in EXPORTS if row.callback is not None)


#: The types of kina_fx.h that the exports' parameters use, as cffi declares them
#: (build.py reads this literal from this file's source for the embedded module:
#: keep it a plain string).
CDEF_TYPES = """\
typedef struct { int64_t rank; void *descriptor; } kina_unranked_memref_t;
typedef uint64_t kina_fiber_t;
typedef uint64_t kina_handler_t;
typedef uint64_t kina_tape_t;
typedef int64_t (*kina_fiber_fn)(void *arg);
typedef int32_t (*kina_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                   int32_t nargs, int64_t *out_value);
"""


def cdef() -> str:
    """The C declarations of the types and every export, for cffi's ABI mode."""
    return CDEF_TYPES + "".join(row.prototype() + "\n" for row in EXPORTS)


# ---- generated files -------------------------------------------------------------------

GENERATOR = "kina_fx.ffi.exports"


def exports_header() -> str:
    """``kina_exports.h``: the X-macro table the C sources expand."""
    lines = [f"/* Generated by `python -m {GENERATOR} --write` from kina_fx/ffi/exports.py: do not edit.",
             " *",
             " * Every export answered by a Python callback, one per line:",
             " *   X(path, exported name, Python callback, (parameters), (arguments))",
             " * path: PYTHON (the wrapper calls the callback) or FAST (it first tries the C",
             " * fast path kina__fast_<name> of kina_runtime.c).  kina_runtime.c expands it",
             " * into the wrappers, kina_loader.c into its forwarders, build.py into cffi's",
             " * extern \"Python\" declarations.  kina_abi_version and kina_last_error are",
             " * written in C in both files. */",
             "#define KINA_EXPORTS(X) \\"]
    rows = [f"    X({'FAST' if row.fast else 'PYTHON'}, {row.name}, {row.callback}, "
            f"({row.c_parameters()}), ({row.c_arguments()}))" for row in PYTHON_EXPORTS]
    ops = ["/* The C fast paths of the runtime op rows marked FAST (kina_runtime.c expands",
           " * them into kina__fast_<name>, which calls kina_fx/_speedups_c/op_calls.c):",
           " *   O(exported name, row of the op table, (parameters), (memref operands),",
           " *     (0, int32 parameters))   -- the leading 0 keeps the array non-empty. */",
           "#define KINA_OP_FAST_PATHS(O) \\"]
    op_rows = [f"    O({row.name}, {RUNTIME_OPS.index(row.op)}, ({row.c_parameters()}), "
               f"({', '.join(p.name for p in row.params if p.memref)}), "
               f"({', '.join(['0'] + [p.name for p in row.params if not p.memref])}))"
               for row in PYTHON_EXPORTS if row.fast and row.op is not None]
    return ("\n".join(lines) + "\n" + " \\\n".join(rows) + "\n\n" + "\n".join(ops) + "\n"
            + " \\\n".join(op_rows) + "\n")


def _marker(kind: str, section: str, fence: str = "c") -> str:
    text = f"{kind} generated by {GENERATOR}: {section}"
    return f"/* {text} */" if fence == "c" else f"<!-- {text} -->"


def _comment(text: str) -> list:
    lines = textwrap.wrap(text, 96, initial_indent="/* ", subsequent_indent=" * ")
    lines[-1] += " */"
    return lines


def _wrapped_prototype(row: Export, width: int = 100) -> list:
    """The prototype, its parameters wrapped under the first one past ``width``."""
    head = row.prototype()[:row.prototype().index("(") + 1]
    lines, line = [], head
    params = [p.declaration() for p in row.params] or ["void"]
    for i, param in enumerate(params):
        piece = param + (", " if i < len(params) - 1 else ");")
        if len(line) + len(piece.rstrip()) > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += piece
    return lines + [line]


def header_block(section: str) -> str:
    """The prototypes of one section of ``kina_fx.h``, between its markers."""
    entries = [_comment(f"[{row.stability}] {row.doc}") + _wrapped_prototype(row)
               for row in EXPORTS if row.section == section]
    return "\n".join([_marker("BEGIN", section)] + ["\n".join(e) for e in entries]
                     + [_marker("END", section)])


def _call_form(row: Export) -> str:
    return f"`{row.name}({row.c_parameters()})`"


def _runtime_ops_table() -> list:
    rows = ["| export | operands (outputs first) | int32 parameters | computes | autograd primitive | stability |",
            "|---|---|---|---|---|---|"]
    for row in EXPORTS:
        op = row.op
        if op is None:
            continue
        operands = ", ".join(f"`{p.name}` {p.element}" for p in row.params if p.memref)
        params = ", ".join(f"`{p}`" for p in op.params) or "-"
        prim = {None: "none (a tape refuses it)", IDENTITY: "identity"}.get(op.primitive, f"`{op.primitive}`")
        rows.append(f"| `{row.name}` | {operands} | {params} | {op.doc} | {prim} | {row.stability} |")
    return rows


def _functions_table(section: str, with_stability: bool = True) -> list:
    head = "| function | stability | does |" if with_stability else "| function | does |"
    rows = [head, "|---|---|---|" if with_stability else "|---|---|"]
    for row in EXPORTS:
        if row.section == section:
            cells = [_call_form(row)] + ([row.stability] if with_stability else []) + [row.summary or row.doc]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def _index_table() -> list:
    rows = ["| export | section | stability | implemented by |", "|---|---|---|---|"]
    for row in EXPORTS:
        impl = (f"`{row.module}.{row.callback}`" + (" (C fast path first)" if row.fast else "")
                if row.callback else "C (`kina_runtime.c`, `kina_loader.c`)")
        rows.append(f"| `{row.name}` | {row.section} | {row.stability} | {impl} |")
    return rows


#: The generated tables of the docs: (page, block name) -> lines.
def docs_blocks() -> dict:
    return {
        ("docs/abi.md", "exports"): _index_table(),
        ("docs/abi.md", "runtime ops"): _runtime_ops_table(),
        ("docs/abi.md", "effects"): _functions_table("effects"),
        ("docs/autograd-abi.md", "tapes"): _functions_table("tapes", with_stability=False),
        ("docs/distributed.md", "distributed"): _functions_table("distributed"),
    }


def _replace_between(text: str, begin: str, end: str, block: str, path: str) -> str:
    if begin not in text or end not in text:
        raise RuntimeError(f"{path} lacks the markers {begin} ... {end}: add them where the "
                           "generated block belongs")
    i, j = text.index(begin), text.index(end) + len(end)
    return text[:i] + block + text[j:]


def generated_files(root: str) -> dict:
    """``{path: expected content}`` of every file generated from the table."""
    native = os.path.join(root, "kina_fx", "ffi", "c")
    header_path = os.path.join(native, "kina_fx.h")
    with open(header_path) as f:
        header = f.read()
    for section in SECTIONS:
        header = _replace_between(header, _marker("BEGIN", section), _marker("END", section),
                                  header_block(section), header_path)
    files = {os.path.join(native, "kina_exports.h"): exports_header(), header_path: header}
    for (page, name), lines in docs_blocks().items():
        path = os.path.join(root, page)
        if path not in files:
            with open(path) as f:
                files[path] = f.read()
        begin, end = _marker("BEGIN", name, "md"), _marker("END", name, "md")
        files[path] = _replace_between(files[path], begin, end,
                                       "\n".join([begin, ""] + lines + ["", end]), path)
    return files


def stale_files(root: str) -> list:
    """The generated files whose content is not what the table gives."""
    stale = []
    for path, content in generated_files(root).items():
        if not os.path.exists(path) or open(path).read() != content:
            stale.append(path)
    return stale


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m {GENERATOR}",
        description="Check (default) or regenerate (--write) the files made from the export table.")
    parser.add_argument("--write", action="store_true", help="write the stale files")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), help="the source tree (default: this one)")
    args = parser.parse_args(argv)
    files = generated_files(args.root)
    stale = stale_files(args.root)
    for path in stale:
        if args.write:
            with open(path, "w") as f:
                f.write(files[path])
        print(("wrote " if args.write else "out of date: ") + os.path.relpath(path, args.root))
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
