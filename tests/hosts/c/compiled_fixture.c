/* A "compiled module" for tests/autodiff/test_compiled.py: C functions that call the
 * runtime's exports the way MLIR-compiled code does, and one that computes a
 * step itself, invisible to a tape. */
#include <math.h>
#include <stdint.h>
#include "kina_fx.h"

typedef struct { float *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } memref2_t;

/* loss = sum(tanh(x @ w)); scratch has the shape of x @ w. */
int32_t tanh_loss(kina_unranked_memref_t *loss, kina_unranked_memref_t *x,
                  kina_unranked_memref_t *w, kina_unranked_memref_t *scratch)
{
    int32_t rc = _mlir_ciface_runtime_gpu_matmul_f32(scratch, x, w);
    if (rc == 0)
        rc = _mlir_ciface_runtime_tanh_f32(scratch, scratch);
    if (rc == 0)
        rc = _mlir_ciface_runtime_sum_f32(loss, scratch, KINA_ALL_AXES, 0);
    return rc;
}

/* The same, with tanh computed by a loop: the tape cannot see it. */
int32_t tanh_loss_loops(kina_unranked_memref_t *loss, kina_unranked_memref_t *x,
                        kina_unranked_memref_t *w, kina_unranked_memref_t *scratch)
{
    int32_t rc = _mlir_ciface_runtime_gpu_matmul_f32(scratch, x, w);
    if (rc)
        return rc;
    memref2_t *s = (memref2_t *)scratch->descriptor;
    for (int64_t i = 0; i < s->sizes[0]; i++)
        for (int64_t j = 0; j < s->sizes[1]; j++) {
            float *p = s->aligned + s->offset + i * s->strides[0] + j * s->strides[1];
            *p = tanhf(*p);
        }
    return _mlir_ciface_runtime_sum_f32(loss, scratch, KINA_ALL_AXES, 0);
}

/* Writes its output itself: out = 2 * x, by a loop. */
int32_t double_by_hand(kina_unranked_memref_t *out, kina_unranked_memref_t *x)
{
    memref2_t *o = (memref2_t *)out->descriptor, *i = (memref2_t *)x->descriptor;
    for (int64_t r = 0; r < o->sizes[0]; r++)
        for (int64_t c = 0; c < o->sizes[1]; c++)
            o->aligned[o->offset + r * o->strides[0] + c * o->strides[1]] =
                2 * i->aligned[i->offset + r * i->strides[0] + c * i->strides[1]];
    return 0;
}

/* Two outputs: y = exp(x), z = y * y. */
int32_t exp_and_square(kina_unranked_memref_t *y, kina_unranked_memref_t *z, kina_unranked_memref_t *x)
{
    int32_t rc = _mlir_ciface_runtime_exp_f32(y, x);
    return rc ? rc : _mlir_ciface_runtime_mul_f32(z, y, y);
}
