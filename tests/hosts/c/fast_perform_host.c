/* kina_perform answered by C handlers from a pure C host: the path that
 * kina_fast_perform (kina_fx/_speedups_c/c_abi.c) takes without entering
 * Python.  Every check also holds on the Python path (KINA_FX_PURE_PYTHON=1,
 * which tests/hosts/c/test_fast_perform_host.py runs too).
 *
 *   cc fast_perform_host.c $(kina-fx config --cflags --libs) -lpthread -o fast_perform_host
 *   env -i ./fast_perform_host        # prints "fast_perform_host: N checks passed"
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kina_fx.h"
#include "kina_check.h"


static int32_t E, F, OTHER;

/* ctx: the value to add to args[0] */
static int32_t add(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect;
    *out = (nargs > 0 ? args[0] : 0) + *(int64_t *)ctx;
    return KINA_HANDLED;
}

/* ctx: a counter of calls */
static int32_t forward(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs; (void)out;
    ++*(int64_t *)ctx;
    errno = 1234;                     /* the host sees it, on either path */
    return KINA_FORWARD;
}

static int32_t status_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs;
    *out = 999;
    return (int32_t)(intptr_t)ctx;
}

static int32_t suspend(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs; (void)out;
    return KINA_SUSPEND;
}

/* Pushes itself again and performs the same effect: recursion through
 * kina_perform that only stops at the runtime's recursion limit. */
static int32_t recurse(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)args; (void)nargs;
    kina_handler_t h;
    int32_t rc = kina_push_handler(recurse, ctx, &effect, 1, &h);
    if (rc != 0)
        return rc;
    ++*(int64_t *)ctx;
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

static void answered_and_forwarded(void)
{
    int64_t ten = 10, forwards = 0, v = -1;
    kina_handler_t outer, inner[100];
    CHECK(kina_push_handler(add, &ten, &E, 1, &outer) == 0);
    for (int64_t i = 0; i < 100000; i++) {
        if (kina_perform(E, &i, 1, &v) != 0 || v != i + 10) {
            CHECK(!"in place");
            break;
        }
    }
    for (int i = 0; i < 100; i++)
        CHECK(kina_push_handler(forward, &forwards, &E, 1, &inner[i]) == 0);
    errno = 7;
    int64_t arg = 5;
    CHECK(kina_perform(E, &arg, 1, &v) == 0 && v == 15 && forwards == 100);
    CHECK(errno == 1234);             /* as the last handler left it (both paths) */
    for (int i = 99; i >= 0; i--)
        CHECK(kina_pop_handler(inner[i]) == 0);
    CHECK(kina_pop_handler(outer) == 0);

    /* forwarded to nothing */
    CHECK(kina_push_handler(forward, &forwards, &E, 1, &outer) == 0);
    v = -7;
    CHECK(kina_perform(E, &arg, 1, &v) == KINA_STATUS_UNHANDLED && v == -7);
    CHECK(strstr(kina_last_error(), "unhandled effect") != NULL);
    CHECK(kina_pop_handler(outer) == 0);
}

static void statuses(void)
{
    kina_handler_t h;
    int64_t v = -7, forwards = 0;
    CHECK(kina_push_handler(status_handler, (void *)(intptr_t)KINA_STATUS_TYPE, &E, 1, &h) == 0);
    CHECK(kina_perform(E, NULL, 0, &v) == KINA_STATUS_TYPE && v == -7);
    CHECK(strcmp(kina_last_error(), "KinaTypeError: the C handler for fast.host.e failed with status 6") == 0);
    kina_handler_t fw;
    CHECK(kina_push_handler(forward, &forwards, &E, 1, &fw) == 0);
    CHECK(kina_perform(E, NULL, 0, &v) == KINA_STATUS_TYPE && v == -7 && forwards == 1);
    CHECK(kina_pop_handler(fw) == 0);
    CHECK(kina_pop_handler(h) == 0);
    CHECK(kina_push_handler(status_handler, (void *)(intptr_t)-5, &E, 1, &h) == 0);
    CHECK(kina_perform(E, NULL, 0, &v) == KINA_STATUS_VALIDATION && v == -7);
    CHECK(strstr(kina_last_error(), "returned -5, which is not a handler result") != NULL);
    CHECK(kina_pop_handler(h) == 0);

    /* invalid arguments: the same statuses and messages as ever */
    int64_t ten = 10;
    CHECK(kina_push_handler(add, &ten, &E, 1, &h) == 0);
    CHECK(kina_perform(E, NULL, 0, NULL) == KINA_STATUS_VALIDATION);
    CHECK(strcmp(kina_last_error(), "ValidationError: out_value is NULL") == 0);
    int64_t many[17] = {0};
    CHECK(kina_perform(E, many, 17, &v) == KINA_STATUS_VALIDATION);
    CHECK(strcmp(kina_last_error(), "ValidationError: nargs must be in [0, 16], got 17") == 0);
    CHECK(kina_perform(E, NULL, 1, &v) == KINA_STATUS_VALIDATION);
    CHECK(strcmp(kina_last_error(), "ValidationError: args is NULL but nargs > 0") == 0);
    CHECK(kina_perform(123456, NULL, 0, &v) == KINA_STATUS_VALIDATION);
    CHECK(strcmp(kina_last_error(), "ValidationError: no effect with id or name 123456") == 0);
    CHECK(kina_perform(E, many, 16, &v) == 0 && v == 10);
    CHECK(kina_pop_handler(h) == 0);
}

static int64_t suspending_entry(void *arg)
{
    (void)arg;
    kina_handler_t h, fw;
    int64_t forwards = 0, v = 0, args[2] = {3, 4};
    if (kina_push_handler(suspend, NULL, &E, 1, &h) != 0 || kina_push_handler(forward, &forwards, &E, 1, &fw) != 0)
        return -1;
    int32_t rc = kina_perform(E, args, 2, &v);
    kina_pop_handler(fw);
    kina_pop_handler(h);
    return rc == 0 && forwards == 1 ? v : -2;
}

static void suspending(void)
{
    kina_fiber_t f;
    int32_t state, id, nargs;
    int64_t args[4], result;
    CHECK(kina_fiber_create(suspending_entry, NULL, &OTHER, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_get_perform_id(f, &id) == 0 && id == E);
    CHECK(kina_get_perform_args(f, args, 4, &nargs) == 0 && nargs == 2 && args[0] == 3 && args[1] == 4);
    CHECK(kina_resume_fiber(f, 77, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(f, &result) == 0 && result == 77);
    CHECK(kina_fiber_destroy(f) == 0);
}

static void recursion(void)
{
    int64_t levels = 0, v = 0;
    kina_handler_t h;
    CHECK(kina_push_handler(recurse, &levels, &F, 1, &h) == 0);
    int32_t rc = kina_perform(F, NULL, 0, &v);
    /* the runtime's recursion limit ends it with a status, not a crash */
    CHECK(rc != 0 && levels > 10);
    CHECK(kina_pop_handler(h) == 0);
    /* still usable afterwards */
    int64_t ten = 10;
    CHECK(kina_push_handler(add, &ten, &E, 1, &h) == 0);
    CHECK(kina_perform(E, NULL, 0, &v) == 0 && v == 10);
    CHECK(kina_pop_handler(h) == 0);
}

static void *thread_main(void *arg)
{
    int64_t add_by = (int64_t)(intptr_t)arg, v = 0, sum = 0;
    kina_handler_t h;
    if (kina_push_handler(add, &add_by, &E, 1, &h) != 0)
        return (void *)1;
    for (int64_t i = 0; i < 20000; i++) {
        if (kina_perform(E, &i, 1, &v) != 0 || v != i + add_by)
            return (void *)2;
        sum += v;
    }
    if (kina_pop_handler(h) != 0)
        return (void *)3;
    /* nothing pushed on this thread any more */
    if (kina_perform(E, NULL, 0, &v) != KINA_STATUS_UNHANDLED)
        return (void *)4;
    return NULL;
}

static void threads(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, thread_main, (void *)(intptr_t)(i * 1000)) == 0);
    for (int i = 0; i < 4; i++) {
        void *r = (void *)-1;
        CHECK(pthread_join(t[i], &r) == 0);
        CHECK(r == NULL);
    }
}

int main(void)
{
    /* a perform before anything else: nothing is pushed */
    int64_t v = -3;
    CHECK(kina_effect_id("fast.host.e", &E) == 0);
    CHECK(kina_effect_id("fast.host.f", &F) == 0);
    CHECK(kina_effect_id("fast.host.other", &OTHER) == 0);
    CHECK(kina_perform(E, NULL, 0, &v) == KINA_STATUS_UNHANDLED && v == -3);
    answered_and_forwarded();
    statuses();
    suspending();
    recursion();
    threads();
    printf("fast_perform_host: %d checks passed\n", checks - failures);
    return failures != 0;
}
