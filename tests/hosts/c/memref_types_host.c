/* The fixed-rank descriptors of kina_fx.h (kina_memref_<dtype>_<N>d_t,
 * KINA_MEMREF_TYPEDEF, kina_unranked) used as a C user would: no hand-written
 * struct.  Prints each result; tests/hosts/c/test_memref_types_host.py checks
 * them against NumPy on the same inputs.
 *
 *   cc -std=c11 -pedantic memref_types_host.c $(kina-fx config --cflags --libs)
 */
#include <stddef.h>
#include <stdio.h>

#include "kina_fx.h"

/* The typedefs have the layout the runtime reads (kina_memref_descriptor_t). */
_Static_assert(offsetof(kina_memref_f32_2d_t, sizes)
                   == offsetof(kina_memref_descriptor_t, sizes_and_strides),
               "sizes start where sizes_and_strides does");
_Static_assert(offsetof(kina_memref_f32_2d_t, strides)
                   == offsetof(kina_memref_descriptor_t, sizes_and_strides) + 2 * sizeof(int64_t),
               "strides follow the sizes");
_Static_assert(sizeof(kina_memref_f32_0d_t) == offsetof(kina_memref_descriptor_t, sizes_and_strides),
               "rank 0 has no sizes");

/* A user-declared rank: five dimensions of double. */
KINA_MEMREF_TYPEDEF(double, 5, my_f64_5d_t);
_Static_assert(sizeof(my_f64_5d_t) == 3 * sizeof(int64_t) + 10 * sizeof(int64_t), "rank 5");

static int failures;

static void check(const char *what, int32_t status)
{
    if (status != KINA_STATUS_SUCCESS) {
        printf("%s: status %d: %s\n", what, status, kina_last_error());
        failures++;
    }
}

static void print_f32(const char *what, const float *v, int n)
{
    printf("%s:", what);
    for (int i = 0; i < n; i++)
        printf(" %.9g", v[i]);
    printf("\n");
}

int main(void)
{
    /* matmul of a 2x3 (row-major) by a 3x2 given transposed (column strides) */
    float a[6], bt[6], out[4] = {0};
    for (int i = 0; i < 6; i++) {
        a[i] = 0.5f * (float)i - 1.0f;
        bt[i] = 0.25f * (float)(i * i) - 2.0f;
    }
    kina_memref_f32_2d_t da = {a, a, 0, {2, 3}, {3, 1}};
    kina_memref_f32_2d_t db = {bt, bt, 0, {3, 2}, {1, 3}}; /* b[i][j] = bt[j * 3 + i] */
    kina_memref_f32_2d_t dout = {out, out, 0, {2, 2}, {2, 1}};
    kina_unranked_memref_t ua = kina_unranked(2, &da), ub = kina_unranked(2, &db),
                           uo = kina_unranked(2, &dout);
    check("matmul", _mlir_ciface_runtime_gpu_matmul_f32(&uo, &ua, &ub));
    print_f32("matmul", out, 4);

    /* gather rows of a 3x2 by int64 indices of rank 1 */
    float values[6] = {1, 2, 3, 4, 5, 6}, rows[4] = {0};
    int64_t idx[2] = {2, 0};
    kina_memref_f32_2d_t dv = {values, values, 0, {3, 2}, {2, 1}};
    kina_memref_i64_1d_t di = {idx, idx, 0, {2}, {1}};
    kina_memref_f32_2d_t dr = {rows, rows, 0, {2, 2}, {2, 1}};
    kina_unranked_memref_t uv = kina_unranked(2, &dv), ui = kina_unranked(1, &di),
                           ur = kina_unranked(2, &dr);
    check("gather", _mlir_ciface_runtime_gpu_gather_f32(&ur, &uv, &ui));
    print_f32("gather", rows, 4);

    /* softmax of a rank-1 view with an offset and a stride of 2 */
    float buf[9] = {9, 0.5f, 9, -1.0f, 9, 2.0f, 9, 0.0f, 9}, soft[4] = {0};
    kina_memref_f32_1d_t dx = {buf, buf, 1, {4}, {2}};
    kina_memref_f32_1d_t ds = {soft, soft, 0, {4}, {1}};
    kina_unranked_memref_t ux = kina_unranked(1, &dx), us = kina_unranked(1, &ds);
    check("softmax", _mlir_ciface_runtime_gpu_softmax_f32(&us, &ux, 0));
    print_f32("softmax", soft, 4);

    /* copy f16 (binary16 bits in uint16_t) from every other element of a buffer */
    uint16_t half_src[6] = {15360, 7, 49408, 7, 31743, 7}, half[3] = {0};
    kina_memref_f16_1d_t dsrc = {half_src, half_src, 0, {3}, {2}};
    kina_memref_f16_1d_t dhalf = {half, half, 0, {3}, {1}};
    kina_unranked_memref_t usrc = kina_unranked(1, &dsrc), uhalf = kina_unranked(1, &dhalf);
    check("copy_f16", _mlir_ciface_runtime_copy_to_device_f16(&uhalf, &usrc, 0));
    printf("copy_f16: %u %u %u\n", half[0], half[1], half[2]);

    /* rank 0 is a scalar: copy one element */
    float s_in = 3.5f, s_out = 0;
    kina_memref_f32_0d_t d0in = {&s_in, &s_in, 0}, d0out = {&s_out, &s_out, 0};
    kina_unranked_memref_t u0in = kina_unranked(0, &d0in), u0out = kina_unranked(0, &d0out);
    check("copy_0d", _mlir_ciface_runtime_copy_to_host_f32(&u0out, &u0in));
    print_f32("copy_0d", &s_out, 1);

    /* a wrong rank in the unranked wrapper is a validation error, not a crash */
    kina_unranked_memref_t bad = kina_unranked(KINA_MAX_RANK + 1, &da);
    int32_t status = _mlir_ciface_runtime_gpu_matmul_f32(&uo, &bad, &ub);
    printf("bad_rank: %d\n", status);

    printf("memref_types_host: %d failures\n", failures);
    return failures != 0;
}
