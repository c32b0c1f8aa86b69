/* C fixture for tests/abi/test_abi_contract.py: entry functions and handlers for
 * the decided corners of the effects C ABI (docs/abi.md, "Decided corners"). */
#include <stddef.h>

#include "kina_fx.h"

/* A C handler that returns (int32_t)ctx and answers 99 when that is KINA_HANDLED. */
int32_t ct_returns_ctx(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs;
    int32_t rc = (int32_t)(intptr_t)ctx;
    if (rc == KINA_HANDLED)
        *out = 99;
    return rc;
}

/* Entry: performs the effect whose id is *(int32_t *)arg; returns the answer
 * or -status, and records the status in ct_last_rc. */
int32_t ct_last_rc = -1;

int64_t ct_perform_once(void *arg)
{
    int64_t v = -77;
    int32_t rc = kina_perform(*(int32_t *)arg, NULL, 0, &v);
    ct_last_rc = rc;
    return rc == 0 ? v : -rc;
}

/* Entry: performs the effect whose id is *(int32_t *)arg with arguments 1, 2, 3. */
int64_t ct_perform_three(void *arg)
{
    int64_t v = 0, args[3] = {1, 2, 3};
    int32_t rc = kina_perform(*(int32_t *)arg, args, 3, &v);
    return rc == 0 ? v : -rc;
}

/* Entry: pushes a handler for effect *(int32_t *)arg and returns without popping it. */
kina_handler_t ct_left_handle;

int64_t ct_push_no_pop(void *arg)
{
    return kina_push_handler(ct_returns_ctx, NULL, (int32_t *)arg, 1, &ct_left_handle);
}

/* Nested fibers: the outer fiber creates an inner one catching only
 * ct_inner_catch and resumes it; the inner fiber performs ct_outer_effect,
 * which it does not catch, so the perform suspends the outer fiber (which
 * catches it) with the inner one still inside its kina_resume_fiber call. */
int32_t ct_inner_catch, ct_outer_effect;
kina_fiber_t ct_inner;
int32_t ct_inner_state = -1, ct_inner_resume_rc = -1;

int64_t ct_outer_entry(void *arg)
{
    (void)arg;
    if (kina_fiber_create(ct_perform_once, &ct_outer_effect, &ct_inner_catch, 1, &ct_inner) != 0)
        return -1000;
    ct_inner_resume_rc = kina_resume_fiber(ct_inner, 0, &ct_inner_state);
    int64_t result = -2000;
    if (ct_inner_resume_rc == 0 && ct_inner_state == KINA_FIBER_DONE)
        kina_fiber_result(ct_inner, &result);
    kina_fiber_destroy(ct_inner);
    return result;
}

/* Pushes itself again and performs the same effect: re-entry through
 * kina_perform that only stops at the runtime's recursion limit. */
int64_t ct_levels;

static int32_t ct_recurse(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)args; (void)nargs;
    kina_handler_t h;
    int32_t rc = kina_push_handler(ct_recurse, ctx, &effect, 1, &h);
    if (rc != 0)
        return rc;
    ++ct_levels;
    int64_t v = 0;
    rc = kina_perform(effect, NULL, 0, &v);
    int32_t pop = kina_pop_handler(h);
    if (rc != 0)
        return rc;
    if (pop != 0)
        return pop;
    *out = v + 1;
    return KINA_HANDLED;
}

/* Runs ct_recurse until the recursion limit ends it; returns the status. */
int32_t ct_recursion(int32_t effect)
{
    kina_handler_t h;
    int64_t v = 0;
    ct_levels = 0;
    if (kina_push_handler(ct_recurse, NULL, &effect, 1, &h) != 0)
        return -1;
    int32_t rc = kina_perform(effect, NULL, 0, &v);
    if (kina_pop_handler(h) != 0)
        return -2;
    return rc;
}

/* Entry: raises signal *(int *)arg (a Python signal handler then runs in the
 * fiber, outside any callback), then returns 1. */
#include <signal.h>
int64_t ct_raise_signal(void *arg)
{
    raise(*(int *)arg);
    return 1;
}
