"""The tape's fast paths against their references.

* ``same_bytes`` / ``copy_bytes`` (kina_fx/_speedups_c/buffers.c) against the
  NumPy comparison and assignment a tracer uses without them: bit-for-bit
  equality (NaN payloads, -0.0), contiguous and strided buffers;
* the identity of a cached view (memref.ViewCache) and of a compiled call's
  memref, read from the descriptor's words, against the identity read from
  the array itself;
* the tracer's overwrite check (``BufferTracer.read``: memcmp straight
  against the recorded value, whose shape and type the buffer's identity
  key fixes) against the reference comparison, for every way a buffer gets
  into the table;
* the memoised shape check of a runtime op against the check itself.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kina_fx import fibers, memref
from kina_fx.autograd import memory
from kina_fx.errors import ValidationError
from kina_fx.runtime_ops import BY_NAME

SETTINGS = dict(deadline=None, max_examples=40, derandomize=True)
core = fibers.speedups
needs_core = pytest.mark.skipif(core is None, reason="needs the compiled kina_fx._speedups")

DTYPES = [np.float32, np.float16, np.float64, np.int64]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def numpy_unchanged(a, b):
    """The reference: memory._unchanged without the C comparison."""
    saved = memory._same_bytes
    memory._same_bytes = None
    try:
        return memory._unchanged(a, b)
    finally:
        memory._same_bytes = saved


def layout(a, kind):
    if kind == "contiguous" or a.ndim == 0:
        return a
    if kind == "reversed":
        return np.ascontiguousarray(a[..., ::-1])[..., ::-1]
    return np.asfortranarray(a)


@needs_core
@settings(**SETTINGS)
@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16),
       change=st.sampled_from(["none", "value", "negative zero", "nan payload", "same nan"]),
       kind=st.sampled_from(["contiguous", "reversed", "fortran"]))
def test_same_bytes_agrees_with_the_numpy_comparison(shape, dtype, seed, change, kind):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 3).astype(dtype)
    b = a.copy()
    if a.size and change != "none":
        flat = b.reshape(-1)
        if change == "value":
            flat[rng.integers(a.size)] += 1
        elif dtype != np.int64:
            i = rng.integers(a.size)
            if change == "negative zero":
                a.reshape(-1)[i], flat[i] = 0.0, -0.0
            else:
                a.reshape(-1)[i] = np.nan
                bits = a.view(f"u{a.itemsize}").reshape(-1)[i]
                flat.view(f"u{a.itemsize}")[i] = bits ^ (1 if change == "nan payload" else 0)
    a, b = layout(a, kind), layout(b, kind)
    expected = numpy_unchanged(a, b)
    got = core.same_bytes(a, b)
    assert got is NotImplemented if not (a.flags.c_contiguous and b.flags.c_contiguous) else got == expected
    assert memory._unchanged(a, b) == expected


@needs_core
@settings(**SETTINGS)
@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["contiguous", "reversed", "fortran"]))
def test_copy_bytes_writes_what_assignment_writes(shape, dtype, seed, kind):
    rng = np.random.default_rng(seed)
    src = layout((rng.standard_normal(shape) * 3).astype(dtype), kind)
    dst = layout(np.zeros(shape, dtype), kind)
    expected = dst.copy()
    expected[...] = src
    result = core.copy_bytes(dst, src)
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        assert result is True
        assert dst.tobytes() == expected.tobytes()
    else:
        assert result is NotImplemented
        assert not dst.any()              # nothing written


@needs_core
def test_copy_bytes_refuses_read_only_or_mismatched_buffers():
    src = np.arange(6, dtype=np.float32)
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False
    assert core.copy_bytes(ro, src) is NotImplemented and not ro.any()
    short = np.zeros(5, np.float32)
    assert core.copy_bytes(short, src) is NotImplemented and not short.any()
    assert core.same_bytes(src, src[:5]) is False


@settings(**SETTINGS)
@given(shape=shapes, dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16),
       change=st.sampled_from(["none", "value", "negative zero", "same value"]),
       kind=st.sampled_from(["contiguous", "reversed", "fortran"]),
       how=st.sampled_from(["constant", "produced", "given", "pending constant"]),
       fast=st.booleans())
def test_the_tracers_overwrite_check_agrees_with_the_reference(shape, dtype, seed, change, kind, how, fast):
    rng = np.random.default_rng(seed)
    values = np.asarray(rng.standard_normal(shape) * 3).astype(dtype)
    index = np.unravel_index(int(rng.integers(values.size)), shape) if values.size else None
    if change == "negative zero" and index is not None:
        values[index] = 0.0
    buffer = layout(values, kind)
    saved = memory._same_bytes
    if not fast:
        memory._same_bytes = None           # the reference comparison only
    tracer = memory.BufferTracer(strict=False)
    tracer.start()
    try:
        if how == "constant":
            tracer.declare_constant(buffer)
        elif how == "produced":
            tracer.record(buffer, buffer.copy())
        elif how == "given":
            tracer.bind(buffer, buffer.copy(), buffer.copy())
        else:                               # a lenient tape's unknown buffer, taken for a constant
            tracer.read(buffer, "x")
        (entry,) = tracer.table.values()
        # what lets read() compare bytes straight away: the recorded value has the buffer's shape and type
        assert entry.value.shape == buffer.shape and entry.value.dtype == buffer.dtype
        recorded = np.array(entry.value, copy=True)
        if index is not None:
            if change == "value":
                buffer[index] += 1
            elif change == "negative zero":
                buffer[index] = -0.0
            elif change == "same value":
                buffer[index] = values[index]
        if numpy_unchanged(buffer, recorded):
            assert tracer.read(buffer, "x") is entry.tensor
        else:
            assert change in ("value", "negative zero")
            with pytest.raises(memory.TapeError, match="overwritten"):
                tracer.read(buffer, "x")
    finally:
        tracer.stop()
        memory._same_bytes = saved


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2**16), offset=st.integers(0, 3),
       kind=st.sampled_from(["contiguous", "reversed", "fortran", "step"]))
def test_identities_from_words_equal_the_arrays_own(shape, seed, offset, kind):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    a = a[::2] if kind == "step" and a.ndim else layout(a, kind if kind != "step" else "contiguous")
    m = memref.from_numpy(a, offset if a.size else 0)
    reference = memref._identity_of(a)
    assert m.identity(a.dtype) == reference
    view = memref.ViewCache(np.float32).view(m.pointer)
    assert memref.identity(view) == reference == memref._identity_of(view)


@pytest.mark.parametrize("name", ["matmul", "add", "softmax", "sum"])
def test_a_memoised_check_gives_the_checks_verdict(name):
    op = BY_NAME[name]
    cases = {
        "matmul": [((2, 3), (3, 4), ()), ((2, 3), (4, 4), ())],
        "add": [((2, 3), (3,), ()), ((2, 3), (2,), ())],
        "softmax": [((2, 3), None, (1,)), ((2, 3), None, (2,))],
        "sum": [((2, 3), None, (1, 0)), ((2, 3), None, (1, 7))],
    }[name]
    for _ in range(2):                       # the second round answers from the memo
        for a_shape, b_shape, params in cases:
            args = [np.zeros(a_shape, np.float32)] + ([np.zeros(b_shape, np.float32)] if b_shape else [])
            try:
                shape = op.check(*args, *params)
            except ValidationError as exc:
                with pytest.raises(ValidationError) as refused:
                    op.check_output(np.zeros((1, 1), np.float32), *args, *params)
                assert str(refused.value) == str(exc)
                continue
            op.check_output(np.zeros(shape, np.float32), *args, *params)
            with pytest.raises(ValidationError, match="out has shape"):
                op.check_output(np.zeros(tuple(n + 1 for n in shape) or (1,), np.float32),
                                *args, *params)


# --- a binary op with a Python number: the node takes the elementwise rule itself ---

SCALAR_OPS = {
    "+": (lambda x, c: x + c, lambda x, c: c + x),
    "-": (lambda x, c: x - c, lambda x, c: c - x),
    "*": (lambda x, c: x * c, lambda x, c: c * x),
    "/": (lambda x, c: x / c, lambda x, c: c / x),
    "**": (lambda x, c: x ** c, lambda x, c: c ** x),
}


def central_difference(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


@settings(**SETTINGS)
@given(op=st.sampled_from(sorted(SCALAR_OPS)), side=st.integers(0, 1),
       shape=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
       c=st.sampled_from([2, 3, 1.5, 0.5, -2.0]), seed=st.integers(0, 2**16))
def test_a_python_number_partner_gives_the_gradient_and_the_second_derivative(op, side, shape, c, seed):
    """``x * 1.5``, ``2 - x``, ...: the node records the elementwise rule
    without its unbroadcast wrapper (nothing is broadcast against a Python
    number); first and second derivatives against central differences, and
    against the same op with the number as a broadcast (1,)-shaped array,
    which takes the wrapper."""
    from kina_fx import autograd as ad

    fn = SCALAR_OPS[op][side]
    x = np.random.default_rng(seed).uniform(0.5, 2.0, shape)

    def f(v):
        return ad.sum(ad.sin(fn(v, c)))

    def f_array(v):
        return ad.sum(ad.sin(fn(v, np.full((1,) * max(1, len(shape)), float(c)))))

    grad = np.asarray(ad.grad(f)(x))
    assert grad.shape == x.shape
    np.testing.assert_allclose(grad, central_difference(lambda v: float(f(v)), x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, np.asarray(ad.grad(f_array)(x)).reshape(shape), rtol=1e-12, atol=1e-12)
    second = np.asarray(ad.grad(lambda v: ad.sum(ad.grad(f)(v)))(x))
    np.testing.assert_allclose(second, central_difference(lambda v: float(ad.sum(ad.grad(f)(v))), x),
                               rtol=1e-4, atol=1e-6)
