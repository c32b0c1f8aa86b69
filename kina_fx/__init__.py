"""kina_fx: the Python implementation of the Kina runtime.

Fibers and OCaml-5-style effect handlers (:mod:`kina_fx.handlers`), the memref
runtime C ABI (:mod:`kina_fx.ffi`, :mod:`kina_fx.gpu_ops`) and autograd tapes
built on effects (:mod:`kina_fx.autograd`).
"""
from .errors import (Cancelled, ContinuationAlreadyResumed, GpuError, InternalError,
                     KinaError, KinaTypeError, ResourceError, Status, UnimplementedError,
                     Unhandled, ValidationError, WrongThread)
from .handlers import FORWARD, Continuation, Effect, Handler, Stepper, fiber, perform

__version__ = "0.1.0"

# Submodules loaded on first use: importing kina_fx stays cheap and never needs
# optional packages (the embedded library imports kina_fx.ffi through here).
_LAZY = {"autograd": "autograd", "ad": "autograd", "gpu_ops": "gpu_ops", "memref": "memref",
         "ffi": "ffi", "fibers": "fibers", "handlers": "handlers", "errors": "errors"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return importlib.import_module(f".{_LAZY[name]}", __name__)
    raise AttributeError(f"module 'kina_fx' has no attribute {name!r}")

__all__ = [
    "Effect", "perform", "Handler", "Continuation", "fiber", "Stepper", "FORWARD",
    "Unhandled", "ContinuationAlreadyResumed", "WrongThread", "Cancelled",
    "Status", "KinaError", "ValidationError", "ResourceError", "GpuError",
    "UnimplementedError", "InternalError", "KinaTypeError",
]
