/* libFuzzer target: the effects C ABI against a model of docs/abi.md.
 *
 * Each input is a program of up to 64 operations on a few fibers and a stack
 * of C handlers pushed at the thread's root: create (with catch sets, some
 * invalid), resume, cancel, destroy, state, result, get_perform_id/args (with
 * small capacities), push/pop handlers (popping the wrong one too), performs
 * from the root (with bad arguments too), effect ids from arbitrary bytes, and
 * handles that are zero, random, stale or of the wrong kind.  Fiber entry
 * functions run a script: an optional handler of their own, then up to four
 * performs whose answers they fold into their result.
 *
 * The model predicts, for every call, the status, the fiber's state, the
 * perform a suspended fiber waits in, its arguments and the fiber's result,
 * from the documented rules: the search order (the fiber's own handlers, its
 * catch set, then the root's handlers, innermost first), what each handler
 * result means (answer, forward, suspend, a status 1-8 passed on, anything
 * else 1), cancellation (the pending perform returns 7), refused calls
 * writing nothing, stale handles.  Check order: pushes that must be refused
 * (no effect, NULL arguments, an effect id nobody made) are status 1 with
 * nothing written and nothing pushed (later performs see the model's stack).
 * Any difference aborts (a reproducer). */
#include "fuzz_common.h"

#define NEFFECTS 4
#define NFIBERS 6
#define NHANDLERS 8
#define NSTEPS 4

enum { H_ANSWER, H_FORWARD, H_SUSPEND, H_STATUS, H_KINDS };

typedef struct {
    int kind;
    unsigned mask;          /* effects it handles (bit i: effect i) */
    int64_t value;          /* H_ANSWER: answer = value + sum((i + 1) * args[i]) */
    int32_t rc;             /* H_STATUS */
} kf_handler_spec_t;

typedef struct {
    int effect, nargs;
    int64_t args[3];
} kf_step_t;

typedef struct {
    /* the script (read by the entry function) */
    int nsteps;
    kf_step_t steps[NSTEPS];
    int has_inner;
    kf_handler_spec_t inner;
    uint64_t base;
    /* the model */
    int live;
    kina_fiber_t handle;
    int state;              /* KINA_FIBER_* */
    int step;               /* the pending step while suspended */
    unsigned catch_mask;    /* ~0u: catches everything */
    uint64_t acc;
} kf_fiber_t;

static int32_t E[NEFFECTS];

/* A status for H_STATUS handlers: anything but the three handler results. */
static int32_t status_rc(kf_bytes_t *b)
{
    int32_t rc = kf_one_in(b, 2) ? 1 + (int32_t)kf_pick(b, 8) : kf_scalar(b);
    return rc >= -2 && rc <= 0 ? rc - 3 : rc;
}
static kf_fiber_t fibers[NFIBERS];
static kf_handler_spec_t root_specs[NHANDLERS];
static kina_handler_t root_handles[NHANDLERS];
static int nroot;
static kina_fiber_t dead_fibers[16];
static int ndead;

/* What the runs reached, printed at exit with KINA_FUZZ_STATS=1. */
static long reached[9];
static const char *reached_names[9] = {"created", "suspended", "done", "cancelled", "stale-checked",
                                       "root performs", "handler pushes", "refused calls",
                                       "refused pushes"};

static void print_reached(void)
{
    for (int i = 0; i < 9; i++)
        fprintf(stderr, "%-16s %ld\n", reached_names[i], reached[i]);
}

static int32_t kf_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)effect;
    const kf_handler_spec_t *h = ctx;
    switch (h->kind) {
    case H_ANSWER: {
        int64_t v = h->value;
        for (int i = 0; i < nargs; i++)
            v += (i + 1) * args[i];
        *out = v;
        return KINA_HANDLED;
    }
    case H_FORWARD: return KINA_FORWARD;
    case H_SUSPEND: return KINA_SUSPEND;
    default: return h->rc;
    }
}

static uint64_t fold(uint64_t acc, int32_t rc, int64_t v)
{
    return acc * 31u + (rc ? (uint64_t)(-1000 * (int64_t)rc) : (uint64_t)v);
}

static int64_t kf_entry(void *arg)
{
    kf_fiber_t *f = arg;
    kina_handler_t h = 0;
    int32_t effect_id = 0;
    if (f->has_inner) {
        for (int e = 0; e < NEFFECTS; e++)
            if (f->inner.mask & (1u << e))
                effect_id = E[e];
        if (kina_push_handler(kf_handler, &f->inner, &effect_id, 1, &h) != 0)
            return -111;
    }
    uint64_t acc = f->base;
    for (int i = 0; i < f->nsteps; i++) {
        int64_t v = -5;
        int32_t rc = kina_perform(E[f->steps[i].effect], f->steps[i].args, f->steps[i].nargs, &v);
        if (rc == KINA_STATUS_CANCELLED)
            break;
        if (rc != 0 && v != -5)
            return -222;                          /* a failed perform wrote *out_value */
        acc = fold(acc, rc, v);
    }
    if (h && kina_pop_handler(h) != 0)
        return -333;
    return (int64_t)acc;
}

/* ---- the model's search ---------------------------------------------------------------- */

enum { OUT_VALUE, OUT_SUSPEND };

typedef struct {
    int kind;
    int32_t rc;
    int64_t value;
} kf_outcome_t;

static int handles(const kf_handler_spec_t *h, int e) { return (h->mask >> e) & 1u; }

static int64_t answer_of(const kf_handler_spec_t *h, const kf_step_t *s)
{
    int64_t v = h->value;
    for (int i = 0; i < s->nargs; i++)
        v += (i + 1) * s->args[i];
    return v;
}

/* One handler's verdict: 1 with *o set when it ends the search. */
static int verdict(const kf_handler_spec_t *h, const kf_step_t *s, int suspends_a_fiber, kf_outcome_t *o)
{
    switch (h->kind) {
    case H_ANSWER: *o = (kf_outcome_t){OUT_VALUE, 0, answer_of(h, s)}; return 1;
    case H_FORWARD: return 0;
    case H_SUSPEND:
        *o = suspends_a_fiber ? (kf_outcome_t){OUT_SUSPEND, 0, 0}
                              : (kf_outcome_t){OUT_VALUE, KINA_STATUS_UNHANDLED, 0};
        return 1;
    default:
        *o = (kf_outcome_t){OUT_VALUE, (h->rc >= 1 && h->rc <= 8) ? h->rc : KINA_STATUS_VALIDATION, 0};
        return 1;
    }
}

static kf_outcome_t search(const kf_fiber_t *f, const kf_step_t *s)
{
    kf_outcome_t o;
    if (f && f->has_inner && handles(&f->inner, s->effect) && verdict(&f->inner, s, 1, &o))
        return o;
    if (f && (f->catch_mask >> s->effect) & 1u)
        return (kf_outcome_t){OUT_SUSPEND, 0, 0};
    for (int i = nroot - 1; i >= 0; i--)
        if (handles(&root_specs[i], s->effect) && verdict(&root_specs[i], s, 0, &o))
            return o;
    return (kf_outcome_t){OUT_VALUE, KINA_STATUS_UNHANDLED, 0};
}

/* Run the model of f from its current step until it suspends or finishes. */
static void model_run(kf_fiber_t *f)
{
    while (f->step < f->nsteps) {
        kf_outcome_t o = search(f, &f->steps[f->step]);
        if (o.kind == OUT_SUSPEND) {
            f->state = KINA_FIBER_SUSPENDED;
            return;
        }
        if (o.rc == KINA_STATUS_CANCELLED)        /* the entry unwinds (a handler said 7) */
            break;
        f->acc = fold(f->acc, o.rc, o.value);
        f->step++;
    }
    f->state = KINA_FIBER_DONE;
}

/* ---- checks ----------------------------------------------------------------------------- */

static int err_has(const char *text) { return strstr(kina_last_error(), text) != NULL; }

static void expect_status(int32_t got, int32_t want, const char *what)
{
    reached[7] += want != 0;
    kf_check_failure_message(got, what);
    KF_CHECK(got == want, "%s: status %d, the model says %d", what, got, want);
}

static void check_state(kf_fiber_t *f, const char *what)
{
    int32_t st = -1;
    expect_status(kina_fiber_state(f->handle, &st), 0, "kina_fiber_state");
    KF_CHECK(st == f->state, "%s: state %d, the model says %d", what, st, f->state);
    if (f->state == KINA_FIBER_SUSPENDED) {
        const kf_step_t *s = &f->steps[f->step];
        int32_t id = -1, nargs = -1;
        int64_t args[4] = {0};
        expect_status(kina_get_perform_id(f->handle, &id), 0, "kina_get_perform_id");
        KF_CHECK(id == E[s->effect], "%s: waits in effect %d, the model says %d", what, id, E[s->effect]);
        expect_status(kina_get_perform_args(f->handle, args, 4, &nargs), 0, "kina_get_perform_args");
        KF_CHECK(nargs == s->nargs, "%s: %d arguments, the model says %d", what, nargs, s->nargs);
        for (int i = 0; i < nargs; i++)
            KF_CHECK(args[i] == s->args[i], "%s: argument %d differs", what, i);
    }
}

/* ---- operations ---------------------------------------------------------------------------- */

static void op_create(kf_bytes_t *b, int slot)
{
    kf_fiber_t *f = &fibers[slot];
    if (f->live)
        return;
    memset(f, 0, sizeof *f);
    f->nsteps = (int)kf_pick(b, NSTEPS + 1);
    for (int i = 0; i < f->nsteps; i++) {
        f->steps[i].effect = (int)kf_pick(b, NEFFECTS);
        f->steps[i].nargs = (int)kf_pick(b, 4);
        for (int j = 0; j < f->steps[i].nargs; j++)
            f->steps[i].args[j] = (int64_t)kf_pick(b, 2001) - 1000;
    }
    f->has_inner = kf_one_in(b, 3);
    f->inner = (kf_handler_spec_t){(int)kf_pick(b, H_KINDS), 1u << kf_pick(b, NEFFECTS),
                                   (int64_t)kf_pick(b, 100), status_rc(b)};
    f->base = kf_pick(b, 1000);
    int32_t catch_ids[3];
    int ncatch = (int)kf_pick(b, 3);
    unsigned mask = 0;
    for (int i = 0; i < ncatch; i++) {
        int e = (int)kf_pick(b, NEFFECTS);
        catch_ids[i] = E[e];
        mask |= 1u << e;
    }
    int invalid = 0;
    if (kf_one_in(b, 12)) {
        invalid = 1;
        if (ncatch == 0)
            ncatch = -1 - (int)kf_pick(b, 3);
        else
            catch_ids[kf_pick(b, (uint32_t)ncatch)] = kf_one_in(b, 2) ? 0 : 1 << 30;
    }
    kina_fiber_t handle = 0;
    int32_t status = kina_fiber_create(kf_entry, f, catch_ids, ncatch, &handle);
    if (invalid) {
        expect_status(status, KINA_STATUS_VALIDATION, "kina_fiber_create, invalid catch set");
        KF_CHECK(handle == 0, "a refused kina_fiber_create wrote *out_fiber");
        return;
    }
    expect_status(status, 0, "kina_fiber_create");
    KF_CHECK(handle != 0, "kina_fiber_create gave handle 0");
    f->live = 1;
    f->handle = handle;
    f->state = KINA_FIBER_NEW;
    f->catch_mask = ncatch == 0 ? ~0u : mask;
    f->acc = f->base;
    reached[0]++;
    check_state(f, "created");
}

static void op_resume(kf_bytes_t *b, int slot)
{
    kf_fiber_t *f = &fibers[slot];
    if (!f->live)
        return;
    int64_t value = (int64_t)kf_pick(b, 1000);
    int32_t st = -42;
    int32_t status = kina_resume_fiber(f->handle, value, &st);
    if (f->state != KINA_FIBER_NEW && f->state != KINA_FIBER_SUSPENDED) {
        expect_status(status, KINA_STATUS_VALIDATION, "resuming an ended fiber");
        KF_CHECK(st == -42, "a refused kina_resume_fiber wrote *out_state");
        return;
    }
    if (f->state == KINA_FIBER_SUSPENDED) {
        f->acc = fold(f->acc, 0, value);
        f->step++;
    }
    model_run(f);
    expect_status(status, 0, "kina_resume_fiber");
    KF_CHECK(st == f->state, "kina_resume_fiber: *out_state %d, the model says %d", st, f->state);
    reached[f->state == KINA_FIBER_SUSPENDED ? 1 : 2]++;
    check_state(f, "resumed");
    if (f->state == KINA_FIBER_DONE) {
        int64_t result = 0;
        expect_status(kina_fiber_result(f->handle, &result), 0, "kina_fiber_result");
        KF_CHECK((uint64_t)result == f->acc, "the fiber's result %lld, the model says %lld",
                 (long long)result, (long long)f->acc);
    } else {
        int64_t result = -42;
        expect_status(kina_fiber_result(f->handle, &result), KINA_STATUS_VALIDATION, "result of a suspended fiber");
        KF_CHECK(result == -42, "a refused kina_fiber_result wrote *out_value");
    }
}

static void op_cancel(kf_bytes_t *b, int slot)
{
    kf_fiber_t *f = &fibers[slot];
    if (!f->live)
        return;
    if (kf_one_in(b, 8)) {
        expect_status(kina_cancel_fiber(f->handle, NULL), KINA_STATUS_VALIDATION, "kina_cancel_fiber(f, NULL)");
        check_state(f, "after a cancel with NULL out_state");
        return;
    }
    int32_t st = -42;
    int32_t status = kina_cancel_fiber(f->handle, &st);
    if (f->state == KINA_FIBER_NEW || f->state == KINA_FIBER_SUSPENDED)
        f->state = KINA_FIBER_CANCELLED;
    expect_status(status, 0, "kina_cancel_fiber");
    KF_CHECK(st == f->state, "kina_cancel_fiber: *out_state %d, the model says %d", st, f->state);
    reached[3]++;
    check_state(f, "cancelled");
}

static void op_destroy(int slot)
{
    kf_fiber_t *f = &fibers[slot];
    if (!f->live)
        return;
    expect_status(kina_fiber_destroy(f->handle), 0, "kina_fiber_destroy");
    f->live = 0;
    int32_t st = -42;
    expect_status(kina_fiber_state(f->handle, &st), KINA_STATUS_VALIDATION, "a destroyed fiber's state");
    KF_CHECK(err_has("stale") && st == -42, "a destroyed fiber's handle is not reported stale");
    if (ndead < 16)
        dead_fibers[ndead++] = f->handle;
}

static void op_bad_handle(kf_bytes_t *b)
{
    kina_fiber_t h;
    switch (kf_pick(b, 4)) {
    case 0: h = 0; break;
    case 1: h = (kina_fiber_t)kf_i64(b); break;
    case 2: h = ndead ? dead_fibers[kf_pick(b, (uint32_t)ndead)] : 0; break;
    default: h = nroot ? root_handles[kf_pick(b, (uint32_t)nroot)] : 0; break;   /* a handler handle */
    }
    for (int i = 0; i < NFIBERS; i++)
        if (fibers[i].live && fibers[i].handle == h)
            return;                                /* a random handle that happens to be live */
    int32_t st = -42, id = -42, nargs = -42;
    int64_t v = -42;
    expect_status(kina_fiber_state(h, &st), KINA_STATUS_VALIDATION, "kina_fiber_state(bad handle)");
    expect_status(kina_resume_fiber(h, 0, &st), KINA_STATUS_VALIDATION, "kina_resume_fiber(bad handle)");
    expect_status(kina_cancel_fiber(h, &st), KINA_STATUS_VALIDATION, "kina_cancel_fiber(bad handle)");
    expect_status(kina_get_perform_id(h, &id), KINA_STATUS_VALIDATION, "kina_get_perform_id(bad handle)");
    expect_status(kina_get_perform_args(h, &v, 1, &nargs), KINA_STATUS_VALIDATION, "kina_get_perform_args(bad)");
    expect_status(kina_fiber_result(h, &v), KINA_STATUS_VALIDATION, "kina_fiber_result(bad handle)");
    expect_status(kina_fiber_destroy(h), KINA_STATUS_VALIDATION, "kina_fiber_destroy(bad handle)");
    KF_CHECK(err_has("stale") || err_has("not a fiber handle"), "bad handle message: %s", kina_last_error());
    KF_CHECK(st == -42 && id == -42 && v == -42 && nargs == -42, "a refused call wrote an out-pointer");
    reached[4]++;
}

static void op_perform_args(kf_bytes_t *b, int slot)
{
    kf_fiber_t *f = &fibers[slot];
    if (!f->live)
        return;
    int32_t nargs = -42;
    int64_t args[4] = {-42, -42, -42, -42};
    int32_t cap = (int32_t)kf_pick(b, 5) - 1;
    int32_t status = kina_get_perform_args(f->handle, args, cap, &nargs);
    if (f->state != KINA_FIBER_SUSPENDED) {
        expect_status(status, KINA_STATUS_VALIDATION, "kina_get_perform_args of a fiber not suspended");
        return;
    }
    int n = f->steps[f->step].nargs;
    expect_status(status, n > cap ? KINA_STATUS_VALIDATION : 0, "kina_get_perform_args");
    KF_CHECK(nargs == n, "kina_get_perform_args: *out_nargs %d, the model says %d", nargs, n);
}

static void op_push(kf_bytes_t *b)
{
    if (nroot == NHANDLERS)
        return;
    kf_handler_spec_t *h = &root_specs[nroot];
    *h = (kf_handler_spec_t){(int)kf_pick(b, H_KINDS), 0, (int64_t)kf_pick(b, 100), status_rc(b)};
    int32_t ids[2];
    int n = 1 + (int)kf_pick(b, 2);
    for (int i = 0; i < n; i++) {
        int e = (int)kf_pick(b, NEFFECTS);
        ids[i] = E[e];
        h->mask |= 1u << e;
    }
    kina_handler_t handle = 0;
    expect_status(kina_push_handler(kf_handler, h, ids, n, &handle), 0, "kina_push_handler");
    root_handles[nroot++] = handle;
    reached[6]++;
}

/* A kina_push_handler that must be refused (check order: validated before
 * anything is pushed or written): no effect, a negative count, NULL effects,
 * an effect id nobody made, a NULL function or out-pointer.  Status 1, the
 * out-pointer untouched, and the stack as it was (every later perform is
 * checked against the model's stack). */
static void op_push_refused(kf_bytes_t *b)
{
    static kf_handler_spec_t spec = {H_ANSWER, 1, 7, 0};
    int32_t ids[2] = {E[kf_pick(b, NEFFECTS)], INT32_MAX - (int32_t)kf_pick(b, 1000)};
    kina_handler_t handle = 0x4242;
    int32_t status;
    switch (kf_pick(b, 5)) {
    case 0: status = kina_push_handler(kf_handler, &spec, ids, 0, &handle); break;
    case 1: status = kina_push_handler(kf_handler, &spec, ids, -1 - (int32_t)kf_pick(b, 5), &handle); break;
    case 2: status = kina_push_handler(kf_handler, &spec, NULL, 1, &handle); break;
    case 3: status = kina_push_handler(kf_handler, &spec, ids, 2, &handle); break;   /* ids[1] unknown */
    default: status = kf_one_in(b, 2) ? kina_push_handler(NULL, &spec, ids, 1, &handle)
                                      : kina_push_handler(kf_handler, &spec, ids, 1, NULL); break;
    }
    expect_status(status, KINA_STATUS_VALIDATION, "a kina_push_handler that must be refused");
    KF_CHECK(handle == 0x4242, "a refused kina_push_handler wrote *out_handler");
    reached[8]++;
}

static void op_pop(kf_bytes_t *b)
{
    if (nroot == 0)
        return;
    int i = kf_one_in(b, 4) ? (int)kf_pick(b, (uint32_t)nroot) : nroot - 1;
    int32_t status = kina_pop_handler(root_handles[i]);
    if (i != nroot - 1) {
        expect_status(status, KINA_STATUS_VALIDATION, "popping a handler that is not the innermost");
        KF_CHECK(err_has("not the innermost handler"), "message: %s", kina_last_error());
        return;
    }
    expect_status(status, 0, "kina_pop_handler");
    nroot--;
    expect_status(kina_pop_handler(root_handles[nroot]), KINA_STATUS_VALIDATION, "popping a popped handler");
}

static void op_root_perform(kf_bytes_t *b)
{
    kf_step_t s = {(int)kf_pick(b, NEFFECTS), (int)kf_pick(b, 4), {0}};
    for (int j = 0; j < s.nargs; j++)
        s.args[j] = (int64_t)kf_pick(b, 2001) - 1000;
    int64_t v = -5;
    switch (kf_pick(b, 10)) {
    case 0:
        expect_status(kina_perform(E[s.effect], s.args, 17, &v), KINA_STATUS_VALIDATION, "nargs 17");
        KF_CHECK(v == -5, "a refused perform wrote *out_value");
        return;
    case 1:
        expect_status(kina_perform(E[s.effect], s.args, s.nargs, NULL), KINA_STATUS_VALIDATION, "NULL out_value");
        return;
    case 2:
        expect_status(kina_perform(0, s.args, s.nargs, &v), KINA_STATUS_VALIDATION, "effect 0");
        KF_CHECK(v == -5, "a refused perform wrote *out_value");
        return;
    }
    kf_outcome_t o = search(NULL, &s);
    reached[5]++;
    int32_t status = kina_perform(E[s.effect], s.args, s.nargs, &v);
    expect_status(status, o.rc, "kina_perform at the root");
    KF_CHECK(o.rc != 0 || v == o.value, "kina_perform answered %lld, the model says %lld",
             (long long)v, (long long)o.value);
    KF_CHECK(o.rc == 0 || v == -5, "a failed kina_perform wrote *out_value");
}

static void op_effect_id(kf_bytes_t *b)
{
    char name[12];
    int n = (int)kf_pick(b, 11);
    for (int i = 0; i < n; i++)
        name[i] = (char)(kf_u8(b) | 1);            /* no NUL inside */
    name[n] = '\0';
    int32_t a = -42, c = -42;
    int32_t sa = kina_effect_id(name, &a);
    int32_t sc = kina_effect_id(name, &c);
    kf_check_failure_message(sa, "kina_effect_id");
    KF_CHECK(sa == sc && a == c, "kina_effect_id differs between two calls with one name");
    if (n == 0)
        KF_CHECK(sa == KINA_STATUS_VALIDATION && a == -42, "kina_effect_id(\"\"): status %d", sa);
    KF_CHECK(sa == 0 || sa == KINA_STATUS_VALIDATION, "kina_effect_id: status %d", sa);
    KF_CHECK(sa != 0 || a > 0, "kina_effect_id gave id %d", a);
    KF_CHECK(sa == 0 || a == -42, "a refused kina_effect_id wrote *out_id");
}

/* ---- the target -------------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    if (getenv("KINA_FUZZ_STATS"))
        atexit(print_reached);
    static const char *names[NEFFECTS] = {"fuzz.e0", "fuzz.e1", "fuzz.e2", "fuzz.e3"};
    for (int i = 0; i < NEFFECTS; i++)
        if (kina_effect_id(names[i], &E[i]) != 0) {
            fprintf(stderr, "fuzz_effects: the library does not start: %s\n", kina_last_error());
            abort();
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kf_bytes_t b = {data, size};
    ndead = 0;
    for (int n = 0; n < 64 && b.n > 0; n++) {
        int slot = (int)kf_pick(&b, NFIBERS);
        switch (kf_pick(&b, 12)) {
        case 0: case 1: op_create(&b, slot); break;
        case 2: case 3: op_resume(&b, slot); break;
        case 4: op_cancel(&b, slot); break;
        case 5: op_destroy(slot); break;
        case 6: op_bad_handle(&b); break;
        case 7: op_perform_args(&b, slot); break;
        case 8: kf_one_in(&b, 4) ? op_push_refused(&b) : op_push(&b); break;
        case 9: op_pop(&b); break;
        case 10: op_root_perform(&b); break;
        default: op_effect_id(&b); break;
        }
    }
    /* Clean up, which is checked too: destroying a suspended fiber cancels it. */
    for (int i = 0; i < NFIBERS; i++)
        op_destroy(i);
    while (nroot > 0) {
        nroot--;
        expect_status(kina_pop_handler(root_handles[nroot]), 0, "kina_pop_handler at clean-up");
    }
    int64_t v = -5;
    expect_status(kina_perform(E[0], NULL, 0, &v), KINA_STATUS_UNHANDLED, "a perform with no handler left");
    return 0;
}
