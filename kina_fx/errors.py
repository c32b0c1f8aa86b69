"""Status codes and exception classes: the one place they are defined.

The Kina ABI (docs/spec.md, "Status codes") returns an ``int32`` status from every C
export.  Each non-zero code has one Python exception class; the C exports in
:mod:`kina_fx.ffi` translate an exception into its class's ``status`` and the
message into ``kina_last_error``.  Codes 0-6 are the specification's; codes from 7 up
are kina_fx extensions and are marked unstable in ``docs/abi.md``.
"""
from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """The ABI's status codes (``FfiErrorCode`` in the specification, docs/spec.md)."""

    SUCCESS = 0
    VALIDATION = 1
    RESOURCE = 2
    GPU = 3
    UNIMPLEMENTED = 4
    INTERNAL = 5
    TYPE = 6
    # Unstable extensions used by the effects C ABI.
    CANCELLED = 7     # the fiber was cancelled while it waited in a perform
    UNHANDLED = 8     # an effect reached the bottom of the handler stack


class KinaError(Exception):
    """Base class of every error kina_fx raises on purpose."""

    status: Status = Status.INTERNAL


# One class per status, each written out (not made by a function) so that
# tracebacks, the docs and type checkers name it: the classes below, through
# CommunicationError, repeat one shape by design (a deliberate repetition).


class ValidationError(KinaError, ValueError):
    """Bad input: null pointer, wrong rank or shape, bad axis, stale handle."""

    status = Status.VALIDATION


class ResourceError(KinaError, MemoryError):
    """An allocation could not be satisfied."""

    status = Status.RESOURCE


class GpuError(KinaError, RuntimeError):
    """The CUDA backend failed (launch, copy, driver)."""

    status = Status.GPU


class UnimplementedError(KinaError, NotImplementedError):
    """A valid request this runtime does not implement (e.g. an unsupported dtype)."""

    status = Status.UNIMPLEMENTED


class InternalError(KinaError, RuntimeError):
    """A bug in kina_fx, or a failure it did not anticipate."""

    status = Status.INTERNAL


class KinaTypeError(KinaError, TypeError):
    """An argument of the wrong element type or kind."""

    status = Status.TYPE


class CommunicationError(KinaError, RuntimeError):
    """A collective could not complete: the other processes did not answer in
    time, one of them failed, or the MPI library reported an error
    (:mod:`kina_fx.distributed`).  Status 2: a resource -- the other
    processes -- is not available."""

    status = Status.RESOURCE


class Cancelled(KinaError):
    """Raised inside a fiber at its pending perform when the fiber is cancelled."""

    status = Status.CANCELLED


class Unhandled(KinaError):
    """No handler handles ``effect``; raised at the perform site.

    ``payload`` is the tuple of arguments the effect was performed with.
    ``effect`` is None when the status came from C code
    (:func:`exception_for` of ``KINA_STATUS_UNHANDLED``), which names no effect
    object; ``message`` replaces the default text.
    """

    status = Status.UNHANDLED

    def __init__(self, effect, payload=(), message=None):
        self.effect = effect
        self.payload = tuple(payload)
        super().__init__(message if message is not None
                         else f"unhandled effect {effect!r} with payload {self.payload!r}")

    def __reduce__(self):
        return (type(self), (self.effect, self.payload, str(self)))


class ContinuationAlreadyResumed(ValidationError):
    """A one-shot continuation was resumed or discontinued a second time."""


class WrongThread(ValidationError):
    """A fiber or continuation was used from an OS thread that does not own it."""


def status_of(exc: BaseException) -> Status:
    """The status code a C export returns for ``exc``."""
    status = getattr(exc, "status", None)     # KinaError, and fibers.Unwind
    if isinstance(status, Status):
        return status
    if isinstance(exc, MemoryError):
        return Status.RESOURCE
    if isinstance(exc, NotImplementedError):
        return Status.UNIMPLEMENTED
    if isinstance(exc, TypeError):
        return Status.TYPE
    if isinstance(exc, (ValueError, IndexError)):
        return Status.VALIDATION
    return Status.INTERNAL


_CLASS_OF_STATUS = {
    Status.VALIDATION: ValidationError,
    Status.RESOURCE: ResourceError,
    Status.GPU: GpuError,
    Status.UNIMPLEMENTED: UnimplementedError,
    Status.INTERNAL: InternalError,
    Status.TYPE: KinaTypeError,
    Status.CANCELLED: Cancelled,
}


def exception_for(status: int, message: str) -> KinaError:
    """The exception a non-zero status from C code stands for (inverse of status_of).

    Every status 1-8 has its class; a code outside the set is an InternalError
    naming it.
    """
    try:
        status = Status(status)
    except ValueError:
        return InternalError(f"status {status}: {message}")
    if status == Status.UNHANDLED:
        return Unhandled(None, (), message)
    if status == Status.SUCCESS:
        return InternalError(f"status 0 is not a failure: {message}")
    return _CLASS_OF_STATUS[status](message)
