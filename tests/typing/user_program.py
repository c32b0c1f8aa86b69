"""A user program of kina_fx, type-checked by ``make typecheck`` (mypy --strict
and pyright in strict mode) and run by tests/package/test_typing.py.

It touches the public API a user reaches for: the paths C builds need, the
errors and status codes, memref descriptors for NumPy arrays, the C ABI opened
from Python, the command line and fibers.  Effects are in effects_program.py.  Every value it keeps has
the type the checkers infer from kina_fx's own annotations (py.typed): no
``Any`` is written here, and mypy --strict would reject an untyped call.
"""
from __future__ import annotations

import numpy as np

import kina_fx
from kina_fx import Status, ValidationError, cli, errors, ffi, fibers, memref


def c_build_paths() -> list[str]:
    include: str = kina_fx.get_include()
    library: str = kina_fx.get_library()
    pkgconfig: str = kina_fx.get_pkgconfig_dir()
    flags: str = cli.config_flags(["cflags", "libs"])
    return [include, library, pkgconfig, flags, kina_fx.__version__]


def status_round_trip() -> Status:
    status: Status = errors.status_of(ValidationError("bad axis"))
    exc: errors.KinaError = errors.exception_for(int(status), "bad axis")
    assert isinstance(exc, ValidationError) and exc.status is Status.VALIDATION
    return status


def descriptor_of(array: np.ndarray) -> tuple[int, tuple[int, ...]]:
    m: memref.UnrankedMemref = memref.from_numpy(array)
    d: memref.Descriptor = m.descriptor()
    address: int = m.address
    assert address != 0 and d.rank == array.ndim
    return d.rank, d.strides


def abi_version() -> int:
    _ffi, lib = ffi.load_library()
    version = int(lib.kina_abi_version())
    return version


def command_line() -> int:
    status: int = cli.main(["--version"])
    return status


def running_fiber() -> fibers.Fiber:
    here: fibers.Fiber = fibers.current()
    fibers.check_owner(here)
    return here


def main() -> None:
    assert len(c_build_paths()) == 5
    assert status_round_trip() is Status.VALIDATION
    assert descriptor_of(np.zeros((2, 3), np.float32)) == (2, (3, 1))
    assert abi_version() == 1000
    assert command_line() == 0
    assert running_fiber() is fibers.current()
    print("typed user program: ok")


if __name__ == "__main__":
    main()
