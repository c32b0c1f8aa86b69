/* kina_fx.h -- the C ABI of libkina_fx.so (the Kina runtime, Python implementation).
 *
 * Link with:  cc host.c $(kina-fx config --cflags --libs)
 *
 * Every function that can fail returns an int32_t status (KINA_STATUS_*).  On a
 * non-zero status, kina_last_error() returns a message describing the failure
 * (thread-local, valid until the next failure on the same thread).  No failure
 * unwinds into the caller and nothing is printed.  See docs/abi.md.
 */
#ifndef KINA_FX_H
#define KINA_FX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: major * 1000 + minor.  Minor bumps only add functions. */
#define KINA_ABI_VERSION_MAJOR 1
#define KINA_ABI_VERSION_MINOR 0
#define KINA_ABI_VERSION (KINA_ABI_VERSION_MAJOR * 1000 + KINA_ABI_VERSION_MINOR)

/* Status codes: mirror kina_fx/errors.py Status (checked by tests/test_abi_header.py). */
#define KINA_STATUS_SUCCESS 0
#define KINA_STATUS_VALIDATION 1
#define KINA_STATUS_RESOURCE 2
#define KINA_STATUS_GPU 3
#define KINA_STATUS_UNIMPLEMENTED 4
#define KINA_STATUS_INTERNAL 5
#define KINA_STATUS_TYPE 6
#define KINA_STATUS_CANCELLED 7
#define KINA_STATUS_UNHANDLED 8

/* Largest rank a memref may have (larger ranks are a validation error). */
#define KINA_MAX_RANK 32

/* MLIR's unranked memref as passed by `llvm.emit_c_interface`:
 * `descriptor` points to a ranked descriptor (kina_memref_descriptor_t). */
typedef struct {
    int64_t rank;
    void *descriptor;
} kina_unranked_memref_t;

/* MLIR's ranked (strided) memref descriptor.  `sizes_and_strides` holds
 * sizes[rank] followed by strides[rank], strides counted in elements. */
typedef struct {
    void *allocated;
    void *aligned;
    int64_t offset;
    int64_t sizes_and_strides[];
} kina_memref_descriptor_t;

/* ---- library ---------------------------------------------------------- */
int32_t kina_abi_version(void);
const char *kina_last_error(void);

/* ---- memref runtime (shared/seeds/000, 001) ---------------------------- */
/* dst <- src (same shape, any strides); `device` is the CUDA device ordinal
 * (0 on the CPU backend), anything else is KINA_STATUS_VALIDATION. */
int32_t _mlir_ciface_runtime_copy_to_device_f32(kina_unranked_memref_t *dst,
                                                kina_unranked_memref_t *src, int32_t device);
int32_t _mlir_ciface_runtime_copy_to_device_f16(kina_unranked_memref_t *dst,
                                                kina_unranked_memref_t *src, int32_t device);
/* dst (host) <- src (device or host), same shape. */
int32_t _mlir_ciface_runtime_copy_to_host_f32(kina_unranked_memref_t *dst,
                                              kina_unranked_memref_t *src);
/* out = a @ b with NumPy's matmul rules (batched for rank >= 3). */
int32_t _mlir_ciface_runtime_gpu_matmul_f32(kina_unranked_memref_t *out,
                                            kina_unranked_memref_t *a,
                                            kina_unranked_memref_t *b);
/* out = values[indices]: rows of `values`; out.shape = indices.shape + values.shape[1:]. */
int32_t _mlir_ciface_runtime_gpu_gather_f32(kina_unranked_memref_t *out,
                                            kina_unranked_memref_t *values,
                                            kina_unranked_memref_t *indices);
/* out = softmax(x) along `axis` (negative counts from the end); out may alias x. */
int32_t _mlir_ciface_runtime_gpu_softmax_f32(kina_unranked_memref_t *out,
                                             kina_unranked_memref_t *x, int32_t axis);
/* out = x with every element repeated `reps` times along `axis`. */
int32_t _mlir_ciface_runtime_gpu_repeat_interleave_f32(kina_unranked_memref_t *out,
                                                       kina_unranked_memref_t *x,
                                                       int32_t axis, int32_t reps);
/* Fill the nested descriptor of `memref` (sizes set, no storage) in place:
 * allocated/aligned/offset/row-major strides of a new buffer of
 * product(sizes) * element_size bytes; element_size must be 2, 4 or 8. */
int32_t _mlir_ciface_runtime_gpu_alloc_unranked(kina_unranked_memref_t *memref,
                                                int32_t element_size);
/* Free every buffer runtime_gpu_alloc_unranked returned; safe to repeat. */
int32_t runtime_gpu_free_all(void);

/* ---- effects C ABI (shared/seeds/001 section 3; docs/abi.md) ----------------
 *
 * Stability (shared/seeds/001): [stable] functions keep their signature and
 * meaning until a major ABI version bump; [unstable] ones may change in a
 * minor version.  The four functions the seed names are [stable].
 *
 * Model.  A fiber is a stackful coroutine running a C entry function.  Each
 * fiber has one handler stack, shared with Python: C handlers pushed with
 * kina_push_handler and Python `with Handler(fun=...)` / `Handler.run` go on
 * the same stack, and an effect performed from C (kina_perform) or Python
 * (`perform`) searches it innermost first, then the stacks of the fibers
 * waiting for this one.  A fiber created by kina_fiber_create suspends to its
 * resumer (the caller of kina_resume_fiber) on the effects it "catches";
 * other effects go on outward.
 *
 * Values crossing the ABI are int64_t; pointers travel as integers.
 *
 * Rules for hosts:
 *  - Never keep a pointer into a suspended fiber's stack (the stack is copied
 *    away while suspended): pass values, or pointers to heap/static memory.
 *  - No C++ exceptions and no longjmp across a kina_* call.
 *  - A fiber belongs to the OS thread that created it: using its handle from
 *    another thread returns KINA_STATUS_VALIDATION.  When that thread exits,
 *    its suspended fibers can no longer run; destroy them first.
 *  - OCaml 4 (and other runtimes that keep per-stack state) must not run their
 *    own code on a kina fiber; drive fibers from them and write entry
 *    functions and handlers in C.
 */

/* Opaque, generation-tagged handles; 0 is never valid.  A stale, freed or
 * foreign handle gets KINA_STATUS_VALIDATION, never undefined behaviour. */
typedef uint64_t kina_fiber_t;
typedef uint64_t kina_handler_t;

/* A fiber's entry function; its return value is the fiber's result. */
typedef int64_t (*kina_fiber_fn)(void *arg);

/* A C handler.  Return KINA_HANDLED with *out_value set to answer the perform
 * in place (no fiber switch), KINA_FORWARD to pass the effect to the next
 * handler out, KINA_SUSPEND to suspend the nearest kina_fiber_create fiber
 * outside this handler (its resumer sees the effect), or a status 1-8
 * (KINA_STATUS_*) that the perform returns; any other value makes the
 * perform return KINA_STATUS_VALIDATION. */
typedef int32_t (*kina_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                   int32_t nargs, int64_t *out_value);

#define KINA_MAX_ARGS 16

#define KINA_HANDLED 0
#define KINA_FORWARD (-1)
#define KINA_SUSPEND (-2)

/* Fiber states (kina_fiber_state, out_state of kina_resume_fiber). */
#define KINA_FIBER_NEW 0       /* created, not started */
#define KINA_FIBER_RUNNING 1   /* running (only seen from inside it) */
#define KINA_FIBER_SUSPENDED 2 /* waiting in a perform: see kina_get_perform_id */
#define KINA_FIBER_DONE 3      /* entry returned: see kina_fiber_result */
#define KINA_FIBER_FAILED 4    /* failed: the status was returned with kina_last_error */
#define KINA_FIBER_CANCELLED 5 /* cancelled */

/* [stable] The id of the effect named `name` (interned: the same id as
 * Python's Effect(name).id).  Ids are > 0 and stable for the process. */
int32_t kina_effect_id(const char *name, int32_t *out_id);

/* [unstable] A new fiber that will run entry(arg).  It suspends to its resumer
 * on the `ncatch` effect ids of `catch_effects`, or on every effect that
 * reaches it unhandled when ncatch == 0. */
int32_t kina_fiber_create(kina_fiber_fn entry, void *arg, const int32_t *catch_effects,
                          int32_t ncatch, kina_fiber_t *out_fiber);

/* [stable] Start a new fiber, or resume a suspended one: its pending
 * kina_perform returns `value`.  Runs the fiber until it suspends, finishes or
 * fails; *out_state (may be NULL) says which.  Returns 0, or the failure's
 * status (with kina_last_error) when the fiber failed or the call is invalid
 * (KINA_STATUS_VALIDATION: a running, finished or cancelled fiber, a stale
 * handle, another thread's fiber; *out_state is then left untouched). */
int32_t kina_resume_fiber(kina_fiber_t fiber, int64_t value, int32_t *out_state);

/* [stable] The id of the effect a suspended fiber is waiting in. */
int32_t kina_get_perform_id(kina_fiber_t fiber, int32_t *out_effect);

/* [unstable] The arguments of that perform: *out_nargs gets their number;
 * out_args (capacity `cap`) gets them, KINA_STATUS_VALIDATION if too small. */
int32_t kina_get_perform_args(kina_fiber_t fiber, int64_t *out_args, int32_t cap,
                              int32_t *out_nargs);

/* [unstable] The fiber's state (KINA_FIBER_*). */
int32_t kina_fiber_state(kina_fiber_t fiber, int32_t *out_state);

/* [unstable] A finished fiber's result (its entry function's return value). */
int32_t kina_fiber_result(kina_fiber_t fiber, int64_t *out_value);

/* [unstable] Cancel a new or suspended fiber: its pending kina_perform returns
 * KINA_STATUS_CANCELLED (and Python code in it gets kina_fx.Cancelled, so
 * finally blocks run); the fiber should unwind and return.  A fiber that
 * performs again is cancelled again (up to 100 times), then dropped.
 * *out_state (not NULL) gets the new state; a fiber that has already ended
 * is left as it is (status 0). */
int32_t kina_cancel_fiber(kina_fiber_t fiber, int32_t *out_state);

/* [unstable] Free the handle (cancelling the fiber first if it is suspended).
 * KINA_STATUS_VALIDATION if the fiber is running. */
int32_t kina_fiber_destroy(kina_fiber_t fiber);

/* [unstable] Perform effect `effect` with `nargs` arguments from C code; the
 * handler's answer goes to *out_value.  Returns KINA_STATUS_UNHANDLED when no
 * handler handles it, KINA_STATUS_CANCELLED when the fiber was cancelled
 * while waiting (unwind and return), or the failing handler's status. */
int32_t kina_perform(int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value);

/* [stable] Push a C handler for the `neffects` effect ids of `effects` onto
 * the running fiber's handler stack (the thread's root stack outside any
 * fiber).  `ctx` is passed back to `fn` unchanged. */
int32_t kina_push_handler(kina_handler_fn fn, void *ctx, const int32_t *effects,
                          int32_t neffects, kina_handler_t *out_handler);

/* [stable] Pop `handler`, which must be the innermost entry of the running
 * fiber's handler stack (KINA_STATUS_VALIDATION otherwise); frees the handle. */
int32_t kina_pop_handler(kina_handler_t handler);


#ifdef __cplusplus
}
#endif
#endif /* KINA_FX_H */
