"""Load libkina_fx.so into this running Python and make its first export calls.

Run as a script by tests/abi/test_abi_inprocess_start.py, with any interpreter that
has kina_fx installed:  python inprocess_start_check.py MODE [THREADS]

MODE says what the process does before the library's first call:

* ``plain``: nothing;
* ``capsule``: an attribute lookup on a capsule object, which gives
  PyCapsule_Type a version tag (the field cffi's start-up used as a spin lock
  before Python 3.12: the first call then hung forever);
* ``torch``: ``import torch`` (which does such lookups itself).

THREADS > 1 makes the first calls from that many threads at once.  Prints
``start-check ok`` and exits 0 when every call returned the right answer.
"""
from __future__ import annotations

import sys
import threading


def prepare(mode: str) -> None:
    if mode == "capsule":
        import _datetime
        hasattr(_datetime.datetime_CAPI, "x")
    elif mode == "torch":
        import torch  # noqa: F401  (its import does capsule lookups)
    elif mode != "plain":
        raise SystemExit(f"unknown mode {mode!r}")


def first_calls(results: list) -> None:
    from kina_fx import Effect
    from kina_fx import ffi as kffi

    ffi, lib = kffi.load_library()
    out = ffi.new("int32_t *")
    status = lib.kina_effect_id(b"start_check.effect", out)
    results.append((status, out[0] == Effect("start_check.effect").id, lib.kina_abi_version()))


def main() -> int:
    mode = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    prepare(mode)
    results: list = []
    workers = [threading.Thread(target=first_calls, args=(results,)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if results != [(0, True, 1000)] * threads:
        print("start-check FAILED", results)
        return 1
    print("start-check ok", sys.version.split()[0], mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
