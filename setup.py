"""Build hook: compile libkina_fx.so (cffi embedding mode) at install time.

The library links the interpreter it is built for, so it is built on the target
by ``pip install .`` and ``pip install -e .`` alike: a build_ext command whose
one "extension" is the library.  In a regular install it lands in the wheel
(``kina_fx/libkina_fx.so``, ``kina_fx/include/kina_fx.h``); in an editable
install build_ext runs in place and writes them into the source tree.
"""
import importlib.util
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _native_builder():
    path = os.path.join(HERE, "kina_fx", "_native", "build.py")
    spec = importlib.util.spec_from_file_location("kina_fx_native_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildNative(build_ext):
    """Builds the ``kina_fx.libkina_fx`` pseudo-extension with kina_fx/_native/build.py."""

    def get_ext_filename(self, fullname):
        if fullname == "kina_fx.libkina_fx":
            return os.path.join("kina_fx", "libkina_fx.so")
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if ext.name != "kina_fx.libkina_fx":
            return super().build_extension(ext)
        target = self.get_ext_fullpath(ext.name)
        _native_builder().build(os.path.dirname(target), verbose=bool(self.verbose > 1))

    def copy_extensions_to_source(self):
        """Editable installs: also put the header next to the in-place library."""
        super().copy_extensions_to_source()
        for ext in self.extensions:
            if ext.name == "kina_fx.libkina_fx":
                built = os.path.join(self.build_lib, "kina_fx", "include", "kina_fx.h")
                target = os.path.join(HERE, "kina_fx", "include", "kina_fx.h")
                self.mkpath(os.path.dirname(target))
                self.copy_file(built, target, level=self.verbose)

    def get_outputs(self):
        outputs = super().get_outputs()
        for ext in self.extensions:
            if ext.name == "kina_fx.libkina_fx":
                outdir = os.path.dirname(self.get_ext_fullpath(ext.name))
                outputs.append(os.path.join(outdir, "include", "kina_fx.h"))
        return outputs


setup(
    ext_modules=[
        Extension("kina_fx.libkina_fx", sources=[]),
        # The compiled fast path of handlers.perform.  Optional: when it cannot
        # be compiled, build_ext warns and kina_fx runs in pure Python.
        Extension("kina_fx._speedups", optional=True,
                  sources=[f"kina_fx/_native/speedups_{part}.c"
                           for part in ("module", "types", "perform", "nogil", "c_abi", "c_fibers", "tail",
                                        "round_trip")],
                  depends=["kina_fx/_native/speedups.h", "kina_fx/_native/kina_fast_api.h"]),
    ],
    cmdclass={"build_ext": BuildNative},
)
