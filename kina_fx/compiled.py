"""Calling compiled code (MLIR, C) with arrays, and differentiating through it.

A shared object compiled from MLIR exports ``_mlir_ciface_<fn>`` wrappers
(``llvm.emit_c_interface``).  A wrapper takes each memref by pointer: a ranked
``memref<?x?xf32>`` as a pointer to its descriptor, declared
``kina_memref_descriptor_t *``; an unranked ``memref<*xf32>`` as
``kina_unranked_memref_t *``::

    from kina_fx import compiled
    mod = compiled.load("mlp.so", '''
        int32_t _mlir_ciface_mlp_loss(kina_memref_descriptor_t *loss, kina_memref_descriptor_t *x,
                                      kina_memref_descriptor_t *labels, kina_memref_descriptor_t *w1,
                                      kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2,
                                      kina_memref_descriptor_t *b2);
    ''')
    mlp_loss = mod.function("_mlir_ciface_mlp_loss", outputs=1)
    loss = mlp_loss(np.zeros((), np.float32), x, labels, w1, b1, w2, b2)

Arguments that are arrays (NumPy, CuPy) or :class:`kina_fx.autograd.Tensor`
are passed as memrefs over their memory (zero-copy): a parameter declared
``kina_unranked_memref_t *`` gets an unranked memref (``memref<*xf32>``), one
declared ``kina_memref_descriptor_t *`` the ranked descriptor that
``llvm.emit_c_interface`` passes for a ranked ``memref<?x?xf32>`` (its rank is
not in the C type: pass arrays of the rank the MLIR function declares); other
parameters take ints as they are.  The first ``outputs`` arguments are output
buffers, returned after the call (one value, or a tuple).  A non-zero status
raises the exception that caused it inside the runtime (e.g. ``TapeError``), or
else the exception class of that status with ``kina_last_error``'s text
(:func:`kina_fx.errors.exception_for`).

**Gradients.**  When an argument is a traced Tensor (inside ``ad.grad``,
``ad.vjp``, ``ad.jvp`` or a ``Tape``), the call runs under a
:class:`~kina_fx.autograd.memory.BufferTracer` that knows each argument's buffer
as its Tensor: the runtime ops the compiled code calls are computed by
autograd's primitives and recorded by the live trace, and each output is
returned as the Tensor its buffer holds.  A Tensor argument is passed as a
copy of its value, so compiled code that updates an argument in place leaves
the Tensor (and what backward computes from it) as it was -- unless the code
provably only reads that parameter (:mod:`kina_fx.mlir_read_only`, recorded by
:func:`compile_mlir`) and no other memref argument overlaps it: then the
Tensor's own array is passed (docs/autograd-abi.md).  Plain arrays are
passed as they are, and declared constant.  The tracer is strict by default: a
floating buffer the compiled code computed without runtime calls (loops), or
an output it did not produce with one, raises
:class:`~kina_fx.autograd.memory.TapeError` instead of yielding a wrong gradient.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from . import autograd as ad
from . import ffi
from . import memref, mlir_read_only
from .errors import exception_for
from .gpu_ops import array_module, copy_into
from .autograd.memory import BufferTracer

__all__ = ["load", "CompiledModule", "CompiledFunction"]


_PRELUDE = f"""
typedef struct {{ int64_t rank; void *descriptor; }} kina_unranked_memref_t;
typedef struct {{ void *allocated; void *aligned; int64_t offset; int64_t sizes_and_strides[]; }}
    kina_memref_descriptor_t;
extern const char {mlir_read_only.SYMBOL}[];
"""
UNRANKED, RANKED = "kina_unranked_memref_t *", "kina_memref_descriptor_t *"

#: A traced argument the code only reads is passed as it is when it is at
#: least this large: a smaller one is copied into its reused spare buffer, and
#: compared, for less than a new array's descriptor and the export's view of
#: it cost (a training loop whose optimiser makes new parameter arrays every
#: step passes new arrays every call; docs/benchmarks.md).
AS_IS_BYTES = 1 << 16


class CompiledModule:
    """A shared object opened in this process, next to ``libkina_fx.so``."""

    def __init__(self, path: str, declarations: str):
        import cffi

        self._kina_ffi, self._kina = ffi.load_library()   # its runtime calls land here
        self.path = os.path.abspath(path)
        self.ffi = cffi.FFI()
        self.ffi.cdef(_PRELUDE + declarations)
        self.lib = self.ffi.dlopen(self.path)
        try:                # what compile_mlir recorded (mlir_read_only)
            verdicts = mlir_read_only.decode(
                self.ffi.string(getattr(self.lib, mlir_read_only.SYMBOL)).decode("ascii", "replace"))
        except (KeyError, AttributeError):     # a shared object compile_mlir did not build
            verdicts = {}
        #: ``{export: positions of the memref arguments it only reads}``
        #: (:mod:`kina_fx.mlir_read_only`); empty for a module compile_mlir did not build
        self.read_only = {name: positions for name, (_, positions) in verdicts.items()}
        self._read_only_arity = {name: n for name, (n, _) in verdicts.items()}

    def function(self, name: str, outputs: int = 0, strict: bool = True) -> "CompiledFunction":
        """The exported function ``name``; its first ``outputs`` arguments are output buffers."""
        function = getattr(self.lib, name)
        kinds = [a.cname for a in self.ffi.typeof(function).args]
        if any(kind not in (UNRANKED, RANKED) for kind in kinds[:outputs]):
            raise TypeError(f"{name}: its first {outputs} parameter(s) must be memrefs to be output "
                            f"buffers, not {kinds[:outputs]}")
        return CompiledFunction(self, name, function, kinds, outputs, strict)

    def __getattr__(self, name):
        if name.startswith("_") and not name.startswith("_mlir_ciface_"):
            raise AttributeError(name)
        return self.function(name)

    def __repr__(self):
        return f"<CompiledModule {self.path}>"


def load(path: str, declarations: str) -> CompiledModule:
    """Open the shared object at ``path``; ``declarations`` are the C prototypes to call."""
    return CompiledModule(path, declarations)


class CompiledFunction:
    """One exported function: converts arguments, checks the status, returns the outputs."""

    def __init__(self, module, name, function, kinds, outputs, strict):
        self.module = module
        self.name = name
        self._function = function
        self._kinds = kinds
        self._memref_parameters = [(i, kind) for i, kind in enumerate(kinds) if kind in (UNRANKED, RANKED)]
        self._snapshots: dict = {}     # (shape, dtype) -> spare buffers for traced arguments' copies
        self._memrefs: dict = {}       # id(array) -> what _memref_of memoises
        self.outputs = outputs
        self.strict = strict
        # The memref parameters the compiled code only reads (mlir_read_only):
        # a large traced argument there is passed without a copy
        # (_call_traced).  A declaration of another number of parameters than
        # the function's own does not say where they are: none is taken.
        self._read_only = frozenset()
        if module._read_only_arity.get(name) == len(kinds):
            self._read_only = module.read_only[name] & {
                i for i, _ in self._memref_parameters if i >= outputs}

    def __repr__(self):
        return f"<CompiledFunction {self.name} of {self.module.path}>"

    def _memref_of(self, array, kind):
        """``(C argument, identity)`` of a memref over ``array``, for a parameter of ``kind``."""
        entry = self._memo(array, kind)
        return entry[4], entry[5]

    def _memo(self, array, kind):
        """``(ref, kind, shape, strides, (C argument, keep), identity)`` of a
        memref over ``array``, for a parameter of ``kind``.

        Memoised per array object (a training loop passes the same buffers
        every step): the entry holds the array weakly and is used only while
        the array's shape and strides are the ones it was made for.  The
        descriptor itself is kept (not the array: the call holds that).
        """
        hit = self._memrefs.get(id(array))
        if (hit is not None and hit[0]() is array and hit[1] == kind and hit[2] == array.shape
                and hit[3] == array.strides):
            return hit
        if kind == UNRANKED:
            m = memref.descriptor_of(array)
            c_arg, key = m.pointer_for(self.module.ffi), m.identity(array.dtype)
        else:       # a ranked memref<...> parameter: MLIR passes its descriptor itself
            c_arg, m, key = memref.ranked_descriptor(array, self.module.ffi)
        try:
            ref = weakref.ref(array)
        except TypeError:
            # not weakly referenceable (a NumPy scalar): not memoised, and ``m``
            # holds the 0-d copy the descriptor points into for the call
            return (None, kind, None, None, (c_arg, m), key)
        if getattr(m, "array", None) is array:
            m.array = None          # the caller holds its array for the call; the memo must not
        if len(self._memrefs) >= 64:
            self._memrefs.clear()
        entry = self._memrefs[id(array)] = (ref, kind, array.shape, array.strides, (c_arg, m), key)
        return entry

    def _spare_copy(self, array):
        # A copy of a traced argument for the compiled code to work on, in a
        # reused buffer: a fresh one costs page faults on every call.
        spares = self._snapshots.get((array.shape, array.dtype))
        copy = spares.pop() if spares else array_module(array).empty(array.shape, array.dtype)
        copy_into(copy, array)
        return copy

    def _release(self, snapshots):
        for copy in snapshots:
            spares = self._snapshots.setdefault((copy.shape, copy.dtype), [])
            if len(spares) < 4:
                spares.append(copy)

    def __call__(self, *args):
        if len(args) < self.outputs:
            raise TypeError(f"{self.name} takes {self.outputs} output buffer(s) first, "
                            f"got {len(args)} argument(s)")
        if len(args) != len(self._kinds):
            raise TypeError(f"{self.name} takes {len(self._kinds)} arguments, got {len(args)}")
        for a in args:
            if a.__class__ is ad.Tensor:
                return self._call_traced(args)
        c_args = list(args)
        keep = []
        for i, kind in self._memref_parameters:
            c_arg, _ = self._memref_of(args[i], kind)     # (memref.descriptor_of takes NumPy scalars too)
            keep.append(c_arg)
            c_args[i] = c_arg[0]
        self._check_status(self._function(*c_args))
        return args[0] if self.outputs == 1 else args[:self.outputs]

    def _call_traced(self, args):
        """The call under a :class:`BufferTracer` that knows each argument's buffer
        (module docstring, "Gradients"): returns the Tensors the outputs hold."""
        outputs = self.outputs
        spares: list = []
        passed = {}         # position -> (array passed, its memo entry, Tensor, its value)
        as_is = False
        for i, kind in self._memref_parameters:
            a = args[i]
            if a.__class__ is ad.Tensor:
                if i < outputs:
                    raise TypeError(f"{self.name}: output {i} must be an array to write into, not a Tensor")
                # Backward reads the Tensor's value: compiled code that updates
                # its argument in place must write a copy, not that value.  The
                # copy's buffer is reused across calls; the value itself is what
                # the copy must still hold when a recorded op reads it.  Code
                # that only reads the argument (_read_only) gets the value itself.
                original = a.data
                if isinstance(original, np.generic):
                    original = np.asarray(original)
                if (i in self._read_only and original.__class__ is np.ndarray
                        and original.nbytes >= AS_IS_BYTES):
                    array = original
                    as_is = True
                else:
                    array = self._spare_copy(original)
                    spares.append(array)
                passed[i] = (array, self._memo(array, kind), a, original)
            else:
                array = np.asarray(a) if isinstance(a, np.generic) else a
                passed[i] = (array, self._memo(array, kind), None, None)
        if as_is:
            for i in self._overlapping(passed):     # a spare copy after all
                array, _, a, original = passed[i]
                array = self._spare_copy(original)
                spares.append(array)
                passed[i] = (array, self._memo(array, self._kinds[i]), a, original)
        tracer = BufferTracer(strict=self.strict)
        c_args = list(args)
        for i, (array, entry, tensor, original) in passed.items():
            c_args[i] = entry[4][0]
            if i < outputs:
                continue
            if tensor is not None:
                tracer.bind(array, tensor, original, key=entry[5])
            else:           # a plain array: passed as it is, a constant (copied now)
                tracer.declare_constant(array, key=entry[5])
        tracer.start()
        try:
            status = self._function(*c_args)
        finally:
            tracer.stop()
            self._release(spares)
        self._check_status(status)
        results = [tracer.produced(passed[i][0], f"{self.name}: output {i}", key=passed[i][1][5])
                   for i in range(outputs)]
        return results[0] if outputs == 1 else tuple(results)

    def _overlapping(self, passed) -> list:
        """The traced arguments passed as their Tensor's own array whose memory
        another memref argument overlaps: through that one the compiled code
        could write them, or see one buffer as two Tensors."""
        # Sorted by their lowest byte, a span overlaps another if it starts
        # below the highest end before it, or ends above the next one's start.
        spans = sorted((memref.byte_span(entry[5]), i) for i, (_, entry, _, _) in passed.items())
        found, reach = [], 0
        for k, ((low, high), i) in enumerate(spans):
            shared = low < reach or (k + 1 < len(spans) and spans[k + 1][0][0] < high)
            reach = max(reach, high)
            if shared and passed[i][0] is passed[i][3]:
                found.append(i)
        return found

    def _check_status(self, status):
        """Raise what a non-zero status stands for (module docstring)."""
        if status:
            original = ffi.take_last_exception(status)
            if original is not None:
                raise original
            text = self.module._kina_ffi.string(self.module._kina.kina_last_error()).decode("utf-8", "replace")
            raise exception_for(status, f"{self.name}: {text}")


# ---- compiling MLIR ------------------------------------------------------------------

#: The lowering pipeline from the func/memref/arith/scf/cf/linalg dialects to the
#: LLVM dialect (mlir-opt-19), as docs/autograd-abi.md describes it.
MLIR_PIPELINE = (
    "--convert-linalg-to-loops", "--convert-scf-to-cf", "--expand-strided-metadata", "--lower-affine",
    "--finalize-memref-to-llvm", "--convert-math-to-llvm", "--convert-func-to-llvm",
    "--convert-arith-to-llvm", "--convert-cf-to-llvm", "--reconcile-unrealized-casts",
)
MLIR_TOOLS = ("mlir-opt-19", "mlir-translate-19", "clang-19")


def missing_mlir_tools() -> list:
    """The MLIR 19 tools (Debian's mlir-19-tools, clang-19) not on PATH."""
    import shutil

    return [tool for tool in MLIR_TOOLS if shutil.which(tool) is None]


def compile_mlir(source: str, output: str) -> str:
    """Lower the MLIR module ``source`` and link it into the shared object ``output``.

    mlir-opt-19 (:data:`MLIR_PIPELINE`) -> mlir-translate-19 --mlir-to-llvmir ->
    clang-19 -shared, linked against this libkina_fx.so (with an rpath), so
    its runtime calls resolve to the library kina_fx loads.  Raises
    ``RuntimeError`` naming the step and its output when a step fails, or the
    missing tools.
    """
    import subprocess
    import tempfile

    missing = missing_mlir_tools()
    if missing:
        raise RuntimeError(f"compiling MLIR needs {', '.join(missing)} "
                           "(Debian: apt-get install mlir-19-tools clang-19)")
    libdir = os.path.dirname(ffi.library_path())
    with tempfile.TemporaryDirectory(prefix="kina_fx-mlir-") as tmp:
        generic = os.path.join(tmp, "generic.mlir")
        llvm_dialect, ll = os.path.join(tmp, "lowered.mlir"), os.path.join(tmp, "module.ll")
        steps = [
            # the module as mlir_read_only reads it; what is compiled is what it read
            ["mlir-opt-19", "--mlir-print-op-generic", source, "-o", generic],
            ["mlir-opt-19", generic, *MLIR_PIPELINE, "-o", llvm_dialect],
            ["mlir-translate-19", "--mlir-to-llvmir", llvm_dialect, "-o", ll],
            # -Bsymbolic: a call of the module's own function reaches that function,
            # not another library's of the same name (mlir_read_only reads its body)
            ["clang-19", "-O2", "-shared", "-fPIC", "-Wno-override-module", ll, "-o", output,
             f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-Wl,-Bsymbolic", "-lkina_fx"],
        ]
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"{step[0]} failed ({result.returncode}):\n{result.stderr}")
            if step[0] == "mlir-translate-19":
                with open(generic) as f, open(ll, "a") as out:
                    out.write(_read_only_global(f.read()))
    return output


def _read_only_global(generic: str) -> str:
    """LLVM IR defining :data:`mlir_read_only.SYMBOL` with the verdicts of the
    module whose generic form is ``generic``."""
    verdicts = mlir_read_only.read_only_arguments(generic)
    data = mlir_read_only.encode(verdicts).encode("ascii") + b"\0"
    text = "".join(chr(c) if chr(c).isalnum() or chr(c) in "_:," else f"\\{c:02X}" for c in data)
    return f'\n@{mlir_read_only.SYMBOL} = constant [{len(data)} x i8] c"{text}"\n'


def example_path(name: str) -> str:
    """The path of an MLIR example shipped with kina_fx (``"mlp.mlir"``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples", name)
