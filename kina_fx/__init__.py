"""kina_fx: the Python implementation of the Kina runtime.

Fibers and OCaml-5-style effect handlers (:mod:`kina_fx.handlers`), the memref
runtime C ABI (:mod:`kina_fx.ffi`, :mod:`kina_fx.gpu_ops`) and autograd tapes
built on effects (:mod:`kina_fx.autograd`).
"""
from .errors import (Cancelled, ContinuationAlreadyResumed, GpuError, InternalError,
                     KinaError, KinaTypeError, ResourceError, Status, UnimplementedError,
                     Unhandled, ValidationError, WrongThread)
from .handlers import Continuation, Effect, Handler, fiber, perform

__version__ = "0.1.0"

__all__ = [
    "Effect", "perform", "Handler", "Continuation", "fiber",
    "Unhandled", "ContinuationAlreadyResumed", "WrongThread", "Cancelled",
    "Status", "KinaError", "ValidationError", "ResourceError", "GpuError",
    "UnimplementedError", "InternalError", "KinaTypeError",
]
