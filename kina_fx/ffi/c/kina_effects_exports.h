/* The effects C ABI's exports, in the X(exported name, Python callback name,
 * (parameters), (arguments)) form of KINA_EXPORTS (kina_runtime.c).  Keep one
 * entry per line: build.py parses these lines.  Callbacks: kina_fx/ffi/effects.py. */
#define KINA_EFFECT_EXPORTS(X) \
    X(kina_effect_id, kina_py_effect_id, (const char *name, int32_t *out_id), (name, out_id)) \
    X(kina_fiber_create, kina_py_fiber_create, (kina_fiber_fn entry, void *arg, const int32_t *catch_effects, int32_t ncatch, kina_fiber_t *out_fiber), (entry, arg, catch_effects, ncatch, out_fiber)) \
    X(kina_cancel_fiber, kina_py_cancel_fiber, (kina_fiber_t fiber, int32_t *out_state), (fiber, out_state)) \
    X(kina_fiber_destroy, kina_py_fiber_destroy, (kina_fiber_t fiber), (fiber)) \
    X(kina_push_handler, kina_py_push_handler, (kina_handler_fn fn, void *ctx, const int32_t *effects, int32_t neffects, kina_handler_t *out_handler), (fn, ctx, effects, neffects, out_handler)) \
    X(kina_pop_handler, kina_py_pop_handler, (kina_handler_t handler), (handler))

/* Exports that try a C fast path before their callback (KINA_DEFINE_FAST_EXPORT
 * in kina_runtime.c calls kina__fast_<name> first; kina_fast_api.h): kina_perform
 * answered by C handlers or suspending to a host fiber, and the host fibers'
 * round trip, without entering Python (_speedups_c/c_abi.c, _speedups_c/c_fibers.c). */
#define KINA_EFFECT_FAST_EXPORTS(X) \
    X(kina_perform, kina_py_perform, (int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value), (effect, args, nargs, out_value)) \
    X(kina_resume_fiber, kina_py_resume_fiber, (kina_fiber_t fiber, int64_t value, int32_t *out_state), (fiber, value, out_state)) \
    X(kina_get_perform_id, kina_py_get_perform_id, (kina_fiber_t fiber, int32_t *out_effect), (fiber, out_effect)) \
    X(kina_get_perform_args, kina_py_get_perform_args, (kina_fiber_t fiber, int64_t *out_args, int32_t cap, int32_t *out_nargs), (fiber, out_args, cap, out_nargs)) \
    X(kina_fiber_state, kina_py_fiber_state, (kina_fiber_t fiber, int32_t *out_state), (fiber, out_state)) \
    X(kina_fiber_result, kina_py_fiber_result, (kina_fiber_t fiber, int64_t *out_value), (fiber, out_value))
