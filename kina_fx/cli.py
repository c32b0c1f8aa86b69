"""The ``kina-fx`` command (also ``python -m kina_fx``): ``config``, ``demo``, ``--version``.

``kina-fx config --cflags --libs`` prints flags in the order asked, on one line,
shell-quoted, so that a C host builds and runs with no LD_LIBRARY_PATH (the
flags carry an rpath to the library)::

    cc host.c $(kina-fx config --cflags --libs)               # paths without spaces
    eval "cc host.c $(kina-fx config --cflags --libs)"        # any path

A shell splits an unquoted ``$(...)`` at every space and does not remove
quotes, so a path with a space needs the ``eval`` form (or a Makefile, whose
recipe lines the shell parses, or pkg-config, which escapes spaces).  A path
option (``--includedir``, ``--libdir``, ``--library``, ``--pkgconfigdir``)
prints one path as it is, for ``"$(kina-fx config --library)"``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__, get_include, get_library, get_pkgconfig_dir

#: The optional packages ``kina-fx demo`` needs: (import name, distribution name).
DEMO_REQUIREMENTS = (("sklearn", "scikit-learn"), ("matplotlib", "matplotlib"), ("tqdm", "tqdm"))

_CONFIG_ITEMS = (
    ("cflags", "compiler flags (-I to kina_fx.h)"),
    ("libs", "linker flags (-L, rpath, -lkina_fx)"),
    ("includedir", "directory holding kina_fx.h"),
    ("libdir", "directory holding libkina_fx.so"),
    ("library", "full path of libkina_fx.so"),
    ("pkgconfigdir", "directory holding kina_fx.pc (for PKG_CONFIG_PATH)"),
)


def config_paths() -> dict[str, str]:
    """The paths ``kina-fx config`` prints, by item name."""
    library = get_library()
    return {"includedir": get_include(), "libdir": os.path.dirname(library), "library": library,
            "pkgconfigdir": get_pkgconfig_dir()}


def config_flags(which: Sequence[str]) -> str:
    """The shell-quoted ``--cflags``/``--libs`` flags for each requested item, in order."""
    q = shlex.quote
    paths = config_paths()
    table = {
        "cflags": "-I" + q(paths["includedir"]),
        "libs": f"-L{q(paths['libdir'])} -Wl,-rpath,{q(paths['libdir'])} -lkina_fx",
    }
    return " ".join(table[w] for w in which)


def _config(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kina-fx config",
        description="Print what a C host needs to use libkina_fx.so: --cflags and --libs as "
                    "shell-quoted flags on one line (use eval \"cc ... $(kina-fx config ...)\" "
                    "when the path may hold a space), or one path as it is (for \"$(...)\").")
    order: list[str] = []

    class Add(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            order.append(self.dest)

    for name, help_ in _CONFIG_ITEMS:
        parser.add_argument(f"--{name}", nargs=0, action=Add, help=help_)
    parser.parse_args(argv)
    paths = [w for w in order if w in config_paths()]
    if not order or (paths and len(order) > 1):
        if paths:
            print("kina-fx config: a path option (--includedir, --libdir, --library, "
                  "--pkgconfigdir) is printed alone", file=sys.stderr)
        else:
            parser.print_help()
        return 2
    lib = get_library()
    if not os.path.exists(lib):
        print(f"kina-fx: {lib} is missing; reinstall kina_fx to build it", file=sys.stderr)
        return 1
    print(config_paths()[paths[0]] if paths else config_flags(order))
    return 0


def missing_demo_requirements() -> list[str]:
    """The distributions of :data:`DEMO_REQUIREMENTS` that are not installed."""
    return [dist for module, dist in DEMO_REQUIREMENTS if importlib.util.find_spec(module) is None]


def _demo(argv: list[str]) -> int:
    if "--quick" not in argv and "-h" not in argv and "--help" not in argv:
        missing = missing_demo_requirements()
        if missing:
            print(f"kina-fx demo: needs the 'demo' extra (missing: {', '.join(missing)}); "
                  "install it with: pip install 'kina_fx[demo]' (or run kina-fx demo --quick)",
                  file=sys.stderr)
            return 1
    from .demos import effects as demo
    # Pass the remaining arguments explicitly: demo.main parses argv itself,
    # and sys.argv still holds "demo".
    result = demo.main(argv)
    return result if isinstance(result, int) else 0


USAGE = """usage: kina-fx [--version] {config,demo} ...

  config  print C compiler/linker flags for libkina_fx.so (--cflags --libs ...)
  demo    run the kina_fx demo (needs the 'demo' extra; --quick does not)"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"kina_fx {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command == "config":
        return _config(rest)
    if command == "demo":
        return _demo(rest)
    print(f"kina-fx: unknown command {command!r} (expected config or demo)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
