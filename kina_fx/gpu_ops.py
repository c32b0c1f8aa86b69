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

from .errors import ValidationError

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


def device() -> str:
    """The backend selected by ``KINA_FX_DEVICE``: ``"cpu"`` or ``"cuda"``."""
    want = os.environ.get("KINA_FX_DEVICE", "auto").lower()
    if want == "cpu":
        return "cpu"
    if want in ("cuda", "gpu"):
        if cupy_module() is None:
            from .errors import GpuError
            raise GpuError("KINA_FX_DEVICE=cuda but CuPy or a CUDA device is unavailable")
        return "cuda"
    if want != "auto":
        raise ValidationError(f"KINA_FX_DEVICE must be cpu, cuda or auto, not {want!r}")
    return "cuda" if cupy_module() is not None else "cpu"


def backend():
    """The array module for the selected device (``numpy`` or ``cupy``)."""
    return np if device() == "cpu" else cupy_module()


def array_module(*arrays):
    """The array module the given arrays live in (CuPy if any is a CuPy array)."""
    cp = _cupy
    if cp is not None:
        for a in arrays:
            if isinstance(a, cp.ndarray):
                return cp
    return np


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative index, else ValidationError."""
    if not -ndim <= axis < ndim:
        raise ValidationError(f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def matmul(a, b, out=None):
    """``a @ b`` with NumPy's rules (2-D, and batched for rank >= 3)."""
    xp = array_module(a, b)
    return xp.matmul(a, b, out=out)


def gather(values, indices, out=None):
    """Rows of ``values`` picked by integer ``indices``.

    Result shape is ``indices.shape + values.shape[1:]``.  An index outside
    ``[0, values.shape[0])`` is a ValidationError (no negative wrap-around).
    """
    xp = array_module(values, indices)
    if values.ndim < 1:
        raise ValidationError("gather needs values of rank >= 1")
    rows = values.shape[0]
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= rows):
        raise ValidationError(f"gather index out of range [0, {rows})")
    result = xp.take(values, indices, axis=0)
    if out is None:
        return result
    out[...] = result
    return out


def softmax(x, axis=-1, out=None):
    """Numerically stable softmax along ``axis``; ``out`` may alias ``x``."""
    xp = array_module(x)
    axis = normalize_axis(axis, x.ndim)
    shifted = x - x.max(axis=axis, keepdims=True)
    e = xp.exp(shifted)
    e /= e.sum(axis=axis, keepdims=True)
    if out is None:
        return e
    out[...] = e
    return out


def log_softmax(x, axis=-1):
    """Numerically stable log-softmax along ``axis``."""
    xp = array_module(x)
    axis = normalize_axis(axis, x.ndim)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


def repeat_interleave(x, reps: int, axis: int, out=None):
    """Each element of ``x`` repeated ``reps`` times along ``axis`` (torch semantics)."""
    xp = array_module(x)
    if reps < 0:
        raise ValidationError(f"repeat_interleave needs reps >= 0, got {reps}")
    axis = normalize_axis(axis, x.ndim)
    result = xp.repeat(x, reps, axis=axis)
    if out is None:
        return result
    out[...] = result
    return out
