/* Adversarial host of the effects C ABI, part 2: lifecycle abuse.
 *
 *   cc adversarial_effects_lifecycle.c $(kina-fx config --cflags --libs) -lpthread -o host
 *   env -i ./host
 *
 * Cancel twice / cancel finished fibers, destroy while suspended or from inside
 * a fiber (itself, its resumer, a sibling), fibers that ignore cancellation and
 * keep performing, handlers pushed and never popped, popping another fiber's
 * handler or a handler from another thread, handlers that return nonsense or
 * manipulate the handler stack from inside a clause, KINA_SUSPEND with no fiber
 * to suspend, and every handle used from another OS thread.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kina_fx.h"
#include "kina_check.h"



#define V KINA_STATUS_VALIDATION

static int32_t YIELD, ASK, OTHER, NEVER;

/* ---- helpers --------------------------------------------------------------------- */

static int32_t answer_ctx(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect; (void)args; (void)nargs;
    *out = (int64_t)(intptr_t)ctx;
    return KINA_HANDLED;
}

static int64_t yield_forever(void *arg)
{
    int64_t *count = arg, v = 0;
    for (;;) {
        int32_t rc = kina_perform(YIELD, NULL, 0, &v);
        if (rc != 0)
            return -rc;
        if (count)
            (*count)++;
    }
}

/* ---- 1. cancel twice, cancel / destroy after every terminal state ---------------------- */

static int cancel_seen = 0;

static int64_t honours_cancel(void *arg)
{
    (void)arg;
    int64_t v = 0;
    int32_t rc = kina_perform(YIELD, NULL, 0, &v);
    if (rc == KINA_STATUS_CANCELLED)
        cancel_seen++;
    return 1234; /* discarded for a cancelled fiber */
}

static void test_cancel_twice(void)
{
    kina_fiber_t f;
    int32_t state = -1;
    int64_t v = -1;
    CHECK(kina_fiber_create(honours_cancel, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_cancel_fiber(f, &state) == 0 && state == KINA_FIBER_CANCELLED && cancel_seen == 1);
    /* a second cancel: no crash, the fiber stays cancelled, the entry does not run again */
    int32_t rc = kina_cancel_fiber(f, &state);
    CHECK(rc == 0 || rc == V);
    CHECK(kina_fiber_state(f, &state) == 0 && state == KINA_FIBER_CANCELLED && cancel_seen == 1);
    CHECK(kina_cancel_fiber(f, NULL) == V && err_has("out_state"));
    /* the return value of a cancelled fiber is discarded */
    CHECK(kina_fiber_result(f, &v) == V && v == -1 && err_has("cancelled"));
    CHECK(kina_resume_fiber(f, 0, &state) == V && err_has("cancelled"));
    CHECK(kina_get_perform_id(f, &(int32_t){0}) == V && err_has("cancelled"));
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_fiber_destroy(f) == V && err_has("stale"));
    /* a new fiber cancelled twice, then resumed: the entry never runs */
    CHECK(kina_fiber_create(honours_cancel, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_cancel_fiber(f, &state) == 0 && state == KINA_FIBER_CANCELLED);
    rc = kina_cancel_fiber(f, &state);
    CHECK(rc == 0 || rc == V);
    CHECK(kina_resume_fiber(f, 0, &state) == V);
    CHECK(cancel_seen == 1);
    CHECK(kina_fiber_destroy(f) == 0);
    /* destroy of a NEW fiber never runs it */
    CHECK(kina_fiber_create(honours_cancel, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_fiber_destroy(f) == 0 && cancel_seen == 1);
}

/* ---- 2. a fiber that ignores cancellation and keeps performing ---------------------------- */

static int stubborn_performs = 0, stubborn_cancelled = 0, stubborn_returned = 0;

static int64_t stubborn(void *arg)
{
    (void)arg;
    int64_t v = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t rc = kina_perform(YIELD, NULL, 0, &v);
        stubborn_performs++;
        if (rc == KINA_STATUS_CANCELLED)
            stubborn_cancelled++;
    }
    stubborn_returned = 1;
    return 0;
}

static int64_t cancelled_then_performs_other(void *arg)
{
    int32_t *out_rcs = arg;
    int64_t v = 0;
    out_rcs[0] = kina_perform(YIELD, NULL, 0, &v);     /* cancelled here */
    out_rcs[1] = kina_perform(NEVER, NULL, 0, &v);     /* not caught, nothing handles it */
    kina_handler_t h = 0;
    out_rcs[2] = kina_push_handler(answer_ctx, (void *)(intptr_t)9, &ASK, 1, &h);
    v = 0;
    out_rcs[3] = kina_perform(ASK, NULL, 0, &v);       /* an in-place handler after cancellation */
    out_rcs[4] = (int32_t)v;
    out_rcs[5] = kina_pop_handler(h);
    return 0;
}

static void test_perform_after_cancel(void)
{
    kina_fiber_t f;
    int32_t state = -1;
    CHECK(kina_fiber_create(stubborn, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    int32_t rc = kina_cancel_fiber(f, &state);
    CHECK(rc == 0 && state == KINA_FIBER_CANCELLED);
    /* "cancelled again, up to 100 times, then dropped": never 1000, and it never returned */
    printf("info: stubborn fiber: %d performs after the cancel, %d returned CANCELLED, returned=%d\n",
           stubborn_performs, stubborn_cancelled, stubborn_returned);
    CHECK(stubborn_cancelled >= 1 && stubborn_cancelled <= 101);
    CHECK(stubborn_performs == stubborn_cancelled); /* every re-perform is "cancelled again" */
    CHECK(stubborn_returned == 0);                  /* "then dropped" */
    CHECK(kina_fiber_state(f, &state) == 0 && state == KINA_FIBER_CANCELLED);
    CHECK(kina_resume_fiber(f, 0, &state) == V);
    CHECK(kina_fiber_destroy(f) == 0);
    /* the same through destroy */
    stubborn_performs = stubborn_cancelled = 0;
    CHECK(kina_fiber_create(stubborn, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(stubborn_cancelled >= 1 && stubborn_cancelled <= 101 && stubborn_returned == 0);
    /* the thread is still healthy: a fresh fiber works and the root stack is clean */
    int64_t count = 0, v = 0;
    CHECK(kina_fiber_create(yield_forever, &count, &YIELD, 1, &f) == 0);
    for (int i = 0; i < 5; i++)
        CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(count == 4);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);

    /* after cancellation, other performs: what do they return? (never a crash) */
    static int32_t rcs[6] = {-9, -9, -9, -9, -9, -9};
    CHECK(kina_fiber_create(cancelled_then_performs_other, rcs, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_cancel_fiber(f, &state) == 0 && state == KINA_FIBER_CANCELLED);
    CHECK(rcs[0] == KINA_STATUS_CANCELLED);
    /* every later perform of a cancelled fiber must fail (cancelled or unhandled), never hang */
    CHECK(rcs[1] == KINA_STATUS_CANCELLED || rcs[1] == KINA_STATUS_UNHANDLED);
    CHECK(rcs[2] == 0);
    CHECK(rcs[5] == 0); /* the fiber could still pop what it pushed */
    printf("info: after cancel: perform(uncaught)=%d push=%d perform(in-place)=%d value=%d pop=%d\n",
           rcs[1], rcs[2], rcs[3], rcs[4], rcs[5]);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED); /* nothing left on the root */
}

/* ---- 3. destroy / cancel from inside fibers ---------------------------------------------- */

static kina_fiber_t outer_h, sibling_h;
static int32_t inner_rcs[8];

static int64_t inner_abuses_outer(void *arg)
{
    (void)arg;
    int32_t st = -1;
    inner_rcs[0] = kina_fiber_destroy(outer_h);          /* outer is running (waiting in resume) */
    inner_rcs[1] = kina_cancel_fiber(outer_h, &st);
    inner_rcs[2] = kina_resume_fiber(outer_h, 0, &st);
    inner_rcs[3] = kina_fiber_state(outer_h, &st);
    inner_rcs[4] = st;
    inner_rcs[5] = kina_fiber_destroy(sibling_h);        /* a suspended sibling: allowed */
    return 3;
}

static int64_t outer_entry(void *arg)
{
    (void)arg;
    kina_fiber_t inner;
    int32_t st = -1;
    if (kina_fiber_create(inner_abuses_outer, NULL, NULL, 0, &inner) != 0)
        return -1;
    int32_t rc = kina_resume_fiber(inner, 0, &st);
    int64_t r = -1;
    kina_fiber_result(inner, &r);
    kina_fiber_destroy(inner);
    return rc == 0 && st == KINA_FIBER_DONE ? r : -2;
}

static void test_destroy_from_inside(void)
{
    int32_t state = -1;
    int64_t count = 0, r = 0;
    CHECK(kina_fiber_create(yield_forever, &count, &YIELD, 1, &sibling_h) == 0);
    CHECK(kina_resume_fiber(sibling_h, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_create(outer_entry, NULL, NULL, 0, &outer_h) == 0);
    CHECK(kina_resume_fiber(outer_h, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(outer_h, &r) == 0 && r == 3);
    CHECK(inner_rcs[0] == V && inner_rcs[1] == V && inner_rcs[2] == V);
    CHECK(inner_rcs[3] == 0 && inner_rcs[4] == KINA_FIBER_RUNNING);
    CHECK(inner_rcs[5] == 0);
    CHECK(kina_fiber_state(sibling_h, &state) == V); /* destroyed by the inner fiber */
    CHECK(kina_fiber_destroy(outer_h) == 0);
}

/* ---- 4. handlers pushed and never popped; popping someone else's handler ---------------- */

static kina_handler_t leaked_h;

static int64_t pushes_and_returns(void *arg)
{
    (void)arg;
    int64_t v = 0;
    if (kina_push_handler(answer_ctx, (void *)(intptr_t)77, &ASK, 1, &leaked_h) != 0)
        return -1;
    if (kina_perform(ASK, NULL, 0, &v) != 0)
        return -2;
    return v; /* handler still pushed */
}

static kina_handler_t a_handler;
static int64_t pushes_then_yields(void *arg)
{
    (void)arg;
    int64_t v = 0;
    if (kina_push_handler(answer_ctx, (void *)(intptr_t)5, &ASK, 1, &a_handler) != 0)
        return -1;
    if (kina_perform(YIELD, NULL, 0, &v) != 0)
        return -2;
    int64_t a = 0;
    if (kina_perform(ASK, NULL, 0, &a) != 0) /* still our handler after the other fiber's abuse */
        return -3;
    if (kina_pop_handler(a_handler) != 0)
        return -4;
    return a;
}

static int32_t pop_foreign_rc = -9;
static int64_t pops_foreign(void *arg)
{
    (void)arg;
    pop_foreign_rc = kina_pop_handler(a_handler);
    return 0;
}

static void test_unpopped_and_foreign_pops(void)
{
    kina_fiber_t f, g;
    int32_t state = -1;
    int64_t v = 0;
    CHECK(kina_fiber_create(pushes_and_returns, NULL, NULL, 0, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(f, &v) == 0 && v == 77);
    /* the fiber's handler did not leak onto the root stack */
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    /* its handle: popping it from the root is an error, not a pop of something else */
    CHECK(kina_pop_handler(leaked_h) == V);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_pop_handler(leaked_h) == V);
    /* a later fiber does not see it either */
    CHECK(kina_fiber_create(pushes_and_returns, NULL, NULL, 0, &f) == 0);
    CHECK(kina_fiber_destroy(f) == 0); /* never started: nothing pushed */

    /* popping another fiber's handler: A pushes and suspends, B and the root try to pop it */
    CHECK(kina_fiber_create(pushes_then_yields, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_pop_handler(a_handler) == V && err_has("innermost"));
    CHECK(kina_fiber_create(pops_foreign, NULL, NULL, 0, &g) == 0);
    CHECK(kina_resume_fiber(g, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(pop_foreign_rc == V);
    CHECK(kina_fiber_destroy(g) == 0);
    /* a suspended fiber's handler is not in scope for the root */
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(f, &v) == 0 && v == 5);
    CHECK(kina_fiber_destroy(f) == 0);

    /* destroying a suspended fiber that holds pushed handlers frees them */
    CHECK(kina_fiber_create(pushes_then_yields, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    kina_handler_t held = a_handler;
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_pop_handler(held) == V);

    /* a root handler popped from inside a fiber: not that fiber's stack */
    kina_handler_t root_h = 0;
    CHECK(kina_push_handler(answer_ctx, (void *)(intptr_t)1, &ASK, 1, &root_h) == 0);
    a_handler = root_h;
    CHECK(kina_fiber_create(pops_foreign, NULL, NULL, 0, &g) == 0);
    CHECK(kina_resume_fiber(g, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(pop_foreign_rc == V);
    CHECK(kina_fiber_destroy(g) == 0);
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 1);
    CHECK(kina_pop_handler(root_h) == 0);
}

/* ---- 5. handlers that misbehave ----------------------------------------------------- */

static int32_t weird_ret;
static int32_t returns_weird(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs;
    *out = 1;
    return weird_ret;
}

static kina_handler_t self_pop_h;
static int32_t self_pop_rc = -9, inner_push_rc = -9;
static kina_handler_t pushed_inside;
static int32_t pops_itself(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs;
    self_pop_rc = kina_pop_handler(self_pop_h);
    *out = 2;
    return KINA_HANDLED;
}

static int32_t pushes_inside(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs;
    inner_push_rc = kina_push_handler(answer_ctx, (void *)(intptr_t)66, &OTHER, 1, &pushed_inside);
    *out = 3;
    return KINA_HANDLED; /* returns with its own push still on the stack */
}

static void *leave_push_behind(void *unused)
{
    (void)unused;
    kina_handler_t h;
    int64_t v = 0;
    CHECK(kina_push_handler(pushes_inside, NULL, &ASK, 1, &h) == 0);
    int32_t rc = kina_perform(ASK, NULL, 0, &v);
    printf("info: handler leaving a push behind: perform=%d v=%d push=%d\n", rc, (int)v, inner_push_rc);
    /* either the perform reports the unbalanced push (an error status), or the stack
     * is left consistent: the clause's push is innermost and can be popped, then h */
    if (rc == 0) {
        CHECK(kina_pop_handler(pushed_inside) == 0 || kina_pop_handler(h) == 0);
        int32_t r1 = kina_pop_handler(pushed_inside), r2 = kina_pop_handler(h);
        (void)r1; (void)r2;
    } else {
        CHECK(kina_pop_handler(h) == 0);
    }
    /* whatever happened, nothing may remain on this thread's root stack */
    kina_handler_t probe = 0;
    CHECK(kina_push_handler(answer_ctx, (void *)(intptr_t)8, &NEVER, 1, &probe) == 0);
    CHECK(kina_pop_handler(probe) == 0);
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    CHECK(kina_perform(OTHER, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    return NULL;
}

static void test_misbehaving_handlers(void)
{
    kina_handler_t h;
    int64_t v = 0;
    int32_t weird[] = {-3, -100, -2147483647 - 1, 9, 100, 2147483647};
    for (size_t i = 0; i < sizeof weird / sizeof *weird; i++) {
        weird_ret = weird[i];
        CHECK(kina_push_handler(returns_weird, NULL, &ASK, 1, &h) == 0);
        v = -7;
        int32_t rc = kina_perform(ASK, NULL, 0, &v);
        /* not a documented return: must be an error status (>0), never success or a crash */
        CHECK(rc > 0);
        if (rc <= 0)
            printf("  (handler returned %d, perform gave %d)\n", weird[i], rc);
        CHECK(kina_pop_handler(h) == 0);
    }
    /* a handler popping itself from inside its clause */
    CHECK(kina_push_handler(pops_itself, NULL, &ASK, 1, &self_pop_h) == 0);
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 2);
    CHECK(self_pop_rc == V);
    CHECK(kina_pop_handler(self_pop_h) == 0);
    /* a handler pushing a handler and returning without popping it: run on a thread of
     * its own, so that a corrupted root stack cannot spoil the other tests */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, leave_push_behind, NULL) == 0);
    pthread_join(t, NULL);
}

/* ---- 6. KINA_SUSPEND with no fiber to suspend ------------------------------------------- */

static int32_t suspends(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs; (void)out;
    return KINA_SUSPEND;
}

static int32_t in_fiber_rc = -9;
static int64_t performs_ask(void *arg)
{
    (void)arg;
    int64_t v = 0;
    in_fiber_rc = kina_perform(ASK, NULL, 0, &v);
    return v;
}

static void test_suspend_without_fiber(void)
{
    kina_handler_t h;
    int64_t v = -7;
    CHECK(kina_push_handler(suspends, NULL, &ASK, 1, &h) == 0);
    int32_t rc = kina_perform(ASK, NULL, 0, &v);
    printf("info: KINA_SUSPEND on the root stack outside fibers -> %d (%s)\n", rc, kina_last_error());
    CHECK(rc > 0 && v == -7);
    CHECK(strlen(kina_last_error()) > 0);
    /* a fiber that does not catch ASK performs it; the root handler says SUSPEND: the
     * fiber is *inside* the handler, so there is still no fiber outside it */
    kina_fiber_t f;
    int32_t state = -1;
    CHECK(kina_fiber_create(performs_ask, NULL, &YIELD, 1, &f) == 0);
    rc = kina_resume_fiber(f, 0, &state);
    printf("info: KINA_SUSPEND from a root handler for a fiber's perform -> resume %d state %d perform %d\n",
           rc, state, in_fiber_rc);
    CHECK(rc == 0 || rc > 0);
    if (state == KINA_FIBER_SUSPENDED) {
        int32_t id = 0;
        CHECK(kina_get_perform_id(f, &id) == 0 && id == ASK);
    }
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_pop_handler(h) == 0);
}

/* ---- 7. handles used from another OS thread ---------------------------------------------- */

struct thread_job {
    kina_fiber_t fiber;
    kina_handler_t handler;
    int32_t rcs[12];
    char err[256];
};

static void *foreign_user(void *p)
{
    struct thread_job *j = p;
    int32_t st = -1, e = -1, n = -1;
    int64_t v = -1, a[4];
    j->rcs[0] = kina_resume_fiber(j->fiber, 0, &st);
    snprintf(j->err, sizeof j->err, "%s", kina_last_error());
    j->rcs[1] = kina_fiber_state(j->fiber, &st);
    j->rcs[2] = kina_get_perform_id(j->fiber, &e);
    j->rcs[3] = kina_get_perform_args(j->fiber, a, 4, &n);
    j->rcs[4] = kina_fiber_result(j->fiber, &v);
    j->rcs[5] = kina_cancel_fiber(j->fiber, &st);
    j->rcs[6] = kina_fiber_destroy(j->fiber);
    j->rcs[7] = kina_pop_handler(j->handler);
    j->rcs[8] = (st == -1 && e == -1 && n == -1 && v == -1);
    /* this thread's own root stack is independent: ASK is unhandled here */
    j->rcs[9] = kina_perform(ASK, NULL, 0, &v);
    return NULL;
}

static void *creates_and_exits(void *p)
{
    struct thread_job *j = p;
    int32_t st;
    j->rcs[0] = kina_fiber_create(yield_forever, NULL, &YIELD, 1, &j->fiber);
    j->rcs[1] = kina_resume_fiber(j->fiber, 0, &st);
    j->rcs[2] = st;
    j->rcs[3] = kina_push_handler(answer_ctx, NULL, &ASK, 1, &j->handler);
    return NULL; /* exits with a suspended fiber and a pushed root handler */
}

static void test_foreign_threads(void)
{
    static struct thread_job j;
    int32_t state = -1;
    pthread_t t;
    /* this thread's handles used by another thread */
    CHECK(kina_fiber_create(yield_forever, NULL, &YIELD, 1, &j.fiber) == 0);
    CHECK(kina_resume_fiber(j.fiber, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_push_handler(answer_ctx, (void *)(intptr_t)4, &ASK, 1, &j.handler) == 0);
    CHECK(pthread_create(&t, NULL, foreign_user, &j) == 0);
    pthread_join(t, NULL);
    for (int i = 0; i < 8; i++) {
        CHECK(j.rcs[i] == V);
        if (j.rcs[i] != V)
            printf("  (foreign call %d returned %d)\n", i, j.rcs[i]);
    }
    CHECK(strstr(j.err, "another OS thread") != NULL);
    CHECK(j.rcs[8] == 1);
    CHECK(j.rcs[9] == KINA_STATUS_UNHANDLED);
    /* all still fine for the owner */
    int64_t v = 0;
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 4);
    CHECK(kina_pop_handler(j.handler) == 0);
    CHECK(kina_resume_fiber(j.fiber, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(j.fiber) == 0);

    /* handles of a thread that has exited: still rejected, never a crash */
    static struct thread_job k;
    CHECK(pthread_create(&t, NULL, creates_and_exits, &k) == 0);
    pthread_join(t, NULL);
    CHECK(k.rcs[0] == 0 && k.rcs[1] == 0 && k.rcs[2] == KINA_FIBER_SUSPENDED && k.rcs[3] == 0);
    CHECK(kina_resume_fiber(k.fiber, 0, &state) == V);
    CHECK(kina_fiber_state(k.fiber, &state) == V);
    CHECK(kina_fiber_destroy(k.fiber) == V);
    CHECK(kina_pop_handler(k.handler) == V);
    /* and the dead thread's root handler is not ours */
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    /* a new thread (maybe the same OS thread id) does not inherit them either */
    memset(j.rcs, 0, sizeof j.rcs);
    j.fiber = k.fiber;
    j.handler = k.handler;
    CHECK(pthread_create(&t, NULL, foreign_user, &j) == 0);
    pthread_join(t, NULL);
    for (int i = 0; i < 8; i++) {
        CHECK(j.rcs[i] == V);
        if (j.rcs[i] != V)
            printf("  (dead thread's handle, call %d returned %d: %s)\n", i, j.rcs[i], j.err);
    }
    CHECK(j.rcs[9] == KINA_STATUS_UNHANDLED);
}

/* ---- 8. a fiber that ignores every status and performs forever --------------------------- */

static volatile long ignorer_performs = 0;
static volatile int ignorer_cancel_rc = -9, ignorer_done = 0;

static int64_t ignores_everything(void *arg)
{
    (void)arg;
    int64_t v = 0;
    for (;;) {
        kina_perform(YIELD, NULL, 0, &v); /* a buggy fiber: never looks at the status */
        ignorer_performs++;
    }
    return 0;
}

static void *cancel_ignorer(void *unused)
{
    (void)unused;
    kina_fiber_t f;
    int32_t state = -1;
    if (kina_fiber_create(ignores_everything, NULL, &YIELD, 1, &f) != 0 ||
        kina_resume_fiber(f, 0, &state) != 0 || state != KINA_FIBER_SUSPENDED)
        return NULL;
    ignorer_cancel_rc = kina_cancel_fiber(f, &state); /* "cancelled again up to 100 times, then dropped" */
    kina_fiber_destroy(f);
    ignorer_done = 1;
    return NULL;
}

/* Returns 0 if the cancel came back within `seconds` (the thread is joined). */
static int test_cancel_of_ignoring_fiber(int seconds)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, cancel_ignorer, NULL) == 0);
    for (int i = 0; i < seconds * 10 && !ignorer_done; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(ignorer_done); /* documented: dropped after 100 cancellations, so the cancel returns */
    if (!ignorer_done) {
        printf("  (kina_cancel_fiber did not return in %d s; the fiber performed %ld times)\n", seconds,
               ignorer_performs);
        return 1;
    }
    pthread_join(t, NULL);
    CHECK(ignorer_cancel_rc == 0);
    return 0;
}

/* ---- 9. the runtime's own effect performed by a host -------------------------------------- */

static int32_t internal_id;
static int64_t performs_internal(void *arg)
{
    int64_t a[3] = {1, 2, 3}, v = 0;
    kina_perform(internal_id, a, (int32_t)(intptr_t)arg, &v);
    return 1;
}

static void test_internal_effect(void)
{
    /* every effect id a host can name is fair game: "kina.suspend_to_host" (the
     * effect behind KINA_SUSPEND) performed directly, with 0..3 arguments */
    CHECK(kina_effect_id("kina.suspend_to_host", &internal_id) == 0);
    for (int n = 0; n < 4; n++) {
        kina_fiber_t f;
        int32_t state = -1;
        CHECK(kina_fiber_create(performs_internal, (void *)(intptr_t)n, NULL, 0, &f) == 0);
        int32_t rc = kina_resume_fiber(f, 0, &state);
        int32_t st2 = -1;
        kina_fiber_state(f, &st2);
        printf("info: perform(kina.suspend_to_host, nargs=%d) in a catch-all fiber: resume %d state %d/%d (%s)\n",
               n, rc, state, st2, kina_last_error());
        /* documented: 0 with SUSPENDED/DONE, or a failure with state FAILED */
        CHECK(rc == 0 ? (state == KINA_FIBER_SUSPENDED || state == KINA_FIBER_DONE) : state == KINA_FIBER_FAILED);
        CHECK(st2 != KINA_FIBER_RUNNING); /* seen from its resumer, a fiber never runs */
        if (st2 == KINA_FIBER_SUSPENDED) {
            int32_t id = -1;
            rc = kina_get_perform_id(f, &id);
            CHECK(rc == 0);
        }
        rc = kina_fiber_destroy(f);
        CHECK(rc == 0); /* otherwise the fiber can never be freed */
        if (rc != 0)
            printf("  (nargs=%d: destroy %d: %s)\n", n, rc, kina_last_error());
    }
}

/* ---- 10. kina_last_error is per thread --------------------------------------------------- */

static char thread_msg[256];
static void *makes_own_error(void *unused)
{
    (void)unused;
    int64_t v;
    kina_perform(NEVER, NULL, 0, &v);
    snprintf(thread_msg, sizeof thread_msg, "%s", kina_last_error());
    return NULL;
}

static void test_last_error_per_thread(void)
{
    pthread_t t;
    CHECK(kina_fiber_state(0, &(int32_t){0}) == V);
    char mine[256];
    snprintf(mine, sizeof mine, "%s", kina_last_error());
    CHECK(pthread_create(&t, NULL, makes_own_error, NULL) == 0);
    pthread_join(t, NULL);
    CHECK(strstr(thread_msg, "advl.never") != NULL);
    CHECK(strcmp(kina_last_error(), mine) == 0);
}

/* ---- 11. arrays passed in are copied --------------------------------------------------- */

static void test_arrays_copied(void)
{
    static int32_t catch_ids[1];
    int32_t effects[1] = {ASK};
    kina_fiber_t f;
    kina_handler_t h;
    int32_t state = -1, id = -1;
    int64_t v = 0;
    catch_ids[0] = YIELD;
    CHECK(kina_fiber_create(yield_forever, NULL, catch_ids, 1, &f) == 0);
    catch_ids[0] = NEVER; /* changed after the call: the fiber still catches YIELD */
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_get_perform_id(f, &id) == 0 && id == YIELD);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_push_handler(answer_ctx, (void *)(intptr_t)12, effects, 1, &h) == 0);
    effects[0] = OTHER;
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 12);
    CHECK(kina_perform(OTHER, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    CHECK(kina_pop_handler(h) == 0);
}

/* ---- 12. a fiber suspended inside its handler's clause, then destroyed -------------------- */

static int32_t clause_rc = -9;
static int32_t clause_yields(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs;
    clause_rc = kina_perform(YIELD, NULL, 0, out); /* the fiber catches it: suspends in the clause */
    return clause_rc == 0 ? KINA_HANDLED : clause_rc;
}

static kina_handler_t clause_h;
static int32_t clause_pop_rc = -9, clause_perform_rc = -9;
static int64_t suspends_in_clause(void *arg)
{
    (void)arg;
    int64_t v = 0;
    if (kina_push_handler(clause_yields, NULL, &ASK, 1, &clause_h) != 0)
        return -1;
    clause_perform_rc = kina_perform(ASK, NULL, 0, &v);
    clause_pop_rc = kina_pop_handler(clause_h);
    return v;
}

static void test_suspended_in_clause(void)
{
    kina_fiber_t f;
    int32_t state = -1;
    int64_t v = 0;
    /* resumed normally */
    CHECK(kina_fiber_create(suspends_in_clause, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED); /* not in scope at the root */
    CHECK(kina_resume_fiber(f, 31, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(f, &v) == 0 && v == 31 && clause_pop_rc == 0);
    CHECK(kina_fiber_destroy(f) == 0);
    /* destroyed while suspended in the clause */
    clause_pop_rc = clause_perform_rc = -9;
    CHECK(kina_fiber_create(suspends_in_clause, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(clause_rc == KINA_STATUS_CANCELLED && clause_perform_rc == KINA_STATUS_CANCELLED);
    CHECK(clause_pop_rc == 0); /* the skip marker of the clause is gone: the pop works */
    CHECK(kina_pop_handler(clause_h) == V);
}

int main(void)
{
    CHECK(kina_effect_id("advl.yield", &YIELD) == 0);
    CHECK(kina_effect_id("advl.ask", &ASK) == 0);
    CHECK(kina_effect_id("advl.other", &OTHER) == 0);
    CHECK(kina_effect_id("advl.never", &NEVER) == 0);
    test_cancel_twice();
    test_perform_after_cancel();
    test_destroy_from_inside();
    test_unpopped_and_foreign_pops();
    test_misbehaving_handlers();
    test_suspend_without_fiber();
    test_foreign_threads();
    test_internal_effect();
    test_last_error_per_thread();
    test_arrays_copied();
    test_suspended_in_clause();
    int hung = test_cancel_of_ignoring_fiber(10);
    fflush(stdout);
    if (hung) { /* the spinning thread cannot be joined: leave without running exit handlers */
        printf("adversarial_effects_lifecycle: %d of %d checks FAILED\n", failures, checks);
        fflush(stdout);
        _exit(1);
    }
    if (failures) {
        printf("adversarial_effects_lifecycle: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("adversarial_effects_lifecycle: %d checks passed\n", checks);
    return 0;
}
