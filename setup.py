"""Build hook: compile kina_fx's C library (kina_fx/ffi/c/build.py) as part of build_ext.

The library is one build_ext "extension", ``kina_fx.libkina_fx``, whose build
writes several files (build.py's docstring says which): the loader
``libkina_fx.so`` that C hosts link, the embedded module it loads, the header
and the pkg-config file.  A wheel gets them under ``kina_fx/``; an editable
install writes them into the source tree.  Neither file depends on where the
build ran: no path of pip's build environment, no RPATH to the build
machine's libpython (the loader finds the interpreter at run time), except
that an editable install records its own interpreter as a last resort.
"""
import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE_LIBRARY = "kina_fx.libkina_fx"


def _native_builder():
    path = os.path.join(HERE, "kina_fx", "ffi", "c", "build.py")
    spec = importlib.util.spec_from_file_location("kina_fx_native_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildNative(build_ext):
    """Builds the ``kina_fx.libkina_fx`` pseudo-extension with kina_fx/ffi/c/build.py."""

    def get_ext_filename(self, fullname):
        if fullname == NATIVE_LIBRARY:
            return os.path.join("kina_fx", "libkina_fx.so")
        return super().get_ext_filename(fullname)

    def _native_outputs(self):
        """Every file the native build writes, relative to the package directory."""
        builder = _native_builder()
        return [builder.LIBRARY, builder.EMBEDDED_LIBRARY, os.path.join("include", builder.HEADER),
                os.path.join("pkgconfig", builder.PKGCONFIG)]

    def build_extension(self, ext):
        if ext.name != NATIVE_LIBRARY:
            return super().build_extension(ext)
        editable = bool(getattr(self, "editable_mode", False) or self.inplace)
        target = self.get_ext_fullpath(ext.name)
        _native_builder().build(os.path.dirname(target), verbose=bool(self.verbose > 1),
                                interpreter=sys.executable if editable else None)

    def copy_extensions_to_source(self):
        """Editable installs: put every native file in the source tree, not only the .so."""
        super().copy_extensions_to_source()
        if not any(ext.name == NATIVE_LIBRARY for ext in self.extensions):
            return
        for name in self._native_outputs()[1:]:  # [0], the .so, super() copied
            built = os.path.join(self.build_lib, "kina_fx", name)
            target = os.path.join(HERE, "kina_fx", name)
            self.mkpath(os.path.dirname(target))
            self.copy_file(built, target, level=self.verbose)

    def get_outputs(self):
        outputs = super().get_outputs()
        for ext in self.extensions:
            if ext.name == NATIVE_LIBRARY:
                outdir = os.path.dirname(self.get_ext_fullpath(ext.name))
                outputs.extend(os.path.join(outdir, name) for name in self._native_outputs()[1:])
        return outputs


setup(
    ext_modules=[
        Extension(NATIVE_LIBRARY, sources=[]),
        # The compiled fast path of handlers.perform.  Optional: when it cannot
        # be compiled, build_ext warns and kina_fx runs in pure Python.
        Extension("kina_fx._speedups", optional=True,
                  sources=[f"kina_fx/_speedups_c/{part}.c"
                           for part in ("module", "types", "perform", "nogil", "c_abi", "c_fibers", "tail",
                                        "round_trip", "buffers", "kernels", "op_calls", "tape_calls",
                                        "tape_clauses")],
                  depends=["kina_fx/_speedups_c/speedups.h", "kina_fx/_speedups_c/kina_fast_api.h"]),
    ],
    cmdclass={"build_ext": BuildNative},
)
