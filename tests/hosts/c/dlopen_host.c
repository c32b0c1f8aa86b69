/* A host that dlopen()s libkina_fx.so with RTLD_LOCAL (as plugin loaders do)
 * and calls one export: extension modules must still find libpython's symbols.
 *
 *   cc dlopen_host.c -ldl -o dlopen_host && env -i ./dlopen_host LIB [EXPECTED_STATUS]
 *
 * With EXPECTED_STATUS (default 0) it checks the matmul's status; when it is 0
 * it also checks the result.  Prints the status and kina_last_error().
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int64_t rank;
    void *descriptor;
} unranked_t;

typedef struct {
    void *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
} desc2_t;

typedef int32_t (*matmul_fn)(unranked_t *, unranked_t *, unranked_t *);
typedef const char *(*error_fn)(void);

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIB [EXPECTED_STATUS]\n", argv[0]);
        return 2;
    }
    int expected = argc > 2 ? atoi(argv[2]) : 0;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    matmul_fn matmul = (matmul_fn)dlsym(lib, "_mlir_ciface_runtime_gpu_matmul_f32");
    error_fn last_error = (error_fn)dlsym(lib, "kina_last_error");
    if (!matmul || !last_error) {
        printf("dlsym failed\n");
        return 1;
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, out[4] = {0};
    desc2_t da = {a, a, 0, {2, 2}, {2, 1}}, db = {b, b, 0, {2, 2}, {2, 1}}, dout = {out, out, 0, {2, 2}, {2, 1}};
    unranked_t ua = {2, &da}, ub = {2, &db}, uo = {2, &dout};
    for (int round = 0; round < 2; round++) { /* the second call takes the started path */
        int32_t rc = matmul(&uo, &ua, &ub);
        printf("status %d: %s\n", rc, rc ? last_error() : "");
        if (rc != expected)
            return 1;
    }
    if (expected == 0 && !(out[0] == 19 && out[1] == 22 && out[2] == 43 && out[3] == 50)) {
        printf("wrong result %g %g %g %g\n", out[0], out[1], out[2], out[3]);
        return 1;
    }
    printf("dlopen_host: ok\n");
    return 0;
}
