/* The C fast paths that kina_fx._speedups offers libkina_fx.so (its capsule
 * kina_fx._speedups._C_API points to one kina_fast_api).
 *
 * Each function either answers the export's call, returning KINA_FAST_DONE
 * with *status set (0, or a status with kina_last_error set as the Python
 * path's onerror hook sets it), or returns KINA_FAST_DECLINED having changed
 * nothing: the export then takes its cffi ``extern "Python"`` path, which
 * does everything (validation and error texts included).  They are called
 * without the GIL and take it themselves when they need it, once per call;
 * on a thread that has no Python thread state yet they decline (its first
 * call through cffi gives it one).
 *
 * kina_runtime.c (libkina_fx.so) and speedups_*.c (kina_fx._speedups) both
 * include this file; KINA_FAST_API_VERSION changes whenever the struct does,
 * and a mismatch turns the fast paths off (a stale build still works).
 */
#ifndef KINA_FAST_API_H
#define KINA_FAST_API_H

#include <stdint.h>

#define KINA_FAST_API_VERSION 4
#define KINA_FAST_DECLINED 0
#define KINA_FAST_DONE 1

typedef struct {
    int version;
    int (*perform)(int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value,
                   int32_t *status);
    int (*resume_fiber)(uint64_t fiber, int64_t value, int32_t *out_state, int32_t *status);
    int (*get_perform_id)(uint64_t fiber, int32_t *out_effect, int32_t *status);
    int (*get_perform_args)(uint64_t fiber, int64_t *out_args, int32_t cap, int32_t *out_nargs,
                            int32_t *status);
    int (*fiber_state)(uint64_t fiber, int32_t *out_state, int32_t *status);
    int (*fiber_result)(uint64_t fiber, int64_t *out_value, int32_t *status);
    /* Called by every export before its extern "Python" path: a C handler
     * called without the GIL may be calling back (nogil.c). */
    void (*prepare)(void);
    /* A runtime op export (kina_runtime_ops.h): ``op`` is its row of
     * kina_fx.runtime_ops.RUNTIME_OPS, ``memrefs`` its nmem
     * kina_unranked_memref_t pointers (outputs first), ``params`` its int32
     * parameters. */
    int (*runtime_op)(int32_t op, void *const *memrefs, int32_t nmem, const int32_t *params,
                      int32_t nparams, int32_t *status);
} kina_fast_api;

#endif /* KINA_FAST_API_H */
