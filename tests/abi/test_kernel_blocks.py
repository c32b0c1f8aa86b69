"""The kernels' blocked, multi-threaded path (kina_fx.kernel_threads) against their one-call path.

Large NumPy operands are cut into row blocks spread over a thread pool.  Here
the thresholds are lowered so that small generated arrays take that path with
many blocks on several threads, and every result is compared with the same
kernel run as one call (and with a float64 reference where the formula
changed).  Also: overlapping outputs, the caller's floating-point error state
in the workers, an exception in a worker, and a forked child.
"""
from __future__ import annotations

import multiprocessing
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kina_fx import fibers, gpu_ops, kernel_threads

# The fixture only sets thresholds, the same for every example.
SETTINGS = dict(deadline=None, max_examples=25, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def blocked(monkeypatch):
    """Every array of 2+ elements takes the blocked path, in blocks of a few rows, on 3 threads."""
    monkeypatch.setattr(kernel_threads, "PARALLEL_MIN_ELEMENTS", 2)
    monkeypatch.setattr(kernel_threads, "BLOCK_BYTES", 64)
    monkeypatch.setenv("KINA_FX_THREADS", "3")


def one_call(fn, *args, **kwargs):
    saved = kernel_threads.PARALLEL_MIN_ELEMENTS
    kernel_threads.PARALLEL_MIN_ELEMENTS = 1 << 62
    try:
        return fn(*args, **kwargs)
    finally:
        kernel_threads.PARALLEL_MIN_ELEMENTS = saved


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)


def arrays(shape, seed, dtype=np.float32):
    return (np.random.default_rng(seed).standard_normal(shape) * 4).astype(dtype)


def reference_log_softmax(x, axis):
    x = x.astype(np.float64)
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2**16), data=st.data())
def test_softmax_and_log_softmax_blocks_match_one_call(blocked, shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = arrays(shape, seed)
    for fn in (gpu_ops.softmax, gpu_ops.log_softmax):
        expected = one_call(fn, x, axis)
        got = fn(x, axis)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        out = np.full_like(x, np.nan)
        assert fn(x, axis, out) is out
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu_ops.log_softmax(x, axis), reference_log_softmax(x, axis),
                               rtol=1e-5, atol=1e-5)


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 12), min_size=2, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_along_axis_0_a_thread_takes_one_wide_block_with_the_one_call_values(blocked, monkeypatch,
                                                                           shape, seed):
    # runs of 2+ elements count as long: shapes of 9+ rows take one block per thread
    monkeypatch.setattr(gpu_ops, "MIN_RUN_ELEMENTS", 2)
    x = arrays(shape, seed)
    cache_run = kernel_threads.BLOCK_BYTES // (shape[0] * 4)         # 64-byte blocks: rows of 8+ are thin
    assert gpu_ops._thin_cache_blocks(x, 0) == (cache_run < 2 and -(-(x.size // shape[0]) // 3) >= 2)
    for fn in (gpu_ops.softmax, gpu_ops.log_softmax):
        expected = one_call(fn, x, 0)
        np.testing.assert_allclose(fn(x, 0), expected, rtol=1e-6, atol=1e-6)
        out = np.full_like(x, np.nan)
        fn(x, 0, out)
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu_ops.log_softmax(x, 0), reference_log_softmax(x, 0),
                               rtol=1e-5, atol=1e-5)


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_cross_entropy_blocks_match_the_reference(blocked, shape, seed):
    logits = arrays(shape, seed)
    labels = np.random.default_rng(seed + 1).integers(0, shape[-1], shape[:-1])
    picked = np.take_along_axis(reference_log_softmax(logits, -1).reshape(-1, shape[-1]),
                                labels.reshape(-1, 1), axis=1)
    expected = -picked.mean()
    got = gpu_ops.cross_entropy(logits, labels)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, one_call(gpu_ops.cross_entropy, logits, labels), rtol=1e-6)
    out = np.zeros((), np.float32)
    gpu_ops.cross_entropy(logits, labels, out)
    assert out == got


UNARY = ["exp", "tanh", "sigmoid", "relu", "neg", "log"]
BINARY = ["add", "sub", "mul", "div", "power"]


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2**16), name=st.sampled_from(UNARY))
def test_elementwise_blocks_are_bitwise_the_one_call_result(blocked, shape, seed, name):
    x = arrays(shape, seed)
    if name == "log":
        x = np.abs(x) + np.float32(0.1)
    fn = getattr(gpu_ops, name)
    expected = one_call(fn, x)
    np.testing.assert_array_equal(fn(x), expected)
    out = np.empty_like(x)
    fn(x, out)
    np.testing.assert_array_equal(out, expected)
    fn(x, x)                                   # in place
    np.testing.assert_array_equal(x, expected)


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2**16), name=st.sampled_from(BINARY), data=st.data())
def test_binary_blocks_broadcast_as_one_call(blocked, shape, seed, name, data):
    # the other operand: the same shape, a suffix of it, or ones in some dimensions
    other = tuple(data.draw(st.sampled_from([n, 1])) for n in shape)[data.draw(st.integers(0, len(shape))):]
    a, b = arrays(shape, seed), arrays(other, seed + 1)
    if name in ("power", "div"):
        a, b = np.abs(a) + np.float32(0.5), np.abs(b) + np.float32(0.5)
    if data.draw(st.booleans()):
        a, b = b, a
    fn = getattr(gpu_ops, name)
    expected = one_call(fn, a, b)
    np.testing.assert_array_equal(fn(a, b), expected)
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.float32)
    fn(a, b, out)
    np.testing.assert_array_equal(out, expected)


UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "power": np.power}


@pytest.mark.parametrize("threads", ["1", "3"])
@settings(**SETTINGS)
@given(rows=st.integers(1, 40), trailing=st.lists(st.integers(1, 5), min_size=1, max_size=2).map(tuple),
       leading_ones=st.integers(0, 2), seed=st.integers(0, 2**16), name=st.sampled_from(BINARY),
       data=st.data())
def test_a_short_repeating_operand_tiled_into_wide_rows_gives_numpys_values(
        monkeypatch, threads, rows, trailing, leading_ones, seed, name, data):
    # Rows of 12 elements from operands repeating every <= 6: every shape
    # here with 48+ elements takes the tiled path (counted), the rest not.
    monkeypatch.setattr(gpu_ops, "WIDE_ROW_ELEMENTS", 12)
    monkeypatch.setattr(gpu_ops, "SHORT_PERIOD", 6)
    monkeypatch.setattr(kernel_threads, "PARALLEL_MIN_ELEMENTS", 2)
    monkeypatch.setenv("KINA_FX_THREADS", threads)
    wide = []
    real = gpu_ops._in_wide_rows
    monkeypatch.setattr(gpu_ops, "_in_wide_rows", lambda *args: wide.append(1) or real(*args))
    full_shape = (rows, *trailing)
    small_dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    a, b = arrays(full_shape, seed), arrays((1,) * leading_ones + trailing, seed + 1, small_dtype)
    if name in ("power", "div"):
        a, b = np.abs(a) + np.float32(0.5), np.abs(b) + small_dtype(0.5)
    swapped = data.draw(st.booleans())
    if swapped:
        a, b = b, a
    fn, expected = getattr(gpu_ops, name), UFUNCS[name](a, b)
    np.testing.assert_array_equal(fn(a, b), expected)
    out = np.full(expected.shape, np.nan, expected.dtype)
    assert fn(a, b, out) is out
    np.testing.assert_array_equal(out, expected)
    full = b if swapped else a
    period = int(np.prod(trailing))
    assert bool(wide) == (full.shape == expected.shape and 2 <= period <= 6 and full.size >= 48)
    if full.shape == expected.shape and full.dtype == expected.dtype:    # in place
        fn(*((a, full) if swapped else (full, b)), full)
        np.testing.assert_array_equal(full, expected)


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 40), min_size=2, max_size=3).map(tuple), seed=st.integers(0, 2**16),
       name=st.sampled_from(["sum", "mean", "max"]), dtype=st.sampled_from([np.float32, np.float64]),
       keepdims=st.booleans(), data=st.data())
def test_reductions_over_one_axis_in_blocks_are_bitwise_numpys(blocked, shape, seed, name, dtype,
                                                             keepdims, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = arrays(shape, seed, dtype)
    if data.draw(st.booleans()):                # NaNs, and zeros of both signs, for max
        x.flat[data.draw(st.integers(0, x.size - 1))] = np.nan
        x.flat[data.draw(st.integers(0, x.size - 1))] = -0.0
    expected = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    fn = getattr(gpu_ops, "reduce_" + name)
    got = fn(x, axis, keepdims)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    out = np.full(expected.shape, 7, dtype)
    assert fn(x, axis, keepdims, out=out) is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("columns", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("order", ["C", "F"])
def test_sums_over_axis_0_in_blocks_add_in_numpys_order(monkeypatch, threads, columns, order):
    # A block of one column is summed pairwise, the whole row after row: such
    # splits (and non-C-contiguous inputs) run as one call.
    monkeypatch.setattr(kernel_threads, "PARALLEL_MIN_ELEMENTS", 2)
    monkeypatch.setenv("KINA_FX_THREADS", threads)
    for rows in (9, 40, 1000):
        x = np.asarray(arrays((rows, columns, 1)[:2 if columns > 1 else 3], rows), order=order)
        for name in ("sum", "mean"):
            for axis in range(x.ndim):
                np.testing.assert_array_equal(getattr(gpu_ops, "reduce_" + name)(x, axis, False),
                                              getattr(np, name)(x, axis=axis))


@pytest.mark.parametrize("classes", [2, 10, gpu_ops.SHORT_AXIS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_over_a_short_last_axis_is_numpys_nans_and_infinities_included(blocked, classes, dtype):
    x = arrays((600, classes), classes, dtype)
    x[3, classes - 1] = x[5, 0] = np.nan                  # NaN last, NaN first
    x[7], x[9, 0] = -np.inf, np.inf                       # a row of -inf, an inf among numbers
    x[11, :] = 0.0
    x[11, 0] = -0.0
    for keepdims in (False, True):
        expected = np.max(x, axis=-1, keepdims=keepdims)
        np.testing.assert_array_equal(gpu_ops.reduce_max(x, -1, keepdims), expected)
        np.testing.assert_array_equal(one_call(gpu_ops.reduce_max, x, 1, keepdims), expected)


AUTOGRAD_UNARY = ["exp", "log", "tanh", "sin", "arctan", "abs", "expm1", "sqrt"]


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2**16), unary=st.sampled_from(AUTOGRAD_UNARY),
       binary=st.sampled_from(["add", "sub", "mul", "div"]), data=st.data())
def test_autograds_kernels_in_blocks_give_numpys_values_and_gradients(blocked, shape, seed, unary,
                                                                        binary, data):
    # A large array takes the runtime's row blocks in autograd's one-input
    # NumPy kernels (here: every array of 2+ elements, on 3 threads): values
    # and gradients are one call's, bit for bit.
    from kina_fx import autograd as ad

    other = tuple(data.draw(st.sampled_from([n, 1])) for n in shape)[data.draw(st.integers(0, len(shape))):]
    x = np.abs(arrays(shape, seed, np.float64)) + 0.5
    y = np.abs(arrays(other, seed + 1, np.float64)) + 0.5
    ufunc = getattr(np, unary)
    operator = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[binary]

    def f(x, y):
        return ad.sum(getattr(ad, binary)(getattr(ad, unary)(x), y))

    expected_value = np.sum(operator(ufunc(x), y))
    value, grads = ad.value_and_grad(f, argnums=(0, 1))(x, y)
    unblocked_value, unblocked_grads = one_call(ad.value_and_grad(f, argnums=(0, 1)), x, y)
    assert float(value) == float(expected_value) == float(unblocked_value)
    for g, u in zip(grads, unblocked_grads):
        np.testing.assert_array_equal(g, u)
    np.testing.assert_array_equal(getattr(ad, unary)(x), ufunc(x))      # an array in, an array out


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "exp", "add"])
def test_an_output_overlapping_its_input_gets_the_values_of_a_copy(blocked, name):
    buf = arrays((41, 7), 3)
    src = buf[1:].copy()
    fn = getattr(gpu_ops, name)
    args = (src, 1) if "softmax" in name else (src, src) if name == "add" else (src,)
    expected = one_call(fn, *args)
    args = (buf[1:], 1) if "softmax" in name else (buf[1:], buf[1:]) if name == "add" else (buf[1:],)
    fn(*args, out=buf[:-1])
    np.testing.assert_allclose(buf[:-1], expected, rtol=1e-6, atol=1e-7)


def test_workers_run_under_the_callers_floating_point_error_state(blocked):
    x = -np.ones((64, 8), np.float32)
    with np.errstate(all="raise"):
        with pytest.raises(FloatingPointError):
            gpu_ops.log(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="ignore"):
            assert np.isnan(gpu_ops.log(x)).all()


def test_an_exception_in_a_worker_reaches_the_caller_and_the_pool_goes_on(blocked):
    seen = []

    def body(index):
        seen.append(index)
        if len(seen) == 5:
            raise ZeroDivisionError("block 5")

    with pytest.raises(ZeroDivisionError, match="block 5"):
        kernel_threads.run_blocks(np, (40, 4), 160, 4, 0, body)
    assert len(seen) == 40 // 4 or len(seen) >= 5       # the other blocks still ran or stopped
    x = arrays((40, 4), 1)
    np.testing.assert_allclose(gpu_ops.softmax(x, 1), one_call(gpu_ops.softmax, x, 1), rtol=1e-6)


def test_blocks_cover_the_index_space_once(blocked):
    marks = np.zeros((37, 5), np.int64)

    def body(index):
        marks[index] += 1

    kernel_threads.run_blocks(np, marks.shape, marks.size, 8, 0, body)
    assert (marks == 1).all()
    marks[...] = 0
    kernel_threads.run_blocks(np, marks.shape, marks.size, 8, 1, body)
    assert (marks == 1).all()
    marks[...] = 0
    kernel_threads.run_blocks(np, marks.shape, marks.size, 8, None, body)
    assert (marks == 1).all()


def test_the_blocks_results_come_back_in_block_order(blocked):
    for split, one_pass in ((0, False), (1, False), (0, True), (None, False)):
        starts = kernel_threads.run_blocks(np, (37, 5), 185, 8, split,
                                           lambda index: index[split or 0].start or 0, one_pass)
        assert starts == sorted(starts) and starts[0] == 0
        assert len(starts) == (1 if split is None else len(set(starts)))


def test_a_one_pass_kernel_gets_one_block_per_thread(blocked):
    marks = np.zeros((37, 5), np.int64)
    seen = []

    def body(index):
        seen.append(index[0])
        marks[index] += 1

    kernel_threads.run_blocks(np, marks.shape, marks.size, 8, 0, body, one_pass=True)
    assert (marks == 1).all()
    assert sorted((s.start, s.stop) for s in seen) == [(0, 13), (13, 26), (26, 37)]   # 3 threads


def test_the_cache_block_is_half_an_l2_within_bounds():
    assert 64 << 10 <= kernel_threads.BLOCK_BYTES <= 1 << 20
    assert kernel_threads._cache_block_bytes() == kernel_threads.BLOCK_BYTES


def _softmax_in_child(queue):
    x = arrays((64, 9), 5)
    queue.put(np.asarray(gpu_ops.softmax(x, 1)).tolist())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_builds_its_own_pool(blocked):
    x = arrays((64, 9), 5)
    expected = gpu_ops.softmax(x, 1)          # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_softmax_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    np.testing.assert_allclose(np.array(got, np.float32), expected, rtol=1e-6)


def test_thread_count_follows_the_environment(monkeypatch):
    monkeypatch.setenv("KINA_FX_THREADS", "5")
    assert kernel_threads.thread_count() == 5
    monkeypatch.setenv("KINA_FX_THREADS", "junk")
    assert kernel_threads.thread_count() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("KINA_FX_THREADS")
    assert kernel_threads.thread_count() == len(os.sched_getaffinity(0))


# ---- sigmoid's formula path (large float arrays) -------------------------------------------

@pytest.mark.parametrize("shape", [(300, 300), (700, 700)])   # one call; blocks on threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_sigmoid_is_the_formula_to_a_few_ulps_and_reports_nothing(shape, dtype):
    assert np.prod(shape) >= gpu_ops.SIGMOID_FORMULA_MIN
    x = (np.random.default_rng(7).standard_normal(shape) * 30).astype(dtype)
    x.flat[:8] = [0.0, -0.0, 100.0, -100.0, np.inf, -np.inf, 1e30, -1e30]
    x.flat[8] = np.nan
    with np.errstate(over="ignore"):                         # exp(1e30) = inf: 1 / inf = 0
        want = 1 / (1 + np.exp(-x.astype(np.float64)))
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gpu_ops.sigmoid(x)
        out = np.empty_like(x)
        gpu_ops.sigmoid(x, out)
        inplace = x.copy()
        gpu_ops.sigmoid(inplace, inplace)
    assert got.dtype == dtype
    # Within 4 units in the last place, or (results below the smallest normal
    # number: exp(-x) overflowed, 1 / inf = 0) within that smallest normal.
    finite = ~np.isnan(want)
    error = np.abs(got[finite] - want[finite])
    ulp = np.spacing(want[finite].astype(dtype)).astype(np.float64)
    assert np.all((error <= 4 * ulp) | (error <= np.finfo(dtype).tiny))
    assert np.isnan(got.flat[8])
    np.testing.assert_array_equal(out, got)
    np.testing.assert_array_equal(inplace, got)


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_sigmoid_formula_blocks_are_bitwise_the_one_call_result(blocked, monkeypatch, shape, seed):
    monkeypatch.setattr(gpu_ops, "SIGMOID_FORMULA_MIN", 1)
    x = arrays(shape, seed) * 10
    expected = one_call(gpu_ops.sigmoid, x)
    with np.errstate(over="ignore"):
        formula = 1 / (1 + np.exp(-x))                      # the formula, in float32
    if gpu_ops._fused_logistic_f32 is None:
        np.testing.assert_array_equal(expected, formula)
    else:                                                   # the accelerator's one-pass loop
        assert_within_ulps(expected, formula, 4)
    np.testing.assert_array_equal(gpu_ops.sigmoid(x), expected)


def assert_within_ulps(got, want, ulps):
    """Each element within ``ulps`` units in the last place of ``want`` (float32),
    or both below the smallest normal number; NaN where ``want`` is NaN."""
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    tiny = np.finfo(np.float32).tiny
    g, w = got[~nan].astype(np.float64), want[~nan].astype(np.float64)
    spacing = np.spacing(np.abs(want[~nan]).astype(np.float32)).astype(np.float64)
    ok = (np.abs(g - w) <= ulps * spacing) | ((np.abs(g) < tiny) & (np.abs(w) < tiny))
    assert ok.all(), list(zip(g[~ok][:5], w[~ok][:5]))


def fused_logistic(x, out=None):
    out = np.empty_like(x) if out is None else out
    assert fibers.speedups.logistic_f32(x, out) is True
    return out


@pytest.mark.only_impl("compiled")          # the accelerator's own loop
def test_the_one_pass_float32_logistic_against_float64_and_the_formula():
    rng = np.random.default_rng(3)
    sweep = np.arange(-110.0, 110.0, 1 / 512).astype(np.float32)             # every 1/512
    patterns = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 87.33654, -87.33654, 87.3365,
                        -87.3365, 88.72, -88.72, 1e-45, -1e-45, 1.1754944e-38, 3e38, -3e38,
                        16.635532, 17.0, -17.0], np.float32)
    for x in (sweep, patterns, special):
        got = fused_logistic(x)
        with np.errstate(over="ignore", invalid="ignore"):
            exact = 1 / (1 + np.exp(-x.astype(np.float64)))
            formula = 1 / (1 + np.exp(-x))
        assert_within_ulps(got, exact.astype(np.float32), 3)
        assert_within_ulps(got, formula, 4)
        below = exact < np.finfo(np.float32).tiny
        assert (got[below] == 0).all()                     # 0 below the smallest normal, as documented
        assert ((got >= 0) & (got <= 1) | np.isnan(got)).all()
    np.testing.assert_array_equal(fused_logistic(special)[:4], [0.5, 0.5, 1.0, 0.0])


@pytest.mark.only_impl("compiled")          # the accelerator's own loop
@pytest.mark.skipif(not os.environ.get("KINA_FX_SOAK"), reason="every float32 input: KINA_FX_SOAK=1 (~3 min)")
def test_the_one_pass_logistic_over_every_float32_input():
    """All 2^32 inputs against the float64 result: at most 2.5 units in the
    last place, NaN exactly for NaN, 0 below the smallest normal number,
    nothing outside [0, 1] (docs/abi.md, "Runtime ops: the table")."""
    tiny = np.finfo(np.float32).tiny
    chunk = 1 << 25
    out = np.empty(chunk, np.float32)
    worst = 0.0
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        assert fibers.speedups.logistic_f32(x, out) is True
        with np.errstate(all="ignore"):
            exact = 1 / (1 + np.exp(-x.astype(np.float64)))
        nan = np.isnan(x)
        assert np.array_equal(np.isnan(out), nan)
        got, exact = out[~nan].astype(np.float64), exact[~nan]
        assert ((got >= 0) & (got <= 1)).all()
        below = exact < tiny
        assert (got[below] == 0).all()
        spacing = np.spacing(exact[~below].astype(np.float32)).astype(np.float64)
        errors = np.abs(got[~below] - exact[~below]) / spacing
        worst = max(worst, float(errors.max(initial=0.0)))
    assert worst <= 2.5, worst


@pytest.mark.only_impl("compiled")          # the accelerator's own loop
def test_the_one_pass_logistic_takes_only_buffers_it_can_and_writes_nothing_otherwise():
    logistic = fibers.speedups.logistic_f32
    x = np.linspace(-5, 5, 64, dtype=np.float32)
    want = fused_logistic(x)
    inplace = x.copy()
    assert logistic(inplace, inplace) is True               # the same memory: in place
    np.testing.assert_array_equal(inplace, want)
    declined = [
        (x.astype(np.float64), np.empty(64)),               # float64
        (x, np.empty(64, np.float64)),
        (x[::2], np.empty(32, np.float32)),                 # strided
        (x, np.empty(63, np.float32)),                      # another length
        (x, np.empty(64, np.float32)[::-1]),                # not C-contiguous
        (x.astype(">f4"), np.empty(64, np.float32)),        # not native
    ]
    frozen = np.empty(64, np.float32)
    frozen.flags.writeable = False
    declined.append((x, frozen))
    shared = np.zeros(96, np.float32)
    shared[:64] = x
    declined.append((shared[:64], shared[32:]))              # partly the same memory
    for src, dst in declined:
        before = np.array(dst, copy=True)
        assert logistic(src, dst) is NotImplemented
        np.testing.assert_array_equal(dst, before)
    assert logistic(b"1234", bytearray(4)) is NotImplemented
    with pytest.raises(TypeError):
        logistic(x)
    # gpu_ops.sigmoid falls back to the formula for what the loop declines
    big = np.linspace(-30, 30, 1 << 18, dtype=np.float32)
    with np.errstate(over="ignore"):
        assert_within_ulps(gpu_ops.sigmoid(big[::2]), 1 / (1 + np.exp(-big[::2])), 0)


def test_float16_and_small_sigmoids_keep_the_one_call_kernel():
    x = np.linspace(-12, 12, 1 << 17).astype(np.float16)    # exp(12) overflows float16
    got = gpu_ops.sigmoid(x)
    want = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=1e-7)
    assert got[0] > 0                                      # the formula in float16 would give 0


@pytest.mark.parametrize("n", [3, 1 << 17, 1 << 19])     # expit; the formula; the formula in blocks
def test_sigmoid_names_itself_when_out_is_the_wrong_shape(n):
    from kina_fx.errors import ValidationError
    with pytest.raises(ValidationError, match=r"^sigmoid: out has shape"):
        gpu_ops.sigmoid(np.zeros(n, np.float32), np.zeros(n + 1, np.float32))


# ---- softmax cross-entropy's fused loops (kina_fx/_speedups_c/kernels.c) ----------

SPECIAL_LOGITS = [np.nan, np.inf, -np.inf, 3e38, -3e38, 88.0, -88.0, 0.0]


def cross_entropy_formula(logits, labels, scale):
    """Per-row losses (float64) and the scaled gradient by NumPy's ufuncs in
    float32, whose NaNs the loops must reproduce."""
    rows = np.arange(labels.size)
    with np.errstate(all="ignore"):
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        losses = (np.log(s)[:, 0] + m[:, 0]).astype(np.float64) - logits[rows, labels]
        p = e / s
        p[rows, labels] -= 1
        p *= np.float32(scale)
    return losses, p


def cross_entropy_float64(logits, labels, scale):
    x = logits.astype(np.float64)
    rows = np.arange(labels.size)
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=1, keepdims=True)
    p = e / s
    p[rows, labels] -= 1
    return (np.log(s)[:, 0] + m[:, 0] - x[rows, labels]).sum(), p * scale


@pytest.mark.only_impl("compiled")          # the accelerator's own loops
@settings(deadline=None, max_examples=200, derandomize=True)
@given(rows=st.integers(1, 40), classes=st.integers(1, 40), seed=st.integers(0, 2**16),
       spread=st.sampled_from([0.1, 1.0, 30.0, 1e3]), specials=st.integers(0, 3),
       scale=st.sampled_from([1.0, 0.25, 1 / 3, -2.0]))
def test_the_fused_cross_entropy_against_float64_and_the_formula(rows, classes, seed, spread,
                                                                 specials, scale):
    """Short rows go sixteen at a time (transposed), the rest and longer rows
    one at a time: both against float64 and, where a row has NaN or an
    infinity, against the NaNs the NumPy formula gives."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, classes)) * spread).astype(np.float32)
    for _ in range(specials):
        logits[rng.integers(rows), rng.integers(classes)] = rng.choice(SPECIAL_LOGITS)
    labels = rng.integers(0, classes, rows)
    losses, formula_grad = cross_entropy_formula(logits, labels, scale)
    total = fibers.speedups.cross_entropy_sum_f32(logits, labels)
    grad = np.full_like(logits, 7.0)
    assert fibers.speedups.cross_entropy_grad_f32(logits, labels, scale, grad) is True
    want = losses.sum()
    assert np.array_equal(np.isnan(grad), np.isnan(formula_grad))
    if np.isnan(want) or np.isinf(want):
        assert total == want or (np.isnan(total) and np.isnan(want))
        ok = ~np.isnan(grad)
        np.testing.assert_allclose(grad[ok], formula_grad[ok], rtol=1e-5, atol=1e-6)
        return
    exact_total, exact_grad = cross_entropy_float64(logits, labels, scale)
    # float32 inputs to the exponentials: a few units in the last place of each row's terms
    tolerance = 4 * np.finfo(np.float32).eps * np.abs(logits.astype(np.float64)).max(axis=1).clip(1).sum()
    assert abs(total - exact_total) <= tolerance
    np.testing.assert_allclose(grad, exact_grad, rtol=2e-6, atol=4e-7 * abs(scale))
    np.testing.assert_allclose(grad, formula_grad, rtol=2e-6, atol=4e-7 * abs(scale))


@pytest.mark.only_impl("compiled")          # the accelerator's own loops
def test_the_fused_cross_entropy_takes_only_buffers_it_can_and_writes_nothing_otherwise():
    ce_sum, ce_grad = fibers.speedups.cross_entropy_sum_f32, fibers.speedups.cross_entropy_grad_f32
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((20, 6)).astype(np.float32)
    labels = rng.integers(0, 6, 20)
    inplace = logits.copy()
    assert ce_grad(inplace, labels, 0.5, inplace) is True       # the same memory: in place
    want = np.empty_like(logits)
    ce_grad(logits, labels, 0.5, want)
    np.testing.assert_array_equal(inplace, want)
    declined_sum = [
        (logits.astype(np.float64), labels),                    # float64 logits
        (logits, labels.astype(np.int32)),                      # other labels
        (logits, labels.astype(">i8")),                         # not native
        (logits[:, ::2], labels),                               # strided
        (logits, labels[:19]),                                  # a label short
        (np.float32(1.0), labels[:1]),                          # rank 0
        (np.empty((0, 6), np.float32), labels[:0]),             # no rows
        (np.empty((4, 0), np.float32), labels[:4]),             # no classes
        (b"1234", labels[:1]),
    ]
    for args in declined_sum:
        assert ce_sum(*args) is NotImplemented
    shared = np.zeros(20 * 6 + 3, np.float32)
    shared[:120] = logits.ravel()
    declined_grad = [
        (logits, labels, np.empty((20, 6), np.float64)),
        (logits, labels, np.empty((20, 5), np.float32)),
        (logits, labels, np.empty((6, 20), np.float32).T),      # not C-contiguous
        (shared[:120].reshape(20, 6), labels, shared[3:].reshape(20, 6)),   # partly the same memory
        (logits[:, ::2], labels, np.empty((20, 3), np.float32)),
    ]
    frozen = np.empty_like(logits)
    frozen.flags.writeable = False
    declined_grad.append((logits, labels, frozen))
    for x, y, out in declined_grad:
        before = np.array(out, copy=True)
        assert ce_grad(x, y, 0.5, out) is NotImplemented
        np.testing.assert_array_equal(out, before)
    for bad in (-1, 6, 2**40):                                  # a label out of range: None
        wrong = labels.copy()
        wrong[17] = bad
        out = np.full_like(logits, 7.0)
        assert ce_sum(logits, wrong) is None
        assert ce_grad(logits, wrong, 0.5, out) is None
        assert (out == 7.0).all()
    in_range = fibers.speedups.labels_in_range_i64
    assert in_range(labels, 6) is True and in_range(labels, int(labels.max())) is False
    assert in_range(np.array([-1, 0]), 6) is False
    assert in_range(labels.astype(np.int32), 6) is NotImplemented
    assert in_range(labels[::2], 6) is NotImplemented
    with pytest.raises(TypeError):
        ce_grad(logits, labels, "half", want)
    with pytest.raises(TypeError):
        ce_sum(logits)


@pytest.mark.only_impl("compiled")          # which path gpu_ops takes
def test_cross_entropy_and_its_gradient_take_the_fused_loops_where_they_can(blocked):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((37, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 37)
    loss = one_call(gpu_ops.cross_entropy, logits, labels)
    assert loss == np.float32(fibers.speedups.cross_entropy_sum_f32(logits, labels) / 37)
    # blocks of a few rows (the fixture): their float64 sums added in order
    np.testing.assert_allclose(gpu_ops.cross_entropy(logits, labels), loss, rtol=1e-7)
    fused = np.empty_like(logits)
    fibers.speedups.cross_entropy_grad_f32(logits, labels, 0.5, fused)
    # a row's gradient does not depend on how the rows are cut into blocks
    np.testing.assert_array_equal(gpu_ops.cross_entropy_grad(logits, labels, np.float32(0.5)), fused)
    np.testing.assert_array_equal(one_call(gpu_ops.cross_entropy_grad, logits, labels, 0.5), fused)
    # what the loops decline takes the formula, which agrees
    wide = np.repeat(logits, 2, axis=1)[:, ::2]
    np.testing.assert_allclose(gpu_ops.cross_entropy(wide, labels), loss, rtol=1e-6)
    np.testing.assert_allclose(gpu_ops.cross_entropy_grad(wide, labels, np.float64(0.5)), fused,
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("many_blocks", [False, True])
@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_cross_entropy_names_a_label_out_of_range_and_writes_nothing(monkeypatch, many_blocks, bad):
    if many_blocks:
        monkeypatch.setattr(kernel_threads, "PARALLEL_MIN_ELEMENTS", 2)
        monkeypatch.setattr(kernel_threads, "BLOCK_BYTES", 64)
        monkeypatch.setenv("KINA_FX_THREADS", "3")
    logits = np.random.default_rng(2).standard_normal((40, 10)).astype(np.float32)
    labels = np.arange(40) % 10
    labels[33] = bad
    out = np.full((), 7.0, np.float32)
    with pytest.raises(gpu_ops.ValidationError, match=f"label {bad} out of range"):
        gpu_ops.cross_entropy(logits, labels, out)
    assert out == 7.0
    with pytest.raises(gpu_ops.ValidationError, match=f"label {bad} out of range"):
        gpu_ops.cross_entropy(logits.astype(np.float64), labels)


@pytest.mark.only_impl("compiled")          # the accelerator's own loop
@settings(deadline=None, max_examples=200, derandomize=True)
@given(rows=st.integers(1, 40), classes=st.integers(1, 40), seed=st.integers(0, 2**16),
       spread=st.sampled_from([0.1, 1.0, 30.0, 1e3]), specials=st.integers(0, 3),
       log=st.booleans())
def test_the_fused_softmax_rows_against_float64_and_the_formula(rows, classes, seed, spread, specials,
                                                                log):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, classes)) * spread).astype(np.float32)
    for _ in range(specials):
        x[rng.integers(rows), rng.integers(classes)] = rng.choice(SPECIAL_LOGITS)
    got = np.full_like(x, 7.0)
    assert fibers.speedups.softmax_rows_f32(x, got, log) is True
    with np.errstate(all="ignore"):
        m = x.max(axis=1, keepdims=True)
        e = np.exp(x - m)
        s = e.sum(axis=1, keepdims=True)
        formula = x - (np.log(s) + m) if log else e / s
        exact = reference_log_softmax(x, 1)
        # (beyond float32's range, as both compute it: -3e38 - 3e38 is -inf)
        exact = (exact if log else np.exp(exact)).astype(np.float32).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(formula))
    # log_softmax is x - lse: its error is a few units in the last place of the row's largest |x|
    spacing = np.spacing(np.abs(x).max(axis=1, keepdims=True)) if log else np.float32(0)
    for want in (formula, exact):
        with np.errstate(invalid="ignore"):         # inf - inf where both are infinite
            error = np.abs(got.astype(np.float64) - want)
        bad = (error > 4 * spacing + 3e-6 * np.abs(want) + 3e-7) | (np.isinf(got) & (got != want))
        assert not bad[~np.isnan(want)].any(), (got[bad][:4], want[bad][:4])
    inplace = x.copy()
    assert fibers.speedups.softmax_rows_f32(inplace, inplace, log) is True
    np.testing.assert_array_equal(inplace, got)


@pytest.mark.only_impl("compiled")          # which path gpu_ops takes
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_rows_take_the_fused_loop_whatever_the_blocks(blocked, name):
    x = arrays((37, 3, 10), 5)
    fused = np.empty_like(x)
    assert fibers.speedups.softmax_rows_f32(x, fused, name == "log_softmax") is True
    fn = getattr(gpu_ops, name)
    np.testing.assert_array_equal(fn(x, -1), fused)               # blocks of a few rows
    np.testing.assert_array_equal(one_call(fn, x, 2), fused)
    out = x.copy()
    np.testing.assert_array_equal(fn(out, -1, out), fused)        # in place
    # what the loop declines takes the formula: another axis, a strided input, float64
    np.testing.assert_allclose(fn(x.swapaxes(1, 2).copy(), 1).swapaxes(1, 2), fused, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fn(np.repeat(x, 2, axis=2)[..., ::2], -1), fused, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fn(x.astype(np.float64), -1), fused, rtol=1e-5, atol=1e-6)


@pytest.mark.only_impl("compiled")          # the accelerator's own loop
def test_the_fused_softmax_takes_only_buffers_it_can_and_writes_nothing_otherwise():
    softmax_rows = fibers.speedups.softmax_rows_f32
    x = arrays((20, 6), 1)
    shared = np.zeros(123, np.float32)
    shared[:120] = x.ravel()
    frozen = np.empty_like(x)
    frozen.flags.writeable = False
    declined = [
        (x.astype(np.float64), np.empty((20, 6))),
        (x, np.empty((20, 6), np.float64)),
        (x[:, ::2], np.empty((20, 3), np.float32)),
        (x, np.empty((20, 5), np.float32)),
        (x, np.empty((6, 20), np.float32).T),
        (shared[:120].reshape(20, 6), shared[3:].reshape(20, 6)),
        (np.float32(1.0), np.empty((), np.float32)),              # rank 0
        (np.empty((3, 0), np.float32), np.empty((3, 0), np.float32)),   # no classes
        (x, frozen),
    ]
    for src, dst in declined:
        before = np.array(dst, copy=True)
        for log in (False, True):
            assert softmax_rows(src, dst, log) is NotImplemented
        np.testing.assert_array_equal(dst, before)
    with pytest.raises(TypeError):
        softmax_rows(x, x)
