/* A host that uses only the effects ABI: NumPy (the memref runtime) must not be
 * imported until the first memref call (tests/hosts/c/test_effects_only_host.py).
 *
 * The probe looks at the embedded interpreter's sys.modules through the
 * Python C API that libkina_fx.so loaded (dlsym: this host is not built
 * against Python).  It also prints how long the first call took (start-up of
 * Python and kina_fx included), for benches/bench_effects_abi.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

#include "kina_check.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* 1 if `name` is in the interpreter's sys.modules, 0 if not, -1 if the probe failed. */
static int python_has_module(const char *name)
{
    int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void (*release)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
    void *(*modules)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyImport_GetModuleDict");
    void *(*get)(void *, const char *) =
        (void *(*)(void *, const char *))dlsym(RTLD_DEFAULT, "PyDict_GetItemString");
    if (!ensure || !release || !modules || !get)
        return -1;
    int gil = ensure();
    int found = get(modules(), name) != NULL;
    release(gil);
    return found;
}

static int32_t E;

static int64_t generator(void *arg)
{
    (void)arg;
    int64_t total = 0, v = 0;
    for (int64_t i = 1; i <= 3; i++) {
        if (kina_perform(E, &i, 1, &v) != 0)
            return -1;
        total += v;
    }
    return total;
}

static int32_t doubler(void *ctx, int32_t effect, const int64_t *args, int32_t nargs, int64_t *out)
{
    (void)ctx; (void)effect;
    *out = nargs > 0 ? 2 * args[0] : 0;
    return KINA_HANDLED;
}

int main(void)
{
    double t0 = now_us();
    CHECK(kina_effect_id("effects_only.e", &E) == 0);
    double first = now_us() - t0;

    /* a generator driven from C */
    kina_fiber_t f;
    int32_t state = -1, id = 0, nargs = 0;
    int64_t args[4], result = 0;
    CHECK(kina_fiber_create(generator, NULL, &E, 1, &f) == 0);
    CHECK(kina_resume_fiber(f, 0, &state) == 0 && state == KINA_FIBER_SUSPENDED);
    while (state == KINA_FIBER_SUSPENDED) {
        CHECK(kina_get_perform_id(f, &id) == 0 && id == E);
        CHECK(kina_get_perform_args(f, args, 4, &nargs) == 0 && nargs == 1);
        CHECK(kina_resume_fiber(f, 10 * args[0], &state) == 0);
    }
    CHECK(state == KINA_FIBER_DONE && kina_fiber_result(f, &result) == 0 && result == 60);
    CHECK(kina_fiber_destroy(f) == 0);

    /* a perform answered in place by a C handler */
    kina_handler_t h;
    int64_t x = 21, v = 0;
    CHECK(kina_push_handler(doubler, NULL, &E, 1, &h) == 0);
    CHECK(kina_perform(E, &x, 1, &v) == 0 && v == 42);
    CHECK(kina_pop_handler(h) == 0);

    CHECK(python_has_module("kina_fx.ffi.effects") == 1);   /* the probe works */
    int numpy_before = python_has_module("numpy");
    CHECK(numpy_before == 0);

    /* the first memref call loads the memref runtime, NumPy included */
    CHECK(runtime_gpu_free_all() == 0);
    int numpy_after = python_has_module("numpy");
    CHECK(numpy_after == 1);

    printf("first_call_us %.0f\n", first);
    printf("numpy_before_memref %d\nnumpy_after_memref %d\n", numpy_before, numpy_after);
    printf("%d checks passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
