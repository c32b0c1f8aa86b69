"""The identity rule of tapes over memory (kina_fx.autograd.memory.buffer_key, docs/autograd-abi.md).

A Python caller's array and the runtime's view of the same memref must be the
same tensor to a tape, whatever strides MLIR left on length-1 dimensions;
different windows of one buffer must not be.
"""
import numpy as np
import pytest

from kina_fx import memref
from kina_fx.autograd.memory import buffer_key


def runtime_view(array, dtype=np.float32):
    """The array a runtime export sees for ``array``'s memref."""
    return memref.array_of(memref.descriptor_of(array), dtype)


@pytest.mark.parametrize("shape", [(1, 2, 2), (2, 1), (1,), (1, 1), (), (3, 4)])
def test_an_array_and_the_runtime_view_of_it_are_one_tensor(shape):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    assert buffer_key(runtime_view(a)) == buffer_key(a)


def test_the_stride_of_a_length_one_dimension_does_not_count():
    base = np.zeros((4, 6), np.float32)
    row = base[1:2, :]                      # strides (6, 1) in elements
    same = np.lib.stride_tricks.as_strided(row, row.shape, (0, 4))
    assert buffer_key(row) == buffer_key(same)


def test_windows_and_aliases_of_one_buffer_are_different_tensors():
    base = np.zeros((4, 6), np.float32)
    keys = {buffer_key(base), buffer_key(base[:2]), buffer_key(base[:, ::2]), buffer_key(base.T),
            buffer_key(base.reshape(6, 4)), buffer_key(base[1:]), buffer_key(base.view(np.int32))}
    assert len(keys) == 7


def test_buffers_without_elements_share_one_identity_per_shape():
    assert buffer_key(np.zeros((0, 3), np.float32)) == buffer_key(np.empty((0, 3), np.float32))
    assert buffer_key(np.zeros((0, 3), np.float32)) != buffer_key(np.zeros((3, 0), np.float32))
