/* The effects C ABI of libkina_fx.so (included by kina_fx.h; see docs/abi.md).
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
#ifndef KINA_EFFECTS_H
#define KINA_EFFECTS_H

#include <stdint.h>

/* Opaque, generation-tagged handles; 0 is never valid.  A stale, freed or
 * foreign handle gets KINA_STATUS_VALIDATION, never undefined behaviour. */
typedef uint64_t kina_fiber_t;
typedef uint64_t kina_handler_t;

/* A fiber's entry function; its return value is the fiber's result. */
typedef int64_t (*kina_fiber_fn)(void *arg);

/* A C handler.  Return KINA_HANDLED with *out_value set to answer the perform
 * in place (no fiber switch), KINA_FORWARD to pass the effect to the next
 * handler out, KINA_SUSPEND to suspend the nearest kina_fiber_create fiber
 * outside this handler (its resumer sees the effect), or a positive
 * KINA_STATUS_* to make the perform fail with that status. */
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
 * handle, another thread's fiber). */
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
 * performs again is cancelled again (up to 100 times), then dropped. */
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

#endif /* KINA_EFFECTS_H */
