"""kina_fx: the Python implementation of the Kina runtime.

Fibers and OCaml-5-style effect handlers (:mod:`kina_fx.handlers`), the memref
runtime C ABI (:mod:`kina_fx.ffi`, :mod:`kina_fx.gpu_ops`) and autograd tapes
built on effects (:mod:`kina_fx.autograd`).

C users find the library with :func:`get_include`, :func:`get_library` and
:func:`get_pkgconfig_dir` (or ``kina-fx config``), as NumPy's
``get_include()`` and pybind11's are used.
"""
from __future__ import annotations

import os as _os
from typing import Any as _Any

from .errors import (Cancelled, ContinuationAlreadyResumed, GpuError, InternalError,
                     KinaError, KinaTypeError, ResourceError, Status, UnimplementedError,
                     Unhandled, ValidationError, WrongThread)
from .handlers import FORWARD, Continuation, Effect, Handler, Stepper, fiber, perform

__version__ = "0.1.0"  # the one source: pyproject.toml and build.py read it

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def get_include() -> str:
    """The directory holding ``kina_fx.h`` (for ``-I``)."""
    return _os.path.join(_HERE, "include")


def get_library() -> str:
    """The full path of ``libkina_fx.so`` (for linking, ``dlopen`` or
    ``mlir-cpu-runner -shared-libs=``); its directory is the ``-L``/rpath one."""
    return _os.path.join(_HERE, "libkina_fx.so")


def get_pkgconfig_dir() -> str:
    """The directory holding ``kina_fx.pc``: put it on ``PKG_CONFIG_PATH``."""
    return _os.path.join(_HERE, "pkgconfig")


# Submodules loaded on first use: importing kina_fx stays cheap and never needs
# optional packages (the embedded library imports kina_fx.ffi through here).
_LAZY = {"autograd": "autograd", "ad": "autograd", "gpu_ops": "gpu_ops", "memref": "memref",
         "ffi": "ffi", "fibers": "fibers", "handlers": "handlers", "errors": "errors"}


def __getattr__(name: str) -> _Any:
    if name in _LAZY:
        import importlib
        return importlib.import_module(f".{_LAZY[name]}", __name__)
    raise AttributeError(f"module 'kina_fx' has no attribute {name!r}")

__all__ = [
    "Effect", "perform", "Handler", "Continuation", "fiber", "Stepper", "FORWARD",
    "Unhandled", "ContinuationAlreadyResumed", "WrongThread", "Cancelled",
    "Status", "KinaError", "ValidationError", "ResourceError", "GpuError",
    "UnimplementedError", "InternalError", "KinaTypeError",
    "get_include", "get_library", "get_pkgconfig_dir", "__version__",
]
