/* A plain C host of libkina_fx.so: calls every memref export, checks results
 * against values computed here, and checks the error paths.
 *
 *   cc host.c $(kina-fx config --cflags --libs) -o host && env -i ./host
 *
 * Prints "host: N checks passed" and exits 0, or prints the failures and exits 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kina_fx.h"

static int checks, failures;

#define CHECK(cond, ...)                                   \
    do {                                                   \
        checks++;                                          \
        if (!(cond)) {                                     \
            failures++;                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);    \
            printf(__VA_ARGS__);                           \
            printf("  [last error: %s]\n", kina_last_error()); \
        }                                                  \
    } while (0)

/* A ranked descriptor of rank <= 4 with the memref layout. */
typedef struct {
    void *allocated;
    void *aligned;
    int64_t offset;
    int64_t sizes_strides[8];
} desc4_t;

typedef struct {
    desc4_t d;
    kina_unranked_memref_t u;
} memref_t;

/* A row-major view of `data` (offset in elements, strides in elements). */
static kina_unranked_memref_t *view(memref_t *m, void *data, int64_t rank, const int64_t *sizes,
                                    const int64_t *strides, int64_t offset)
{
    memset(m, 0, sizeof *m);
    m->d.allocated = data;
    m->d.aligned = data;
    m->d.offset = offset;
    int64_t s = 1;
    for (int64_t i = rank - 1; i >= 0; i--) {
        m->d.sizes_strides[i] = sizes[i];
        m->d.sizes_strides[rank + i] = strides ? strides[i] : s;
        s *= sizes[i];
    }
    m->u.rank = rank;
    m->u.descriptor = &m->d;
    return &m->u;
}

static int close_to(float a, float b) { return fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)); }

int main(void)
{
    memref_t mo, ma, mb, mx;
    int32_t rc;

    CHECK(kina_abi_version() == KINA_ABI_VERSION, "abi version %d", kina_abi_version());

    /* matmul 2x3 @ 3x2 */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, out[4] = {0};
    int64_t sa[2] = {2, 3}, sb[2] = {3, 2}, so[2] = {2, 2};
    rc = _mlir_ciface_runtime_gpu_matmul_f32(view(&mo, out, 2, so, NULL, 0), view(&ma, a, 2, sa, NULL, 0),
                                             view(&mb, b, 2, sb, NULL, 0));
    CHECK(rc == KINA_STATUS_SUCCESS, "matmul rc %d", rc);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            float ref = 0;
            for (int k = 0; k < 3; k++)
                ref += a[i * 3 + k] * b[k * 2 + j];
            CHECK(close_to(out[i * 2 + j], ref), "matmul[%d][%d] = %g, want %g", i, j, out[i * 2 + j], ref);
        }

    /* matmul with a transposed (strided) a: a^T is 3x2 with strides {1, 3} */
    float out3[9] = {0};
    int64_t sat[2] = {3, 2}, st_at[2] = {1, 3}, sbt[2] = {2, 3}, so3[2] = {3, 3};
    float bt[6] = {1, 0, 2, 0, 1, 3};
    rc = _mlir_ciface_runtime_gpu_matmul_f32(view(&mo, out3, 2, so3, NULL, 0), view(&ma, a, 2, sat, st_at, 0),
                                             view(&mb, bt, 2, sbt, NULL, 0));
    CHECK(rc == 0, "strided matmul rc %d", rc);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            float ref = 0;
            for (int k = 0; k < 2; k++)
                ref += a[k * 3 + i] * bt[k * 3 + j];
            CHECK(close_to(out3[i * 3 + j], ref), "strided matmul[%d][%d]", i, j);
        }

    /* matmul shape mismatch -> validation, out untouched */
    out[0] = -1;
    rc = _mlir_ciface_runtime_gpu_matmul_f32(view(&mo, out, 2, so, NULL, 0), view(&ma, a, 2, sa, NULL, 0),
                                             view(&mb, b, 2, sa, NULL, 0));
    CHECK(rc == KINA_STATUS_VALIDATION, "matmul mismatch rc %d", rc);
    CHECK(strstr(kina_last_error(), "matmul") != NULL, "message names matmul");
    CHECK(out[0] == -1, "out untouched on error");

    /* null pointer */
    rc = _mlir_ciface_runtime_gpu_matmul_f32(NULL, &ma.u, &mb.u);
    CHECK(rc == KINA_STATUS_VALIDATION, "null rc %d", rc);

    /* softmax of a 2x3 along axis -1, written in place (out aliases x) */
    float x[6] = {1, 2, 3, -1, 0, 1000};
    float xr[6];
    memcpy(xr, x, sizeof x);
    rc = _mlir_ciface_runtime_gpu_softmax_f32(view(&mo, x, 2, sa, NULL, 0), view(&mx, x, 2, sa, NULL, 0), -1);
    CHECK(rc == 0, "softmax rc %d", rc);
    for (int i = 0; i < 2; i++) {
        float m = xr[i * 3], sum = 0;
        for (int k = 1; k < 3; k++)
            m = xr[i * 3 + k] > m ? xr[i * 3 + k] : m;
        for (int k = 0; k < 3; k++)
            sum += expf(xr[i * 3 + k] - m);
        for (int k = 0; k < 3; k++)
            CHECK(close_to(x[i * 3 + k], expf(xr[i * 3 + k] - m) / sum), "softmax[%d][%d]", i, k);
    }
    rc = _mlir_ciface_runtime_gpu_softmax_f32(view(&mo, x, 2, sa, NULL, 0), view(&mx, x, 2, sa, NULL, 0), 2);
    CHECK(rc == KINA_STATUS_VALIDATION, "softmax bad axis rc %d", rc);

    /* gather rows {2, 0, 2} of a 3x2 */
    float vals[6] = {10, 11, 20, 21, 30, 31}, g[6] = {0};
    int64_t idx[3] = {2, 0, 2}, si[1] = {3}, sv[2] = {3, 2}, sg[2] = {3, 2};
    memref_t mi;
    rc = _mlir_ciface_runtime_gpu_gather_f32(view(&mo, g, 2, sg, NULL, 0), view(&ma, vals, 2, sv, NULL, 0),
                                             view(&mi, idx, 1, si, NULL, 0));
    CHECK(rc == 0, "gather rc %d", rc);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 2; c++)
            CHECK(g[r * 2 + c] == vals[idx[r] * 2 + c], "gather[%d][%d]", r, c);
    idx[1] = 3;
    rc = _mlir_ciface_runtime_gpu_gather_f32(&mo.u, &ma.u, &mi.u);
    CHECK(rc == KINA_STATUS_VALIDATION, "gather out of range rc %d", rc);

    /* repeat_interleave of {1,2,3} by 2 along axis 0 */
    float r_in[3] = {1, 2, 3}, r_out[6] = {0};
    int64_t s3[1] = {3}, s6[1] = {6};
    rc = _mlir_ciface_runtime_gpu_repeat_interleave_f32(view(&mo, r_out, 1, s6, NULL, 0),
                                                        view(&mx, r_in, 1, s3, NULL, 0), 0, 2);
    CHECK(rc == 0, "repeat rc %d", rc);
    for (int i = 0; i < 6; i++)
        CHECK(r_out[i] == r_in[i / 2], "repeat[%d]", i);
    rc = _mlir_ciface_runtime_gpu_repeat_interleave_f32(&mo.u, &mx.u, 0, -1);
    CHECK(rc == KINA_STATUS_VALIDATION, "repeat negative reps rc %d", rc);

    /* alloc: sizes but no storage, filled in place */
    memref_t mal;
    int64_t s23[2] = {2, 3};
    view(&mal, NULL, 2, s23, NULL, 0);
    rc = _mlir_ciface_runtime_gpu_alloc_unranked(&mal.u, 4);
    CHECK(rc == 0, "alloc rc %d", rc);
    CHECK(mal.d.aligned != NULL && mal.d.allocated != NULL && mal.d.offset == 0, "alloc pointers");
    CHECK(mal.d.sizes_strides[2] == 3 && mal.d.sizes_strides[3] == 1, "alloc strides");
    CHECK(((uintptr_t)mal.d.aligned % 64) == 0, "alloc alignment");

    /* copy to device (the allocation) and back */
    memref_t msrc, mdst;
    float host_in[6] = {1, 2, 3, 4, 5, 6}, host_out[6] = {0};
    rc = _mlir_ciface_runtime_copy_to_device_f32(&mal.u, view(&msrc, host_in, 2, s23, NULL, 0), 0);
    CHECK(rc == 0, "copy_to_device rc %d", rc);
    rc = _mlir_ciface_runtime_copy_to_host_f32(view(&mdst, host_out, 2, s23, NULL, 0), &mal.u);
    CHECK(rc == 0, "copy_to_host rc %d", rc);
    CHECK(memcmp(host_in, host_out, sizeof host_in) == 0, "copy round trip");
    rc = _mlir_ciface_runtime_copy_to_device_f32(&mal.u, &msrc.u, 7);
    CHECK(rc == KINA_STATUS_VALIDATION, "copy bad device rc %d", rc);

    /* f16 copy: bit patterns travel unchanged */
    uint16_t h_in[3] = {0x3c00, 0x4000, 0xc200}, h_out[3] = {0};
    rc = _mlir_ciface_runtime_copy_to_device_f16(view(&mdst, h_out, 1, s3, NULL, 0),
                                                 view(&msrc, h_in, 1, s3, NULL, 0), 0);
    CHECK(rc == 0 && memcmp(h_in, h_out, sizeof h_in) == 0, "f16 copy rc %d", rc);

    /* alloc errors */
    rc = _mlir_ciface_runtime_gpu_alloc_unranked(&mal.u, 3);
    CHECK(rc == KINA_STATUS_TYPE, "alloc element_size 3 rc %d", rc);
    int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 20};
    view(&mal, NULL, 2, huge, NULL, 0);
    rc = _mlir_ciface_runtime_gpu_alloc_unranked(&mal.u, 4);
    CHECK(rc == KINA_STATUS_RESOURCE, "alloc 4 PiB rc %d", rc);
    mal.u.rank = 99;
    rc = _mlir_ciface_runtime_gpu_alloc_unranked(&mal.u, 4);
    CHECK(rc == KINA_STATUS_VALIDATION, "alloc rank 99 rc %d", rc);

    CHECK(runtime_gpu_free_all() == 0, "free_all");
    CHECK(runtime_gpu_free_all() == 0, "free_all again");

    if (failures) {
        printf("host: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("host: %d checks passed\n", checks);
    return 0;
}
