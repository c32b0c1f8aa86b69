/* Effects C ABI timings from a C host, each next to a baseline timed in the
 * same run (benches/bench_effects_abi.py builds and runs it; docs/benchmarks.md).
 *
 *   generator        a fiber performs in a loop; the host answers each perform:
 *                    kina_resume_fiber + kina_get_perform_id + kina_get_perform_args
 *   in_place         kina_perform answered by a C handler (kina_push_handler)
 *   pass_<k>         the same with k C handlers of other effects pushed above it
 *   forward_<k>      the same with k C handlers that return KINA_FORWARD above it
 *   threads_<n>      n threads, each driving its own generator fiber: round
 *                    trips per second of all threads together
 *   python_fun       kina_perform answered by a Python `fun` clause (argv[1]
 *                    "py": the runner installs one, see bench_effects_abi.py)
 *   call_floor       one C -> Python call into the library (kina_effect_id)
 * Baselines:
 *   c_call           a plain C call of the handler through a function pointer
 *   greenlet_rt      a raw greenlet switch round trip driven from C through
 *                    greenlet's C API (the host holds the GIL)
 *
 * Output: "name value" lines: nanoseconds per operation (median of RUNS
 * runs), or round trips per second for threads_<n>.  With argv[1] = a name and
 * argv[2] = N it runs that one loop N times and prints nothing (for
 * callgrind: instructions per operation = difference of two N, see the .py). */
#include <Python.h>
#include <greenlet.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kina_fx.h"

#define RUNS 7

static int32_t E, OTHER;

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

static void die(const char *what)
{
    printf("FAILED %s: %s\n", what, kina_last_error());
    exit(1);
}

/* ---- the workloads ---------------------------------------------------------------- */

static int64_t generator_body(void *arg)
{
    (void)arg;
    int64_t v = 0;
    for (int64_t i = 0;; i++)
        if (kina_perform(E, &i, 1, &v) != 0)
            return -1;                   /* cancelled by kina_fiber_destroy */
}

static int32_t answer(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)nargs;
    *out = args[0];
    return KINA_HANDLED;
}

static int32_t forward(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect; (void)args; (void)nargs; (void)out;
    return KINA_FORWARD;
}

/* n generator round trips on a new fiber. */
static void generator(int64_t n)
{
    kina_fiber_t f;
    int32_t state, id, nargs;
    int64_t args[4];
    if (kina_fiber_create(generator_body, NULL, &E, 1, &f) != 0 || kina_resume_fiber(f, 0, &state) != 0)
        die("kina_fiber_create");
    for (int64_t i = 0; i < n; i++) {
        if (kina_get_perform_id(f, &id) != 0 || kina_get_perform_args(f, args, 4, &nargs) != 0
                || kina_resume_fiber(f, args[0] + 1, &state) != 0)
            die("the generator");
    }
    kina_fiber_destroy(f);
}

/* n performs answered by a C handler below `levels` handlers of `kind`
 * ("pass": other effects, "forward": KINA_FORWARD). */
static void in_place(int64_t n, int levels, int forwarding)
{
    kina_handler_t h[65], answer_h;
    if (kina_push_handler(answer, NULL, &E, 1, &answer_h) != 0)
        die("kina_push_handler");
    for (int k = 0; k < levels; k++)
        if (kina_push_handler(forwarding ? forward : answer, NULL, forwarding ? &E : &OTHER, 1, &h[k]) != 0)
            die("kina_push_handler");
    int64_t v = 0;
    for (int64_t i = 0; i < n; i++)
        if (kina_perform(E, &i, 1, &v) != 0)
            die("kina_perform");
    for (int k = levels - 1; k >= 0; k--)
        kina_pop_handler(h[k]);
    kina_pop_handler(answer_h);
}

static int32_t (*volatile handler_ptr)(void *, int32_t, const int64_t *, int32_t, int64_t *) = answer;

static void c_call(int64_t n)
{
    int64_t v = 0;
    for (int64_t i = 0; i < n; i++)
        handler_ptr(NULL, E, &i, 1, &v);
}

static void call_floor(int64_t n)
{
    int32_t id;
    for (int64_t i = 0; i < n; i++)
        kina_effect_id("bench.abi.e", &id);
}

/* A raw greenlet round trip from C: main switches to a child whose C body
 * switches straight back. */
static PyGreenlet *main_glet;

static PyObject *child_body(PyObject *self, PyObject *args)
{
    (void)self; (void)args;
    for (;;) {
        PyObject *r = PyGreenlet_Switch(main_glet, NULL, NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
}

static PyMethodDef child_def = {"child", child_body, METH_VARARGS, NULL};

static PyGreenlet *child_glet;

static void greenlet_rt(int64_t n)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    if (child_glet == NULL) {            /* one child for every run, as the generator's fiber */
        PyGreenlet_Import();
        if (_PyGreenlet_API == NULL)
            die("importing greenlet's C API");
        main_glet = PyGreenlet_GetCurrent();
        child_glet = PyGreenlet_New(PyCFunction_New(&child_def, NULL), NULL);
    }
    for (int64_t i = 0; i < n; i++) {
        PyObject *r = PyGreenlet_Switch(child_glet, NULL, NULL);
        Py_XDECREF(r);
    }
    PyGILState_Release(gil);
}

/* ---- threads ---------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    pthread_barrier_t *start;
} thread_job;

static void *thread_main(void *arg)
{
    thread_job *job = arg;
    int32_t id;
    kina_effect_id("bench.abi.e", &id);  /* this thread's first call (through cffi) */
    pthread_barrier_wait(job->start);
    generator(job->n);
    return NULL;
}

/* Round trips per second of `threads` threads together, each doing n. */
static double threads_rate(int threads, int64_t n)
{
    pthread_t t[16];
    thread_job job[16];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int k = 0; k < threads; k++) {
        job[k].n = n;
        job[k].start = &start;
        pthread_create(&t[k], NULL, thread_main, &job[k]);
    }
    pthread_barrier_wait(&start);
    double t0 = now();
    for (int k = 0; k < threads; k++)
        pthread_join(t[k], NULL);
    double elapsed = now() - t0;
    pthread_barrier_destroy(&start);
    return threads * n / elapsed;
}

/* ---- the driver ------------------------------------------------------------------- */

typedef void (*loop_fn)(int64_t n);

static int levels_of(const char *name, const char *prefix)
{
    size_t k = strlen(prefix);
    return strncmp(name, prefix, k) == 0 ? atoi(name + k) : -1;
}

static void run(const char *name, int64_t n)
{
    int k;
    if (strcmp(name, "generator") == 0)
        generator(n);
    else if (strcmp(name, "in_place") == 0)
        in_place(n, 0, 0);
    else if ((k = levels_of(name, "pass_")) >= 0)
        in_place(n, k, 0);
    else if ((k = levels_of(name, "forward_")) >= 0)
        in_place(n, k, 1);
    else if (strcmp(name, "c_call") == 0)
        c_call(n);
    else if (strcmp(name, "greenlet_rt") == 0)
        greenlet_rt(n);
    else if (strcmp(name, "call_floor") == 0)
        call_floor(n);
    else
        die(name);
}

/* Median ns per operation of RUNS runs of n. */
static double per_op(const char *name, int64_t n)
{
    double t[RUNS];
    run(name, n / 10);                   /* warm up */
    for (int r = 0; r < RUNS; r++) {
        double t0 = now();
        run(name, n);
        t[r] = (now() - t0) / n * 1e9;
    }
    return median(t, RUNS);
}

static void python_fun_loop(int64_t n)
{
    int64_t v = 0;
    for (int64_t i = 0; i < n; i++)
        if (kina_perform(E, &i, 1, &v) != 0)
            die("kina_perform");
}

int main(int argc, char **argv)
{
    if (kina_effect_id("bench.abi.e", &E) != 0 || kina_effect_id("bench.abi.other", &OTHER) != 0)
        die("kina_effect_id");
    if (argc > 1 && argv[1][0] == 'p' && argv[1][1] == 'y') {
        /* The runner (Python) installed a `fun` handler for bench.abi.e on
         * this thread's root stack (see bench_effects_abi.py). */
        double t[RUNS];
        for (int r = 0; r < RUNS; r++) {
            double t0 = now();
            python_fun_loop(20000);
            t[r] = (now() - t0) / 20000 * 1e9;
        }
        printf("python_fun %.1f\n", median(t, RUNS));
        return 0;
    }
    if (argc > 2) {                      /* one loop, for callgrind */
        run(argv[1], atoll(argv[2]));
        return 0;
    }
    const char *ns_rows[] = {"c_call", "greenlet_rt", "generator", "in_place", "pass_8", "pass_32",
                             "forward_8", "forward_32", "call_floor", NULL};
    const int64_t counts[] = {20000000, 200000, 200000, 2000000, 1000000, 500000,
                              1000000, 500000, 20000};
    for (int k = 0; ns_rows[k] != NULL; k++)
        printf("%s %.2f\n", ns_rows[k], per_op(ns_rows[k], counts[k]));
    int threads[] = {1, 4};
    for (int k = 0; k < 2; k++) {
        double rates[RUNS];
        for (int r = 0; r < RUNS; r++)
            rates[r] = threads_rate(threads[k], 200000 / threads[k]);
        printf("threads_%d %.0f\n", threads[k], median(rates, RUNS));
    }
    return 0;
}
