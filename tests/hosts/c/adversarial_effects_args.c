/* Adversarial host of the effects C ABI, part 1: every bad input.
 *
 *   cc adversarial_effects_args.c $(kina-fx config --cflags --libs) -o host && env -i ./host
 *
 * Every documented status for every bad argument (docs/abi.md "Statuses and
 * states"): NULL out-pointers in every position of every function, nargs /
 * ncatch / neffects / cap out of range, unknown effect ids (0, negative,
 * huge), and handles that are zero, random, of the wrong kind, freed, reused,
 * with a tampered generation or kind, or destroyed twice.  A failed call must
 * leave its outputs untouched, and kina_last_error must name the problem.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kina_fx.h"
#include "kina_check.h"



#define CHECK_ERR(expr, status, word)                                                 \
    do {                                                                              \
        int32_t rc__ = (expr);                                                        \
        checks++;                                                                     \
        if (rc__ != (status) || !err_has(word)) {                                     \
            failures++;                                                               \
            printf("FAIL %s:%d: %s -> %d, want %d mentioning '%s' (last error: %s)\n", \
                   __FILE__, __LINE__, #expr, rc__, (status), (word) ? (word) : "",    \
                   kina_last_error());                                                \
        }                                                                             \
    } while (0)

#define V KINA_STATUS_VALIDATION

static int32_t YIELD, ASK, OTHER;

static int64_t yield_twice(void *arg)
{
    int64_t args[3] = {1, 2, 3}, v = 0;
    (void)arg;
    if (kina_perform(YIELD, args, 3, &v) != 0)
        return -1;
    if (kina_perform(YIELD, NULL, 0, &v) != 0)
        return -2;
    return v;
}

static int64_t returns_7(void *arg)
{
    (void)arg;
    return 7;
}

static int32_t answer_5(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs;
    *out = 5;
    return KINA_HANDLED;
}

/* ---- kina_effect_id --------------------------------------------------------------- */

static void test_effect_id(void)
{
    int32_t id = -77;
    CHECK_ERR(kina_effect_id(NULL, NULL), V, NULL);
    CHECK_ERR(kina_effect_id(NULL, &id), V, "name");
    CHECK(id == -77); /* untouched on failure */
    CHECK_ERR(kina_effect_id("adv.x", NULL), V, "out_id");
    /* the empty name and a long name: either a valid id > 0 or a validation error */
    int32_t rc = kina_effect_id("", &id);
    CHECK(rc == 0 ? id > 0 : rc == V);
    char long_name[5000];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    int32_t id2 = 0, id3 = 0;
    CHECK(kina_effect_id(long_name, &id2) == 0 && id2 > 0);
    CHECK(kina_effect_id(long_name, &id3) == 0 && id3 == id2);
    /* not UTF-8: must not crash; either an id or a validation/type error */
    id = -77;
    rc = kina_effect_id("\xff\xfe\x80", &id);
    CHECK(rc == 0 ? id > 0 : (rc == V || rc == KINA_STATUS_TYPE));
    /* distinct names, distinct ids */
    int32_t a = 0, b = 0;
    CHECK(kina_effect_id("adv.a", &a) == 0 && kina_effect_id("adv.b", &b) == 0 && a != b);
}

/* ---- kina_fiber_create -------------------------------------------------------------- */

static void test_fiber_create(void)
{
    kina_fiber_t f = 0xabcdef;
    int32_t unknowns[] = {0, -1, -2147483647 - 1, 2147483647, 1 << 30};
    CHECK_ERR(kina_fiber_create(NULL, NULL, NULL, 0, NULL), V, NULL);
    CHECK_ERR(kina_fiber_create(NULL, NULL, NULL, 0, &f), V, "entry");
    CHECK(f == 0xabcdef);
    CHECK_ERR(kina_fiber_create(returns_7, NULL, NULL, 0, NULL), V, "out_fiber");
    CHECK_ERR(kina_fiber_create(returns_7, NULL, NULL, -1, &f), V, "ncatch");
    CHECK_ERR(kina_fiber_create(returns_7, NULL, NULL, -2147483647 - 1, &f), V, "ncatch");
    /* ncatch > 0 with no array */
    CHECK_ERR(kina_fiber_create(returns_7, NULL, NULL, 1, &f), V, "catch");
    CHECK(f == 0xabcdef);
    for (size_t i = 0; i < sizeof unknowns / sizeof *unknowns; i++) {
        CHECK_ERR(kina_fiber_create(returns_7, NULL, &unknowns[i], 1, &f), V, "effect");
        CHECK(f == 0xabcdef);
    }
    /* one bad id among good ones */
    int32_t mixed[3] = {YIELD, 1 << 29, ASK};
    CHECK_ERR(kina_fiber_create(returns_7, NULL, mixed, 3, &f), V, "effect");
    /* duplicates and a catch array of every known effect are fine */
    int32_t dup[4] = {YIELD, YIELD, ASK, YIELD};
    CHECK(kina_fiber_create(returns_7, NULL, dup, 4, &f) == 0 && f != 0);
    int32_t state = -1;
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK(kina_fiber_destroy(f) == 0);
    /* a non-NULL array with ncatch == 0 is "catch everything" */
    CHECK(kina_fiber_create(yield_twice, NULL, unknowns, 0, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(f) == 0);
    /* arg is passed through untouched, even if it is a weird pointer value */
    CHECK(kina_fiber_create(returns_7, (void *)(uintptr_t)0xdeadbeefULL, NULL, 0, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, NULL) == 0); /* out_state may be NULL */
    int64_t r = 0;
    CHECK(kina_fiber_result(f, &r) == 0 && r == 7);
    CHECK(kina_fiber_destroy(f) == 0);
}

/* ---- functions taking a fiber handle, with NULL out-pointers ------------------------- */

static void test_null_outs_on_live_fiber(void)
{
    kina_fiber_t f = 0;
    int32_t state = -1, eff = -1, nargs = -1;
    int64_t args[16], v = -1;
    CHECK(kina_fiber_create(yield_twice, NULL, &YIELD, 1, &f) == 0);
    /* NEW fiber: state ok, but perform id / args / result are state errors */
    CHECK(kina_fiber_state(f, &state) == 0 && state == KINA_FIBER_NEW);
    CHECK_ERR(kina_fiber_state(f, NULL), V, "out_state");
    CHECK_ERR(kina_get_perform_id(f, &eff), V, "new");
    CHECK(eff == -1);
    CHECK_ERR(kina_get_perform_args(f, args, 16, &nargs), V, "new");
    CHECK(nargs == -1);
    CHECK_ERR(kina_fiber_result(f, &v), V, "new");
    CHECK(v == -1);
    CHECK_ERR(kina_fiber_result(f, NULL), V, NULL);
    /* suspended in YIELD(1, 2, 3) */
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    CHECK_ERR(kina_get_perform_id(f, NULL), V, "out_effect");
    CHECK_ERR(kina_get_perform_args(f, args, 16, NULL), V, "out_nargs");
    CHECK_ERR(kina_get_perform_args(f, NULL, 16, &nargs), V, "out_args");
    nargs = -1;
    CHECK_ERR(kina_get_perform_args(f, args, -1, &nargs), V, "-1");
    nargs = -1;
    args[0] = args[1] = args[2] = -9;
    CHECK_ERR(kina_get_perform_args(f, args, 2, &nargs), V, "3");
    CHECK(nargs == 3);
    CHECK(args[0] == -9 && args[1] == -9 && args[2] == -9); /* untouched on failure */
    CHECK(kina_get_perform_args(f, args, 3, &nargs) == 0 && nargs == 3 && args[0] == 1 &&
          args[1] == 2 && args[2] == 3);
    CHECK(kina_get_perform_args(f, args, 2147483647, &nargs) == 0 && nargs == 3);
    CHECK_ERR(kina_fiber_result(f, &v), V, "suspended");
    /* the failed calls changed nothing: the fiber still works */
    CHECK(kina_get_perform_id(f, &eff) == 0 && eff == YIELD);
    /* second perform has no args: cap 0 with NULL args is enough */
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    nargs = -1;
    CHECK(kina_get_perform_args(f, NULL, 0, &nargs) == 0 && nargs == 0);
    nargs = -1;
    CHECK(kina_get_perform_args(f, args, 0, &nargs) == 0 && nargs == 0);
    /* a negative capacity is invalid even when there is nothing to copy */
    nargs = -1;
    CHECK_ERR(kina_get_perform_args(f, args, -1, &nargs), V, NULL);
    CHECK(kina_resume_fiber(f, 11, NULL) == 0);
    CHECK(kina_fiber_state(f, &state) == 0 && state == KINA_FIBER_DONE);
    CHECK_ERR(kina_fiber_result(f, NULL), V, "out_value");
    CHECK(kina_fiber_result(f, &v) == 0 && v == 11);
    CHECK_ERR(kina_get_perform_id(f, &eff), V, "done");
    CHECK_ERR(kina_get_perform_args(f, args, 16, &nargs), V, "done");
    /* cancel of a finished fiber: nothing to cancel */
    int32_t rc = kina_cancel_fiber(f, &state);
    CHECK(rc == V || (rc == 0 && state == KINA_FIBER_DONE));
    CHECK(kina_fiber_result(f, &v) == 0 && v == 11); /* result still there */
    CHECK(kina_fiber_destroy(f) == 0);
}

/* ---- kina_perform ------------------------------------------------------------------ */

static void test_perform_args(void)
{
    int64_t args[KINA_MAX_ARGS + 1] = {0}, v = -5;
    kina_handler_t h = 0;
    CHECK(kina_push_handler(answer_5, NULL, &ASK, 1, &h) == 0);
    CHECK_ERR(kina_perform(ASK, args, -1, &v), V, "nargs");
    CHECK_ERR(kina_perform(ASK, args, -2147483647 - 1, &v), V, "nargs");
    CHECK_ERR(kina_perform(ASK, args, KINA_MAX_ARGS + 1, &v), V, "nargs");
    CHECK_ERR(kina_perform(ASK, args, 2147483647, &v), V, "nargs");
    CHECK_ERR(kina_perform(ASK, NULL, 1, &v), V, "args");
    CHECK_ERR(kina_perform(ASK, args, 0, NULL), V, "out_value");
    CHECK(v == -5);
    CHECK_ERR(kina_perform(0, NULL, 0, &v), V, "effect");
    CHECK_ERR(kina_perform(-1, NULL, 0, &v), V, "effect");
    CHECK_ERR(kina_perform(2147483647, NULL, 0, &v), V, "effect");
    CHECK(v == -5);
    /* the boundaries work */
    CHECK(kina_perform(ASK, args, KINA_MAX_ARGS, &v) == 0 && v == 5);
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 5);
    CHECK(kina_perform(ASK, args, 0, &v) == 0 && v == 5);
    CHECK(kina_pop_handler(h) == 0);
    /* an unhandled perform leaves *out_value untouched and says which effect */
    v = -5;
    CHECK_ERR(kina_perform(OTHER, NULL, 0, &v), KINA_STATUS_UNHANDLED, "unhandled");
    CHECK(err_has("adv.other"));
    CHECK(v == -5);
}

/* ---- kina_push_handler / kina_pop_handler ----------------------------------------------- */

static void test_push_pop_args(void)
{
    kina_handler_t h = 0x5555;
    int32_t bad = 1 << 29, zero = 0;
    CHECK_ERR(kina_push_handler(answer_5, NULL, &ASK, 1, NULL), V, "out_handler");
    CHECK_ERR(kina_push_handler(NULL, NULL, &ASK, 1, &h), V, "fn");
    CHECK_ERR(kina_push_handler(answer_5, NULL, &ASK, 0, &h), V, "effect");
    CHECK_ERR(kina_push_handler(answer_5, NULL, &ASK, -1, &h), V, "effect");
    CHECK_ERR(kina_push_handler(answer_5, NULL, NULL, 1, &h), V, "effect");
    CHECK_ERR(kina_push_handler(answer_5, NULL, &bad, 1, &h), V, "effect");
    CHECK_ERR(kina_push_handler(answer_5, NULL, &zero, 1, &h), V, "effect");
    int32_t mixed[2] = {ASK, -3};
    CHECK_ERR(kina_push_handler(answer_5, NULL, mixed, 2, &h), V, "effect");
    CHECK(h == 0x5555);
    /* none of the failed pushes left anything on the root stack */
    int64_t v = 0;
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    /* pop: zero, random, fiber-kind, stale, double pop, tampered generation */
    CHECK_ERR(kina_pop_handler(0), V, NULL);
    CHECK_ERR(kina_pop_handler(~0ULL), V, NULL);
    CHECK_ERR(kina_pop_handler(0x0123456789abcdefULL), V, NULL);
    kina_fiber_t f = 0;
    CHECK(kina_fiber_create(returns_7, NULL, NULL, 0, &f) == 0);
    CHECK_ERR(kina_pop_handler((kina_handler_t)f), V, "not a handler");
    CHECK(kina_push_handler(answer_5, NULL, &ASK, 1, &h) == 0 && h != 0);
    CHECK_ERR(kina_fiber_destroy((kina_fiber_t)h), V, "not a fiber handle");
    CHECK_ERR(kina_fiber_state((kina_fiber_t)h, &(int32_t){0}), V, "not a fiber handle");
    CHECK_ERR(kina_cancel_fiber((kina_fiber_t)h, &(int32_t){0}), V, "not a fiber handle");
    CHECK_ERR(kina_get_perform_id((kina_fiber_t)h, &(int32_t){0}), V, "not a fiber handle");
    CHECK_ERR(kina_fiber_result((kina_fiber_t)h, &(int64_t){0}), V, "not a fiber handle");
    CHECK_ERR(kina_get_perform_args((kina_fiber_t)h, NULL, 0, &(int32_t){0}), V, "not a fiber handle");
    /* the wrong-kind attempts left the handler usable */
    CHECK(kina_perform(ASK, NULL, 0, &v) == 0 && v == 5);
    /* a handle with another generation, or another kind in the top byte */
    CHECK_ERR(kina_pop_handler(h + (1ULL << 32)), V, "stale");
    CHECK_ERR(kina_pop_handler(h ^ (1ULL << 56)), V, NULL);
    CHECK_ERR(kina_pop_handler(h ^ (0x7fULL << 56)), V, NULL);
    CHECK_ERR(kina_pop_handler(h + 1), V, NULL);
    CHECK(kina_pop_handler(h) == 0);
    CHECK_ERR(kina_pop_handler(h), V, "stale");
    CHECK(kina_perform(ASK, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    CHECK(kina_fiber_destroy(f) == 0);
}

/* ---- fiber handles: zero, random, freed, reused, tampered, double destroy ----------- */

static void bad_fiber_everywhere(kina_fiber_t bad, const char *word, int line)
{
    int32_t s = -1, e = -1, n = -1;
    int64_t v = -1, a[4];
    int before = failures;
    CHECK_ERR(kina_resume_fiber(bad, 0, &s), V, word);
    CHECK_ERR(kina_resume_fiber(bad, 0, NULL), V, word);
    CHECK_ERR(kina_get_perform_id(bad, &e), V, word);
    CHECK_ERR(kina_get_perform_args(bad, a, 4, &n), V, word);
    CHECK_ERR(kina_fiber_state(bad, &s), V, word);
    CHECK_ERR(kina_fiber_result(bad, &v), V, word);
    CHECK_ERR(kina_cancel_fiber(bad, &s), V, word);
    CHECK_ERR(kina_fiber_destroy(bad), V, word);
    CHECK(s == -1 && e == -1 && n == -1 && v == -1);
    if (failures != before)
        printf("  (bad fiber handle 0x%" PRIx64 " from line %d)\n", bad, line);
}

static void test_bad_fiber_handles(void)
{
    bad_fiber_everywhere(0, NULL, __LINE__);
    bad_fiber_everywhere(~0ULL, NULL, __LINE__);
    bad_fiber_everywhere(1, NULL, __LINE__);
    bad_fiber_everywhere(0x00ffffffffffffffULL, NULL, __LINE__);
    srand(12345);
    for (int i = 0; i < 200; i++) {
        kina_fiber_t r = ((uint64_t)rand() << 33) ^ ((uint64_t)rand() << 11) ^ (uint64_t)rand();
        bad_fiber_everywhere(r | 1, NULL, __LINE__);
    }
    /* freed, then its slot reused by a new fiber */
    kina_fiber_t f1 = 0, f2 = 0;
    CHECK(kina_fiber_create(returns_7, NULL, NULL, 0, &f1) == 0);
    CHECK(kina_fiber_destroy(f1) == 0);
    bad_fiber_everywhere(f1, "stale", __LINE__); /* includes a double destroy */
    CHECK(kina_fiber_create(yield_twice, NULL, &YIELD, 1, &f2) == 0);
    CHECK(f2 != f1);
    /* same slot, new generation? the old handle must not reach the new fiber */
    bad_fiber_everywhere(f1, "stale", __LINE__);
    int32_t s = -1;
    CHECK(kina_fiber_state(f2, &s) == 0 && s == KINA_FIBER_NEW); /* f1's abuse did not touch f2 */
    /* tampered variants of a live handle */
    bad_fiber_everywhere(f2 + (1ULL << 32), NULL, __LINE__);
    bad_fiber_everywhere(f2 - (1ULL << 32), NULL, __LINE__);
    bad_fiber_everywhere(f2 ^ (1ULL << 56), NULL, __LINE__);
    bad_fiber_everywhere(f2 & 0xffffffffULL, NULL, __LINE__);
    bad_fiber_everywhere(f2 + 1000, NULL, __LINE__);
    CHECK(kina_fiber_state(f2, &s) == 0 && s == KINA_FIBER_NEW);
    CHECK(kina_resume_fiber(f2, 0, &s) == 0 && s == KINA_FIBER_SUSPENDED);
    CHECK(kina_fiber_destroy(f2) == 0);
    bad_fiber_everywhere(f2, "stale", __LINE__);
    /* churn one slot many times: every old handle stays stale */
    kina_fiber_t old[64];
    for (int i = 0; i < 64; i++) {
        CHECK(kina_fiber_create(returns_7, NULL, NULL, 0, &old[i]) == 0);
        CHECK(kina_fiber_destroy(old[i]) == 0);
    }
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < i; j++)
            CHECK(old[i] != old[j]);
    kina_fiber_t live = 0;
    CHECK(kina_fiber_create(returns_7, NULL, NULL, 0, &live) == 0);
    for (int i = 0; i < 64; i++)
        CHECK(kina_fiber_state(old[i], &s) == V);
    CHECK(kina_fiber_state(live, &s) == 0 && s == KINA_FIBER_NEW);
    CHECK(kina_fiber_destroy(live) == 0);
}

/* ---- kina_last_error ---------------------------------------------------------------- */

static void test_last_error(void)
{
    /* never NULL, and survives successful calls */
    CHECK(kina_last_error() != NULL);
    CHECK(kina_fiber_state(0, &(int32_t){0}) == V);
    const char *e1 = kina_last_error();
    CHECK(e1 != NULL && strlen(e1) > 0 && strlen(e1) <= 1023);
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", e1);
    int32_t id;
    CHECK(kina_effect_id("adv.ok", &id) == 0);
    CHECK(strcmp(kina_last_error(), copy) == 0);
    /* "ExceptionClass: message" */
    CHECK(strchr(copy, ':') != NULL);
    /* a very long effect name in an unhandled perform: message capped, not overflowing */
    char name[3000];
    memset(name, 'z', sizeof name - 1);
    name[sizeof name - 1] = 0;
    int32_t zid = 0;
    int64_t v;
    CHECK(kina_effect_id(name, &zid) == 0);
    CHECK(kina_perform(zid, NULL, 0, &v) == KINA_STATUS_UNHANDLED);
    CHECK(strlen(kina_last_error()) <= 1023 && strlen(kina_last_error()) > 0);
}

int main(void)
{
    CHECK(kina_abi_version() == KINA_ABI_VERSION);
    CHECK(kina_effect_id("adv.yield", &YIELD) == 0);
    CHECK(kina_effect_id("adv.ask", &ASK) == 0);
    CHECK(kina_effect_id("adv.other", &OTHER) == 0);
    test_effect_id();
    test_fiber_create();
    test_null_outs_on_live_fiber();
    test_perform_args();
    test_push_pop_args();
    test_bad_fiber_handles();
    test_last_error();
    fflush(stdout);
    if (failures) {
        printf("adversarial_effects_args: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("adversarial_effects_args: %d checks passed\n", checks);
    return 0;
}
