/* Adversarial host of the effects C ABI, part 3: stress.
 *
 *   cc adversarial_effects_stress.c $(kina-fx config --cflags --libs) -lpthread -o host && env -i ./host
 *
 * 1. 10,000 fibers created and destroyed in several patterns, memory flat
 *    (resident set from /proc/self/statm);
 * 2. deep recursion in entry functions, locals verified after many switches;
 * 3. hundreds of fibers alive and resumed in a pseudo-random order;
 * 4. fibers created inside fibers, a chain 64 deep, effects crossing the chain;
 * 5. a fiber resuming another fiber, which is later resumed by someone else;
 * 6. C handlers that create and run fibers;
 * 7. thousands of handlers on one stack, forwarded through;
 * 8. threads running their own fibers and handlers at the same time.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kina_fx.h"
#include "kina_check.h"


static int32_t YIELD, ASK, DEEP;

static long rss_kb(void)
{
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int32_t answer_ctx(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect;
    *out = (int64_t)(intptr_t)ctx + (nargs > 0 ? args[0] : 0);
    return KINA_HANDLED;
}

static int32_t forward(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs; (void)out;
    return KINA_FORWARD;
}

/* ---- 1. 10,000 fibers, memory flat --------------------------------------------------- */

static int64_t yield_args_twice(void *arg)
{
    int64_t a[4] = {(int64_t)(intptr_t)arg, 1, 2, 3}, v = 0, w = 0;
    if (kina_perform(YIELD, a, 4, &v) != 0)
        return -1;
    if (kina_perform(YIELD, a, 1, &w) != 0)
        return -2;
    return v + w;
}

static int64_t push_no_pop(void *arg)
{
    kina_handler_t h[3];
    int64_t v = 0;
    for (int i = 0; i < 3; i++)
        if (kina_push_handler(answer_ctx, arg, &ASK, 1, &h[i]) != 0)
            return -1;
    if (kina_perform(ASK, NULL, 0, &v) != 0)
        return -2;
    return v; /* never pops */
}

/* pattern 0: run to completion; 1: leave suspended and destroy; 2: never start;
 * 3: cancel then destroy; 4: unpopped handlers */
static int churn(int pattern, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        kina_fiber_t f;
        int32_t st = -1;
        int64_t r = 0, args[4];
        int32_t na = 0;
        kina_fiber_fn fn = pattern == 4 ? push_no_pop : yield_args_twice;
        if (kina_fiber_create(fn, (void *)(intptr_t)i, &YIELD, 1, &f) != 0) {
            bad++;
            continue;
        }
        if (pattern == 0) {
            bad += kina_resume_fiber(f, 0, &st) != 0 || st != KINA_FIBER_SUSPENDED;
            bad += kina_get_perform_args(f, args, 4, &na) != 0 || na != 4 || args[0] != i;
            bad += kina_resume_fiber(f, 10, &st) != 0 || st != KINA_FIBER_SUSPENDED;
            bad += kina_resume_fiber(f, 20, &st) != 0 || st != KINA_FIBER_DONE;
            bad += kina_fiber_result(f, &r) != 0 || r != 30;
        } else if (pattern == 1) {
            bad += kina_resume_fiber(f, 0, &st) != 0 || st != KINA_FIBER_SUSPENDED;
        } else if (pattern == 3) {
            bad += kina_resume_fiber(f, 0, &st) != 0 || st != KINA_FIBER_SUSPENDED;
            bad += kina_cancel_fiber(f, &st) != 0 || st != KINA_FIBER_CANCELLED;
        } else if (pattern == 4) {
            bad += kina_resume_fiber(f, 0, &st) != 0 || st != KINA_FIBER_DONE;
            bad += kina_fiber_result(f, &r) != 0 || r != i;
        }
        bad += kina_fiber_destroy(f) != 0;
    }
    return bad;
}

static void test_churn(void)
{
    static const char *names[] = {"complete", "suspended+destroy", "never started", "cancelled",
                                  "unpopped handlers"};
    for (int p = 0; p < 5; p++) {
        CHECK(churn(p, 2000) == 0); /* warm up pools and caches */
        long before = rss_kb();
        CHECK(churn(p, 10000) == 0);
        long mid = rss_kb();
        CHECK(churn(p, 10000) == 0);
        long after = rss_kb();
        printf("info: 10,000 fibers (%s): rss %ld -> %ld -> %ld kB\n", names[p], before, mid, after);
        /* flat: the second batch of 10,000 must not grow the resident set by more than 2 MB */
        CHECK(after - mid < 2048);
        CHECK(mid - before < 8192);
    }
    /* 10,000 alive at the same time, all suspended, then destroyed; twice */
    static kina_fiber_t many[10000];
    long base = 0;
    for (int round = 0; round < 3; round++) {
        int bad = 0;
        for (int i = 0; i < 10000; i++) {
            int32_t st = -1;
            bad += kina_fiber_create(yield_args_twice, (void *)(intptr_t)i, &YIELD, 1, &many[i]) != 0;
            bad += kina_resume_fiber(many[i], 0, &st) != 0 || st != KINA_FIBER_SUSPENDED;
        }
        for (int i = 0; i < 10000; i++) {
            int32_t id = 0;
            bad += kina_get_perform_id(many[i], &id) != 0 || id != YIELD;
            bad += kina_fiber_destroy(many[i]) != 0;
        }
        CHECK(bad == 0);
        long now = rss_kb();
        printf("info: 10,000 simultaneous fibers, round %d: rss after destroy %ld kB\n", round, now);
        if (round == 1)
            base = now;
        if (round == 2)
            CHECK(now - base < 4096);
    }
}

/* ---- 2. deep recursion with locals across switches -------------------------------------- */

typedef struct {
    int id, depth, every;
    int64_t switches;
} deep_t;

static int64_t deep_rec(deep_t *t, int level)
{
    volatile int64_t local[6];
    for (int i = 0; i < 6; i++)
        local[i] = (int64_t)t->id * 1000003 + level * 7 + i;
    int64_t below = 0;
    if (level < t->depth)
        below = deep_rec(t, level + 1);
    if (level % t->every == 0) {
        int64_t v = 0, a = level;
        if (kina_perform(YIELD, &a, 1, &v) != 0 || v != level + t->id)
            return -1000000000;
        t->switches++;
    }
    for (int i = 0; i < 6; i++)
        if (local[i] != (int64_t)t->id * 1000003 + level * 7 + i)
            return -2000000000;
    return below + level;
}

static int64_t deep_entry(void *arg)
{
    deep_t *t = arg;
    return deep_rec(t, 0);
}

static void test_deep(void)
{
    enum { N = 6 };
    static deep_t tasks[N];
    kina_fiber_t f[N];
    int32_t st[N];
    int depths[N] = {20000, 5000, 12000, 100, 30000, 1};
    for (int i = 0; i < N; i++) {
        tasks[i] = (deep_t){i + 1, depths[i], 37 + i, 0};
        CHECK(kina_fiber_create(deep_entry, &tasks[i], &YIELD, 1, &f[i]) == 0);
        st[i] = KINA_FIBER_NEW;
    }
    int64_t value[N] = {0};
    int live = N, guard = 0;
    while (live > 0 && guard++ < 100000) {
        for (int i = 0; i < N; i++) {
            if (st[i] == KINA_FIBER_DONE)
                continue;
            int32_t rc = kina_resume_fiber(f[i], value[i], &st[i]);
            if (rc != 0) {
                CHECK(rc == 0);
                st[i] = KINA_FIBER_DONE;
                live--;
                continue;
            }
            if (st[i] == KINA_FIBER_SUSPENDED) {
                int64_t a = -1;
                int32_t n = 0;
                CHECK(kina_get_perform_args(f[i], &a, 1, &n) == 0 && n == 1);
                value[i] = a + tasks[i].id;
            } else {
                live--;
            }
        }
    }
    for (int i = 0; i < N; i++) {
        int64_t r = 0, d = tasks[i].depth;
        CHECK(kina_fiber_result(f[i], &r) == 0 && r == d * (d + 1) / 2);
        CHECK(tasks[i].switches == d / tasks[i].every + 1);
        CHECK(kina_fiber_destroy(f[i]) == 0);
    }
}

/* ---- 3. many interleaved fibers, random order ------------------------------------------- */

static int64_t interleaved(void *arg)
{
    int64_t id = (int64_t)(intptr_t)arg;
    volatile int64_t mine[4] = {id, id * 3, id * 5, id * 7};
    int64_t sum = 0;
    for (int64_t i = 0; i < 20; i++) {
        int64_t a[2] = {id, i}, v = 0;
        if (kina_perform(YIELD, a, 2, &v) != 0)
            return -1;
        if (v != id * 100 + i)
            return -2;
        if (mine[0] != id || mine[1] != id * 3 || mine[2] != id * 5 || mine[3] != id * 7)
            return -3;
        sum += v;
    }
    return sum;
}

static void test_interleaved(void)
{
    enum { N = 500 };
    static kina_fiber_t f[N];
    static int32_t st[N];
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += kina_fiber_create(interleaved, (void *)(intptr_t)i, &YIELD, 1, &f[i]) != 0;
        st[i] = KINA_FIBER_NEW;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    int live = N;
    long resumes = 0;
    while (live > 0) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int i = (int)((seed >> 33) % N);
        if (st[i] == KINA_FIBER_DONE)
            continue;
        int64_t value = 0;
        if (st[i] == KINA_FIBER_SUSPENDED) {
            int64_t a[2];
            int32_t n = 0;
            bad += kina_get_perform_args(f[i], a, 2, &n) != 0 || n != 2 || a[0] != i;
            value = a[0] * 100 + a[1];
        }
        bad += kina_resume_fiber(f[i], value, &st[i]) != 0;
        resumes++;
        if (st[i] == KINA_FIBER_DONE)
            live--;
    }
    for (int i = 0; i < N; i++) {
        int64_t r = 0;
        bad += kina_fiber_result(f[i], &r) != 0 || r != (int64_t)i * 100 * 20 + 190;
        bad += kina_fiber_destroy(f[i]) != 0;
    }
    CHECK(bad == 0);
    CHECK(resumes == (long)N * 21);
}

/* ---- 4. fibers created inside fibers ------------------------------------------------------ */

static int64_t chain_entry(void *arg)
{
    int64_t level = (int64_t)(intptr_t)arg;
    int64_t v = 0;
    if (level == 0) {
        /* the innermost: ASK crosses every fiber to the root handler; YIELD goes to its parent */
        if (kina_perform(ASK, &level, 1, &v) != 0)
            return -1;
        int64_t y = 0;
        if (kina_perform(YIELD, NULL, 0, &y) != 0)
            return -2;
        return v + y;
    }
    kina_fiber_t child;
    int32_t st = -1;
    if (kina_fiber_create(chain_entry, (void *)(intptr_t)(level - 1), &YIELD, 1, &child) != 0)
        return -3;
    if (kina_resume_fiber(child, 0, &st) != 0)
        return -4;
    if (st == KINA_FIBER_SUSPENDED) { /* only the level-1 fiber sees its child's YIELD */
        if (level != 1 || kina_resume_fiber(child, 1000, &st) != 0)
            return -5;
    }
    int64_t r = 0;
    if (st != KINA_FIBER_DONE || kina_fiber_result(child, &r) != 0)
        return -6;
    if (kina_fiber_destroy(child) != 0)
        return -7;
    return r + 1;
}

static void test_nested_creation(void)
{
    kina_handler_t h;
    kina_fiber_t f;
    int32_t st = -1;
    int64_t r = 0;
    CHECK(kina_push_handler(answer_ctx, (void *)(intptr_t)500, &ASK, 1, &h) == 0);
    CHECK(kina_fiber_create(chain_entry, (void *)(intptr_t)64, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &st) == 0 && st == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(f, &r) == 0 && r == 500 + 0 + 1000 + 64);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_pop_handler(h) == 0);
}

/* ---- 5. a fiber resuming another fiber, later resumed by someone else --------------------- */

static kina_fiber_t worker;
static int64_t worker_entry(void *arg)
{
    (void)arg;
    int64_t a = 0, b = 0, y = 0;
    int32_t r1 = kina_perform(ASK, NULL, 0, &a);   /* first: inside the driver, its handler answers */
    if (kina_perform(YIELD, NULL, 0, &y) != 0)     /* suspend to the driver */
        return -1;
    int32_t r2 = kina_perform(ASK, NULL, 0, &b);   /* now resumed by main: the driver's handler is gone */
    return (r1 == 0 ? a : -100) * 1000 + (r2 == 0 ? b : -r2);
}

static int64_t driver_entry(void *arg)
{
    (void)arg;
    kina_handler_t h;
    int32_t st = -1;
    int64_t dummy = 0;
    if (kina_push_handler(answer_ctx, (void *)(intptr_t)7, &ASK, 1, &h) != 0)
        return -1;
    if (kina_resume_fiber(worker, 0, &st) != 0 || st != KINA_FIBER_SUSPENDED)
        return -2;
    if (kina_pop_handler(h) != 0)
        return -3;
    if (kina_perform(YIELD, NULL, 0, &dummy) != 0) /* the driver suspends too, worker still suspended */
        return -4;
    return 1;
}

static void test_handoff(void)
{
    kina_fiber_t driver;
    int32_t st = -1;
    int64_t r = 0;
    CHECK(kina_fiber_create(worker_entry, NULL, &YIELD, 1, &worker) == 0);
    CHECK(kina_fiber_create(driver_entry, NULL, &YIELD, 1, &driver) == 0);
    CHECK(kina_resume_fiber(driver, 0, &st) == 0 && st == KINA_FIBER_SUSPENDED);
    /* main takes over the worker while its first resumer is suspended */
    kina_handler_t h;
    CHECK(kina_push_handler(answer_ctx, (void *)(intptr_t)9, &ASK, 1, &h) == 0);
    CHECK(kina_resume_fiber(worker, 0, &st) == 0 && st == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(worker, &r) == 0 && r == 7 * 1000 + 9);
    CHECK(kina_pop_handler(h) == 0);
    CHECK(kina_resume_fiber(driver, 0, &st) == 0 && st == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(driver, &r) == 0 && r == 1);
    CHECK(kina_fiber_destroy(worker) == 0);
    CHECK(kina_fiber_destroy(driver) == 0);
}

/* ---- 6. C handlers that create and run fibers -------------------------------------------- */

static int64_t yields_n(void *arg)
{
    int64_t n = (int64_t)(intptr_t)arg, s = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = 0;
        if (kina_perform(YIELD, &i, 1, &v) != 0)
            return -1;
        s += v;
    }
    return s;
}

static kina_fiber_t left_suspended;
static int32_t spawning_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect;
    int64_t n = nargs > 0 ? args[0] : 3;
    kina_fiber_t f;
    int32_t st = -1;
    if (kina_fiber_create(yields_n, (void *)(intptr_t)n, &YIELD, 1, &f) != 0)
        return KINA_STATUS_INTERNAL;
    int64_t v = 0;
    for (;;) {
        if (kina_resume_fiber(f, v, &st) != 0)
            return KINA_STATUS_INTERNAL;
        if (st != KINA_FIBER_SUSPENDED)
            break;
        int64_t a = 0;
        int32_t na = 0;
        kina_get_perform_args(f, &a, 1, &na);
        v = a * 2;
    }
    kina_fiber_result(f, out);
    kina_fiber_destroy(f);
    /* and one more, left suspended for the host to finish after the handler returned */
    if (kina_fiber_create(yields_n, (void *)(intptr_t)2, &YIELD, 1, &left_suspended) != 0 ||
        kina_resume_fiber(left_suspended, 0, &st) != 0 || st != KINA_FIBER_SUSPENDED)
        return KINA_STATUS_INTERNAL;
    return KINA_HANDLED;
}

static int64_t asks_spawner(void *arg)
{
    (void)arg;
    int64_t n = 10, v = 0;
    int32_t rc = kina_perform(ASK, &n, 1, &v);
    return rc == 0 ? v : -rc;
}

static void test_handler_spawns(void)
{
    kina_handler_t h;
    int64_t v = 0;
    int32_t st = -1;
    CHECK(kina_push_handler(spawning_handler, NULL, &ASK, 1, &h) == 0);
    /* from the root */
    int64_t n = 5;
    CHECK(kina_perform(ASK, &n, 1, &v) == 0 && v == 2 * (0 + 1 + 2 + 3 + 4));
    CHECK(kina_resume_fiber(left_suspended, 1, &st) == 0 && st == KINA_FIBER_SUSPENDED);
    CHECK(kina_resume_fiber(left_suspended, 2, &st) == 0 && st == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(left_suspended, &v) == 0 && v == 3);
    CHECK(kina_fiber_destroy(left_suspended) == 0);
    /* from inside a fiber that catches YIELD itself: the handler's fibers catch their own */
    kina_fiber_t f;
    CHECK(kina_fiber_create(asks_spawner, NULL, &YIELD, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &st) == 0 && st == KINA_FIBER_DONE);
    CHECK(kina_fiber_result(f, &v) == 0 && v == 90);
    CHECK(kina_fiber_destroy(f) == 0);
    CHECK(kina_resume_fiber(left_suspended, 1, &st) == 0 && st == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(left_suspended) == 0);
    CHECK(kina_pop_handler(h) == 0);
}

/* ---- 7. thousands of handlers on one stack -------------------------------------------- */

static int64_t deep_stack_entry(void *arg)
{
    int n = (int)(intptr_t)arg;
    kina_handler_t *hs = malloc(sizeof *hs * (size_t)n);
    int64_t v = 0, total = 0;
    if (kina_push_handler(answer_ctx, (void *)(intptr_t)42, &DEEP, 1, &hs[0]) != 0)
        return -1;
    for (int i = 1; i < n; i++)
        if (kina_push_handler(forward, NULL, &DEEP, 1, &hs[i]) != 0)
            return -2;
    for (int k = 0; k < 3; k++) {
        if (kina_perform(DEEP, NULL, 0, &v) != 0) {
            total = -3;
            break;
        }
        total += v;
    }
    for (int i = n - 1; i >= 0; i--)
        if (kina_pop_handler(hs[i]) != 0)
            return -4;
    free(hs);
    return total;
}

static void test_deep_handler_stack(void)
{
    /* forwarding through n C handlers: 400 works; 2000 fails with status 5
     * (RecursionError: each KINA_FORWARD recurses in the runtime) */
    int sizes[] = {400, 2000};
    for (int k = 0; k < 2; k++) {
        kina_fiber_t f;
        int32_t st = -1;
        int64_t r = 0;
        int n = sizes[k];
        CHECK(kina_fiber_create(deep_stack_entry, (void *)(intptr_t)n, NULL, 0, &f) == 0);
        CHECK(kina_resume_fiber(f, 0, &st) == 0 && st == KINA_FIBER_DONE);
        CHECK(kina_fiber_result(f, &r) == 0 && r == 126);
        if (r != 126)
            printf("  (%d handlers in a fiber: entry returned %" PRId64 ")\n", n, r);
        CHECK(kina_fiber_destroy(f) == 0);
        r = deep_stack_entry((void *)(intptr_t)n); /* on the root stack */
        CHECK(r == 126);
        if (r != 126)
            printf("  (%d handlers on the root stack: returned %" PRId64 ")\n", n, r);
    }
}

/* ---- 8. threads running their own fibers concurrently ------------------------------------ */

typedef struct {
    int id;
    int bad;
    int64_t total;
} thread_arg_t;

static int64_t thread_fiber(void *arg)
{
    int64_t k = (int64_t)(intptr_t)arg, s = 0;
    for (int i = 0; i < 10; i++) {
        int64_t v = 0, w = 0;
        if (kina_perform(ASK, &k, 1, &v) != 0) /* answered by this thread's root handler */
            return -1;
        if (kina_perform(YIELD, &k, 1, &w) != 0)
            return -2;
        s += v + w;
    }
    return s;
}

static void *thread_main(void *p)
{
    thread_arg_t *t = p;
    enum { N = 100 };
    kina_fiber_t f[N];
    int32_t st[N];
    kina_handler_t h;
    int64_t base = (int64_t)t->id * 1000000;
    if (kina_push_handler(answer_ctx, (void *)(intptr_t)base, &ASK, 1, &h) != 0) {
        t->bad++;
        return NULL;
    }
    for (int i = 0; i < N; i++) {
        t->bad += kina_fiber_create(thread_fiber, (void *)(intptr_t)i, &YIELD, 1, &f[i]) != 0;
        st[i] = KINA_FIBER_NEW;
    }
    int live = N;
    while (live > 0) {
        for (int i = 0; i < N; i++) {
            if (st[i] == KINA_FIBER_DONE)
                continue;
            int64_t value = 0;
            if (st[i] == KINA_FIBER_SUSPENDED) {
                int64_t a = 0;
                int32_t n = 0;
                t->bad += kina_get_perform_args(f[i], &a, 1, &n) != 0 || a != i;
                value = t->id;
            }
            if (kina_resume_fiber(f[i], value, &st[i]) != 0) {
                t->bad++;
                st[i] = KINA_FIBER_DONE;
            }
            if (st[i] == KINA_FIBER_DONE)
                live--;
        }
    }
    for (int i = 0; i < N; i++) {
        int64_t r = 0;
        t->bad += kina_fiber_result(f[i], &r) != 0 || r != 10 * (base + i + t->id);
        t->total += r;
        t->bad += kina_fiber_destroy(f[i]) != 0;
    }
    t->bad += kina_pop_handler(h) != 0;
    int64_t v = 0;
    t->bad += kina_perform(ASK, NULL, 0, &v) != KINA_STATUS_UNHANDLED;
    return NULL;
}

static void test_threads(void)
{
    enum { T = 8 };
    pthread_t th[T];
    thread_arg_t args[T];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < T; i++) {
            args[i] = (thread_arg_t){i + 1, 0, 0};
            CHECK(pthread_create(&th[i], NULL, thread_main, &args[i]) == 0);
        }
        /* the main thread keeps working on its own fibers meanwhile */
        CHECK(churn(0, 300) == 0);
        for (int i = 0; i < T; i++) {
            pthread_join(th[i], NULL);
            CHECK(args[i].bad == 0);
        }
    }
}

int main(void)
{
    CHECK(kina_effect_id("advs.yield", &YIELD) == 0);
    CHECK(kina_effect_id("advs.ask", &ASK) == 0);
    CHECK(kina_effect_id("advs.deep", &DEEP) == 0);
    test_churn();
    test_deep();
    test_interleaved();
    test_nested_creation();
    test_handoff();
    test_handler_spawns();
    test_deep_handler_stack();
    test_threads();
    fflush(stdout);
    if (failures) {
        printf("adversarial_effects_stress: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("adversarial_effects_stress: %d checks passed\n", checks);
    return 0;
}
