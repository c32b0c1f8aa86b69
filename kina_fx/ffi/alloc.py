"""The memref allocator's callbacks (``runtime_gpu_alloc_unranked``, ``runtime_gpu_free_all``).

The copy and compute exports' callbacks are built from the op table in
:mod:`kina_fx.ffi.ops`.  Like the rest of the ffi layer this module only
translates: descriptors are read and written by :mod:`kina_fx.memref`, memory
comes from :mod:`kina_fx.gpu_ops`.
:mod:`kina_fx.ffi` binds these callbacks lazily: this module, and with it
NumPy (and CuPy), is imported by the first memref call a host makes, so a host
that uses only the effects ABI never pays for them.
"""
from __future__ import annotations

from .. import gpu_ops, memref


def kina_py_gpu_alloc_unranked(ptr, element_size):
    gpu_ops.device()        # KINA_FX_DEVICE is checked first, as by every other export
    nbytes = memref.allocation_bytes(ptr, element_size, "memref")
    address = gpu_ops.allocate(nbytes, memref.ALIGNMENT)
    memref.clear_caches()
    memref.write_allocation(ptr, address, element_size, "memref")
    return 0


def kina_py_gpu_free_all():
    memref.clear_caches()
    gpu_ops.free_all()
    return 0


CALLBACKS = {name: fn for name, fn in globals().items() if name.startswith("kina_py_")}
