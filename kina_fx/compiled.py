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
are passed as memrefs over their memory (zero-copy), in the form the
declaration names; ints pass as they are.  A ranked parameter's rank is not in
its C type: pass arrays of the rank the MLIR function declares.  The first ``outputs`` arguments are output buffers, returned after
the call (one value, or a tuple).  A non-zero status raises the exception of
that status with ``kina_last_error``'s text (:func:`kina_fx.errors.exception_for`).

**Gradients.**  When an argument is a traced Tensor (inside ``ad.grad``,
``ad.vjp``, ``ad.jvp`` or a ``Tape``), the call runs under a
:class:`~kina_fx.memory_tape.BufferTracer` that knows each argument's buffer
as its Tensor: the runtime ops the compiled code calls are computed by
autograd's primitives and recorded by the live trace, and each output is
returned as the Tensor its buffer holds.  A Tensor argument is passed as a
copy of its value, so compiled code that updates an argument in place leaves
the Tensor (and what backward computes from it) as it was; plain arrays are
passed as they are, and declared constant.  The tracer is strict by default: a
floating buffer the compiled code computed without runtime calls (loops), or
an output it did not produce with one, raises
:class:`~kina_fx.memory_tape.TapeError` instead of yielding a wrong gradient.
"""
from __future__ import annotations

import os

from . import autograd as ad
from . import ffi, memref
from .errors import exception_for
from .gpu_ops import array_module
from .memory_tape import BufferTracer

__all__ = ["load", "CompiledModule", "CompiledFunction"]


class CompiledModule:
    """A shared object opened in this process, next to ``libkina_fx.so``."""

    def __init__(self, path: str, declarations: str):
        import cffi

        self._kina_ffi, self._kina = ffi.load_library()   # its runtime calls land here
        self.path = os.path.abspath(path)
        self.ffi = cffi.FFI()
        self.ffi.cdef("typedef struct { int64_t rank; void *descriptor; } kina_unranked_memref_t;\n"
                      "typedef struct { void *allocated; void *aligned; int64_t offset; "
                      "int64_t sizes_and_strides[]; } kina_memref_descriptor_t;\n"
                      + declarations)
        self.lib = self.ffi.dlopen(self.path)

    def function(self, name: str, outputs: int = 0, strict: bool = True) -> "CompiledFunction":
        """The exported function ``name``; its first ``outputs`` arguments are output buffers."""
        return CompiledFunction(self, name, getattr(self.lib, name), outputs, strict)

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

    def __init__(self, module, name, function, outputs, strict):
        self.module = module
        self.name = name
        self._function = function
        self.outputs = outputs
        self.strict = strict
        parameters = module.ffi.typeof(function).args
        self._ranked = tuple(p.cname == "kina_memref_descriptor_t *" for p in parameters)

    def __repr__(self):
        return f"<CompiledFunction {self.name} of {self.module.path}>"

    def __call__(self, *args):
        if len(args) < self.outputs:
            raise TypeError(f"{self.name} takes {self.outputs} output buffer(s) first, "
                            f"got {len(args)} argument(s)")
        traced = any(isinstance(a, ad.Tensor) for a in args)
        tracer = BufferTracer(strict=self.strict) if traced else None
        keep, c_args, arrays = [], [], []
        for i, a in enumerate(args):
            if isinstance(a, int):
                c_args.append(a)
                arrays.append(None)
                continue
            array = a.data if isinstance(a, ad.Tensor) else a
            if i < self.outputs and isinstance(a, ad.Tensor):
                raise TypeError(f"{self.name}: output {i} must be an array to write into, not a Tensor")
            if tracer is not None and isinstance(a, ad.Tensor):
                # Backward reads the Tensor's value: compiled code that writes
                # its argument in place must write a copy, not that value.
                array = array_module(array).array(array, copy=True)
            m = memref.descriptor_of(array)
            keep.append(m)
            ranked = i < len(self._ranked) and self._ranked[i]
            c_args.append(m.descriptor_pointer_for(self.module.ffi) if ranked
                          else m.pointer_for(self.module.ffi))
            arrays.append(m.array)
            if tracer is not None and i >= self.outputs:
                if isinstance(a, ad.Tensor):
                    tracer.bind(m.array, a)
                else:
                    tracer.declare_constant(m.array)
        if tracer is not None:
            tracer.start()
            try:
                status = self._function(*c_args)
            finally:
                tracer.stop()
        else:
            status = self._function(*c_args)
        if status:
            text = self.module._kina_ffi.string(self.module._kina.kina_last_error()).decode("utf-8", "replace")
            raise exception_for(status, f"{self.name}: {text}")
        results = [args[i] if tracer is None else tracer.produced(arrays[i], f"{self.name}: output {i}")
                   for i in range(self.outputs)]
        return results[0] if self.outputs == 1 else tuple(results)
