/* Effects C ABI timings from a C host (benches/bench_effects_abi.py builds and runs it).
 *   1. perform + resume round trip through a suspending handler (the fiber's
 *      host catches the effect; kina_resume_fiber answers it);
 *   2. perform answered in place by a C handler (kina_push_handler);
 *   3. perform answered in place by a Python `fun` clause (argv[1] = "py"
 *      makes the runner install one; see bench_effects_abi.py);
 *   4. an empty call into the library (kina_effect_id), the boundary's floor.
 * Prints one "name median_ns" line per benchmark (median of 7 runs). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kina_fx.h"

static int32_t E;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

static int64_t performer(void *arg)
{
    int64_t n = *(int64_t *)arg, v = 0;
    for (int64_t i = 0; i < n; i++)
        kina_perform(E, &i, 1, &v);
    return v;
}

static int32_t answer(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)nargs;
    *out = args[0];
    return KINA_HANDLED;
}

#define RUNS 7

static double bench_round_trip(int64_t n)
{
    double t[RUNS];
    for (int r = 0; r < RUNS; r++) {
        kina_fiber_t f;
        int32_t state;
        kina_fiber_create(performer, &n, &E, 1, &f);
        kina_resume_fiber(f, 0, &state);
        double t0 = now();
        for (int64_t i = 0; i < n; i++)
            kina_resume_fiber(f, i, &state);
        t[r] = (now() - t0) / n;
        kina_fiber_destroy(f);
    }
    return median(t, RUNS);
}

static double bench_in_place(int64_t n, int push_c_handler)
{
    double t[RUNS];
    kina_handler_t h = 0;
    if (push_c_handler)
        kina_push_handler(answer, NULL, &E, 1, &h);
    for (int r = 0; r < RUNS; r++) {
        double t0 = now();
        int64_t v = 0;
        for (int64_t i = 0; i < n; i++)
            kina_perform(E, &i, 1, &v);
        t[r] = (now() - t0) / n;
    }
    if (push_c_handler)
        kina_pop_handler(h);
    return median(t, RUNS);
}

static double bench_floor(int64_t n)
{
    double t[RUNS];
    int32_t id;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now();
        for (int64_t i = 0; i < n; i++)
            kina_abi_version();
        double mid = now();
        for (int64_t i = 0; i < n; i++)
            kina_effect_id("bench.abi.e", &id);
        t[r] = ((now() - mid) - (mid - t0)) / n;
    }
    return median(t, RUNS);
}

int main(int argc, char **argv)
{
    int python_fun = argc > 1 && argv[1][0] == 'p';
    int64_t n = 20000;
    if (kina_effect_id("bench.abi.e", &E) != 0) {
        printf("kina_effect_id failed: %s\n", kina_last_error());
        return 1;
    }
    if (python_fun) {
        /* The runner (Python) installed a `fun` handler for bench.abi.e on
         * this thread's root stack through KINA_FX_BENCH_PY (see the .py). */
        printf("python_fun_in_place %.0f\n", bench_in_place(n, 0) * 1e9);
        return 0;
    }
    printf("call_floor %.0f\n", bench_floor(n) * 1e9);
    printf("suspend_resume_round_trip %.0f\n", bench_round_trip(n) * 1e9);
    printf("c_handler_in_place %.0f\n", bench_in_place(n, 1) * 1e9);
    return 0;
}
