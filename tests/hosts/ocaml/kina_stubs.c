/* Hand-written OCaml bindings to the effects C ABI of libkina_fx.so, plus the
 * C entry functions and handler the OCaml host's fibers run.  OCaml code never
 * runs on a kina fiber (OCaml 4 keeps per-stack runtime state that greenlet
 * does not switch): OCaml only drives fibers and answers their effects. */
#include <stdlib.h>
#include <string.h>

#include <caml/alloc.h>
#include <caml/fail.h>
#include <caml/memory.h>
#include <caml/mlvalues.h>

#include "kina_fx.h"

/* Raise Failure "kina: <status>: <kina_last_error>" for a non-zero status. */
static void check(int32_t rc, const char *what)
{
    if (rc != 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s: status %d: %s", what, rc, kina_last_error());
        caml_failwith(msg);
    }
}

value ml_kina_effect_id(value name)
{
    int32_t id = 0;
    check(kina_effect_id(String_val(name), &id), "kina_effect_id");
    return Val_int(id);
}

/* ---- fiber bodies (C) ------------------------------------------------------- */

typedef struct {
    int32_t effect_a, effect_b;
    int64_t n;
} body_arg;

/* Perform effect_a (Yield) with 0..n-1; return the sum of the answers. */
static int64_t generator_body(void *p)
{
    body_arg *a = p;
    int64_t total = 0;
    for (int64_t i = 0; i < a->n; i++) {
        int64_t answer = 0;
        if (kina_perform(a->effect_a, &i, 1, &answer) != 0)
            return -1;
        total += answer;
    }
    return total;
}

/* With effect_a = Get and effect_b = Put: n times put(get() + i); return get(). */
static int64_t counter_body(void *p)
{
    body_arg *a = p;
    for (int64_t i = 0; i < a->n; i++) {
        int64_t v = 0, unit = 0;
        if (kina_perform(a->effect_a, NULL, 0, &v) != 0)
            return -1;
        int64_t next = v + i;
        if (kina_perform(a->effect_b, &next, 1, &unit) != 0)
            return -2;
    }
    int64_t final = 0;
    if (kina_perform(a->effect_a, NULL, 0, &final) != 0)
        return -3;
    return final;
}

/* create body_kind n effect_a effect_b catch_all : fiber handle.
 * body_kind 0 = generator, 1 = counter.  The body arguments live on the heap
 * (never on a stack a fiber might copy away); they are freed by ml_kina_fiber_destroy
 * through the small registry below. */
#define MAX_LIVE 256
static struct { int64_t fiber; body_arg *arg; } live[MAX_LIVE];

value ml_kina_fiber_create(value kind, value n, value effect_a, value effect_b)
{
    body_arg *arg = malloc(sizeof *arg);
    if (!arg)
        caml_failwith("out of memory");
    arg->effect_a = Int_val(effect_a);
    arg->effect_b = Int_val(effect_b);
    arg->n = Long_val(n);
    int32_t catch_[2] = {arg->effect_a, arg->effect_b};
    kina_fiber_t f = 0;
    int32_t rc = kina_fiber_create(Int_val(kind) == 0 ? generator_body : counter_body, arg,
                                   catch_, Int_val(kind) == 0 ? 1 : 2, &f);
    if (rc != 0)
        free(arg);
    check(rc, "kina_fiber_create");
    for (int i = 0; i < MAX_LIVE; i++) {
        if (live[i].arg == NULL) {
            live[i].fiber = (int64_t)f;
            live[i].arg = arg;
            break;
        }
    }
    return caml_copy_int64((int64_t)f);
}

/* resume fiber v : state (raises Failure with the status on failure) */
value ml_kina_resume_fiber(value fiber, value v)
{
    int32_t state = -1;
    check(kina_resume_fiber((kina_fiber_t)Int64_val(fiber), Long_val(v), &state), "kina_resume_fiber");
    return Val_int(state);
}

/* The raw status of a resume, for the error-path checks. */
value ml_kina_resume_status(value fiber, value v)
{
    int32_t state = -1;
    return Val_int(kina_resume_fiber((kina_fiber_t)Int64_val(fiber), Long_val(v), &state));
}

value ml_kina_get_perform_id(value fiber)
{
    int32_t id = 0;
    check(kina_get_perform_id((kina_fiber_t)Int64_val(fiber), &id), "kina_get_perform_id");
    return Val_int(id);
}

value ml_kina_get_perform_args(value fiber)
{
    CAMLparam1(fiber);
    CAMLlocal1(arr);
    int64_t args[KINA_MAX_ARGS];
    int32_t n = 0;
    check(kina_get_perform_args((kina_fiber_t)Int64_val(fiber), args, KINA_MAX_ARGS, &n),
          "kina_get_perform_args");
    arr = caml_alloc(n, 0);
    for (int32_t i = 0; i < n; i++)
        Store_field(arr, i, Val_long(args[i]));
    CAMLreturn(arr);
}

value ml_kina_fiber_result(value fiber)
{
    int64_t r = 0;
    check(kina_fiber_result((kina_fiber_t)Int64_val(fiber), &r), "kina_fiber_result");
    return Val_long(r);
}

value ml_kina_fiber_destroy(value fiber)
{
    int64_t f = Int64_val(fiber);
    check(kina_fiber_destroy((kina_fiber_t)f), "kina_fiber_destroy");
    for (int i = 0; i < MAX_LIVE; i++) {
        if (live[i].arg != NULL && live[i].fiber == f) {
            free(live[i].arg);
            live[i].arg = NULL;
        }
    }
    return Val_unit;
}

/* ---- a C handler pushed from OCaml onto the thread's root handler stack ---- */

static int64_t scale = 3;

static int32_t scaling_handler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs,
                               int64_t *out)
{
    (void)effect;
    *out = *(int64_t *)ctx * (nargs > 0 ? args[0] : 1);
    return KINA_HANDLED;
}

value ml_kina_push_scaling_handler(value effect)
{
    int32_t e = Int_val(effect);
    kina_handler_t h = 0;
    check(kina_push_handler(scaling_handler, &scale, &e, 1, &h), "kina_push_handler");
    return caml_copy_int64((int64_t)h);
}

value ml_kina_pop_handler(value h)
{
    check(kina_pop_handler((kina_handler_t)Int64_val(h)), "kina_pop_handler");
    return Val_unit;
}

value ml_kina_pop_status(value h)
{
    return Val_int(kina_pop_handler((kina_handler_t)Int64_val(h)));
}

value ml_kina_perform1(value effect, value arg)
{
    int64_t a = Long_val(arg), out = 0;
    check(kina_perform(Int_val(effect), &a, 1, &out), "kina_perform");
    return Val_long(out);
}
