/* C fixture for tests/hosts/c/test_adversarial_effects.py: entry functions and
 * handlers that the in-process adversarial tests combine with Python code. */
#include <stddef.h>

#include "kina_fx.h"

/* statuses recorded by the entry functions below, for the tests to inspect */
int32_t adv_rcs[8];
int64_t adv_values[8];

/* A C handler answering (int64_t)ctx, in place. */
int32_t adv_answer(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs;
    *out = (int64_t)(intptr_t)ctx;
    return KINA_HANDLED;
}

/* A C handler that suspends the nearest kina fiber outside it. */
int32_t adv_suspend(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs; (void)out;
    return KINA_SUSPEND;
}

/* Entry: pushes a handler for effect *(int32_t *)arg and returns without popping it. */
int64_t adv_push_no_pop(void *arg)
{
    int32_t effect = *(int32_t *)arg;
    kina_handler_t h = 0;
    int64_t v = 0;
    if (kina_push_handler(adv_answer, (void *)(intptr_t)5, &effect, 1, &h) != 0)
        return -1;
    if (kina_perform(effect, NULL, 0, &v) != 0)
        return -2;
    return v;
}

/* Performs `effect` twice, recording both statuses and answers; returns the count of successes. */
int64_t adv_perform_twice(int32_t effect)
{
    int64_t n = 0;
    for (int i = 0; i < 2; i++) {
        adv_values[i] = -77;
        adv_rcs[i] = kina_perform(effect, NULL, 0, &adv_values[i]);
        n += adv_rcs[i] == 0;
    }
    return n;
}

/* Entry form of adv_perform_twice (effect id in *arg). */
int64_t adv_perform_twice_entry(void *arg)
{
    return adv_perform_twice(*(int32_t *)arg);
}

/* Performs `effect` once and returns -status or the answer. */
int64_t adv_perform_once(int32_t effect)
{
    int64_t v = -77;
    int32_t rc = kina_perform(effect, NULL, 0, &v);
    adv_values[0] = v;
    return rc == 0 ? v : -rc;
}
