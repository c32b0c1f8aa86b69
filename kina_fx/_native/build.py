"""Build libkina_fx.so with cffi's embedding mode.

Run at install time by setup.py (the library is tied to the interpreter it is
built for), or by hand: ``python kina_fx/_native/build.py OUTDIR``.  It writes
``OUTDIR/libkina_fx.so`` and ``OUTDIR/include/kina_fx.h``.

The C part (kina_runtime.c) is the only thing exported; the ``extern "Python"``
callbacks it calls are declared here from its ``KINA_EXPORTS`` table, so an
export is added in one place on the C side.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libkina_fx.so"
HEADER = "kina_fx.h"
MODULE = "_kina_fx_embedded"

TYPES_CDEF = """
typedef struct { int64_t rank; void *descriptor; } kina_unranked_memref_t;
typedef uint64_t kina_fiber_t;
typedef uint64_t kina_handler_t;
typedef uint64_t kina_tape_t;
typedef int64_t (*kina_fiber_fn)(void *arg);
typedef int32_t (*kina_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                   int32_t nargs, int64_t *out_value);
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

# The files holding X(...) export lines: the memref runtime and the effects ABI.
EXPORT_TABLES = ("kina_runtime.c", "kina_runtime_ops.h", "kina_tape_exports.h", "kina_effects_exports.h")

_EXPORT_LINE = re.compile(r"^\s*X\((\w+),\s*(\w+),\s*\(([^)]*)\),\s*\(([^)]*)\)\)", re.M)


def exports(source: str | None = None) -> list[tuple[str, str, str]]:
    """``(exported name, Python callback name, parameter list)`` per KINA_EXPORTS line."""
    if source is None:
        source = ""
        for name in EXPORT_TABLES:
            with open(os.path.join(HERE, name)) as f:
                source += f.read()
    return [(m.group(1), m.group(2), m.group(3).strip()) for m in _EXPORT_LINE.finditer(source)]


def make_ffi():
    import cffi

    with open(os.path.join(HERE, "kina_runtime.c")) as f:
        source = f.read()
    table = exports()
    if not table:
        raise RuntimeError("no KINA_EXPORTS entries found in kina_runtime.c")
    ffibuilder = cffi.FFI()
    cdef = TYPES_CDEF + "".join(
        f'extern "Python" int32_t {py}({params});\n' for _, py, params in table)
    ffibuilder.cdef(cdef)
    ffibuilder.embedding_init_code(INIT_CODE)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ffibuilder.set_source(
        MODULE,
        source,
        include_dirs=[HERE],
        define_macros=[("KINA_FX_BUILD_PYTHON", '"%s"' % sys.executable.replace('"', '\\"'))],
        extra_compile_args=["-O2", "-fvisibility=hidden"],
        # RPATH (not RUNPATH) to this interpreter's libpython: Debian ships another
        # libpython3.x that the loader could pick otherwise.  The version script
        # exports only the ABI (not cffi's PyInit function).
        extra_link_args=[f"-Wl,-rpath,{libdir}", "-Wl,--disable-new-dtags",
                         f"-Wl,-soname,{LIBRARY}",
                         "-Wl,--version-script=" + os.path.join(HERE, "exports.map"),
                         "-ldl", "-lpthread"],
    )
    return ffibuilder


def build(outdir: str, verbose: bool = False) -> str:
    """Compile the library into ``outdir`` and copy the header to ``outdir/include``."""
    outdir = os.path.abspath(outdir)
    os.makedirs(os.path.join(outdir, "include"), exist_ok=True)
    ffibuilder = make_ffi()
    with tempfile.TemporaryDirectory(prefix="kina_fx-build-") as tmp:
        built = ffibuilder.compile(tmpdir=tmp, target=LIBRARY, verbose=verbose)
        target = os.path.join(outdir, LIBRARY)
        tmp_target = target + ".tmp"
        shutil.copyfile(built, tmp_target)
        os.chmod(tmp_target, 0o755)
        os.replace(tmp_target, target)  # atomic: a running process keeps the old inode
    shutil.copyfile(os.path.join(HERE, HEADER), os.path.join(outdir, "include", HEADER))
    return target


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, ".."), verbose=True))
