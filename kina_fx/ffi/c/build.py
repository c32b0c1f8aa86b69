"""Build the C library of kina_fx: two shared objects, a header and a pkg-config file.

Run at install time by setup.py, or by hand: ``python kina_fx/ffi/c/build.py OUTDIR``.
It writes into OUTDIR:

* ``libkina_fx.so`` -- what C hosts link: the loader (kina_loader.c).  It holds
  no Python and links no libpython.  On its first call it finds the interpreter
  of the environment it is installed in, loads that interpreter's libpython and
  then the embedded module below, and forwards every export to it.
* ``_libkina_fx_cpython.so`` -- kina_runtime.c compiled with cffi's embedding
  mode for this CPython minor version.  Its Python symbols are left undefined
  (as in any extension module), to be resolved against the libpython the
  loader chose.  No RPATH names the build machine's libpython.
* ``include/kina_fx.h`` and ``pkgconfig/kina_fx.pc``.

The exports are the rows of kina_fx/ffi/exports.py, the table of the C ABI.
This script cannot import that table (the build's environment has no NumPy):
it reads the table's C form, kina_exports.h (generated from it and checked by
a test), through the C preprocessor -- to declare the ``extern "Python"``
callbacks to cffi.  kina_runtime.c and the loader include the same header.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# kina_fast_api.h, the table the effects accelerator publishes, lives with the accelerator.
SPEEDUPS_DIR = os.path.join(HERE, "..", "..", "_speedups_c")
LIBRARY = "libkina_fx.so"
EMBEDDED_LIBRARY = "_libkina_fx_cpython.so"
HEADER = "kina_fx.h"
PKGCONFIG = "kina_fx.pc"
MODULE = "_kina_fx_embedded"


def _cdef_types() -> str:
    """The types of kina_fx.h that the callbacks' parameters use: the string
    kina_fx.ffi.exports.CDEF_TYPES, read from that module's source (the build
    cannot import it, but the string is a literal)."""
    with open(os.path.join(HERE, "..", "exports.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "CDEF_TYPES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("kina_fx/ffi/exports.py has no CDEF_TYPES string")


TYPES_CDEF = _cdef_types()

# What kina_fx.ffi.binding calls in the embedded module besides the callbacks.
INTERNAL_CDEF = """
static void kina__set_last_error(const char *message);
static void kina__set_init_error(const char *message);
static const char *kina__callback_name(int i);
int32_t kina_abi_version(void);
const char *kina_last_error(void);
"""

# Runs inside the library's interpreter the first time an export is called.  It
# must never raise (cffi would print the traceback and make exports return 0):
# failures go to kina__set_init_error, which every export then reports as 5.
INIT_CODE = f"""
from {MODULE} import ffi, lib
try:
    import kina_fx.ffi as _kina_ffi
    _kina_ffi.attach(ffi, lib)
except BaseException as exc:
    try:
        import traceback
        text = "kina_fx: importing kina_fx.ffi failed: " + "".join(
            traceback.format_exception_only(type(exc), exc)).strip()
    except BaseException:
        text = "kina_fx: importing kina_fx.ffi failed"
    lib.kina__set_init_error(text.encode("utf-8", "replace")[:1000])
"""

def export_rows() -> list[tuple[str, str, str, str, str]]:
    """``(path, exported name, Python callback, (parameters), (arguments))`` for
    every row of kina_exports.h's KINA_EXPORTS, expanded by the C preprocessor."""
    program = ('#include "kina_exports.h"\n'
               "#define KINA_ROW(path, name, py, params, args) (#path, #name, #py, #params, #args),\n"
               "[KINA_EXPORTS(KINA_ROW)]\n")
    cmd = [*_compiler(), "-E", "-P", f"-I{HERE}", "-x", "c", "-"]
    result = subprocess.run(cmd, input=program, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"expanding kina_exports.h failed:\n{' '.join(cmd)}\n{result.stderr}")
    rows = ast.literal_eval(result.stdout.strip())
    if not rows:
        raise RuntimeError("kina_exports.h has no KINA_EXPORTS rows")
    return rows


def exports() -> list[tuple[str, str, str]]:
    """``(exported name, Python callback, parameter list)`` of every export answered by Python."""
    return [(name, py, params[1:-1]) for _path, name, py, params, _args in export_rows()]


def version() -> str:
    """kina_fx's version: ``__version__`` in kina_fx/__init__.py (its one source)."""
    with open(os.path.join(HERE, "..", "..", "__init__.py")) as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if match is None:
        raise RuntimeError("kina_fx/__init__.py has no __version__")
    return match.group(1)


def libpython_soname() -> str:
    """The file name the dynamic loader knows this interpreter's libpython by."""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    if not name.startswith("libpython"):  # a static-only build names its .a here
        abiflags = getattr(sys, "abiflags", "")
        name = f"libpython{sys.version_info.major}.{sys.version_info.minor}{abiflags}.so.1.0"
    return name


def make_ffi():
    import cffi

    with open(os.path.join(HERE, "kina_runtime.c")) as f:
        source = f.read()
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(TYPES_CDEF + INTERNAL_CDEF + "".join(
        f'extern "Python" int32_t {py}{params};\n' for _path, _name, py, params, _args in export_rows()))
    ffibuilder.embedding_init_code(INIT_CODE)
    ffibuilder.set_source(MODULE, source)
    return ffibuilder


def _compiler() -> list[str]:
    """$CC, else the compiler this interpreter was built with (as setuptools picks it)."""
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _link(source: str, target: str, extra: list[str], verbose: bool) -> None:
    """Compile and link one shared object.  Not through setuptools or cffi's
    compile(): both add libpython or the build interpreter's RPATH on some
    platforms, and the point here is that neither lib depends on them."""
    # Each source is compiled from its own directory under its bare name: the
    # object's file symbol then names no directory of the build machine.
    cmd = [*_compiler(), "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wall",
           f"-I{HERE}", f"-I{SPEEDUPS_DIR}", *shlex.split(os.environ.get("CFLAGS", "")), os.path.basename(source),
           "-o", target,
           f"-Wl,--version-script={os.path.join(HERE, 'exports.map')}",
           *extra, *shlex.split(os.environ.get("LDFLAGS", "")), "-ldl", "-lpthread"]
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd))
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(source))
    if result.returncode != 0:
        raise RuntimeError(f"compiling {os.path.basename(target)} failed:\n"
                           f"{' '.join(shlex.quote(c) for c in cmd)}\n{result.stdout}{result.stderr}")


def _pkgconfig_text() -> str:
    # ${pcfiledir}: pkg-config substitutes the .pc file's own directory, so the
    # file holds no absolute path and works wherever the wheel is installed.
    return ("prefix=${pcfiledir}/..\n"
            "libdir=${prefix}\n"
            "includedir=${prefix}/include\n\n"
            "Name: kina_fx\n"
            "Description: The Kina runtime C ABI (memref runtime, effects) of kina_fx\n"
            f"Version: {version()}\n"
            "Cflags: -I${includedir}\n"
            "Libs: -L${libdir} -Wl,-rpath,${libdir} -lkina_fx\n")


def build(outdir: str, verbose: bool = False, interpreter: str | None = None) -> list[str]:
    """Compile both libraries into ``outdir``, with the header and .pc file beside them.

    ``interpreter`` is baked into the loader as the last resort when it finds
    no environment around itself: only for editable installs, whose library
    stays in the source tree.  Returns the paths written.
    """
    outdir = os.path.abspath(outdir)
    written = []
    with tempfile.TemporaryDirectory(prefix="kina_fx-build-") as tmp:
        embedded_c = os.path.join(tmp, MODULE + ".c")
        make_ffi().emit_c_code(embedded_c)
        paths = sysconfig.get_paths()
        includes = sorted({paths["include"], paths["platinclude"]})
        embedded = os.path.join(tmp, EMBEDDED_LIBRARY)
        _link(embedded_c, embedded, [*(f"-I{p}" for p in includes),
                                       f"-Wl,-soname,{EMBEDDED_LIBRARY}", "-Wl,-Bsymbolic"], verbose)

        defines = {
            "KINA_PYTHON_MAJOR": str(sys.version_info.major),
            "KINA_PYTHON_MINOR": str(sys.version_info.minor),
            "KINA_LIBPYTHON": _c_string(libpython_soname()),
            "KINA_MULTIARCH": _c_string(sysconfig.get_config_var("MULTIARCH") or ""),
            "KINA_EMBEDDED_LIBRARY": _c_string(EMBEDDED_LIBRARY),
            "KINA_EDITABLE_PYTHON": _c_string(interpreter or ""),
        }
        loader = os.path.join(tmp, LIBRARY)
        _link(os.path.join(HERE, "kina_loader.c"), loader,
              [*(f"-D{k}={v}" for k, v in defines.items()), f"-Wl,-soname,{LIBRARY}"],
              verbose)

        os.makedirs(outdir, exist_ok=True)
        for built in (embedded, loader):
            target = os.path.join(outdir, os.path.basename(built))
            shutil.copyfile(built, target + ".tmp")
            os.chmod(target + ".tmp", 0o755)
            os.replace(target + ".tmp", target)  # atomic: a running process keeps the old inode
            written.append(target)
    for sub, name, text in (("include", HEADER, None), ("pkgconfig", PKGCONFIG, _pkgconfig_text())):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)
        target = os.path.join(outdir, sub, name)
        if text is None:
            shutil.copyfile(os.path.join(HERE, name), target)
        else:
            with open(target, "w") as f:
                f.write(text)
        written.append(target)
    return written


if __name__ == "__main__":
    # By hand the library usually lands in the source tree, as an editable
    # install's does: record this interpreter for it.
    for path in build(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", ".."),
                      verbose=True, interpreter=sys.executable):
        print(path)
