"""Check order at the memref ABI: a call is validated before anything is
allocated, copied, read for computing or written (docs/abi.md, "Check order").

Each export is called with operands that lie on a page nobody may touch
(PROT_NONE), all at the same address (so that the memmove paths, which copy
an input overlapping the output, are taken), with sizes of 2^40 elements or
more and an output shape that disagrees with the inputs.  The only right
answer is status 1 naming the shapes: a copy made before validating would try
to allocate terabytes (status 2), and a read would crash.  Integer operands
(indices, labels, permutations), which validation reads, are real buffers.
"""
from __future__ import annotations

import pytest

from support.abi import Abi, memref_at, mismatched_huge_call, untouchable_page
from support.tapes import LENIENT, Tape
from kina_fx.errors import Status
from kina_fx.runtime_ops import BY_NAME, RUNTIME_OPS


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


@pytest.fixture(scope="module")
def abi():
    return Abi()


@pytest.fixture(scope="module")
def untouchable():
    with untouchable_page() as address:
        yield address


@pytest.fixture(params=["untaped", "lenient tape"])
def taped(request, abi):
    """Each call untaped, and under a lenient tape (which copies unknown inputs:
    after validating)."""
    if request.param == "untaped":
        yield
        return
    tape = Tape(abi, LENIENT)
    yield
    tape.free()


@pytest.mark.parametrize("op", RUNTIME_OPS, ids=lambda op: op.name)
def test_a_mismatched_output_is_refused_before_any_copy_or_read(abi, untouchable, taped, op):
    status = abi.call(op.export, *mismatched_huge_call(op, untouchable))
    assert status == Status.VALIDATION, abi.last_error()
    assert "shape" in abi.last_error()


def test_copy_to_host_of_mismatched_overlapping_huge_buffers(abi, untouchable, taped):
    """The finding: dst [2^48] and src [2^48 + 1] at one address tried to
    allocate 1 PiB for the memmove copy (status 2) before seeing the shapes."""
    op = BY_NAME["copy_to_host_f32"]
    status = abi.call(op.export, memref_at(untouchable, (1 << 48,)), memref_at(untouchable, ((1 << 48) + 1,)))
    assert status == Status.VALIDATION, abi.last_error()
    assert "shape" in abi.last_error()
