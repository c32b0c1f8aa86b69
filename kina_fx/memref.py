"""MLIR memref descriptors <-> NumPy/CuPy views, zero-copy.

An unranked memref arrives from C as a pointer to ``{int64 rank; void
*descriptor}``; ``descriptor`` points to ``{T *allocated; T *aligned; int64
offset; int64 sizes[rank]; int64 strides[rank]}`` (strides in elements).  Every
field is eight bytes on the 64-bit platforms we support, so a descriptor is
``3 + 2 * rank`` int64 words and is read in one copy.

One function per conversion:

* :func:`read_descriptor` -- unranked pointer -> validated :class:`Descriptor`
* :func:`numpy_view`      -- Descriptor -> NumPy array over the same memory
* :func:`cupy_view`       -- Descriptor -> CuPy array over the same device memory
* :func:`stage`           -- NumPy view of host memory -> CuPy copy + write-back
* :func:`write_allocation`-- fill a descriptor in place for a new buffer
* :func:`from_numpy`      -- NumPy array -> unranked memref (for Python callers/tests)
* :func:`descriptor_of`   -- NumPy/CuPy array -> unranked memref, any FFI's pointers
* :func:`ranked_descriptor` -- array -> a compiled function's ranked descriptor
  argument and its identity (the accelerator's one call on NumPy arrays)

plus :class:`ViewCache`, the hot path of the C exports: the view for a
descriptor's exact bytes is memoised, because building an ndarray costs several
microseconds while a 2x2 matmul costs about one.  A view is a pure function of
those bytes (address, shape, strides, dtype), so a cached view is the same
object one would build again; caches are dropped whenever the runtime allocates
or frees (:func:`clear_caches`).

Pointers given to these functions may be cdata of any cffi FFI instance (the
embedded library's or this module's) or plain integer addresses.
"""
from __future__ import annotations

import functools
import struct
from typing import Any, Callable, NamedTuple, Sequence, Tuple

import cffi
import numpy as np

from . import fibers
from .errors import KinaTypeError, ResourceError, ValidationError

ffi = cffi.FFI()
ffi.cdef("typedef struct { int64_t rank; void *descriptor; } kina_unranked_memref_t;")

#: Largest accepted rank (kina_fx.h: KINA_MAX_RANK); NumPy supports at least 32 dims.
MAX_RANK = 32
#: Element sizes ``runtime_gpu_alloc_unranked`` accepts.
ELEMENT_SIZES = (2, 4, 8)
#: Byte size of a rank-r descriptor, by rank.
DESCRIPTOR_BYTES = tuple(8 * (3 + 2 * r) for r in range(MAX_RANK + 1))
#: Alignment of buffers the runtime allocates (one cache line / AVX-512 vector).
ALIGNMENT = 64

_INT64_MAX = (1 << 63) - 1
_ADDR_LIMIT = 1 << 64


class Descriptor(NamedTuple):
    """A decoded ranked descriptor (addresses as ints, strides in elements)."""

    rank: int
    allocated: int
    aligned: int
    offset: int
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]

    def nbytes_needed(self, itemsize: int) -> int:
        """Bytes a dense row-major buffer of these sizes needs."""
        n = 1
        for s in self.sizes:
            n *= s
        return n * itemsize


def _as_unranked(ptr, name):
    if isinstance(ptr, int):
        ptr = ffi.cast("kina_unranked_memref_t *", ptr)
    if not ptr:
        raise ValidationError(f"{name}: null memref pointer")
    return ptr


def _checked_rank(p, name) -> int:
    rank = p.rank
    if not 0 <= rank <= MAX_RANK:
        raise ValidationError(f"{name}: rank {rank} out of range [0, {MAX_RANK}]")
    return rank


_tuple_new = tuple.__new__
_CHAR_P = ffi.typeof("char *")
_WORDS = tuple(struct.Struct(f"={3 + 2 * r}q") for r in range(MAX_RANK + 1))


def _decode(rank: int, raw: bytes, name: str) -> Descriptor:
    words = _WORDS[rank].unpack(raw)
    sizes = words[3:3 + rank]
    if sizes and min(sizes) < 0:
        i = next(i for i, s in enumerate(sizes) if s < 0)
        raise ValidationError(f"{name}: negative size {sizes[i]} in dimension {i}")
    allocated, aligned = words[0], words[1]
    if allocated < 0:
        allocated += _ADDR_LIMIT
    if aligned < 0:
        aligned += _ADDR_LIMIT
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (a cache miss
    # decodes up to three descriptors per call).
    return _tuple_new(Descriptor, (rank, allocated, aligned, words[2], sizes, words[3 + rank:]))


def read_descriptor(ptr: Any, name: str = "memref") -> Descriptor:
    """Validate and decode an unranked memref: null pointers, rank range, sizes.

    Raises ValidationError before reading anything a bad rank would put out of
    bounds.
    """
    p = _as_unranked(ptr, name)
    rank = _checked_rank(p, name)
    desc = p.descriptor
    if not desc:
        raise ValidationError(f"{name}: null descriptor pointer")
    return _decode(rank, ffi.buffer(desc, DESCRIPTOR_BYTES[rank])[:], name)


class ZeroSize:
    """An operand with no elements whose other sizes NumPy cannot hold (their
    product times the item size does not fit in int64: sizes ``[0, 2**40,
    2**40]``).  Its shape is all an op uses of an operand with no elements;
    writing to it writes nothing."""

    __slots__ = ("shape", "dtype")
    size = 0

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __setitem__(self, key, value):
        pass

    def __repr__(self):
        return f"ZeroSize({self.shape}, {self.dtype})"


def _elements_fit(sizes, itemsize: int, skip_zeros: bool) -> bool:
    n = itemsize
    for size in sizes:
        if size or not skip_zeros:
            n *= size
    return n <= _INT64_MAX


def empty_operand(sizes, dtype, xp=np):
    """An array of backend ``xp`` with no elements and these sizes (ZeroSize
    where the backend cannot hold the other sizes)."""
    if _elements_fit(sizes, np.dtype(dtype).itemsize, skip_zeros=True):
        return xp.empty(sizes, dtype)
    return ZeroSize(sizes, dtype)


def _extent(d: Descriptor, itemsize: int, name: str):
    """(lowest byte address, span in bytes, byte offset of element 0) of the
    view; None for a memref with no elements."""
    _rank, _allocated, aligned, offset, sizes, strides = d
    if 0 in sizes:
        return None
    if not _elements_fit(sizes, itemsize, skip_zeros=False):
        raise ValidationError(f"{name}: sizes {sizes} hold more than 2^63 bytes of "
                              f"{itemsize}-byte elements (zero strides included): more than "
                              "an operand may have")
    if aligned == 0:
        raise ValidationError(f"{name}: null data pointer for a non-empty memref")
    low = high = offset
    for size, stride in zip(sizes, strides):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    lo_addr = aligned + low * itemsize
    hi_addr = aligned + (high + 1) * itemsize
    if lo_addr < 0 or hi_addr > _ADDR_LIMIT or hi_addr - lo_addr > _INT64_MAX:
        raise ValidationError(f"{name}: offset/strides address memory outside the address space")
    if lo_addr == 0:
        # NumPy takes a buffer at address 0 for none and allocates its own:
        # the view would silently be of other memory.
        raise ValidationError(f"{name}: offset/strides reach address 0 (a null pointer)")
    return lo_addr, hi_addr - lo_addr, (aligned + offset * itemsize) - lo_addr


def numpy_view(d: Descriptor, dtype: Any, name: str = "memref") -> np.ndarray:
    """A writable NumPy array over the descriptor's memory (no copy).

    Honours any offset and strides, negative or zero included.  The view does
    not own the memory: it must not outlive the C call that lent it.
    """
    if type(dtype) is not np.dtype:
        dtype = np.dtype(dtype)
    item = dtype.itemsize
    ext = _extent(d, item, name)
    if ext is None:
        return empty_operand(d.sizes, dtype)
    lo, span, start = ext
    buf = ffi.buffer(ffi.cast(_CHAR_P, lo), span)
    # A stride of a length-1 dimension never moves; MLIR leaves it arbitrary.
    strides = tuple([s * item if n != 1 else 0 for s, n in zip(d.strides, d.sizes)])
    return np.ndarray(d.sizes, dtype, buf, start, strides)


def _is_device_pointer(cp, address: int) -> bool:
    try:
        attrs = cp.cuda.runtime.pointerGetAttributes(address)
    except Exception:
        return False
    # cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3
    return getattr(attrs, "type", 0) in (2, 3)


def cupy_view(d: Descriptor, dtype: Any, cp: Any, name: str = "memref") -> Any:
    """A CuPy array over the descriptor's device or managed memory (no copy).

    Returns None when the memory is plain host memory that the device cannot
    address; :func:`stage` handles that case.
    """
    dtype = np.dtype(dtype)
    ext = _extent(d, dtype.itemsize, name)
    if ext is None:
        return empty_operand(d.sizes, dtype, cp)
    lo, span, start = ext
    if not _is_device_pointer(cp, lo):
        return None
    mem = cp.cuda.UnownedMemory(lo, span, None)
    ptr = cp.cuda.MemoryPointer(mem, start)
    strides = tuple([s * dtype.itemsize if n != 1 else 0 for s, n in zip(d.strides, d.sizes)])
    return cp.ndarray(d.sizes, dtype, ptr, strides)


def stage(host: Any, cp: Any) -> Tuple[Any, Callable[[], None]]:
    """A device copy of ``host`` (a NumPy view of host memory, :func:`numpy_view`)
    and a function that writes it back.

    Used on the CUDA backend for operands the device cannot address (a host's
    stack or malloc memory): inputs are copied in, outputs copied back after
    the op by calling the returned function.
    """
    if type(host) is ZeroSize:
        return host, lambda: None
    dev = cp.asarray(host)
    _staged[id(dev)] = (dev, identity(host))

    def write_back():
        host[...] = cp.asnumpy(dev)

    return dev, write_back


#: Device copies made by stage -> the identity of the host memory they
#: stand for (released by release_staged when the call is over).
_staged: dict = {}


def release_staged(arrays) -> None:
    """Forget the staged copies among ``arrays`` (the call that used them is over)."""
    for a in arrays:
        _staged.pop(id(a), None)


def identity(array) -> tuple:
    """What memory an array views: (address of its first element, shape, strides
    in elements, dtype string; a length-1 dimension's stride counts as 0, an
    empty array has address 0).  A device copy of host memory made by
    :func:`stage` has the identity of that host memory.  Tapes identify
    tensors by this (docs/autograd-abi.md)."""
    key = id(array)
    hit = VIEW_IDENTITIES.get(key)
    if hit is not None and hit[0] is array:
        return hit[1]
    hit = _staged.get(key)
    if hit is not None and hit[0] is array:
        return hit[1]
    return _identity_of(array)


@functools.lru_cache(maxsize=256)
def byte_span(identity_key: tuple) -> tuple:
    """``(lowest, one past the highest)`` byte address of the memory an
    :func:`identity` describes; ``(0, 0)`` for one with no element."""
    address, shape, strides, dtype = identity_key
    if 0 in shape:
        return (0, 0)
    low = high = 0
    for n, stride in zip(shape, strides):
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    item = np.dtype(dtype).itemsize
    return (address + low * item, address + (high + 1) * item)


def _identity_of(array) -> tuple:
    shape = tuple(array.shape)
    if 0 in shape:          # no element, no address to tell it apart by
        return (0, shape, (0,) * len(shape), array.dtype.str)
    if isinstance(array, np.ndarray):
        address = array.__array_interface__["data"][0]
    else:  # a CuPy array
        address = array.data.ptr
    item = array.dtype.itemsize
    # The stride of a length-1 dimension never moves and MLIR leaves it
    # arbitrary (the runtime's views make it 0): it counts as 0.
    strides = tuple(0 if n == 1 else s // item for n, s in zip(shape, array.strides))
    return (address, shape, strides, array.dtype.str)


def row_major_strides(sizes, element_size: int, name: str = "memref") -> tuple:
    """Row-major strides (in elements) for ``sizes``, as alloc writes them.

    A zero size counts as 1, so each stride is the product of the non-zero
    sizes after it.  ResourceError when a stride, in bytes, does not fit in
    int64 (possible only for zero-element shapes: otherwise the byte count
    would overflow first).
    """
    strides = [0] * len(sizes)
    stride = 1
    for i in reversed(range(len(sizes))):
        if stride * element_size > _INT64_MAX:
            raise ResourceError(f"{name}: the row-major stride of dimension {i} of {tuple(sizes)} "
                                f"x {element_size} bytes overflows 64 bits")
        strides[i] = stride
        stride *= max(sizes[i], 1)
    return tuple(strides)


def write_allocation(ptr: Any, address: int, element_size: int, name: str = "memref") -> Descriptor:
    """Point an existing descriptor at a new row-major buffer, in place.

    Writes allocated = aligned = ``address``, offset 0 and row-major strides
    into the nested descriptor the unranked pointer refers to: the ``{rank,
    descriptor}`` struct itself is the caller's per-call temporary, so only the
    nested descriptor's update is seen by an MLIR host.  Everything is
    computed (and may fail) before the first word is written.
    """
    d = read_descriptor(ptr, name)
    strides = row_major_strides(d.sizes, element_size, name)
    words = ffi.cast("int64_t *", _as_unranked(ptr, name).descriptor)
    for i, stride in enumerate(strides):
        words[3 + d.rank + i] = stride
    words[0] = address
    words[1] = address
    words[2] = 0
    return read_descriptor(ptr, name)


def allocation_bytes(ptr: Any, element_size: int, name: str = "memref") -> int:
    """Bytes ``runtime_gpu_alloc_unranked`` must allocate for this descriptor.

    Validates everything alloc depends on, so that nothing is allocated or
    written for a request that fails, in parameter order (docs/abi.md, "Check
    order"): the descriptor (ValidationError: null pointers, rank, negative
    sizes), element_size (KinaTypeError unless 2, 4 or 8), then the byte
    count and the row-major strides (ResourceError when either overflows 64
    bits).
    """
    d = read_descriptor(ptr, name)
    if element_size not in ELEMENT_SIZES:
        raise KinaTypeError(f"element_size must be 2, 4 or 8, not {element_size}")
    n = d.nbytes_needed(element_size)
    if n > _INT64_MAX:
        raise ResourceError(f"{name}: {d.sizes} x {element_size} bytes overflows 64 bits")
    row_major_strides(d.sizes, element_size, name)
    return n


# ---- the hot path ----------------------------------------------------------

_CACHE_LIMIT = 4096
_caches: list = []

#: id(view) -> (view, identity) for every view a ViewCache made: the tapes ask
#: for the identity of each operand of each call, and reading it back from the
#: view (``__array_interface__`` over foreign memory) costs microseconds.  The
#: entry holds the view, so its id cannot be reused while the entry exists.
#: The compiled tape clause (``_speedups_c/tape_calls.c``) reads it too.
VIEW_IDENTITIES: dict = {}
_caches.append(VIEW_IDENTITIES)


def register_cache(cache: dict) -> None:
    """Have :func:`clear_caches` empty ``cache`` too (a memo of views kept elsewhere)."""
    _caches.append(cache)


def clear_caches() -> None:
    """Forget every memoised view (called when the runtime allocates or frees)."""
    for views in _caches:
        views.clear()


def _descriptor_identity(d: Descriptor, dtype) -> tuple:
    """:func:`identity` of the view of ``d`` (computed from the descriptor, as
    :func:`_identity_of` would read it from the view)."""
    sizes = d.sizes
    if 0 in sizes:
        return (0, sizes, (0,) * len(sizes), dtype.str)
    strides = tuple([0 if n == 1 else s for n, s in zip(sizes, d.strides)])
    return (d.aligned + d.offset * dtype.itemsize, sizes, strides, dtype.str)


class ViewCache:
    """:func:`read_descriptor` + :func:`numpy_view`, memoised on the descriptor's bytes.

    One cache per (dtype, role).  ``output=True`` also rejects layouts whose
    elements are not distinct by construction (:func:`check_output_layout`):
    writing through them would be undefined.
    """

    __slots__ = ("dtype", "output", "views", "_spec")

    def __init__(self, dtype: Any, output: bool = False) -> None:
        self.dtype = np.dtype(dtype)
        self.output = output
        self.views: dict = {}
        self._spec = (np.ndarray, self.dtype, self.dtype.itemsize, self.dtype.str, output)
        _caches.append(self.views)

    def view(self, ptr: Any, name: str = "memref") -> np.ndarray:
        if not ptr:
            raise ValidationError(f"{name}: null memref pointer")
        rank = ptr.rank
        if not 0 <= rank <= MAX_RANK:
            raise ValidationError(f"{name}: rank {rank} out of range [0, {MAX_RANK}]")
        desc = ptr.descriptor
        if not desc:
            raise ValidationError(f"{name}: null descriptor pointer")
        raw = _buffer(desc, DESCRIPTOR_BYTES[rank])[:]
        view = self.views.get(raw)
        if view is None:
            view = self._miss(rank, raw, name)
        return view

    def _miss(self, rank, raw, name):
        # The accelerator's transcription takes the common case (a training
        # loop's fresh batch every step); this is the reference, and decides
        # every other descriptor (empty, invalid, an output to check).
        made = NotImplemented if _view_of_descriptor is None else _view_of_descriptor(raw, rank, self._spec)
        if made is NotImplemented:
            d = _decode(rank, raw, name)
            if self.output:
                check_output_layout(d, name)
            view = numpy_view(d, self.dtype, name)
            identity = _descriptor_identity(d, self.dtype)
        else:
            view, identity = made
        if len(self.views) >= _CACHE_LIMIT:
            self.views.clear()
        if len(VIEW_IDENTITIES) >= _CACHE_LIMIT * 8:
            VIEW_IDENTITIES.clear()
        VIEW_IDENTITIES[id(view)] = (view, identity)
        self.views[raw] = view
        return view


_view_of_descriptor = getattr(fibers.speedups, "view_of_descriptor", None)


_buffer = ffi.buffer


def check_output_layout(d: Descriptor, name: str = "out") -> None:
    """ValidationError unless ``d`` is a layout whose elements are distinct by
    construction: ordered by absolute stride, each dimension's stride is
    larger than the span of all dimensions with smaller strides (every
    row-major, column-major, permuted, stepped or reversed layout).  Layouts
    that fail this test alias (sizes ``[2, 2]``, strides ``[1, 1]``; a zero
    stride) or interleave; outputs with no elements always pass."""
    if 0 in d.sizes:
        return
    span = 0                    # elements covered by the dimensions checked so far, minus one
    for stride, size, i in sorted((abs(st), n, i) for i, (n, st) in enumerate(zip(d.sizes, d.strides))
                                  if n != 1):
        if stride <= span:
            what = ("stride 0" if stride == 0 else
                    f"stride {d.strides[i]} reaching elements of smaller dimensions")
            raise ValidationError(f"{name}: {what} in dimension {i} of size {size} makes "
                                  "elements alias; outputs need distinct elements")
        span += stride * (size - 1)


# ---- Python -> memref (callers written in Python, tests) ---------------------

class UnrankedMemref:
    """An unranked memref over a NumPy array, for calling the C exports from Python.

    Keeps the array and both C structs alive; ``pointer`` is what a C export takes.
    """

    def __init__(self, array: np.ndarray | None, rank: int, words: list[int]) -> None:
        self.array = array
        self.words = ffi.new("int64_t[]", words if words else 1)
        self.struct = ffi.new("kina_unranked_memref_t *", {"rank": rank, "descriptor": self.words})
        self.pointer = self.struct

    def identity(self, dtype) -> tuple:
        """:func:`identity` of the array this memref describes, read from its
        words (``dtype``: its element type): no view of the memory is made."""
        rank = self.struct.rank
        words = self.words
        sizes = tuple(words[3:3 + rank])
        if 0 in sizes:
            return (0, sizes, (0,) * rank, dtype.str)
        strides = tuple([0 if n == 1 else st for n, st in zip(sizes, words[3 + rank:3 + 2 * rank])])
        return (words[1] + words[2] * dtype.itemsize, sizes, strides, dtype.str)

    @property
    def address(self) -> int:
        """The address of the unranked memref ``{rank, descriptor}``."""
        return int(ffi.cast("intptr_t", self.struct))


    def descriptor(self) -> Descriptor:
        return read_descriptor(self.struct)

    def pointer_for(self, foreign_ffi):
        """This memref as a ``kina_unranked_memref_t *`` of another cffi FFI instance."""
        return foreign_ffi.cast("kina_unranked_memref_t *", self.address)

    def descriptor_pointer_for(self, foreign_ffi):
        """The ranked descriptor as a ``kina_memref_descriptor_t *`` of another cffi FFI
        instance: what an ``llvm.emit_c_interface`` wrapper takes for a ranked memref."""
        return foreign_ffi.cast("kina_memref_descriptor_t *", int(ffi.cast("intptr_t", self.words)))


def from_numpy(array: np.ndarray, offset_elements: int = 0) -> UnrankedMemref:
    """The unranked memref MLIR would pass for ``array`` (zero-copy, any strides).

    The data starts at the array's first element: ``aligned`` is placed
    ``offset_elements`` items before it and ``offset`` says so (to exercise
    non-zero offsets).  Byte strides must be multiples of the item size
    (memref strides count elements).
    """
    item = array.dtype.itemsize
    for s in array.strides:
        if s % item:
            raise ValidationError(f"stride {s} is not a multiple of the item size {item}")
    address = array.__array_interface__["data"][0]
    base = address - offset_elements * item
    words = [base, base, offset_elements, *array.shape, *(s // item for s in array.strides)]
    return UnrankedMemref(array, array.ndim, words)


def empty_descriptor(sizes: Sequence[int]) -> UnrankedMemref:
    """A descriptor with sizes but no storage: what an MLIR host passes to alloc."""
    sizes = list(sizes)
    return UnrankedMemref(None, len(sizes), [0, 0, 0, *sizes, *([0] * len(sizes))])


# ---- public helpers: calling compiled code with arrays ---------------------------
#
# What MLIR's Python runtime offers as get_ranked_memref_descriptor /
# ranked_memref_to_numpy, for NumPy and CuPy, with pointers usable by any
# cffi FFI instance (kina_fx.ffi.load_library()'s, a compiled module's).

def descriptor_of(array) -> UnrankedMemref:
    """An unranked memref over ``array``'s memory (NumPy or CuPy; zero-copy, any strides).

    ``.pointer_for(ffi)`` is what a C function declared in ``ffi`` takes; the
    object keeps the array and the descriptor alive: hold it for the call.
    """
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if isinstance(array, np.ndarray):
        return from_numpy(array)
    data = getattr(array, "data", None)
    if data is None or not hasattr(data, "ptr"):
        raise KinaTypeError(f"cannot pass a {type(array).__name__} as a memref "
                            "(use a NumPy or CuPy array)")
    item = array.dtype.itemsize
    for s in array.strides:
        if s % item:
            raise ValidationError(f"stride {s} is not a multiple of the item size {item}")
    words = [data.ptr, data.ptr, 0, *array.shape, *(s // item for s in array.strides)]
    return UnrankedMemref(array, array.ndim, words)


def ranked_descriptor(array, foreign_ffi) -> tuple:
    """``(pointer, keep, identity)`` for a compiled function's ranked memref
    parameter: ``pointer`` a ``kina_memref_descriptor_t *`` of ``foreign_ffi``
    over ``array`` (:func:`descriptor_of`'s descriptor), ``keep`` what to hold
    for the call, ``identity`` :func:`identity`'s tuple of that memory.

    NumPy arrays take the accelerator's transcription
    (``kina_fx/_speedups_c/buffers.c``: one call, no array-interface dict);
    the descriptor and identity are the same."""
    if array.__class__ is np.ndarray and _ranked_descriptor_words is not None:
        made = _ranked_descriptor_words(array, array.strides, array.dtype.str)
        if made is not NotImplemented:
            words, key = made
            return foreign_ffi.from_buffer("kina_memref_descriptor_t *", words), words, key
    m = descriptor_of(array)
    return m.descriptor_pointer_for(foreign_ffi), m, m.identity(array.dtype)


_ranked_descriptor_words = getattr(fibers.speedups, "ranked_descriptor_words", None)


def array_of(ptr, dtype, name: str = "memref"):
    """The array a memref describes: a zero-copy NumPy view (CuPy for device memory).

    ``ptr`` is a ``kina_unranked_memref_t *`` of any FFI instance, an address,
    or an :class:`UnrankedMemref`.
    """
    if isinstance(ptr, UnrankedMemref):
        ptr = ptr.address
    elif not isinstance(ptr, int):
        ptr = int(ffi.cast("intptr_t", ptr))
    d = read_descriptor(ptr, name)
    from . import gpu_ops

    cp = gpu_ops.cupy_module()
    if cp is not None:
        view = cupy_view(d, np.dtype(dtype), cp, name)
        if view is not None:
            return view
    return numpy_view(d, np.dtype(dtype), name)
