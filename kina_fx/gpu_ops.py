"""The runtime's compute ops, written once against the array API NumPy and CuPy share.

Every op takes arrays of one backend and returns (or writes into ``out``) an
array of the same backend.  ``xp`` is NumPy on the CPU and CuPy on CUDA; the
CuPy path's logic is the NumPy path's logic, so CI exercises it on the CPU.

Backend choice: ``KINA_FX_DEVICE=cpu|cuda|auto`` (default ``auto``: CUDA when
CuPy imports and sees a device).
"""
from __future__ import annotations

import os

import numpy as np

from . import fibers, kernel_threads
from .errors import GpuError, InternalError, ResourceError, ValidationError

_cupy = None
_cupy_checked = False


def cupy_module():
    """CuPy if it is importable and a CUDA device is present, else None."""
    global _cupy, _cupy_checked
    if not _cupy_checked:
        _cupy_checked = True
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() > 0:
                _cupy = cupy
        except Exception:  # no CuPy, no driver, no device: the CPU backend serves
            _cupy = None
    return _cupy


_device_memo: tuple = (None, None)

# os.environ.get costs ~1 us (key encoding); CPython keeps the encoded mapping
# in os.environ._data, updated by every os.environ write, so reading it sees
# the same value ~20x faster.  Other implementations use the public API.
_env_data = getattr(os.environ, "_data", None)
if isinstance(_env_data, dict) and hasattr(os.environ, "encodekey"):
    _DEVICE_KEY = os.environ.encodekey("KINA_FX_DEVICE")

    def _env_get(key, _get=_env_data.get, _decode=os.environ.decodevalue):
        value = _get(key)
        return "auto" if value is None else _decode(value)
else:  # pragma: no cover
    _DEVICE_KEY = "KINA_FX_DEVICE"

    def _env_get(key):
        return os.environ.get(key, "auto")


#: For callers that cache :func:`device`'s answer (the C exports' fast path,
#: op_calls.c): ``(environ, key, namespace)``.  ``environ[key]`` is
#: KINA_FX_DEVICE's encoded value, an object replaced by every write of the
#: variable; ``namespace["_device_memo"]`` (this module's) is replaced
#: whenever device() resolves again.  While both are the same objects, the
#: answer is the same.  None where os.environ keeps no such dict.
DEVICE_INPUTS = (_env_data, _DEVICE_KEY, globals()) if isinstance(_env_data, dict) else None


def device() -> str:
    """The backend selected by ``KINA_FX_DEVICE``: ``"cpu"`` or ``"cuda"``.

    Read on every call (tests switch it) but resolved once per value: the C
    exports ask for every op.
    """
    global _device_memo
    want = _env_get(_DEVICE_KEY)
    if _device_memo[0] == want:
        return _device_memo[1]
    result = _resolve_device(want)
    _device_memo = (want, result)
    return result


def _resolve_device(want: str) -> str:
    want = want.lower()
    if want == "cpu":
        return "cpu"
    if want in ("cuda", "gpu"):
        if cupy_module() is None:
            raise GpuError("KINA_FX_DEVICE=cuda but CuPy or a CUDA device is unavailable")
        return "cuda"
    if want != "auto":
        raise ValidationError(f"KINA_FX_DEVICE must be cpu, cuda or auto, not {want!r}")
    return "cuda" if cupy_module() is not None else "cpu"


def backend():
    """The array module for the selected device (``numpy`` or ``cupy``)."""
    return np if device() == "cpu" else cupy_module()


_copy_bytes = getattr(fibers.speedups, "copy_bytes", None)


def copy_into(dst, src) -> None:
    """``dst[...] = src`` for two arrays of one shape and type: one memmove
    where both are C-contiguous host buffers (the accelerator), else the
    backend's assignment."""
    if _copy_bytes is None or _copy_bytes(dst, src) is NotImplemented:
        dst[...] = src


def array_module(*arrays):
    """The array module the given arrays live in (CuPy if any is a CuPy array)."""
    cp = _cupy
    if cp is not None:
        for a in arrays:
            if isinstance(a, cp.ndarray):
                return cp
    return np


def may_overlap(out, x, xp) -> bool:
    """Whether ``x`` may share memory with ``out`` (by bounds: nothing is read)."""
    return bool(x.size and out.size and xp.may_share_memory(out, x))


def _quiet_numpy():
    """``(enter, leave, context)``: ``enter``/``leave`` make NumPy ignore
    floating-point conditions in the running context until ``leave(enter())``:
    what ``np.errstate(all="ignore")`` does.  NumPy >= 2 keeps that state in a
    context variable, which is set directly (errstate's own ``__enter__``/
    ``__exit__`` cost ~1.4 us, a third of a small op's whole call from C);
    ``context`` is then that ``(variable, value)`` pair, for C code to set
    itself.  Older NumPy uses errstate itself, and ``context`` is None."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj
        ignore = _make_extobj(all="ignore")
    except (ImportError, TypeError):  # pragma: no cover - NumPy 1.x
        def enter():
            state = np.errstate(all="ignore")
            state.__enter__()
            return state

        return enter, lambda state: state.__exit__(None, None, None), None
    return ((lambda: _extobj_contextvar.set(ignore)), _extobj_contextvar.reset,
            (_extobj_contextvar, ignore))


_fp_enter, _fp_leave, QUIET_FP_CONTEXT = _quiet_numpy()


def quiet_fp(fn):
    """``fn`` computing under ``np.errstate(all="ignore")``: floating-point
    conditions (overflow, division by zero, invalid operations) give their
    IEEE results (inf, NaN) and never a warning or an exception, whatever the
    caller's NumPy error state and warnings filters (restored on return).
    The C exports run so: the library prints nothing and raises nothing into
    its host (docs/abi.md, "Floating-point conditions")."""
    enter, leave = _fp_enter, _fp_leave

    def quiet(*args):
        token = enter()
        try:
            return fn(*args)
        finally:
            leave(token)
    quiet.__name__ = quiet.__qualname__ = fn.__name__
    quiet.__doc__ = fn.__doc__
    quiet.__wrapped__ = fn
    return quiet


def apart_from(outputs, x, xp):
    """``x``, or a copy of it when it may share memory with one of ``outputs``
    (what gives an op memmove semantics when its kernel would not)."""
    for out in outputs:
        if may_overlap(out, x, xp):
            return x.copy()
    return x


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative index, else ValidationError."""
    if not -ndim <= axis < ndim:
        raise ValidationError(f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def _check_out(out, shape, op):
    if out is not None and tuple(out.shape) != tuple(shape):
        raise ValidationError(f"{op}: out has shape {tuple(out.shape)}, expected {tuple(shape)}")


def matmul_shape(a_shape, b_shape) -> tuple:
    """The shape of ``a @ b`` under NumPy's matmul rules, or ValidationError.

    Rank-1 operands are vectors (promoted, then the added axis dropped); for
    rank >= 3 the leading (batch) dimensions broadcast.
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    for which, shape in (("first", a_shape), ("second", b_shape)):
        if not shape:
            raise ValidationError(f"matmul: the {which} operand is a scalar (shape ()); matmul needs "
                                  "operands of rank >= 1 (use mul to scale by a scalar)")
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ValidationError(f"matmul: inner dimensions differ: {a_shape} @ {b_shape}")
    try:
        batch = broadcast_shape(a2[:-2], b2[:-2], "matmul")
    except ValidationError:
        raise ValidationError(f"matmul: batch dimensions do not broadcast: {a_shape} @ {b_shape}"
                              ) from None
    shape = batch + (a2[-2], b2[-1])
    if len(a_shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b_shape) == 1:
        shape = shape[:-1]
    return shape


_matmul_shapes: dict = {}


def matmul(a, b, out=None):
    """``a @ b`` with NumPy's rules (2-D, and batched for rank >= 3).

    Shapes are checked (with a clear message) before anything is written; the
    check is memoised per shape pair because the C export calls this for
    every 2x2 product a compiled loop makes.
    """
    xp = np if _cupy is None else array_module(a, b)
    try:
        key = (a.shape, b.shape)
    except AttributeError:      # a Python scalar or list (autograd's kernel passes them on)
        key = (np.shape(a), np.shape(b))
    shape = _matmul_shapes.get(key)
    if shape is None:
        shape = matmul_shape(*key)
        if len(_matmul_shapes) > 1024:
            _matmul_shapes.clear()
        _matmul_shapes[key] = shape
    if out is None:
        return xp.matmul(a, b)
    if out.shape != shape:
        _check_out(out, shape, "matmul")
    if a.size == 0 or b.size == 0:   # nothing to multiply (operands may be memref.ZeroSize)
        out[...] = 0
        return out
    if not shape:  # NumPy's matmul refuses a 0-d out for vector @ vector
        out[...] = xp.matmul(a, b)
        return out
    return xp.matmul(a, b, out=out)


def gather_shape(values, indices) -> tuple:
    """The shape of ``gather(values, indices)``, ``indices.shape + values.shape[1:]``,
    or ValidationError (``values`` of rank 0, indices that are not integers)."""
    if values.ndim < 1:
        raise ValidationError("gather needs values of rank >= 1")
    if indices.dtype.kind not in "iu":
        raise ValidationError(f"gather needs integer indices, not {indices.dtype}")
    return tuple(indices.shape) + tuple(values.shape[1:])


def check_gather_indices(values, indices) -> None:
    """ValidationError for an index outside ``[0, values.shape[0])`` (no negative
    wrap-around).  Checked after the shapes: it reads the data."""
    rows = values.shape[0]
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= rows:
            raise ValidationError(f"gather index {lo if lo < 0 else hi} out of range [0, {rows})")


def gather(values, indices, out=None):
    """Rows of ``values`` picked by integer ``indices`` (:func:`gather_shape`),
    everything checked before ``out`` is written."""
    xp = array_module(values, indices)
    _check_out(out, gather_shape(values, indices), "gather")
    check_gather_indices(values, indices)
    if out is None:
        return xp.take(values, indices, axis=0)
    if out.size == 0:
        return out
    # take(a, indices, axis, out) is the subset NumPy and CuPy share (CuPy has
    # no ``mode``); a strided out goes through a temporary.  take copies a
    # non-contiguous ``values`` whole first (a broadcast one may be huge):
    # indexing reads only the rows picked.
    if not values.flags.c_contiguous:
        out[...] = values[indices]
    elif out.flags.c_contiguous:
        xp.take(values, indices, axis=0, out=out)
    else:
        out[...] = xp.take(values, indices, axis=0)
    return out


def _split_axis(ndim: int, axis: int):
    """The axis a kernel reducing along ``axis`` cuts its blocks along (None: none)."""
    if axis != 0:
        return 0
    return 1 if ndim > 1 else None


#: Elements a block's contiguous runs need at least for NumPy's loops to run
#: at speed (a loop per run).
MIN_RUN_ELEMENTS = 1024


def _thin_cache_blocks(x, axis) -> bool:
    """Whether a kernel along ``axis`` should take one block per thread
    because cache-sized blocks of ``x`` would be made of contiguous runs
    shorter than :data:`MIN_RUN_ELEMENTS` and a thread's block would not.
    Along axis 0 the blocks are cut across the other axes: a block of
    :data:`~kina_fx.kernel_threads.BLOCK_BYTES` over 4096 rows of float32 is
    rows of 32 elements (a softmax of 4096x4096 along axis 0 took 92 ms,
    PyTorch's 51).  Where a thread's block would be short rows too (10
    columns), the cache blocks stay: a block of one column is one long
    strided loop to NumPy, faster than a million loops of five."""
    if axis != 0 or x.ndim < 2 or x.size == 0:
        return False
    run = x.size // x.shape[0]                    # elements of one row of axis 0
    cache_run = kernel_threads.BLOCK_BYTES // (x.shape[0] * x.dtype.itemsize)
    threads = kernel_threads.thread_count()
    return cache_run < MIN_RUN_ELEMENTS and -(-run // threads) >= MIN_RUN_ELEMENTS


def _input_apart(out, x, xp):
    """``x``, or a copy of it when ``out`` overlaps it without being the same
    view: blocks write ``out`` while other blocks still read ``x``."""
    if out is x or x.size == 0 or not xp.may_share_memory(out, x):
        return x
    if (out.shape == x.shape and out.strides == x.strides and out.dtype == x.dtype
            and _data_address(out) == _data_address(x)):
        return x
    return x.copy()


def _data_address(a):
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def _along_axis_operands(x, axis, out, name):
    """``(xp, x, axis, out)`` for a kernel along ``axis`` whose result has
    ``x``'s shape: the axis normalised, ``out`` checked (or made), and ``x``
    copied where ``out`` overlaps it otherwise than as the same view
    (:func:`_input_apart`)."""
    xp = array_module(x)
    axis = normalize_axis(axis, x.ndim)
    _check_out(out, x.shape, name)
    if out is None:
        out = xp.empty_like(x)
    elif x.size:
        x = _input_apart(out, x, xp)
    return xp, x, axis, out


#: A reduced axis at most this long is worked on swapped first, in a
#: contiguous copy (NumPy only): NumPy reduces a short innermost axis 3-6x
#: slower per element than it reduces across rows (10 classes: max 11.6 us,
#: across rows 1.9 us plus 1.3 us for the copy; docs/benchmarks.md, target 4).
SHORT_AXIS = 32


def _short_axis(xp, xb, axis) -> bool:
    """Whether block ``xb`` is reduced along ``axis`` in the swapped layout:
    a NumPy block of at least 512 elements whose ``axis`` has 2 to
    :data:`SHORT_AXIS` elements (fewer rows gain less than the copy costs)."""
    return xp is np and 1 < xb.shape[axis] <= SHORT_AXIS and xb.ndim > 1 and xb.size >= 512


def _short_axis_max(xb, axis):
    """``(m, w)``: ``w`` is NumPy block ``xb`` with its short ``axis``
    (:func:`_short_axis`) swapped to the front, a contiguous copy, and ``m``
    the maximum along ``axis`` reduced across ``w``'s rows (``axis`` kept,
    in ``xb``'s axis order)."""
    w = xb.swapaxes(0, axis).copy()
    return np.maximum.reduce(w, axis=0, keepdims=True).swapaxes(0, axis), w


def _max_and_exp_sum(xp, xb, axis, e_out=None):
    """``(m, e, s)`` of block ``xb`` along ``axis``: ``m`` its maximum and
    ``s`` the sum of ``e = exp(xb - m)``, both with ``axis`` kept (length 1),
    and ``e`` itself (``xb``'s shape), computed in ``e_out`` when given (it
    may be ``xb``).

    A short axis (:data:`SHORT_AXIS`) of a NumPy block is swapped with the
    first in a contiguous copy, which then holds ``e`` (``e_out`` untouched);
    all three come back as views in ``xb``'s axis order."""
    if _short_axis(xp, xb, axis):
        m, w = _short_axis_max(xb, axis)
        np.subtract(w, m.swapaxes(0, axis), out=w)
        np.exp(w, out=w)
        total = np.add.reduce(w, axis=0, keepdims=True)
        return m, w.swapaxes(0, axis), total.swapaxes(0, axis)
    m = xb.max(axis=axis, keepdims=True)
    e = xp.subtract(xb, m, out=e_out)
    xp.exp(e, out=e)
    return m, e, e.sum(axis=axis, keepdims=True)


def softmax(x, axis=-1, out=None):
    """Numerically stable softmax along ``axis``; ``out`` may alias ``x``.

    Computed in ``out`` block by block (max, subtract, exp, sum, scale: the
    block stays in cache between the passes), blocks spread over the
    process's cores (:mod:`kina_fx.kernel_threads`).
    """
    xp, x, axis, out = _along_axis_operands(x, axis, out, "softmax")
    if x.shape[axis] == 0 or x.size == 0:
        return out
    if _fused_rows(xp, x, axis, out):
        return _softmax_rows_fused(x, out, False)

    def block(index):
        ob = out[index]
        # the exponentials in ``ob`` itself, unless it is rows of a few strided
        # columns (along axis 0): then in a contiguous scratch, written to ``ob`` once
        short_rows = not ob.flags.c_contiguous and ob.size < MIN_RUN_ELEMENTS * ob.shape[0]
        _, e, s = _max_and_exp_sum(xp, x[index], axis, None if short_rows else ob)
        xp.divide(e, s, out=ob)

    kernel_threads.run_blocks(xp, x.shape, x.size, x.dtype.itemsize, _split_axis(x.ndim, axis), block,
                              one_pass=_thin_cache_blocks(x, axis))
    return out


#: softmax or log_softmax of each row (the last axis) of C-contiguous float32
#: buffers, one call per block (kina_fx/_speedups_c/kernels.c), or None: the
#: blocks of NumPy ufuncs above are the reference.
_fused_softmax_rows = getattr(fibers.speedups, "softmax_rows_f32", None)


def _fused_rows(xp, x, axis, out) -> bool:
    """Whether the fused loop takes every block of ``x`` along ``axis`` into
    ``out`` (as :func:`_along_axis_operands` left them: the same memory or none
    shared)."""
    return (_fused_softmax_rows is not None and xp is np and axis == x.ndim - 1
            and x.dtype == np.float32 and out.dtype == np.float32
            and x.flags.c_contiguous and out.flags.c_contiguous)


def _softmax_rows_fused(x, out, log: bool):
    classes = x.shape[-1]
    rows_in, rows_out = x.reshape(-1, classes), out.reshape(-1, classes)

    def block(index):
        rows = index[0]
        return _fused_softmax_rows(rows_in[rows], rows_out[rows], log)

    done = kernel_threads.run_blocks(np, rows_in.shape, rows_in.size, 4, 0, block)
    if any(d is not True for d in done):     # none of these declines: C-contiguous float32 rows
        raise InternalError("the fused softmax loop declined a block it takes")
    return out


def repeat_interleave_shape(shape, reps: int, axis: int) -> tuple:
    """``(axis, result shape)`` of repeating each element ``reps`` times along
    ``axis`` (normalised), or ValidationError (negative ``reps``, bad axis)."""
    if reps < 0:
        raise ValidationError(f"repeat_interleave needs reps >= 0, got {reps}")
    axis = normalize_axis(axis, len(shape))
    shape = list(shape)
    shape[axis] *= reps
    return axis, tuple(shape)


def repeat_interleave(x, reps: int, axis: int, out=None):
    """Each element of ``x`` repeated ``reps`` times along ``axis`` (torch semantics)."""
    xp = array_module(x)
    axis, shape = repeat_interleave_shape(x.shape, reps, axis)
    _check_out(out, shape, "repeat_interleave")
    if out is None:
        return xp.repeat(x, reps, axis=axis)
    if out.size == 0:
        return out
    # A C-contiguous out seen as (..., n, reps, ...) is a view in NumPy and
    # CuPy alike: broadcast x into it with no temporary.
    if out.flags.c_contiguous:
        split = tuple(x.shape[:axis]) + (x.shape[axis], reps) + tuple(x.shape[axis + 1:])
        out.reshape(split)[...] = xp.expand_dims(x, axis + 1)
    else:
        out[...] = xp.repeat(x, reps, axis=axis)
    return out


# ---- the differentiable runtime's ops (kina_fx.runtime_ops exports them) -------
#
# Each kernel computes into ``out`` when given one (the C exports pass the
# caller's output buffer) and returns a new array otherwise (autograd's
# kernels call the same functions), so both share one code path per op.
# Shapes are checked before anything is written.

#: The ``axis`` value that means "every axis" in the reduction exports (INT32_MIN).
ALL_AXES = -(1 << 31)


def _elementwise(fn, name=None, one_pass=True):
    """The kernel ``kernel(x, out=None)`` of ``fn(xp, x, out)``: ``out``
    checked, large NumPy arrays in row blocks.  ``name`` (default: ``fn``'s)
    is the op's in messages; ``one_pass=False`` for an ``fn`` that passes over
    its block several times (cache-sized blocks, not one per thread)."""
    name = name or fn.__name__

    def kernel(x, out=None):
        _check_out(out, x.shape, name)
        if x.__class__ is np.ndarray and x.size >= kernel_threads.PARALLEL_MIN_ELEMENTS:
            return _elementwise_blocks(fn, x, out, one_pass)
        return fn(array_module(x), x, out)
    kernel.__name__ = name
    kernel.__doc__ = fn.__doc__
    return kernel


def ufunc_in_blocks(ufunc, x):
    """``ufunc(x)`` (a one-input NumPy ufunc) of a NumPy array, in row blocks
    on the process's cores from :data:`~kina_fx.kernel_threads.PARALLEL_MIN_ELEMENTS`
    elements: the same values, bit for bit (autograd's elementwise kernels
    call it for large arrays)."""
    return _elementwise_blocks(lambda xp, xb, ob: ufunc(xb, out=ob), x, None, True)


def _elementwise_blocks(fn, x, out, one_pass):
    """``fn`` on a large NumPy array, in row blocks spread over the cores
    (:mod:`kina_fx.kernel_threads`); one call when the output's type or an
    overlap with the input would make blocks differ from it."""
    if x.dtype.kind != "f" or x.ndim == 0:
        return fn(np, x, out)
    if out is None:
        out = np.empty_like(x)
    elif out.dtype != x.dtype or (out is not x and np.may_share_memory(out, x)
                                  and _input_apart(out, x, np) is not x):
        return fn(np, x, out)

    def block(index):
        fn(np, x[index], out[index])

    kernel_threads.run_blocks(np, x.shape, x.size, x.dtype.itemsize, 0, block, one_pass=one_pass)
    return out


@_elementwise
def neg(xp, x, out):
    """``-x``.

    NumPy 2.4's ``negative`` reads some strided inputs into strided outputs
    as if they were contiguous (float32 with a step of 4 elements into an
    output of step 4: ``out[i] = -x_base[i]``), so into an output that is not
    contiguous it computes a fresh array and copies it (the same values, bit
    for bit; tests/abi/test_runtime_ops.py::test_unary_on_stepped_buffers)."""
    if out is None or xp is not np or (out.flags.c_contiguous and x.flags.c_contiguous):
        return xp.negative(x, out=out)
    out[...] = xp.negative(x)
    return out


@_elementwise
def exp(xp, x, out):
    """``e**x``."""
    return xp.exp(x, out=out)


@_elementwise
def log(xp, x, out):
    """Natural logarithm (``-inf`` at 0, NaN below, as NumPy)."""
    return xp.log(x, out=out)


@_elementwise
def tanh(xp, x, out):
    """Hyperbolic tangent."""
    return xp.tanh(x, out=out)


_expit_cache: dict = {}


def _expit(xp):
    """SciPy's (or CuPy's) one-kernel logistic function when installed, else None."""
    try:
        return _expit_cache[xp]
    except KeyError:
        pass
    fn = None
    try:
        if xp is np:
            from scipy.special import expit as fn
        else:
            from cupyx.scipy.special import expit as fn
    except Exception:
        fn = None
    _expit_cache[xp] = fn
    return fn


#: From this many float32/float64 elements a NumPy sigmoid is the formula
#: ``1 / (1 + exp(-x))`` in row blocks (four passes over a cached block;
#: NumPy's ``exp`` is vectorised), not SciPy's ``expit``, one scalar loop:
#: 4096x4096 float32 took 57 ms through the export against 5.9 ms for
#: PyTorch (docs/benchmarks.md, target 3).  Smaller arrays (autograd's usual
#: operands) keep ``expit``'s one call, cheaper than four.
SIGMOID_FORMULA_MIN = 1 << 16


def sigmoid(x, out=None):
    """The logistic function ``1 / (1 + exp(-x))``; no overflow for large ``|x|``.

    Large float32/float64 NumPy arrays (:data:`SIGMOID_FORMULA_MIN`) compute
    that formula, to a few units in the last place (float32 in one pass, the
    accelerator's own loop, where it is built); results below the smallest
    normal number (``x`` < -87.3 in float32) are 0 or subnormal.  Others:
    SciPy's (CuPy's) ``expit``, else ``0.5 * (1 + tanh(x / 2))``."""
    if x.__class__ is np.ndarray:
        if x.size >= SIGMOID_FORMULA_MIN and (x.dtype == np.float32 or x.dtype == np.float64):
            # exp(-x) overflows to inf below x = -88 (float32) and 1 / (1 + inf) = 0,
            # or 1 / (1 + e) underflows: the right results, nothing to report,
            # whatever the caller's error state (the blocks' threads take this one)
            with np.errstate(over="ignore", under="ignore"):
                if x.dtype == np.float32 and _fused_logistic_f32 is not None:
                    return _sigmoid_fused(x, out)
                return _sigmoid_formula(x, out)
        if out is None and x.size < kernel_threads.PARALLEL_MIN_ELEMENTS:
            expit = _expit(np)      # autograd's small operands: expit itself, two frames fewer
            if expit is not None:
                return expit(x)
    return _sigmoid_one_call(x, out)


def _logistic_formula(xp, x, out):
    # under sigmoid()'s error state: its overflow and underflow are quiet
    r = xp.negative(x, out=out)
    xp.exp(r, out=r)
    xp.add(r, 1, out=r)
    return xp.divide(1, r, out=r)        # NumPy's reciprocal has no SIMD loop: 1.5x slower


#: The formula in one pass over C-contiguous float32 buffers (the
#: accelerator's loop, kina_fx/_speedups_c/kernels.c; NotImplemented for
#: others), or None: _logistic_formula is the reference.
_fused_logistic_f32 = getattr(fibers.speedups, "logistic_f32", None)


def _logistic_fused(xp, x, out):
    r = np.empty(x.shape, np.float32) if out is None else out
    if _fused_logistic_f32(x, r) is True:
        return r
    return _logistic_formula(xp, x, r)      # a buffer the loop declines (strided, another type)


def _logistic_expit(xp, x, out):
    """SciPy's (CuPy's) ``expit`` when installed, else ``0.5 * (1 + tanh(x / 2))``."""
    expit = _expit(xp)
    if expit is not None:
        return expit(x) if out is None else expit(x, out=out)
    r = xp.multiply(x, 0.5, out=out)
    if out is None:
        r = xp.asarray(r)       # rank 0: NumPy returned a scalar, which out= cannot take
    xp.tanh(r, out=r)
    xp.multiply(r, 0.5, out=r)
    xp.add(r, 0.5, out=r)
    return r


_sigmoid_formula = _elementwise(_logistic_formula, "sigmoid", one_pass=False)
_sigmoid_fused = _elementwise(_logistic_fused, "sigmoid")
_sigmoid_one_call = _elementwise(_logistic_expit, "sigmoid")


#: The NumPy inputs :func:`numpy_relu` compares with a zero array (elements):
#: smaller ones cost more to look the zeros up for than they save.
ZEROS_RANGE = (1024, 1 << 20)
_zero_arrays: dict = {}    # dtype -> a read-only zero array of up to ZEROS_RANGE[1] elements
_zero_views: dict = {}     # (shape, dtype) -> a view of it


def _zeros_shaped(x):
    """Zeros of ``x``'s shape and type, a view of one cached array per type.

    ``np.zeros`` maps pages it has not written, and reading them maps the
    system's shared zero page: the cached array costs address space, not
    memory."""
    key = (x.shape, x.dtype)
    view = _zero_views.get(key)
    if view is not None:
        return view
    zeros = _zero_arrays.get(x.dtype)
    if zeros is None or zeros.size < x.size:
        grown = 0 if zeros is None else 2 * zeros.size
        zeros = np.zeros(min(ZEROS_RANGE[1], max(x.size, grown)), x.dtype)
        zeros.flags.writeable = False
        _zero_arrays[x.dtype] = zeros
        _zero_views.clear()
    if len(_zero_views) >= 64:
        _zero_views.clear()
    view = _zero_views[key] = zeros[:x.size].reshape(x.shape)
    return view


def numpy_relu(x, out=None):
    """``np.maximum(x, 0, out=out)`` on a NumPy array, the same bits.

    NumPy 2.4 runs float32 ``maximum`` against a broadcast scalar without its
    SIMD loop, 2-3x slower than against an array of zeros (docs/benchmarks.md,
    target 3); in :data:`ZEROS_RANGE` the zeros are an array (larger inputs
    come here in row blocks)."""
    if x.dtype.kind == "f" and ZEROS_RANGE[0] <= x.size <= ZEROS_RANGE[1]:
        return np.maximum(x, _zeros_shaped(x), out=out)
    return np.maximum(x, x.dtype.type(0), out=out)


@_elementwise
def relu(xp, x, out):
    """``max(x, 0)`` (NaN stays NaN)."""
    if xp is np:
        return numpy_relu(x, out)
    return xp.maximum(x, 0, out=out) if out is not None else xp.maximum(x, x.dtype.type(0))


def broadcast_shape(a_shape, b_shape, op: str = "broadcast") -> tuple:
    """NumPy's broadcast of two shapes, or ValidationError naming the op."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    n = max(len(a_shape), len(b_shape))
    a2 = (1,) * (n - len(a_shape)) + a_shape
    b2 = (1,) * (n - len(b_shape)) + b_shape
    shape = []
    for x, y in zip(a2, b2):
        if x != y and x != 1 and y != 1:
            raise ValidationError(f"{op}: shapes {a_shape} and {b_shape} do not broadcast")
        shape.append(y if x == 1 else x)
    return tuple(shape)


def _binary(name, ufunc, doc):
    """The kernel ``name(a, b, out=None)``: the array module's ``ufunc``
    (broadcasting), in row blocks on threads for large NumPy arrays."""
    def fn(xp, a, b, out):
        return getattr(xp, ufunc)(a, b, out=out)

    def kernel(a, b, out=None):
        if out is not None:
            _check_out(out, broadcast_shape(getattr(a, "shape", ()), getattr(b, "shape", ()), name),
                       name)
        # blocks on threads, or perhaps wide rows (the sizes _repeat_period
        # needs at least: mid-sized operands without a short one skip its checks)
        if (a.__class__ is np.ndarray and b.__class__ is np.ndarray
                and (max(a.size, b.size) >= kernel_threads.PARALLEL_MIN_ELEMENTS
                     or (min(a.size, b.size) <= SHORT_PERIOD
                         and max(a.size, b.size) >= 4 * WIDE_ROW_ELEMENTS))):
            return _binary_blocks(fn, a, b, out)
        return fn(array_module(a, b), a, b, out)
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel



#: NumPy runs its inner loop along the last axes an operand does not
#: broadcast over: ``x + bias`` with ``x`` of shape (1048576, 10) is a million
#: loops of ten elements, 3x the time of the same add in rows of 16,384
#: (docs/benchmarks.md).  When one operand repeats along the other's leading
#: axes with a period of at most :data:`SHORT_PERIOD` elements, it is tiled to
#: about this many, and the other operand and the output are viewed as rows
#: of that length: the same pairs of elements, in long loops
#: (:func:`_in_wide_rows`).
WIDE_ROW_ELEMENTS = 16384
SHORT_PERIOD = 1024


def _repeat_period(full, small, out) -> int:
    """The number of elements after which ``small`` repeats when broadcast to
    ``full``'s shape -- the size of its shape without leading ones, when that
    is ``full``'s trailing shape -- if it is at most :data:`SHORT_PERIOD`,
    ``full`` spans at least four wide rows, and ``full`` and ``out`` are
    C-contiguous arrays of the result's shape; else 0."""
    period = small.size
    if (small.ndim == 0 or period < 2 or period > SHORT_PERIOD
            or full.size < 4 * WIDE_ROW_ELEMENTS or full.shape != out.shape
            or not (full.flags.c_contiguous and out.flags.c_contiguous)):
        return 0
    trailing = small.shape
    while trailing[0] == 1:
        trailing = trailing[1:]
    return period if full.shape[len(full.shape) - len(trailing):] == trailing else 0


def _in_wide_rows(fn, full, tiled, period, out, full_first) -> None:
    """``fn`` of ``full`` and the operand ``tiled`` repeats (``period``
    elements, whole repeats), into ``out``: as rows of ``tiled.size``
    elements, then the last repeats that fill no such row, one row each."""
    flat_full, flat_out = full.reshape(-1), out.reshape(-1)    # views: both C-contiguous
    wide = flat_full.size - flat_full.size % tiled.size
    for lo, hi, other in ((0, wide, tiled), (wide, flat_full.size, tiled[:period])):
        if hi > lo:
            rows = flat_full[lo:hi].reshape(-1, other.size)
            fn(np, *((rows, other) if full_first else (other, rows)),
               flat_out[lo:hi].reshape(-1, other.size))


def _binary_blocks(fn, a, b, out):
    """``fn(a, b)`` (broadcasting) on NumPy arrays: in row blocks of the
    result for large ones (as :func:`_elementwise_blocks`), and an operand
    that repeats with a short period tiled (:data:`WIDE_ROW_ELEMENTS`)."""
    shape = broadcast_shape(a.shape, b.shape)
    dtype = np.result_type(a, b)
    if not shape or dtype.kind != "f":
        return fn(np, a, b, out)
    if out is None:
        out = np.empty(shape, dtype)
    elif out.dtype != dtype or any(out is not v and np.may_share_memory(out, v)
                                   and _input_apart(out, v, np) is not v for v in (a, b)):
        return fn(np, a, b, out)
    rows = shape[0]
    full_first = a.shape == shape
    full, small = (a, b) if full_first else (b, a)
    period = _repeat_period(full, small, out)
    tiled = np.tile(small.reshape(-1), WIDE_ROW_ELEMENTS // period) if period else None

    def part(v, index):
        # Operands with the result's leading axis are cut with it; broadcast ones are whole.
        if v.ndim == len(shape) and v.shape[0] == rows and rows != 1:
            return v[index[:1]]
        return v

    def block(index):
        if period:      # a block of rows: whole repeats, still C-contiguous
            _in_wide_rows(fn, full[index[:1]], tiled, period, out[index[:1]], full_first)
        else:
            fn(np, part(a, index), part(b, index), out[index])

    kernel_threads.run_blocks(np, shape, out.size, dtype.itemsize, 0, block, one_pass=True)
    return out


add = _binary("add", "add", "``a + b`` with NumPy broadcasting.")
sub = _binary("sub", "subtract", "``a - b`` with NumPy broadcasting.")
mul = _binary("mul", "multiply", "``a * b`` with NumPy broadcasting.")
div = _binary("div", "divide", "``a / b`` with NumPy broadcasting (IEEE results for division by zero).")
power = _binary("power", "power", "``a ** b`` with NumPy broadcasting.")


def reduced_shape(shape, axis, keepdims: bool) -> tuple:
    """The shape of a reduction of ``shape`` over ``axis`` (None: all axes)."""
    shape = tuple(shape)
    if axis is None:
        return (1,) * len(shape) if keepdims else ()
    ax = normalize_axis(axis, len(shape))
    return shape[:ax] + ((1,) if keepdims else ()) + shape[ax + 1:]


def require_elements(x, axis, op: str) -> None:
    """ValidationError when reducing ``x`` over ``axis`` (None: all) reduces nothing."""
    count = x.size if axis is None else x.shape[normalize_axis(axis, x.ndim)]
    if count == 0:
        raise ValidationError(f"{op} over an empty axis of shape {tuple(x.shape)}")



def check_reduction(op: str, x, axis, keepdims) -> tuple:
    """Validate a reduction of ``x`` (``axis``: an int, None or ALL_AXES for all;
    ``keepdims`` 0 or 1) and return ``(axis, keepdims, result shape)``.  ``mean``
    and ``max`` of nothing are ValidationErrors; ``sum`` of nothing is 0."""
    if axis == ALL_AXES:
        axis = None
    if keepdims not in (0, 1, False, True):
        raise ValidationError(f"{op}: keepdims must be 0 or 1, not {keepdims}")
    keepdims = bool(keepdims)
    shape = reduced_shape(x.shape, axis, keepdims)
    if op != "sum":
        require_elements(x, axis, op)
    return axis, keepdims, shape


def _reduction(fn):
    """The kernel ``kernel(x, axis=None, keepdims=False, out=None)`` of
    ``fn(x, axis, keepdims)``: checked, and over one axis of a large
    floating NumPy array in blocks on the process's cores
    (:func:`_reduction_blocks`)."""
    name = fn.__name__
    op = name.removeprefix("reduce_")

    def kernel(x, axis=None, keepdims=False, out=None):
        axis, keepdims, shape = check_reduction(op, x, axis, keepdims)
        _check_out(out, shape, op)
        if axis is not None:            # fn takes it normalised
            axis = normalize_axis(axis, x.ndim)
        if (x.__class__ is np.ndarray and axis is not None and x.ndim > 1
                and x.size >= kernel_threads.PARALLEL_MIN_ELEMENTS
                and (x.dtype == np.float32 or x.dtype == np.float64)
                and _blocks_keep_the_order(x, axis)):
            r = _reduction_blocks(fn, x, axis, keepdims)
        else:
            r = fn(x, axis, keepdims)
        if out is None:
            return r
        out[...] = r
        return out
    kernel.__name__ = name
    kernel.__doc__ = fn.__doc__
    return kernel


def _blocks_keep_the_order(x, axis) -> bool:
    """Whether every block :func:`_reduction_blocks` cuts from ``x`` is
    reduced in the order one call reduces the whole: NumPy loops innermost
    over the axis with the smallest stride that is longer than 1, and sums
    pairwise along it when it is the reduced one, else row after row.  A
    block of one C-contiguous column (reducing along axis 0) would be summed
    pairwise where the whole is summed row after row (other bits): ``x``
    must be C-contiguous, and along axis 0 each block must keep two or more
    elements of every row."""
    if not x.flags.c_contiguous:
        return False
    if axis != 0 or x.size // (x.shape[0] * x.shape[1]) >= 2:
        return True
    return all(hi - lo >= 2 for lo, hi in kernel_threads.thread_blocks(x.shape[1]))


def _reduction_blocks(fn, x, axis, keepdims):
    """``fn(x, axis, keepdims)`` (a float32/float64 result of ``x``'s type) in
    blocks cut along another axis, one per thread: each result element is
    the one ``fn`` computes for it alone, bit for bit."""
    kept = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    r = np.empty(kept, x.dtype)

    def block(index):       # index keeps ``axis`` whole: r's length-1 axis
        r[index] = fn(x[index], axis, True)

    kernel_threads.run_blocks(np, x.shape, x.size, x.dtype.itemsize, _split_axis(x.ndim, axis), block,
                              one_pass=True)
    return r if keepdims else r.reshape(x.shape[:axis] + x.shape[axis + 1:])


@_reduction
def reduce_sum(x, axis, keepdims):
    """Sum over one axis or all axes (0 over an empty one)."""
    return x.sum(axis=axis, keepdims=keepdims)


@_reduction
def reduce_mean(x, axis, keepdims):
    """Mean over one axis or all axes; an empty reduction is a ValidationError."""
    return x.mean(axis=axis, keepdims=keepdims)


@_reduction
def reduce_max(x, axis, keepdims):
    """Maximum over one axis or all axes; an empty reduction is a ValidationError.

    A short last axis (:data:`SHORT_AXIS`) of a NumPy array is reduced across
    the rows of a swapped copy (the same maximum: it does not depend on the
    order)."""
    if (axis is not None and axis == x.ndim - 1 and x.__class__ is np.ndarray
            and x.dtype.kind == "f" and _short_axis(np, x, axis)):
        m, _ = _short_axis_max(x, axis)
        return m if keepdims else m.reshape(x.shape[:-1])
    return x.max(axis=axis, keepdims=keepdims)


def check_permutation(perm, ndim: int) -> tuple:
    """``perm`` as a tuple of ints if it is a permutation of ``range(ndim)``, else ValidationError."""
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(ndim)):
        raise ValidationError(f"transpose: {list(perm)} is not a permutation of the {ndim} axes")
    return perm


def transpose_shape(shape, perm) -> tuple:
    """``(perm, result shape)`` of permuting the axes of ``shape`` (``perm`` None:
    reversed), or ValidationError when ``perm`` is not a permutation."""
    ndim = len(shape)
    perm = tuple(reversed(range(ndim))) if perm is None else check_permutation(perm, ndim)
    return perm, tuple(shape[p] for p in perm)


def transpose(x, perm=None, out=None):
    """``x`` with its axes permuted (``perm`` None: reversed)."""
    perm, shape = transpose_shape(x.shape, perm)
    _check_out(out, shape, "transpose")
    r = x.transpose(perm)
    if out is None:
        return r
    out[...] = r
    return out


def log_softmax(x, axis=-1, out=None):
    """Numerically stable log-softmax along ``axis``: ``x - max - log(sum(exp(x - max)))``.

    Block by block as :func:`softmax`, the exponentials in a block-sized
    scratch buffer: ``x`` is read twice and ``out`` written once.
    """
    xp, x, axis, out = _along_axis_operands(x, axis, out, "log_softmax")
    if x.size == 0:
        return out
    if _fused_rows(xp, x, axis, out):
        return _softmax_rows_fused(x, out, True)

    def block(index):
        xb = x[index]
        shift, _, s = _max_and_exp_sum(xp, xb, axis)
        xp.log(s, out=s)
        s += shift
        xp.subtract(xb, s, out=out[index])

    kernel_threads.run_blocks(xp, x.shape, x.size, x.dtype.itemsize, _split_axis(x.ndim, axis), block,
                              one_pass=_thin_cache_blocks(x, axis))
    return out


def check_cross_entropy(logits, labels) -> None:
    """ValidationError unless ``cross_entropy(logits, labels)`` is defined."""
    _check_cross_entropy_shapes(logits, labels)
    _check_labels_in_range(labels, logits.shape[-1])


def _check_cross_entropy_shapes(logits, labels) -> None:
    if logits.ndim < 1:
        raise ValidationError("cross_entropy needs logits of rank >= 1")
    if labels.dtype.kind not in "iu":
        raise ValidationError(f"cross_entropy needs integer labels, not {labels.dtype}")
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValidationError(f"cross_entropy: labels of shape {tuple(labels.shape)} "
                              f"for logits of shape {tuple(logits.shape)}")
    if labels.size == 0:
        raise ValidationError("cross_entropy of an empty batch")
    if logits.shape[-1] == 0:
        raise ValidationError("cross_entropy needs at least one class")


def _check_labels_in_range(labels, classes: int) -> None:
    if _fused_labels_in_range is not None and labels.__class__ is np.ndarray:
        if _fused_labels_in_range(labels, classes) is True:     # (NotImplemented: not C-contiguous int64)
            return
    # One reduction: seen unsigned, a negative label is larger than any class.
    unsigned = labels.view(labels.dtype.str.replace("i", "u")) if labels.dtype.kind == "i" else labels
    if int(unsigned.max()) >= classes:
        lo, hi = int(labels.min()), int(labels.max())
        raise ValidationError(f"cross_entropy label {lo if lo < 0 else hi} out of range [0, {classes})")


#: Softmax cross-entropy and its gradient over the rows of C-contiguous
#: float32 logits with C-contiguous int64 labels, one call per block
#: (kina_fx/_speedups_c/kernels.c: they check the labels' range as they go),
#: or None: the NumPy formulas below are the references.
_fused_cross_entropy_sum = getattr(fibers.speedups, "cross_entropy_sum_f32", None)
_fused_cross_entropy_grad = getattr(fibers.speedups, "cross_entropy_grad_f32", None)
#: The labels' range check over C-contiguous int64 labels in one loop (no
#: unsigned view and reduction, two NumPy calls of a microsecond each).
_fused_labels_in_range = getattr(fibers.speedups, "labels_in_range_i64", None)


def _fused_cross_entropy_operands(logits, labels) -> bool:
    """Whether the fused loops take ``logits`` and ``labels`` (as
    :func:`_check_cross_entropy_shapes` admitted them) whole, and so every block."""
    return (_fused_cross_entropy_sum is not None and logits.__class__ is np.ndarray
            and labels.__class__ is np.ndarray and logits.dtype == np.float32
            and labels.dtype == np.int64 and logits.flags.c_contiguous and labels.flags.c_contiguous)


def cross_entropy(logits, labels, out=None):
    """Mean over samples of ``-log_softmax(logits)[label]``, classes on the last axis.

    ``labels`` are integers with shape ``logits.shape[:-1]``, each in
    ``[0, classes)``; the result is a scalar (a rank-0 ``out``).  Per row it
    is ``logsumexp(row) - row[label]``: no full-size log-softmax is made,
    only a block-sized scratch buffer, and the rows are summed in float64.
    """
    xp = array_module(logits, labels)
    _check_cross_entropy_shapes(logits, labels)
    classes, n = logits.shape[-1], labels.size
    fused = _fused_cross_entropy_operands(logits, labels)
    if not fused:
        _check_labels_in_range(labels, classes)
    _check_out(out, (), "cross_entropy")
    flat = logits.reshape(-1, classes)
    picks = labels.reshape(-1)

    def block(index):          # the block's sum of logsumexp(row) - row[pick], in float64
        rows = index[0]
        if fused:              # a float, or None: a label out of range
            return _fused_cross_entropy_sum(flat[rows], picks[rows])
        xb = flat[rows]
        m, _, lse = _max_and_exp_sum(xp, xb, 1)
        xp.log(lse, out=lse)
        lse += m
        picked = xb[xp.arange(xb.shape[0]), picks[rows]]
        return (lse[:, 0] - picked).sum(dtype=np.float64)

    # the blocks' sums added in row order: the same total whatever the threads
    sums = kernel_threads.run_blocks(xp, flat.shape, flat.size, flat.dtype.itemsize, 0, block)
    if fused:
        if None in sums:
            _check_labels_in_range(labels, classes)     # raises: the loops met a label out of range
        sums = [np.float64(s) for s in sums]            # what the formula's blocks return
    total = sums[0]
    for p in sums[1:]:
        total = total + p
    r = (total / n).astype(logits.dtype)
    if out is None:
        return r
    out[...] = r
    return out


def cross_entropy_grad(logits, labels, scale):
    """``(softmax(logits, -1) - one_hot(labels)) * scale``: the gradient of
    :func:`cross_entropy` with respect to ``logits`` times ``scale`` (the
    cotangent over the number of samples), in one buffer -- the softmax, one
    indexed subtraction and one scaling -- instead of a one-hot matrix and
    three full-size temporaries.  ``labels`` as :func:`cross_entropy` checked them."""
    xp = array_module(logits, labels)
    if _fused_cross_entropy_operands(logits, labels) and _float32_scale(scale):
        return _cross_entropy_grad_fused(logits, labels, float(scale))
    p = softmax(logits, -1)
    classes = logits.shape[-1]
    flat = p.reshape(-1, classes)           # p is fresh and C-contiguous: a view
    rows = flat.shape[0]
    flat[xp.arange(rows), labels.reshape(-1)] -= 1
    p *= scale
    return p


def _float32_scale(scale) -> bool:
    """Whether ``p *= scale`` multiplies float32 ``p`` by ``float32(scale)``: a
    Python number (NumPy takes it in the array's type), or a float32 scalar."""
    return scale.__class__ in (float, int) or (getattr(scale, "dtype", None) == np.float32
                                              and np.ndim(scale) == 0)


def _cross_entropy_grad_fused(logits, labels, scale: float):
    classes = logits.shape[-1]
    p = np.empty(logits.shape, np.float32)
    flat, rows_out, picks = logits.reshape(-1, classes), p.reshape(-1, classes), labels.reshape(-1)

    def block(index):       # True, or None: a label out of range (nothing written)
        rows = index[0]
        return _fused_cross_entropy_grad(flat[rows], picks[rows], scale, rows_out[rows])

    if None in kernel_threads.run_blocks(np, flat.shape, flat.size, 4, 0, block):
        _check_labels_in_range(labels, classes)     # raises
    return p


# ---- memory the runtime allocates ----------------------------------------------

#: Live allocations: address -> (device, nbytes, owner).  The owner keeps host
#: memory alive; CUDA memory is freed explicitly.
_allocations: dict = {}


def _host_memory_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def allocate(nbytes: int, alignment: int = 64) -> int:
    """A new buffer of ``nbytes`` on the selected device; returns its address.

    CUDA: managed memory (cudaMallocManaged), refused with ResourceError when
    larger than the device's free memory.  CPU: host memory aligned to
    ``alignment``, refused when larger than physical memory.  Zero bytes still
    give a distinct, non-null address.  Every buffer is registered for
    :func:`free_all`.
    """
    if nbytes < 0:
        raise ValidationError(f"cannot allocate {nbytes} bytes")
    if device() == "cuda":
        cp = cupy_module()
        try:
            free, _total = cp.cuda.runtime.memGetInfo()
        except Exception as exc:
            raise GpuError(f"cudaMemGetInfo failed: {exc}") from exc
        if nbytes > free:
            raise ResourceError(f"cannot allocate {nbytes} bytes of managed memory: "
                                f"the device has {free} bytes free")
        try:
            address = cp.cuda.runtime.mallocManaged(max(nbytes, 1))  # cudaMemAttachGlobal
        except cp.cuda.runtime.CUDARuntimeError as exc:
            raise ResourceError(f"cudaMallocManaged({nbytes}) failed: {exc}") from exc
        _allocations[address] = ("cuda", nbytes, None)
        return address
    limit = _host_memory_limit()
    if nbytes > limit:
        raise ResourceError(f"cannot allocate {nbytes} bytes: the host has {limit} bytes of memory")
    owner = np.empty(max(nbytes, 1) + alignment, dtype=np.uint8)
    base = owner.__array_interface__["data"][0]
    address = (base + alignment - 1) // alignment * alignment
    _allocations[address] = ("cpu", nbytes, owner)
    return address


def free_all() -> int:
    """Free every buffer :func:`allocate` returned; returns how many.  Idempotent."""
    count = 0
    while _allocations:
        address, (dev, _n, _owner) = _allocations.popitem()
        count += 1
        if dev == "cuda":
            cupy_module().cuda.runtime.free(address)
    return count


def allocations() -> dict:
    """A snapshot of the live allocations: address -> (device, nbytes)."""
    return {a: (d, n) for a, (d, n, _o) in _allocations.items()}


def synchronize(xp) -> None:
    """Wait for queued device work (a no-op for NumPy): results must be visible to the host on return."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
