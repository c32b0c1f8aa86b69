"""Driving the tape ABI (kina_tape_*) through the real exports, in-process."""
from __future__ import annotations

import numpy as np

from kina_fx.errors import Status
from kina_fx.runtime_ops import BY_NAME

OK, VALIDATION, TYPE = Status.SUCCESS, Status.VALIDATION, Status.TYPE
F32, F16, I64 = 1, 2, 3       # KINA_DTYPE_*
STRICT, LENIENT = 0, 1
DTYPE_CODES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int64): I64}


class Tape:
    """A thin driver of one tape through the C functions (``abi``: support.abi.Abi)."""

    #: Tapes begun and not freed through the driver, oldest first (see free_leftovers).
    live: list = []

    def __init__(self, abi, flags=STRICT):
        self.abi = abi
        handle = abi.ffi.new("kina_tape_t *")
        assert abi.lib.kina_tape_begin(flags, handle) == OK, abi.last_error()
        self.handle = handle[0]
        Tape.live.append(self)

    def call(self, name, *args):
        """``kina_tape_<name>(handle, *args)``'s status (name with or without the prefix)."""
        if not name.startswith("kina_tape_"):
            name = "kina_tape_" + name
        return self.abi.call(name, self.handle, *args)

    def op(self, op, *args):
        status = op_status(self.abi, op, *args)
        assert status == OK, self.abi.last_error()

    def end(self):
        assert self.abi.lib.kina_tape_end(self.handle) == OK, self.abi.last_error()

    def free(self):
        assert self.abi.lib.kina_tape_free(self.handle) == OK, self.abi.last_error()
        Tape.live.remove(self)


def free_leftovers() -> None:
    """Free the tapes a failed test left behind, innermost first, so that the
    next test does not run inside them."""
    while Tape.live:
        t = Tape.live.pop()
        t.abi.lib.kina_tape_free(t.handle)


def op_status(abi, op, *args) -> int:
    """The status of runtime op ``op`` (its name in the op table) called through its export."""
    return abi.call(BY_NAME[op].export, *args)
