/* A C host of the decisions of docs/abi.md and docs/autograd-abi.md that only a
 * real process shows: floating-point conditions (log of a negative number or
 * of 0, an overflowing matmul, taped or not, and in backward) give IEEE
 * results with status 0 and print nothing; calls refused by validation read
 * nothing (operands on a page nobody may touch); a tape left recording on a
 * fiber that ended is stale and freeable; watch of a produced buffer is
 * refused.  Prints one line per result; tests/hosts/c/test_quiet_host.py
 * checks them and that stderr is empty.
 *
 *   cc quiet_host.c $(kina-fx config --cflags --libs)
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kina_fx.h"

static void print_f32(const char *what, int32_t status, const float *v, int n)
{
    printf("%s: %d", what, status);
    for (int i = 0; i < n; i++)
        printf(" %.9g", v[i]);
    printf("\n");
}

static void print_status(const char *what, int32_t status)
{
    /* the message's first word, to check the reason without printing addresses */
    char word[64] = "";
    if (status != 0)
        sscanf(kina_last_error(), "%63s", word);
    printf("%s: %d %s%s\n", what, status, word,
           status != 0 && strstr(kina_last_error(), "shape") ? " shape" : "");
}

/* A fiber entry that begins a tape, watches a buffer and returns while it records. */
static kina_tape_t left_recording;
static int64_t leave_a_tape(void *arg)
{
    kina_memref_f32_1d_t *d = arg;
    kina_unranked_memref_t u = kina_unranked(1, d);
    if (kina_tape_begin(KINA_TAPE_STRICT, &left_recording) != 0)
        return -1;
    return kina_tape_watch(left_recording, &u, KINA_DTYPE_F32);
}

int main(void)
{
    /* ---- floating-point conditions: IEEE results, status 0, nothing printed ---- */
    float x[3] = {-1.0f, 0.0f, 2.0f}, y[3];
    kina_memref_f32_1d_t dx = {x, x, 0, {3}, {1}}, dy = {y, y, 0, {3}, {1}};
    kina_unranked_memref_t ux = kina_unranked(1, &dx), uy = kina_unranked(1, &dy);
    print_f32("log", _mlir_ciface_runtime_log_f32(&uy, &ux), y, 3);

    float big[4] = {3e38f, 3e38f, 3e38f, 3e38f}, prod[4];
    kina_memref_f32_2d_t db = {big, big, 0, {2, 2}, {2, 1}}, dp = {prod, prod, 0, {2, 2}, {2, 1}};
    kina_unranked_memref_t ub = kina_unranked(2, &db), up = kina_unranked(2, &dp);
    print_f32("matmul", _mlir_ciface_runtime_gpu_matmul_f32(&up, &ub, &ub), prod, 4);

    /* taped: d sum(log(w)) / dw = 1 / w, infinite at 0 */
    float w[3] = {0.0f, 1.0f, 4.0f}, lw[3], s = 0, one = 1, g[3];
    kina_memref_f32_1d_t dw = {w, w, 0, {3}, {1}}, dl = {lw, lw, 0, {3}, {1}}, dg = {g, g, 0, {3}, {1}};
    kina_memref_f32_0d_t ds = {&s, &s, 0}, done = {&one, &one, 0};
    kina_unranked_memref_t uw = kina_unranked(1, &dw), ul = kina_unranked(1, &dl),
                           ug = kina_unranked(1, &dg), us = kina_unranked(0, &ds),
                           uone = kina_unranked(0, &done);
    kina_tape_t tape;
    int32_t st = kina_tape_begin(KINA_TAPE_STRICT, &tape);
    st = st ? st : kina_tape_watch(tape, &uw, KINA_DTYPE_F32);
    st = st ? st : _mlir_ciface_runtime_log_f32(&ul, &uw);
    st = st ? st : _mlir_ciface_runtime_sum_f32(&us, &ul, KINA_ALL_AXES, 0);
    st = st ? st : kina_tape_end(tape);
    st = st ? st : kina_tape_backward(tape, &us, &uone);
    st = st ? st : kina_tape_grad(tape, &uw, &ug);
    print_f32("taped log", st, lw, 3);
    print_f32("taped grad", st, g, 3);
    kina_tape_free(tape);

    /* ---- check order: refused before anything is read or copied ---- */
    long page = sysconf(_SC_PAGESIZE);
    float *nothing = mmap(NULL, (size_t)page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (nothing == MAP_FAILED)
        return 2;
    kina_memref_f32_1d_t huge_dst = {nothing, nothing, 0, {1LL << 48}, {1}};
    kina_memref_f32_1d_t huge_src = {nothing, nothing, 0, {(1LL << 48) + 1}, {1}};
    kina_unranked_memref_t uhd = kina_unranked(1, &huge_dst), uhs = kina_unranked(1, &huge_src);
    print_status("copy huge mismatch", _mlir_ciface_runtime_copy_to_host_f32(&uhd, &uhs));
    kina_memref_f32_1d_t small_dst = {nothing, nothing, 0, {1000}, {1}};
    kina_memref_f32_1d_t small_src = {nothing, nothing, 0, {1001}, {1}};
    kina_unranked_memref_t usd = kina_unranked(1, &small_dst), uss = kina_unranked(1, &small_src);
    print_status("copy small mismatch", _mlir_ciface_runtime_copy_to_host_f32(&usd, &uss));
    kina_memref_f32_2d_t t_out = {nothing, nothing, 0, {3, 1000}, {1000, 1}};
    kina_memref_f32_2d_t t_in = {nothing, nothing, 0, {1000, 2}, {2, 1}};
    int64_t perm[2] = {1, 0};
    kina_memref_i64_1d_t dperm = {perm, perm, 0, {2}, {1}};
    kina_unranked_memref_t uto = kina_unranked(2, &t_out), uti = kina_unranked(2, &t_in),
                           uperm = kina_unranked(1, &dperm);
    print_status("transpose mismatch", _mlir_ciface_runtime_transpose_f32(&uto, &uti, &uperm));

    /* ---- a tape left recording on a fiber that ended ---- */
    float buf[4] = {1, 2, 3, 4};
    kina_memref_f32_1d_t dbuf = {buf, buf, 0, {4}, {1}};
    kina_unranked_memref_t ubuf = kina_unranked(1, &dbuf);
    int32_t never;
    kina_effect_id("quiet_host.never_performed", &never);
    kina_fiber_t fiber;
    int32_t state = -1;
    st = kina_fiber_create(leave_a_tape, &dbuf, &never, 1, &fiber);
    st = st ? st : kina_resume_fiber(fiber, 0, &state);
    printf("fiber: %d %d\n", st, state);
    kina_fiber_destroy(fiber);
    print_status("stale watch", kina_tape_watch(left_recording, &ubuf, KINA_DTYPE_F32));
    print_status("stale end", kina_tape_end(left_recording));
    print_status("stale free", kina_tape_free(left_recording));
    print_status("stale free again", kina_tape_free(left_recording));

    /* ---- watch of a buffer a recorded op produced ---- */
    st = kina_tape_begin(KINA_TAPE_STRICT, &tape);
    st = st ? st : kina_tape_watch(tape, &ubuf, KINA_DTYPE_F32);
    float e[4];
    kina_memref_f32_1d_t de = {e, e, 0, {4}, {1}};
    kina_unranked_memref_t ue = kina_unranked(1, &de);
    st = st ? st : _mlir_ciface_runtime_exp_f32(&ue, &ubuf);
    printf("produced: %d\n", st);
    print_status("watch produced", kina_tape_watch(tape, &ue, KINA_DTYPE_F32));
    print_status("constant watched", kina_tape_constant(tape, &ubuf, KINA_DTYPE_F32));
    print_status("free", kina_tape_free(tape));
    fflush(stdout);
    return 0;
}
