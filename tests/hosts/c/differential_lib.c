/* C side of the differential tests of effects (tests/effects/test_differential.py):
 * a C handler whose behaviour is its ctx, and a C frame that performs. */
#include <stdint.h>

#include "kina_fx.h"

/* ctx 0: answer 3 * args[0] + 1 in place; 1: decline (KINA_FORWARD);
 * 2: fail with KINA_STATUS_VALIDATION (a ValidationError at the perform). */
int32_t diff_clause(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect;
    switch ((intptr_t)ctx) {
    case 0:
        if (nargs < 1)
            return KINA_STATUS_VALIDATION;
        *out = 3 * args[0] + 1;
        return KINA_HANDLED;
    case 1:
        return KINA_FORWARD;
    default:
        return KINA_STATUS_VALIDATION;
    }
}

/* kina_perform from a C frame: the answer, or -status. */
int64_t diff_perform(int32_t effect, int64_t arg)
{
    int64_t out = -77;
    int32_t rc = kina_perform(effect, &arg, 1, &out);
    return rc == 0 ? out : -(int64_t)rc;
}
