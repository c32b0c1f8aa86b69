"""The Python side of libkina_fx.so's C exports: binding the callbacks, error translation.

libkina_fx.so (built from ``kina_fx/ffi/c``) exports hand-written C wrappers;
each starts Python if needed and calls a static ``extern "Python"`` callback.
:func:`attach` runs inside the library's embedded module at start-up and binds
every callback to the function of the same name in one of the callback modules
(:data:`CALLBACK_MODULES`) with ``@ffi.def_extern(error=INTERNAL, onerror=...)``:
an exception becomes its status code (:func:`kina_fx.errors.status_of`) and its
message goes to the thread-local ``kina_last_error``.  Nothing unwinds into C
and nothing is printed.

The ffi layer only translates between C and Python: :mod:`kina_fx.ffi.effects`
for the effects ABI, :mod:`kina_fx.ffi.alloc` for the memref allocator,
:mod:`kina_fx.ffi.ops` for the copy and compute exports (one callback per row of
the runtime op table; descriptors become arrays in :mod:`kina_fx.memref`, the
ops run in :mod:`kina_fx.gpu_ops`) and :mod:`kina_fx.ffi.tapes` for the tape ABI.

:func:`load_library` opens the built library from Python (ABI mode), as the
in-process tests and benchmarks do.
"""
from __future__ import annotations

import importlib
import os
import threading
from typing import Any, Tuple

from .. import fibers
from ..errors import GpuError, InternalError, Status, status_of

_lib = None  # the embedded module's lib, once attached

# The callback modules, each with a CALLBACKS dict (Python callback name ->
# function).  "eager" ones are imported and bound by attach(); "lazy" ones on
# the first call of one of the C table's callbacks that no eager module has,
# so that a host using only the effects ABI never imports NumPy (the memref
# runtime's modules do).  A new group of exports adds its module here.
CALLBACK_MODULES = {
    "kina_fx.ffi.effects": "eager",
    "kina_fx.ffi.alloc": "lazy",
    "kina_fx.ffi.ops": "lazy",
    "kina_fx.ffi.tapes": "lazy",
    "kina_fx.ffi.distributed": "lazy",
}


# ---- error translation -----------------------------------------------------------

def _is_cuda_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("cupy", "cupy_backends")) and not isinstance(exc, MemoryError)


def status_and_message(exc: BaseException) -> tuple[int, str]:
    """The status code and kina_last_error text for an exception."""
    if _is_cuda_error(exc):
        exc = GpuError(f"{type(exc).__name__}: {exc}")
    status = int(status_of(exc))
    return status, f"{type(exc).__name__}: {exc}"


_last = threading.local()


def _onerror(exc_type, exc_value, _traceback):
    """cffi's onerror hook: record the message and return the status (never raises)."""
    try:
        exc = exc_value if exc_value is not None else exc_type()
        status, message = status_and_message(exc)
        _lib.kina__set_last_error(message.encode("utf-8", "replace")[:1000])
        # Kept without its traceback, nor the exceptions it replaced (which
        # keep theirs): their frames, and their callers', may hold a
        # continuation, which would then look kept (docs/effects.md, "Abort
        # cleanup") until the thread's next failure replaced this one.
        exc = exc.with_traceback(None)
        exc.__cause__ = exc.__context__ = None
        _last.failure = (status, exc)
        return status
    except BaseException:  # even formatting failed: still a code, never a traceback
        return int(Status.INTERNAL)


def take_last_exception(status: int) -> BaseException | None:
    """The exception behind the last failed export on this thread, if it gave ``status``.

    For Python code that called compiled code, which called the library: it
    re-raises the original exception (a :class:`kina_fx.autograd.memory.TapeError`,
    say) rather than the generic class of its status, without the traceback
    and the chain (``__cause__``, ``__context__``) it had.  Taken once."""
    failure = getattr(_last, "failure", None)
    _last.failure = None
    if failure is None or failure[0] != status:
        return None
    return failure[1]


# ---- binding the callbacks -----------------------------------------------------------

def attach(ffi: Any, lib: Any) -> None:
    """Bind every ``extern "Python"`` callback of the embedded module (run by its init code).

    Callbacks of the eager modules are bound to their functions; every other
    name of the C table to a stub that finds its function in the lazy modules
    on its first call.  Every name gets a function, so cffi's silent 0 for an
    unbound callback cannot happen: a name that no module has fails each of
    its calls with InternalError (status 5).  tests/abi/test_abi_header.py checks
    that the modules cover the C table.
    """
    global _lib
    _lib = lib
    callbacks = {}
    for module, when in CALLBACK_MODULES.items():
        if when == "eager":
            mod = importlib.import_module(module)
            callbacks.update(mod.attach(ffi, _onerror) if hasattr(mod, "attach") else mod.CALLBACKS)
    names = []
    i = 0
    while True:
        name = lib.kina__callback_name(i)
        if name == ffi.NULL:
            break
        names.append(ffi.string(name).decode())
        i += 1
    for name in names:
        fn = callbacks.get(name) or _lazy_callback(name)
        ffi.def_extern(name=name, error=int(Status.INTERNAL), onerror=_onerror)(fn)
    set_fast_paths(True)


def set_fast_paths(on: bool) -> bool:
    """Turn the C fast paths of the exports on or off (kina_fx._speedups: the
    effects exports, the runtime ops on the CPU; docs/abi.md, "Fast paths");
    returns whether they were on.  They are on once the library is attached,
    with the compiled implementation in use; off, every call takes its
    ``extern "Python"`` path, which the tests compare them with."""
    return False if fibers.speedups is None else fibers.speedups.set_c_abi_fast_paths(on)


def _lazy_callback(name: str):
    """A callback that imports the lazy modules on its first call and then
    forwards to ``name`` there.  (It stays the bound function: cffi must not
    rebind a callback from inside that callback.)"""
    target = None

    def callback(*args):
        nonlocal target
        if target is None:
            target = _find_lazy(name)
        return target(*args)

    callback.__name__ = callback.__qualname__ = name
    return callback


# Host threads may make their first calls at the same moment: the lazy imports
# are made one thread at a time.  (Concurrent first imports from threads that
# C created raise a spurious KeyError inside importlib on CPython 3.11.)
_lazy_lock = threading.Lock()


def _find_lazy(name: str):
    with _lazy_lock:
        return _find_lazy_locked(name)


def _find_lazy_locked(name: str):
    for module, when in CALLBACK_MODULES.items():
        if when == "lazy":
            fn = importlib.import_module(module).CALLBACKS.get(name)
            if fn is not None:
                return fn
    raise InternalError(f"kina_fx.ffi has no callback for {name!r}")


# ---- loading the library from Python -------------------------------------------

def cdef() -> str:
    """Every C declaration of kina_fx.h that Python callers need (``ffi.CDEF``):
    the types and every export of the table (:func:`kina_fx.ffi.exports.cdef`).

    Built on first use: the table's op rows come from the runtime op table,
    whose modules import NumPy."""
    from . import exports

    return exports.cdef()


def __getattr__(name):
    if name == "CDEF":
        return cdef()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_loaded = None
_load_lock = threading.Lock()


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_path() -> str:
    """Where the installed libkina_fx.so is (in the kina_fx package directory)."""
    return os.path.join(_PACKAGE_DIR, "libkina_fx.so")


def header_dir() -> str:
    """The directory holding the installed kina_fx.h."""
    return os.path.join(_PACKAGE_DIR, "include")


def load_library() -> Tuple[Any, Any]:
    """``(ffi, lib)`` for the built libkina_fx.so, opened in this process (ABI mode).

    Inside a running Python the library uses this interpreter; the exports
    release the GIL around the call as any cffi ABI call does.
    """
    global _loaded
    with _load_lock:
        if _loaded is None:
            import cffi

            path = library_path()
            if not os.path.exists(path):
                raise InternalError(f"{path} is missing: reinstall kina_fx (pip install -e .) to build it")
            c = cffi.FFI()
            c.cdef(cdef())
            _loaded = (c, c.dlopen(path))
        return _loaded
