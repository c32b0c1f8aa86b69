"""The ``kina-fx`` command: ``config`` (how a C host compiles against libkina_fx.so) and ``demo``.

``kina-fx config --cflags --libs`` prints flags in the order asked, on one line,
so ``cc host.c $(kina-fx config --cflags --libs)`` builds and runs a host with
no LD_LIBRARY_PATH (the flags carry an rpath to the library).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys


def _paths():
    here = os.path.dirname(os.path.abspath(__file__))
    return {"libdir": here, "includedir": os.path.join(here, "include")}


def config_flags(which: list[str]) -> str:
    """The flags for each requested item, in order, joined by spaces."""
    p = _paths()
    q = shlex.quote
    table = {
        "cflags": f"-I{q(p['includedir'])}",
        "libs": f"-L{q(p['libdir'])} -Wl,-rpath,{q(p['libdir'])} -lkina_fx",
        "includedir": q(p["includedir"]),
        "libdir": q(p["libdir"]),
        "library": q(os.path.join(p["libdir"], "libkina_fx.so")),
    }
    return " ".join(table[w] for w in which)


def _config(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kina-fx config",
                                     description="Print what a C host needs to use libkina_fx.so.")
    order = []

    class Add(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            order.append(self.dest)

    for name, help_ in [("cflags", "compiler flags (-I to kina_fx.h)"),
                        ("libs", "linker flags (-L, rpath, -lkina_fx)"),
                        ("includedir", "directory holding kina_fx.h"),
                        ("libdir", "directory holding libkina_fx.so"),
                        ("library", "full path of libkina_fx.so")]:
        parser.add_argument(f"--{name}", nargs=0, action=Add, help=help_)
    parser.parse_args(argv)
    if not order:
        parser.print_help()
        return 2
    lib = os.path.join(_paths()["libdir"], "libkina_fx.so")
    if not os.path.exists(lib):
        print(f"kina-fx: {lib} is missing; reinstall kina_fx to build it", file=sys.stderr)
        return 1
    print(config_flags(order))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: kina-fx {config,demo} ...\n\n"
              "  config  print C compiler/linker flags for libkina_fx.so (--cflags --libs ...)\n"
              "  demo    run the kina_fx demo")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "config":
        return _config(rest)
    if command == "demo":
        from . import demo
        # Pass the remaining arguments explicitly: demo.main parses argv itself,
        # and sys.argv still holds "demo".
        result = demo.main(rest)
        return result if isinstance(result, int) else 0
    print(f"kina-fx: unknown command {command!r} (expected config or demo)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
