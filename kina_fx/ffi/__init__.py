"""kina_fx.ffi: libkina_fx.so's C exports and the Python behind them.

The package holds the table of every export (:mod:`~kina_fx.ffi.exports`, from
which the library's C wrappers, its header's prototypes and the docs' tables
are generated), the cffi layer -- :mod:`~kina_fx.ffi.binding` (binding the
callbacks, error translation, loading the library from Python),
:mod:`~kina_fx.ffi.effects` (the effects ABI and its handle tables),
:mod:`~kina_fx.ffi.alloc` (the memref allocator), :mod:`~kina_fx.ffi.ops` (the
copy and compute exports) and :mod:`~kina_fx.ffi.tapes` (the tape ABI) -- and
the library's C sources and header in ``kina_fx/ffi/c``.

The names below are the package's public API (``from kina_fx import ffi;
ffi.load_library()``).
"""
from __future__ import annotations

from typing import Any

from .binding import (CALLBACK_MODULES, attach, cdef, header_dir, library_path, load_library,
                      set_fast_paths, status_and_message, take_last_exception)


def __getattr__(name: str) -> Any:
    if name == "CDEF":
        return cdef()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CALLBACK_MODULES", "attach", "cdef", "header_dir", "library_path", "load_library",
           "set_fast_paths", "status_and_message", "take_last_exception"]
