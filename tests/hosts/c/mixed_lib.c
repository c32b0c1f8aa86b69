/* C code for tests/abi/test_abi_effects.py: entry functions and handlers that the
 * Python tests mix with Python handlers on one handler stack. */
#include <stddef.h>

#include "kina_fx.h"

typedef int64_t (*py_callback)(int64_t);

/* Performs `effect` (id in *arg) from C and adds one to the answer. */
int64_t c_perform_plus_one(void *arg)
{
    int32_t effect = *(int32_t *)arg;
    int64_t v = 0;
    int32_t rc = kina_perform(effect, NULL, 0, &v);
    return rc == 0 ? v + 1 : -rc;
}

/* Performs `effect` twice with an argument and keeps C locals across both. */
int64_t c_two_performs(int32_t effect, int64_t base)
{
    volatile int64_t keep[16];
    for (int i = 0; i < 16; i++)
        keep[i] = base + i;
    int64_t a = 0, b = 0;
    if (kina_perform(effect, &base, 1, &a) != 0)
        return -1;
    int64_t next = base + 1;
    if (kina_perform(effect, &next, 1, &b) != 0)
        return -2;
    int64_t s = 0;
    for (int i = 0; i < 16; i++)
        s += keep[i];
    return a * 1000 + b + s - (16 * base + 120);
}

/* A C handler answering with ctx's value plus the first argument (or 0). */
int32_t c_answer_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect;
    *out = *(int64_t *)ctx + (nargs > 0 ? args[0] : 0);
    return KINA_HANDLED;
}

/* A C handler that forwards (counting) or suspends, by ctx. */
int32_t c_forward_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs; (void)out;
    (*(int64_t *)ctx)++;
    return KINA_FORWARD;
}

/* Push a C handler for `effect` answering `answer`, call back into Python,
 * pop, and return what Python returned (or a negative status). */
int64_t c_push_and_call(int32_t effect, int64_t *answer, py_callback cb, int64_t arg)
{
    kina_handler_t h = 0;
    if (kina_push_handler(c_answer_handler, answer, &effect, 1, &h) != 0)
        return -1000;
    int64_t r = cb(arg);
    if (kina_pop_handler(h) != 0)
        return -2000;
    return r;
}

/* An entry function that runs a Python callback on the fiber. */
int64_t c_entry_calls_python(void *cb)
{
    return ((py_callback)cb)(7);
}
