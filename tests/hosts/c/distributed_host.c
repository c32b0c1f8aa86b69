/* A C host running data-parallel under mpiexec (docs/distributed.md, "From C and MLIR").
 *
 *   cc distributed_host.c $(kina-fx config --cflags --libs) -o distributed_host
 *   mpiexec -n 4 ./distributed_host            # kina_distributed_init(0) makes MPI the group
 *   KINA_FX_DISTRIBUTED=mpi mpiexec -n 2 ./distributed_host env   # the environment does
 *   KINA_FX_DIST_TIMEOUT=2 mpiexec -n 2 ./distributed_host hang   # rank 1 never joins
 *
 * Every process fills x[i] = (rank + 1) * (i + 1), calls the collective exports and
 * checks the results against sums it computes itself, checks the error paths, and
 * differentiates through a collective with a tape (kina_tape_*): for
 * s_r = sum(all_reduce(x * x)) the SPMD gradient on every rank is 2 * size * x_r.
 * It prints "distributed host rank R of N: C checks, F failures".  In "hang" mode
 * rank 1 sleeps; rank 0's all_reduce returns KINA_STATUS_RESOURCE (the timeout)
 * with kina_last_error, and rank 0 then ends the job with kina_distributed_abort(3).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kina_check.h"

enum { ROWS = 2, COLS = 3, COUNT = ROWS * COLS };

typedef struct {
    void *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
} desc2_t;

typedef struct {
    void *allocated, *aligned;
    int64_t offset;
} desc0_t;

/* An unranked memref over a ROWS x COLS row-major float buffer. */
typedef struct {
    float v[COUNT];
    desc2_t d;
    kina_unranked_memref_t u;
} matrix_t;

static void matrix(matrix_t *m)
{
    m->d.allocated = m->d.aligned = m->v;
    m->d.offset = 0;
    m->d.sizes[0] = ROWS, m->d.sizes[1] = COLS;
    m->d.strides[0] = COLS, m->d.strides[1] = 1;
    m->u.rank = 2;
    m->u.descriptor = &m->d;
}

typedef struct {
    float v;
    desc0_t d;
    kina_unranked_memref_t u;
} scalar_t;

static void scalar(scalar_t *s)
{
    s->d.allocated = s->d.aligned = &s->v;
    s->d.offset = 0;
    s->u.rank = 0;
    s->u.descriptor = &s->d;
}

static int near(float a, double b) { return fabs((double)a - b) <= 1e-5 * (1.0 + fabs(b)); }

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "init";
    int32_t rank = -1, size = -1;
    if (strcmp(mode, "env") != 0)
        CHECK(kina_distributed_init(0) == KINA_STATUS_SUCCESS);
    CHECK(kina_distributed_rank(&rank) == KINA_STATUS_SUCCESS);
    CHECK(kina_distributed_size(&size) == KINA_STATUS_SUCCESS);
    CHECK(size >= 1 && rank >= 0 && rank < size);

    matrix_t x, out;
    matrix(&x), matrix(&out);
    for (int i = 0; i < COUNT; i++)
        x.v[i] = (float)((rank + 1) * (i + 1));
    /* sum over ranks of (r + 1) = size (size + 1) / 2; max is size, min is 1 */
    double ranks_sum = size * (size + 1) / 2.0;

    if (strcmp(mode, "hang") == 0) {
        if (rank == 1) {
            sleep(60);      /* bounded: the abort below normally ends it at once */
            return 0;
        }
        int32_t status = _mlir_ciface_runtime_all_reduce_f32(&out.u, &x.u, KINA_REDUCE_SUM);
        printf("rank %d: all_reduce status %d: %s\n", rank, status, kina_last_error());
        fflush(stdout);
        kina_distributed_abort(3);
        return 1;   /* not reached on a group of several processes */
    }

    const int ops[4] = {KINA_REDUCE_SUM, KINA_REDUCE_MEAN, KINA_REDUCE_MAX, KINA_REDUCE_MIN};
    const double factor[4] = {ranks_sum, ranks_sum / size, (double)size, 1.0};
    for (int k = 0; k < 4; k++) {
        memset(out.v, 0, sizeof out.v);
        CHECK(_mlir_ciface_runtime_all_reduce_f32(&out.u, &x.u, ops[k]) == KINA_STATUS_SUCCESS);
        for (int i = 0; i < COUNT; i++)
            CHECK(near(out.v[i], factor[k] * (i + 1)));
    }
    for (int root = 0; root < size; root++) {
        CHECK(_mlir_ciface_runtime_broadcast_f32(&out.u, &x.u, root) == KINA_STATUS_SUCCESS);
        for (int i = 0; i < COUNT; i++)
            CHECK(near(out.v[i], (root + 1) * (i + 1)));
    }
    matrix_t y;
    matrix(&y);
    memcpy(y.v, x.v, sizeof y.v);
    CHECK(_mlir_ciface_runtime_all_reduce_f32(&y.u, &y.u, KINA_REDUCE_SUM) == KINA_STATUS_SUCCESS);
    CHECK(near(y.v[COUNT - 1], ranks_sum * COUNT));

    /* Refused alike on every rank, nothing written, and the group works after. */
    for (int i = 0; i < COUNT; i++)
        out.v[i] = 7.0f;
    CHECK(_mlir_ciface_runtime_all_reduce_f32(&out.u, &x.u, 4) == KINA_STATUS_VALIDATION);
    CHECK(err_has("unknown reduction code 4"));
    CHECK(_mlir_ciface_runtime_broadcast_f32(&out.u, &x.u, size) == KINA_STATUS_VALIDATION);
    CHECK(err_has("out of range"));
    CHECK(out.v[0] == 7.0f && out.v[COUNT - 1] == 7.0f);
    CHECK(kina_distributed_rank(NULL) == KINA_STATUS_VALIDATION);
    CHECK(kina_distributed_init(5) == KINA_STATUS_VALIDATION);
    CHECK(kina_distributed_barrier() == KINA_STATUS_SUCCESS);

    /* A tape records the collective: d/dx_r of sum over ranks of s = 2 * size * x_r. */
    kina_tape_t tape = 0;
    matrix_t sq, red, grad;
    matrix(&sq), matrix(&red), matrix(&grad);
    scalar_t s, one;
    scalar(&s), scalar(&one);
    one.v = 1.0f;
    CHECK(kina_tape_begin(KINA_TAPE_STRICT, &tape) == KINA_STATUS_SUCCESS);
    CHECK(kina_tape_watch(tape, &x.u, KINA_DTYPE_F32) == KINA_STATUS_SUCCESS);
    CHECK(_mlir_ciface_runtime_mul_f32(&sq.u, &x.u, &x.u) == KINA_STATUS_SUCCESS);
    CHECK(_mlir_ciface_runtime_all_reduce_f32(&red.u, &sq.u, KINA_REDUCE_SUM) == KINA_STATUS_SUCCESS);
    CHECK(_mlir_ciface_runtime_sum_f32(&s.u, &red.u, KINA_ALL_AXES, 0) == KINA_STATUS_SUCCESS);
    CHECK(kina_tape_end(tape) == KINA_STATUS_SUCCESS);
    CHECK(kina_tape_backward(tape, &s.u, &one.u) == KINA_STATUS_SUCCESS);
    CHECK(kina_tape_grad(tape, &x.u, &grad.u) == KINA_STATUS_SUCCESS);
    for (int i = 0; i < COUNT; i++)
        CHECK(near(grad.v[i], 2.0 * size * x.v[i]));
    CHECK(kina_tape_free(tape) == KINA_STATUS_SUCCESS);

    printf("distributed host rank %d of %d: %d checks, %d failures\n", rank, size, checks, failures);
    fflush(stdout);
    CHECK(kina_distributed_finalize() == KINA_STATUS_SUCCESS);
    /* After finalize, the process group is this process alone. */
    CHECK(kina_distributed_size(&size) == KINA_STATUS_SUCCESS && size == 1);
    return failures ? 1 : 0;
}
