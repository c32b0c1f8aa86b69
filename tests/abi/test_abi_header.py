"""kina_fx.h, the export table, the built library and kina_fx.ffi agree.

The status codes are defined once, in kina_fx/errors.py; the header mirrors
them as #defines and this test keeps the two equal.  The exports are listed
once, in the table of kina_fx/ffi/exports.py; what build.py reads of it
(kina_exports.h), the header, the library's dynamic symbols and the Python
callbacks must match it.
"""
from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.abi import load_module

from kina_fx import ffi as kffi
from kina_fx.errors import Status
from kina_fx.ffi import exports
from kina_fx.memref import MAX_RANK

NATIVE = Path(kffi.__file__).parent / "c"
HEADER = (NATIVE / "kina_fx.h").read_text()


def native_build():
    return load_module(NATIVE / "build.py", "kina_native_build")


def test_status_defines_mirror_errors_py():
    defines = {m.group(1): int(m.group(2))
               for m in re.finditer(r"#define KINA_STATUS_(\w+) (\d+)", HEADER)}
    assert defines == {s.name: int(s) for s in Status}


def test_max_rank_matches():
    assert f"#define KINA_MAX_RANK {MAX_RANK}" in HEADER


MEMREF_EXPORTS = {
    "_mlir_ciface_runtime_copy_to_device_f32", "_mlir_ciface_runtime_copy_to_device_f16",
    "_mlir_ciface_runtime_copy_to_host_f32", "_mlir_ciface_runtime_gpu_matmul_f32",
    "_mlir_ciface_runtime_gpu_gather_f32", "_mlir_ciface_runtime_gpu_softmax_f32",
    "_mlir_ciface_runtime_gpu_repeat_interleave_f32", "_mlir_ciface_runtime_gpu_alloc_unranked",
    "runtime_gpu_free_all"}


def all_callbacks():
    """Every Python callback the library binds (the callback modules of kina_fx.ffi)."""
    callbacks = {}
    for module in kffi.CALLBACK_MODULES:
        callbacks.update(importlib.import_module(module).CALLBACKS)
    return callbacks


def test_export_table_header_and_callbacks_agree():
    table = native_build().exports()
    names = {name for name, _, _ in table}
    assert MEMREF_EXPORTS <= names
    assert names == {row.name for row in exports.PYTHON_EXPORTS}
    callbacks = all_callbacks()
    for name, py, params in table:
        row = exports.BY_NAME[name]
        assert (py, params) == (row.callback, row.c_parameters())
        assert re.search(rf"\bint32_t {name}\(", HEADER), f"{name} is not declared in kina_fx.h"
        assert py in callbacks, f"no Python callback {py} for {name}"
        assert py in importlib.import_module(row.module).CALLBACKS, f"{py} is not in {row.module}"
        assert re.search(rf"\bint32_t {name}\(", kffi.CDEF), f"{name} is not in ffi.CDEF"
    assert set(callbacks) == {py for _, py, _ in table}


def test_installed_header_is_the_source_header():
    installed = Path(kffi.header_dir()) / "kina_fx.h"
    assert installed.read_text() == HEADER


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm is not installed")
def test_library_exports_exactly_the_abi():
    out = subprocess.run(["nm", "-D", "--defined-only", kffi.library_path()],
                         check=True, capture_output=True, text=True).stdout
    symbols = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert symbols == {row.name for row in exports.EXPORTS}  # no bare cffi export (PyInit_...)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf is not installed")
def test_libraries_name_no_libpython_and_no_build_path():
    """The loader links no libpython and neither library has an RPATH: which
    libpython to use is decided at run time (kina_loader.c), so a wheel runs
    with any build of its CPython minor version."""
    lib = Path(kffi.library_path())
    for path in (lib, lib.parent / native_build().EMBEDDED_LIBRARY):
        dynamic = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True,
                                 text=True).stdout
        assert "libpython" not in dynamic and "RPATH" not in dynamic and "RUNPATH" not in dynamic


def test_kina_fx_config_prints_flags_in_the_order_asked(capsys):
    from kina_fx import cli

    assert cli.main(["config", "--libs", "--cflags"]) == 0
    out = capsys.readouterr().out.split()
    libdir = str(Path(kffi.library_path()).parent)
    assert out == [f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkina_fx", f"-I{kffi.header_dir()}"]
    assert cli.main(["config", "--library"]) == 0
    assert capsys.readouterr().out.strip() == kffi.library_path()
    assert cli.main(["config"]) == 2
    assert cli.main(["frobnicate"]) == 2
