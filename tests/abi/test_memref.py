"""kina_fx.memref: descriptors <-> NumPy views, zero-copy, checked against NumPy."""
from __future__ import annotations

import itertools
import struct

import cffi
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_fx import memref
from kina_fx.errors import KinaTypeError, ResourceError, ValidationError


@st.composite
def strided_arrays(draw):
    """Random arrays of rank 0-4 seen through random slices (steps, reversals, offsets)."""
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int64]))
    base = np.arange(int(np.prod(shape)) if shape else 1, dtype=dtype).reshape(shape)
    index = []
    for n in shape:
        start = draw(st.integers(0, n - 1))
        step = draw(st.sampled_from([1, 2, -1, -2]))
        index.append(slice(start, None, step))
    view = base[tuple(index)] if index else base
    if rank >= 2 and draw(st.booleans()):
        view = view.T
    return view


@settings(max_examples=200, deadline=None)
@given(strided_arrays())
def test_round_trip_is_zero_copy(arr):
    m = memref.from_numpy(arr)
    d = m.descriptor()
    assert d.rank == arr.ndim and d.sizes == arr.shape
    view = memref.numpy_view(d, arr.dtype)
    np.testing.assert_array_equal(view, arr)
    if arr.size:
        assert np.shares_memory(view, arr)
        view.flat[0] = 7
        assert arr.flat[0] == 7


@settings(max_examples=100, deadline=None)
@given(strided_arrays(), st.integers(0, 9))
def test_offset_is_honoured(arr, offset):
    d = memref.from_numpy(arr, offset_elements=offset).descriptor()
    assert d.offset == offset
    np.testing.assert_array_equal(memref.numpy_view(d, arr.dtype), arr)


def test_view_cache_returns_equal_views_and_is_cleared():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = memref.from_numpy(a)
    cache = memref.ViewCache(np.float32)
    v1 = cache.view(m.struct, "a")
    assert cache.view(m.struct, "a") is v1
    np.testing.assert_array_equal(v1, a)
    memref.clear_caches()
    assert cache.views == {}
    b = a.T.copy()
    mb = memref.from_numpy(b)
    assert cache.view(mb.struct, "b").shape == (3, 2)


def test_read_descriptor_rejects_malformed_input():
    with pytest.raises(ValidationError, match="null memref"):
        memref.read_descriptor(0)
    with pytest.raises(ValidationError, match="rank 40"):
        memref.read_descriptor(memref.UnrankedMemref(None, 40, [0]).struct)
    with pytest.raises(ValidationError, match="negative size"):
        memref.read_descriptor(memref.empty_descriptor((3, -2)).struct)
    m = memref.from_numpy(np.zeros(3, np.float32))
    m.struct.descriptor = memref.ffi.NULL
    with pytest.raises(ValidationError, match="null descriptor"):
        memref.read_descriptor(m.struct)


def test_null_data_is_only_fine_when_empty():
    d = memref.empty_descriptor((0, 4)).descriptor()
    assert memref.numpy_view(d, np.float32).shape == (0, 4)
    with pytest.raises(ValidationError, match="null data"):
        memref.numpy_view(memref.empty_descriptor((2, 4)).descriptor(), np.float32)


def test_write_allocation_fills_the_nested_descriptor_in_place():
    m = memref.empty_descriptor((2, 3, 4))
    before = bytes(memref.ffi.buffer(m.struct))
    buf = np.zeros(24, np.float32)
    address = buf.__array_interface__["data"][0]
    d = memref.write_allocation(m.struct, address, 4)
    assert bytes(memref.ffi.buffer(m.struct)) == before
    assert (d.allocated, d.aligned, d.offset, d.strides) == (address, address, 0, (12, 4, 1))
    memref.numpy_view(d, np.float32)[1, 2, 3] = 5
    assert buf[23] == 5


def test_allocation_bytes():
    assert memref.allocation_bytes(memref.empty_descriptor((2, 3)).struct, 8) == 48
    assert memref.allocation_bytes(memref.empty_descriptor(()).struct, 2) == 2
    with pytest.raises(KinaTypeError):
        memref.allocation_bytes(memref.empty_descriptor((2,)).struct, 3)
    with pytest.raises(ResourceError):
        memref.allocation_bytes(memref.empty_descriptor((1 << 62, 4)).struct, 8)


def test_output_layout_check():
    ok = memref.from_numpy(np.zeros((2, 3), np.float32)).descriptor()
    memref.check_output_layout(ok)
    alias = memref.UnrankedMemref(None, 2, [8, 8, 0, 2, 3, 0, 1]).descriptor()
    with pytest.raises(ValidationError, match="stride 0"):
        memref.check_output_layout(alias)
    memref.check_output_layout(memref.UnrankedMemref(None, 2, [8, 8, 0, 0, 3, 0, 1]).descriptor())


def test_strides_must_be_whole_elements():
    raw = np.zeros(16, np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw[:12].view(np.float32), (2,), (6,))
    with pytest.raises(ValidationError, match="multiple"):
        memref.from_numpy(odd)


@pytest.mark.parametrize("words", [
    [4096, 4096, 0, 3, 1 << 62],            # stride too large for the address space
    [4096, 4096, -(1 << 40), 2, 1],         # offset before address 0
    [4096, 4096, (1 << 62), 2, 1],          # offset past the address space
])
def test_descriptors_addressing_outside_memory_are_rejected(words):
    d = memref.UnrankedMemref(None, 1, words).descriptor()
    with pytest.raises(ValidationError, match="address space"):
        memref.numpy_view(d, np.float32)


def test_strides_of_length_one_dimensions_are_ignored():
    a = np.arange(3, dtype=np.float32)
    address = a.__array_interface__["data"][0]
    d = memref.UnrankedMemref(a, 2, [address, address, 0, 1, 3, 1 << 62, 1]).descriptor()
    np.testing.assert_array_equal(memref.numpy_view(d, np.float32), a[None, :])


def _descriptor_words(ptr, rank, ffi):
    return ([int(ffi.cast("intptr_t", ptr.allocated)), int(ffi.cast("intptr_t", ptr.aligned)), ptr.offset]
            + [ptr.sizes_and_strides[i] for i in range(2 * rank)])


_RANKED_FFI = cffi.FFI()
_RANKED_FFI.cdef("typedef struct { void *allocated; void *aligned; int64_t offset; "
                 "int64_t sizes_and_strides[]; } kina_memref_descriptor_t;")


@settings(max_examples=200, deadline=None)
@given(strided_arrays(), st.sampled_from(["as is", "empty", "length one"]))
def test_a_ranked_descriptor_is_descriptor_ofs_words_and_identity(arr, variant):
    """memref.ranked_descriptor (the accelerator's transcription where it is
    built) against its reference, descriptor_of: the same words, read through
    another FFI instance, and memref.identity's tuple."""
    if variant == "empty" and arr.ndim:
        arr = arr[..., :0]
    elif variant == "length one" and arr.ndim:
        arr = arr[..., :1]
    ptr, keep, key = memref.ranked_descriptor(arr, _RANKED_FFI)
    reference = memref.descriptor_of(arr)
    assert _descriptor_words(ptr, arr.ndim, _RANKED_FFI) == list(reference.words)[:3 + 2 * arr.ndim]
    assert key == reference.identity(arr.dtype) == memref.identity(arr)
    assert keep is not None
    if arr.size:
        view = memref.numpy_view(memref.read_descriptor(reference.address), arr.dtype)
        np.testing.assert_array_equal(view, arr)


def test_a_ranked_descriptor_of_what_the_accelerator_declines_is_descriptor_ofs():
    scalar = np.float32(2.5)                     # not an ndarray: descriptor_of's 0-d copy
    ptr, keep, key = memref.ranked_descriptor(scalar, _RANKED_FFI)
    assert isinstance(keep, memref.UnrankedMemref) and keep.array.shape == ()
    assert float(_RANKED_FFI.cast("float *", ptr.aligned)[0]) == 2.5
    odd = np.zeros(8, np.uint8)[1:].view(np.dtype([("a", np.uint8)]))[::2]   # a structured view
    ptr, keep, key = memref.ranked_descriptor(odd, _RANKED_FFI)
    assert key == memref.identity(odd)
    misaligned = np.ndarray((2,), np.int32, np.zeros(16, np.uint8), 1, (6,))   # 6-byte strides
    with pytest.raises(ValidationError, match="multiple of the item size"):
        memref.ranked_descriptor(misaligned, _RANKED_FFI)


# ---- ViewCache's miss: the accelerator's view against the Python form -----------------

_INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def descriptor_words(draw):
    """Descriptor words of rank 0-4 and what a view of them needs: mostly
    plausible (a real address, small sizes, strides of any sign, zero
    included), now and then anything int64 words can say."""
    rank = draw(st.integers(0, 4))
    wild = draw(st.integers(0, 5)) == 0
    number = _INT64 if wild else st.integers(-6, 6)
    sizes = [draw(_INT64 if wild else st.integers(0, 5)) for _ in range(rank)]
    strides = [draw(number) for _ in range(rank)]
    aligned = draw(st.sampled_from([0, 8, 64, 1 << 20, (1 << 40) + 64, 2**63 - 64, -64]) if wild
                   else st.sampled_from([1 << 32, 1 << 32, 1 << 32, 8, 16]))   # near 0: see address 0
    offset = draw(number if wild else st.integers(-8, 40))
    return rank, [aligned, aligned, offset, *sizes, *strides]


def _packed(*words) -> bytes:
    """A descriptor's bytes, as a C caller lays its int64 words out."""
    return struct.pack(f"<{len(words)}q", *words)


def _python_view(cache, rank, raw):
    """ViewCache._miss's Python form: (view, identity), or the exception it raises."""
    try:
        d = memref._decode(rank, raw, "x")
        if cache.output:
            memref.check_output_layout(d, "x")
        return memref.numpy_view(d, cache.dtype, "x"), memref._descriptor_identity(d, cache.dtype)
    except (ValidationError, ResourceError) as error:
        return error


@pytest.mark.only_impl("compiled")
@settings(max_examples=400, deadline=None)
@given(descriptor_words(), st.sampled_from([np.float32, np.float16, np.int64]), st.booleans())
def test_the_accelerators_view_is_the_python_forms(words, dtype, output):
    """Where the accelerator makes the view, the Python form makes the same one
    (shape, strides, address, type, writable) with the same identity; what
    the Python form refuses the accelerator declines, never a view."""
    rank, w = words
    raw = _packed(*w)
    cache = memref.ViewCache(dtype, output=output)
    made = memref._view_of_descriptor(raw, rank, cache._spec)
    expected = _python_view(cache, rank, raw)
    if made is NotImplemented:
        return
    assert not isinstance(expected, Exception), expected
    (view, identity), (reference, reference_identity) = made, expected
    assert type(view) is np.ndarray and view.dtype == reference.dtype
    assert view.shape == reference.shape and view.strides == reference.strides
    assert view.__array_interface__["data"] == reference.__array_interface__["data"]
    assert view.flags.writeable
    assert identity == reference_identity and identity == memref._identity_of(view)


@pytest.mark.only_impl("compiled")
@settings(max_examples=100, deadline=None)
@given(strided_arrays(), st.booleans())
def test_the_accelerator_views_real_arrays_and_row_major_outputs(arr, output):
    """The common case is taken: any non-empty input, and an output laid out
    row-major (stepped or not); the view is the array's memory, and writes
    through it land in the array."""
    m = memref.from_numpy(arr)
    raw = bytes(memref._buffer(m.struct.descriptor, memref.DESCRIPTOR_BYTES[arr.ndim]))
    cache = memref.ViewCache(arr.dtype, output=output)
    made = memref._view_of_descriptor(raw, arr.ndim, cache._spec)
    row_major = all(s > 0 for s in arr.strides) and arr.strides == tuple(sorted(arr.strides, reverse=True))
    if output and not row_major:
        return                         # the Python form checks these layouts
    assert made is not NotImplemented
    view, identity = made
    np.testing.assert_array_equal(view, arr)
    assert identity == memref.identity(arr)
    view.flat[-1] = 3
    assert arr.flat[-1] == 3


@pytest.mark.only_impl("compiled")
@pytest.mark.parametrize("rank", [2, 3])
def test_the_accelerator_declines_every_output_layout_the_python_form_refuses(rank):
    """Every layout of small sizes and strides (0-4, and -1), as an output: the
    accelerator makes a view only where check_output_layout accepts it, and
    takes every row-major one.  (A first version summed the dimensions' spans
    wrongly and took sizes (2, 2, 2), strides (3, 2, 1), which puts two
    indices on one element; the fuzzer found it.)"""
    cache = memref.ViewCache(np.float32, output=True)
    for sizes in itertools.product([1, 2, 3], repeat=rank):
        for strides in itertools.product([-1, 0, 1, 2, 3, 4], repeat=rank):
            raw = _packed(1 << 32, 1 << 32, 8, *sizes, *strides)
            made = memref._view_of_descriptor(raw, rank, cache._spec)
            expected = _python_view(cache, rank, raw)
            if made is not NotImplemented:
                assert not isinstance(expected, Exception), (sizes, strides, expected)
            row_major = all(st == int(np.prod(sizes[d + 1:])) or n == 1
                            for d, (n, st) in enumerate(zip(sizes, strides)))
            if row_major:
                assert made is not NotImplemented, (sizes, strides)


@pytest.mark.parametrize("output", [False, True])
def test_a_view_reaching_address_zero_is_refused(output):
    """aligned 8, offset -2 (float32): the first element at address 0.  NumPy
    takes a buffer at address 0 for none and allocates memory of its own, so
    the view would silently be of other memory: refused by the Python form,
    declined by the accelerator."""
    raw = _packed(8, 8, -2, 2, 1)
    cache = memref.ViewCache(np.float32, output=output)
    assert isinstance(_python_view(cache, 1, raw), ValidationError)
    if memref._view_of_descriptor is not None:
        assert memref._view_of_descriptor(raw, 1, cache._spec) is NotImplemented
