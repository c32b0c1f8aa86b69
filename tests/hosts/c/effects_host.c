/* A C host of the effects ABI: fibers, performs and handlers driven from C only.
 *
 *   cc effects_host.c $(kina-fx config --cflags --libs) -o effects_host
 *   env -i ./effects_host        -> prints "effects_host: N checks passed"
 *
 * 1. a generator: a fiber yields 0..n-1 through a suspending perform;
 * 2. a state handler written in C (answers in place: no fiber switch);
 * 3. a round-robin scheduler over fibers whose entry functions recurse deeply
 *    and keep locals (and a checksum array) across every switch;
 * 4. KINA_FORWARD / KINA_SUSPEND from C handlers, nesting of handlers;
 * 5. cancellation: the pending perform returns KINA_STATUS_CANCELLED;
 * 6. every error path: stale / foreign / wrong-kind handles, double resume,
 *    resume of finished or running fibers, popping out of order, bad arguments.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kina_fx.h"
#include "kina_check.h"


static int32_t YIELD, GET, PUT, ASK, NEVER;

/* ---- 1. generator ------------------------------------------------------------ */

static int64_t generator(void *arg)
{
    int64_t n = *(int64_t *)arg, sum_of_answers = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t answer = -1;
        if (kina_perform(YIELD, &i, 1, &answer) != KINA_STATUS_SUCCESS)
            return -1000;
        sum_of_answers += answer;
    }
    return sum_of_answers;
}

static void test_generator(void)
{
    static int64_t n = 5;
    kina_fiber_t f = 0;
    CHECK(kina_fiber_create(generator, &n, &YIELD, 1, &f) == 0 && f != 0);
    int32_t state = -1;
    CHECK(kina_fiber_state(f, &state) == 0 && state == KINA_FIBER_NEW);
    int64_t expected = 0, resume_with = 0;
    for (;;) {
        CHECK(kina_resume_fiber(f, resume_with, &state) == 0);
        if (state != KINA_FIBER_SUSPENDED)
            break;
        int32_t id = 0, nargs = -1;
        int64_t args[4];
        CHECK(kina_get_perform_id(f, &id) == 0 && id == YIELD);
        CHECK(kina_get_perform_args(f, args, 4, &nargs) == 0 && nargs == 1 && args[0] == expected);
        resume_with = 10 * args[0];
        expected++;
    }
    CHECK(state == KINA_FIBER_DONE && expected == 5);
    int64_t result = 0;
    CHECK(kina_fiber_result(f, &result) == 0 && result == 10 * (0 + 1 + 2 + 3 + 4));
    /* finished: resuming again is a validation error, not a crash */
    CHECK(kina_resume_fiber(f, 0, &state) == KINA_STATUS_VALIDATION);
    CHECK(kina_get_perform_id(f, &(int32_t){0}) == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_destroy(f) == 0);
    /* stale handle after destroy */
    CHECK(kina_resume_fiber(f, 0, &state) == KINA_STATUS_VALIDATION);
    CHECK(strstr(kina_last_error(), "stale") != NULL);
    CHECK(kina_fiber_destroy(f) == KINA_STATUS_VALIDATION);
}

/* ---- 2. a state handler in C --------------------------------------------------- */

static int32_t state_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs,
                             int64_t *out)
{
    int64_t *cell = ctx;
    if (effect == GET) {
        *out = *cell;
        return KINA_HANDLED;
    }
    if (effect == PUT && nargs == 1) {
        *cell = args[0];
        *out = 0;
        return KINA_HANDLED;
    }
    return KINA_STATUS_VALIDATION;
}

static int64_t counter(void *arg)
{
    int64_t rounds = *(int64_t *)arg;
    static int64_t cell; /* heap/static memory only: never pointers into a fiber stack */
    cell = 100;
    kina_handler_t h = 0;
    int32_t both[2] = {GET, PUT};
    if (kina_push_handler(state_handler, &cell, both, 2, &h) != 0)
        return -1;
    for (int64_t i = 0; i < rounds; i++) {
        int64_t v = 0, ignored = 0;
        kina_perform(GET, NULL, 0, &v);
        int64_t next = v + i;
        kina_perform(PUT, &next, 1, &ignored);
    }
    int64_t final = 0;
    kina_perform(GET, NULL, 0, &final);
    /* a wrong-arity PUT makes the handler fail: the perform returns its status */
    int64_t junk = 0;
    int32_t rc = kina_perform(PUT, NULL, 0, &junk);
    if (kina_pop_handler(h) != 0)
        return -2;
    /* popped: GET is now caught by the fiber itself (it suspends) */
    return rc == KINA_STATUS_VALIDATION ? final : -3;
}

static void test_state_handler(void)
{
    static int64_t rounds = 1000;
    kina_fiber_t f = 0;
    int32_t state = -1;
    CHECK(kina_fiber_create(counter, &rounds, NULL, 0, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_DONE);
    int64_t result = 0;
    CHECK(kina_fiber_result(f, &result) == 0 && result == 100 + 999 * 1000 / 2);
    CHECK(kina_fiber_destroy(f) == 0);
}

/* ---- 3. round-robin scheduler over deeply recursive fibers ----------------------- */

typedef struct {
    int id;
    int depth;
    int yields;
    int64_t checksum;
} task_t;

static int64_t recurse(task_t *t, int depth, int64_t acc)
{
    volatile int64_t local[8]; /* locals that must survive every switch */
    for (int i = 0; i < 8; i++)
        local[i] = acc * 31 + depth * 7 + i + t->id;
    if (depth > 0) {
        int64_t below = recurse(t, depth - 1, acc + depth);
        int64_t s = 0;
        for (int i = 0; i < 8; i++)
            s += local[i];
        return below + s;
    }
    for (int y = 0; y < t->yields; y++) {
        int64_t arg = t->id, ignored = 0;
        if (kina_perform(YIELD, &arg, 1, &ignored) != 0)
            return -1000000;
    }
    int64_t s = 0;
    for (int i = 0; i < 8; i++)
        s += local[i];
    return s;
}

static int64_t task_entry(void *arg)
{
    task_t *t = arg;
    return recurse(t, t->depth, 0);
}

static int64_t expected_recurse(task_t *t, int depth, int64_t acc)
{
    int64_t s = 0;
    for (int i = 0; i < 8; i++)
        s += acc * 31 + depth * 7 + i + t->id;
    if (depth > 0)
        return expected_recurse(t, depth - 1, acc + depth) + s;
    return s;
}

static void test_round_robin(void)
{
    enum { N = 4 };
    static task_t tasks[N];
    kina_fiber_t fibers[N];
    int order[64], norder = 0;
    for (int i = 0; i < N; i++) {
        tasks[i] = (task_t){.id = i + 1, .depth = 500 + 300 * i, .yields = 3 + i};
        CHECK(kina_fiber_create(task_entry, &tasks[i], &YIELD, 1, &fibers[i]) == 0);
    }
    int live = N;
    int32_t state;
    while (live > 0) {
        for (int i = 0; i < N; i++) {
            if (kina_fiber_state(fibers[i], &state) != 0 ||
                (state != KINA_FIBER_NEW && state != KINA_FIBER_SUSPENDED))
                continue;
            CHECK(kina_resume_fiber(fibers[i], 0, &state) == 0);
            if (state == KINA_FIBER_SUSPENDED) {
                int64_t who = 0;
                int32_t n = 0;
                kina_get_perform_args(fibers[i], &who, 1, &n);
                if (norder < 64)
                    order[norder++] = (int)who;
            } else {
                CHECK(state == KINA_FIBER_DONE);
                live--;
            }
        }
    }
    /* strictly interleaved while every task still runs */
    CHECK(order[0] == 1 && order[1] == 2 && order[2] == 3 && order[3] == 4 && order[4] == 1);
    for (int i = 0; i < N; i++) {
        int64_t result = 0;
        CHECK(kina_fiber_result(fibers[i], &result) == 0);
        CHECK(result == expected_recurse(&tasks[i], tasks[i].depth, 0));
        CHECK(kina_fiber_destroy(fibers[i]) == 0);
    }
}

/* ---- 4. forwarding, suspending and nesting of C handlers ------------------------- */

static int32_t forward_all(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs; (void)out;
    (*(int *)ctx)++;
    return KINA_FORWARD;
}

static int32_t add_one_then_ask_outer(void *ctx, int32_t effect, const int64_t *args,
                                      int32_t nargs, int64_t *out)
{
    (void)ctx; (void)args; (void)nargs;
    /* a handler runs outside itself: this perform reaches the next handler out */
    int64_t outer = 0;
    int32_t rc = kina_perform(effect, NULL, 0, &outer);
    if (rc != 0)
        return rc;
    *out = outer + 1;
    return KINA_HANDLED;
}

static int32_t answer_41(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs;
    *out = 41;
    return KINA_HANDLED;
}

static int32_t suspend_it(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs; (void)out;
    return KINA_SUSPEND;
}

static int forwards = 0;

static int64_t nesting_entry(void *arg)
{
    (void)arg;
    kina_handler_t outer, inner, fwd, susp;
    kina_push_handler(answer_41, NULL, &ASK, 1, &outer);
    kina_push_handler(add_one_then_ask_outer, NULL, &ASK, 1, &inner);
    kina_push_handler(forward_all, &forwards, &ASK, 1, &fwd);
    int64_t v = 0;
    int32_t rc = kina_perform(ASK, NULL, 0, &v);     /* fwd -> inner -> outer: 42 */
    /* popping a handler that is not innermost fails and changes nothing */
    int32_t bad_pop = kina_pop_handler(outer);
    kina_pop_handler(fwd);
    kina_pop_handler(inner);
    kina_pop_handler(outer);
    /* a C handler that suspends the fiber to its resumer */
    kina_push_handler(suspend_it, NULL, &GET, 1, &susp);
    int64_t from_host = 0;
    int32_t rc2 = kina_perform(GET, NULL, 0, &from_host);
    kina_pop_handler(susp);
    /* nothing handles NEVER: the fiber catches only YIELD */
    int64_t dummy;
    int32_t rc3 = kina_perform(NEVER, NULL, 0, &dummy);
    if (rc != 0 || v != 42 || bad_pop != KINA_STATUS_VALIDATION || rc2 != 0 ||
        rc3 != KINA_STATUS_UNHANDLED)
        return -1;
    return from_host;
}

static void test_nesting(void)
{
    kina_fiber_t f;
    int32_t state, id;
    CHECK(kina_fiber_create(nesting_entry, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_get_perform_id(f, &id) == 0 && id == GET);
    CHECK(kina_resume_fiber(f, 777, &state) == 0 && state == KINA_FIBER_DONE);
    int64_t result = 0;
    CHECK(kina_fiber_result(f, &result) == 0 && result == 777);
    CHECK(forwards == 1);
    kina_fiber_destroy(f);
}

/* ---- 5. cancellation --------------------------------------------------------------- */

static int cleanups = 0;

static int64_t cancellable(void *arg)
{
    (void)arg;
    int64_t v;
    for (;;) {
        int32_t rc = kina_perform(YIELD, NULL, 0, &v);
        if (rc == KINA_STATUS_CANCELLED) {
            cleanups++;
            return -7;
        }
    }
}

static void test_cancel(void)
{
    kina_fiber_t f;
    int32_t state;
    CHECK(kina_fiber_create(cancellable, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_cancel_fiber(f, &state) == 0 && state == KINA_FIBER_CANCELLED);
    CHECK(cleanups == 1);
    CHECK(kina_resume_fiber(f, 0, &state) == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_destroy(f) == 0);
    /* destroying a suspended fiber cancels it first */
    CHECK(kina_fiber_create(cancellable, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(f) == 0 && cleanups == 2);
    /* a new fiber can be cancelled without ever running */
    CHECK(kina_fiber_create(cancellable, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_cancel_fiber(f, &state) == 0 && state == KINA_FIBER_CANCELLED && cleanups == 2);
    CHECK(kina_fiber_destroy(f) == 0);
}

/* ---- 6. error paths --------------------------------------------------------------- */

static kina_fiber_t self_handle;
static int32_t self_resume_rc = -1, self_cancel_rc = -1, self_destroy_rc = -1;

static int64_t resumes_itself(void *arg)
{
    (void)arg;
    int32_t state;
    self_resume_rc = kina_resume_fiber(self_handle, 0, &state);
    self_cancel_rc = kina_cancel_fiber(self_handle, &state);
    self_destroy_rc = kina_fiber_destroy(self_handle);
    return 5;
}

static void test_errors(void)
{
    int32_t state, id;
    int64_t v;
    kina_fiber_t f;
    kina_handler_t h;
    /* NULL and bad arguments */
    CHECK(kina_effect_id(NULL, &id) == KINA_STATUS_VALIDATION);
    CHECK(kina_effect_id("x", NULL) == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_create(NULL, NULL, NULL, 0, &f) == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_create(generator, NULL, NULL, 0, NULL) == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_create(generator, NULL, NULL, -1, &f) == KINA_STATUS_VALIDATION);
    int32_t unknown = 1 << 30;
    CHECK(kina_fiber_create(generator, NULL, &unknown, 1, &f) == KINA_STATUS_VALIDATION);
    CHECK(kina_push_handler(NULL, NULL, &GET, 1, &h) == KINA_STATUS_VALIDATION);
    CHECK(kina_push_handler(answer_41, NULL, NULL, 0, &h) == KINA_STATUS_VALIDATION);
    CHECK(kina_push_handler(answer_41, NULL, &unknown, 1, &h) == KINA_STATUS_VALIDATION);
    CHECK(kina_perform(unknown, NULL, 0, &v) == KINA_STATUS_VALIDATION);
    CHECK(kina_perform(GET, NULL, 0, NULL) == KINA_STATUS_VALIDATION);
    CHECK(kina_perform(GET, NULL, 3, &v) == KINA_STATUS_VALIDATION);
    CHECK(kina_perform(GET, NULL, KINA_MAX_ARGS + 1, &v) == KINA_STATUS_VALIDATION);
    /* outside any fiber nothing handles GET */
    CHECK(kina_perform(GET, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    CHECK(strstr(kina_last_error(), "unhandled") != NULL);
    /* foreign, zero and wrong-kind handles */
    CHECK(kina_resume_fiber(0, 0, &state) == KINA_STATUS_VALIDATION);
    CHECK(kina_resume_fiber(0xdeadbeefcafeULL, 0, &state) == KINA_STATUS_VALIDATION);
    CHECK(kina_pop_handler(0x1234) == KINA_STATUS_VALIDATION);
    CHECK(kina_push_handler(answer_41, NULL, &ASK, 1, &h) == 0);
    CHECK(kina_resume_fiber((kina_fiber_t)h, 0, &state) == KINA_STATUS_VALIDATION);
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 41);   /* the root stack works too */
    CHECK(kina_pop_handler(h) == 0);
    CHECK(kina_pop_handler(h) == KINA_STATUS_VALIDATION);    /* stale */
    /* a fiber resuming, cancelling or destroying itself */
    CHECK(kina_fiber_create(resumes_itself, NULL, NULL, 0, &self_handle) == 0);
    CHECK(kina_resume_fiber(self_handle, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(self_resume_rc == KINA_STATUS_VALIDATION && self_cancel_rc == KINA_STATUS_VALIDATION &&
          self_destroy_rc == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_result(self_handle, &v) == 0 && v == 5);
    CHECK(kina_fiber_destroy(self_handle) == 0);
    /* result of an unfinished fiber; perform args with too small a buffer */
    static int64_t n = 2;
    CHECK(kina_fiber_create(generator, &n, &YIELD, 1, &f) == 0);
    CHECK(kina_fiber_result(f, &v) == KINA_STATUS_VALIDATION);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    int32_t nargs = -1;
    CHECK(kina_get_perform_args(f, NULL, 0, &nargs) == KINA_STATUS_VALIDATION && nargs == 1);
    CHECK(kina_get_perform_id(f, NULL) == KINA_STATUS_VALIDATION);
    CHECK(kina_fiber_destroy(f) == 0);
}

int main(void)
{
    CHECK(kina_effect_id("host.yield", &YIELD) == 0 && YIELD > 0);
    CHECK(kina_effect_id("host.get", &GET) == 0);
    CHECK(kina_effect_id("host.put", &PUT) == 0);
    CHECK(kina_effect_id("host.ask", &ASK) == 0);
    CHECK(kina_effect_id("host.never", &NEVER) == 0);
    int32_t again = 0;
    CHECK(kina_effect_id("host.yield", &again) == 0 && again == YIELD);
    test_generator();
    test_state_handler();
    test_round_robin();
    test_nesting();
    test_cancel();
    test_errors();
    if (failures) {
        printf("effects_host: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("effects_host: %d checks passed\n", checks);
    return 0;
}
