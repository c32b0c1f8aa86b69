"""Helpers for the tests that pin the ABI contract (test_abi_contract.py,
test_abi_status_tables.py): the C fixture tests/hosts/c/contract_lib.c
(built by the ``contract_lib`` fixture of conftest.py), fiber calls with
out-parameters made here, raw descriptors."""
from __future__ import annotations

import numpy as np

from kina_fx import memref

FIBER_NEW, FIBER_RUNNING, FIBER_SUSPENDED, FIBER_DONE, FIBER_FAILED, FIBER_CANCELLED = range(6)

CONTRACT_CDEF = """
int32_t ct_returns_ctx(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out);
int64_t ct_perform_once(void *arg);
int64_t ct_outer_entry(void *arg);
int32_t ct_recursion(int32_t effect);
extern int32_t ct_inner_catch, ct_outer_effect;
extern kina_fiber_t ct_inner;
extern int32_t ct_inner_state, ct_inner_resume_rc;
extern int64_t ct_levels;
int64_t ct_raise_signal(void *arg);
extern int32_t ct_last_rc;
int64_t ct_push_no_pop(void *arg);
int64_t ct_perform_three(void *arg);
extern kina_handler_t ct_left_handle;
"""

COPY_HOST = "_mlir_ciface_runtime_copy_to_host_f32"
COPY_DEV = "_mlir_ciface_runtime_copy_to_device_f32"
MATMUL = "_mlir_ciface_runtime_gpu_matmul_f32"
GATHER = "_mlir_ciface_runtime_gpu_gather_f32"
SOFTMAX = "_mlir_ciface_runtime_gpu_softmax_f32"
REPEAT = "_mlir_ciface_runtime_gpu_repeat_interleave_f32"
ALLOC = "_mlir_ciface_runtime_gpu_alloc_unranked"


def descriptor(sizes, strides, aligned=0x1000, offset=0):
    """A raw memref descriptor (no storage behind it unless ``aligned`` points to some)."""
    return memref.UnrankedMemref(None, len(sizes), [aligned, aligned, offset, *sizes, *strides])


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def last_error(kina) -> str:
    ffi, lib = kina
    return ffi.string(lib.kina_last_error()).decode()


class Fibers:
    """kina_fiber_* calls from Python with out-parameters made here."""

    def __init__(self, kina, contract_lib):
        self.ffi, self.lib, self.clib = kina[0], kina[1], contract_lib
        self.keep = []

    def create(self, effect, catch=()):
        arg = self.ffi.new("int32_t *", effect.id)
        ids = self.ffi.new("int32_t[]", [e.id for e in catch] or [0])
        out = self.ffi.new("kina_fiber_t *")
        self.keep += [arg, ids]
        entry = self.ffi.cast("kina_fiber_fn", self.clib.ct_perform_once)
        assert self.lib.kina_fiber_create(entry, arg, ids, len(catch), out) == 0
        return out[0]

    def state(self, fiber):
        out = self.ffi.new("int32_t *", -1)
        assert self.lib.kina_fiber_state(fiber, out) == 0
        return out[0]

    def resume(self, fiber, value=0, sentinel=-1):
        out = self.ffi.new("int32_t *", sentinel)
        return self.lib.kina_resume_fiber(fiber, value, out), out[0]

    def cancel(self, fiber, sentinel=-1):
        out = self.ffi.new("int32_t *", sentinel)
        return self.lib.kina_cancel_fiber(fiber, out), out[0]


def push_returning(kina, contract_lib, rc, effect):
    ffi, lib = kina
    h = ffi.new("kina_handler_t *")
    ids = ffi.new("int32_t[1]", [effect.id])
    fn = ffi.cast("kina_handler_fn", contract_lib.ct_returns_ctx)
    assert lib.kina_push_handler(fn, ffi.cast("void *", rc), ids, 1, h) == 0
    return h[0]


def c_perform(kina, effect):
    ffi, lib = kina
    out = ffi.new("int64_t *", -5)
    return lib.kina_perform(effect.id, ffi.NULL, 0, out), out[0]
