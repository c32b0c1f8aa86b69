/* A C host that differentiates MLIR-compiled code through the tape ABI
 * (docs/autograd-abi.md): it drives tapes around @mlp_loss of
 * kina_fx/examples/mlp.mlir, compiled into libmlp.so.
 *
 *   cc tape_host.c -I. $(kina-fx config --cflags --libs) -L<dir> -lmlp -Wl,-rpath,<dir> -lpthread
 *
 * It prints what test_mlir_tape.py checks, one fact a line:
 *   value <name> <k> <v>    element k (row-major) of a result: gradients gw1..gb2,
 *                           a Hessian-vector product hw1..hb2 from nested tapes,
 *                           the gradients a lenient tape gives the loops forward
 *   status <check> <code>   the status of one call (misuse, strictness, overwrites)
 *   error <check>: <text>   its kina_last_error, when the code is not 0
 * The expected codes and messages live in test_mlir_tape.py, shared with
 * mlp.mlir's @main.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kina_fx.h"

/* The problem's sizes: N samples of D features, H hidden units, C classes. */
enum { N = 6, D = 4, H = 5, C = 3 };

/* A ranked descriptor with room for rank 2: kina_memref_descriptor_t's layout. */
typedef struct {
    void *allocated, *aligned;
    int64_t offset;
    int64_t sizes_and_strides[4];
} descriptor_t;

/* A row-major buffer, reachable both ways MLIR passes memrefs: `ranked` for
 * @mlp_loss's ranked arguments, `unranked` for the runtime and tape calls. */
typedef struct {
    void *data;
    int64_t count;
    descriptor_t desc;
    kina_unranked_memref_t u;
} buffer_t;

static buffer_t *buffer(size_t element_size, int rank, int64_t rows, int64_t cols)
{
    buffer_t *b = calloc(1, sizeof *b);
    int64_t sizes[2] = {rows, cols};
    b->count = 1;
    for (int i = 0; i < rank; i++)
        b->count *= sizes[i];
    b->data = calloc((size_t)(b->count ? b->count : 1), element_size);
    b->desc.allocated = b->desc.aligned = b->data;
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        b->desc.sizes_and_strides[i] = sizes[i];
        b->desc.sizes_and_strides[rank + i] = stride;
        stride *= sizes[i];
    }
    b->u.rank = rank;
    b->u.descriptor = &b->desc;
    return b;
}

static buffer_t *f32(int rank, int64_t rows, int64_t cols) { return buffer(sizeof(float), rank, rows, cols); }
static float *values(buffer_t *b) { return (float *)b->data; }
static kina_memref_descriptor_t *ranked(buffer_t *b) { return (kina_memref_descriptor_t *)&b->desc; }

static void release(buffer_t *b)
{
    free(b->data);
    free(b);
}

/* mlp.mlir's exports (llvm.emit_c_interface: ranked memrefs by descriptor). */
typedef int32_t (*forward_fn)(kina_memref_descriptor_t *loss, kina_memref_descriptor_t *x,
                              kina_memref_descriptor_t *labels, kina_memref_descriptor_t *w1,
                              kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2,
                              kina_memref_descriptor_t *b2);
int32_t _mlir_ciface_mlp_loss(kina_memref_descriptor_t *loss, kina_memref_descriptor_t *x,
                              kina_memref_descriptor_t *labels, kina_memref_descriptor_t *w1,
                              kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2,
                              kina_memref_descriptor_t *b2);
int32_t _mlir_ciface_mlp_loss_loops(kina_memref_descriptor_t *loss, kina_memref_descriptor_t *x,
                                    kina_memref_descriptor_t *labels, kina_memref_descriptor_t *w1,
                                    kina_memref_descriptor_t *b1, kina_memref_descriptor_t *w2,
                                    kina_memref_descriptor_t *b2);
int32_t _mlir_ciface_mlp_problem(kina_memref_descriptor_t *x, kina_memref_descriptor_t *labels,
                                 kina_memref_descriptor_t *w1, kina_memref_descriptor_t *b1,
                                 kina_memref_descriptor_t *w2, kina_memref_descriptor_t *b2);

/* ---- reporting ---- */

static void report(const char *check, int32_t status)
{
    printf("status %s %d\n", check, status);
    if (status != 0)
        printf("error %s: %s\n", check, kina_last_error());
}

static void print_values(const char *name, buffer_t *b)
{
    for (int64_t k = 0; k < b->count; k++)
        printf("value %s %lld %.9g\n", name, (long long)k, (double)values(b)[k]);
}

/* ---- the network ---- */

typedef struct {
    buffer_t *x, *labels, *loss, *one;
    buffer_t *param[4];       /* w1, b1, w2, b2 */
} problem_t;

static const char *const grad_names[4] = {"gw1", "gb1", "gw2", "gb2"};
static const char *const hvp_names[4] = {"hw1", "hb1", "hw2", "hb2"};
static const char *const lenient_names[4] = {"lenient_gw1", "lenient_gb1", "lenient_gw2", "lenient_gb2"};

static int32_t forward(problem_t *p, forward_fn fn)
{
    return fn(ranked(p->loss), ranked(p->x), ranked(p->labels), ranked(p->param[0]), ranked(p->param[1]),
              ranked(p->param[2]), ranked(p->param[3]));
}

static buffer_t *like(buffer_t *b) { return f32((int)b->u.rank, b->desc.sizes_and_strides[0], b->desc.sizes_and_strides[1]); }

/* Watch the parameters, declare the data constant: what every tape here starts with. */
static int32_t watch_problem(kina_tape_t tape, problem_t *p)
{
    int32_t s = 0;
    for (int i = 0; i < 4 && s == 0; i++)
        s = kina_tape_watch(tape, &p->param[i]->u, KINA_DTYPE_F32);
    if (s == 0)
        s = kina_tape_constant(tape, &p->x->u, KINA_DTYPE_F32);
    if (s == 0)
        s = kina_tape_constant(tape, &p->labels->u, KINA_DTYPE_I64);
    return s;
}

/* One reverse pass around `fn` with tape flags `flags`: grads[i] = d loss / d param[i].
 * Returns the first non-zero status; the tape is freed whatever happens. */
static int32_t gradients(problem_t *p, forward_fn fn, int32_t flags, buffer_t *grads[4])
{
    kina_tape_t tape;
    int32_t s = kina_tape_begin(flags, &tape);
    if (s != 0)
        return s;
    s = watch_problem(tape, p);
    if (s == 0)
        s = forward(p, fn);
    if (s == 0)
        s = kina_tape_end(tape);
    if (s == 0)
        s = kina_tape_backward(tape, &p->loss->u, &p->one->u);
    for (int i = 0; i < 4 && s == 0; i++)
        s = kina_tape_grad(tape, &p->param[i]->u, &grads[i]->u);
    int32_t freed = kina_tape_free(tape);
    return s != 0 ? s : freed;
}

/* The Hessian of the loss applied to the direction `dir`, by nested tapes: the
 * inner tape's gradients are recorded by the outer tape (kina_tape_grad under a
 * recording tape), which then differentiates sum_i <grad_i, dir_i>. */
static int32_t hessian_vector_product(problem_t *p, buffer_t *dir[4], buffer_t *out[4])
{
    kina_tape_t outer, inner;
    buffer_t *g[4], *prod[4], *dot[4], *partial[3];
    int32_t freed;
    for (int i = 0; i < 4; i++) {
        g[i] = like(p->param[i]);
        prod[i] = like(p->param[i]);
        dot[i] = f32(0, 0, 0);
    }
    for (int i = 0; i < 3; i++)
        partial[i] = f32(0, 0, 0);
    int32_t s = kina_tape_begin(KINA_TAPE_STRICT, &outer);
    if (s != 0)
        goto done;
    for (int i = 0; i < 4 && s == 0; i++)
        s = kina_tape_watch(outer, &p->param[i]->u, KINA_DTYPE_F32);
    for (int i = 0; i < 4 && s == 0; i++)
        s = kina_tape_constant(outer, &dir[i]->u, KINA_DTYPE_F32);
    if (s == 0)
        s = kina_tape_begin(KINA_TAPE_STRICT, &inner);
    if (s != 0)
        goto free_outer;
    s = watch_problem(inner, p);
    if (s == 0)
        s = forward(p, _mlir_ciface_mlp_loss);
    if (s == 0)
        s = kina_tape_end(inner);
    if (s == 0)
        s = kina_tape_backward(inner, &p->loss->u, &p->one->u);
    for (int i = 0; i < 4 && s == 0; i++)
        s = kina_tape_grad(inner, &p->param[i]->u, &g[i]->u);
    freed = kina_tape_free(inner);
    if (s == 0)
        s = freed;
    /* <g, dir> with runtime ops, so that the outer tape records it. */
    for (int i = 0; i < 4 && s == 0; i++) {
        s = _mlir_ciface_runtime_mul_f32(&prod[i]->u, &g[i]->u, &dir[i]->u);
        if (s == 0)
            s = _mlir_ciface_runtime_sum_f32(&dot[i]->u, &prod[i]->u, KINA_ALL_AXES, 0);
    }
    if (s == 0)
        s = _mlir_ciface_runtime_add_f32(&partial[0]->u, &dot[0]->u, &dot[1]->u);
    if (s == 0)
        s = _mlir_ciface_runtime_add_f32(&partial[1]->u, &partial[0]->u, &dot[2]->u);
    if (s == 0)
        s = _mlir_ciface_runtime_add_f32(&partial[2]->u, &partial[1]->u, &dot[3]->u);
    if (s == 0)
        s = kina_tape_end(outer);
    if (s == 0)
        s = kina_tape_backward(outer, &partial[2]->u, &p->one->u);
    for (int i = 0; i < 4 && s == 0; i++)
        s = kina_tape_grad(outer, &p->param[i]->u, &out[i]->u);
free_outer:
    freed = kina_tape_free(outer);
    if (s == 0)
        s = freed;
done:
    for (int i = 0; i < 4; i++) {
        release(g[i]);
        release(prod[i]);
        release(dot[i]);
    }
    for (int i = 0; i < 3; i++)
        release(partial[i]);
    return s;
}

/* ---- overwrites: a recorded buffer changed behind the tape's back ---- */

static void overwrites(problem_t *p)
{
    kina_tape_t tape;
    buffer_t *z = f32(2, N, H), *hidden = f32(2, N, H), *total = f32(0, 0, 0);

    /* The loss, after the forward recorded it and before backward. */
    int32_t s = kina_tape_begin(KINA_TAPE_STRICT, &tape);
    if (s == 0)
        s = watch_problem(tape, p);
    if (s == 0)
        s = forward(p, _mlir_ciface_mlp_loss);
    if (s == 0)
        s = kina_tape_end(tape);
    report("c_setup_loss", s);
    values(p->loss)[0] += 1.0f;
    report("overwritten_loss", kina_tape_backward(tape, &p->loss->u, &p->one->u));
    report("free_after_overwrite", kina_tape_free(tape));

    /* A hidden activation, then read by a recorded op. */
    s = kina_tape_begin(KINA_TAPE_STRICT, &tape);
    if (s == 0)
        s = watch_problem(tape, p);
    if (s == 0)
        s = _mlir_ciface_runtime_gpu_matmul_f32(&z->u, &p->x->u, &p->param[0]->u);
    if (s == 0)
        s = _mlir_ciface_runtime_relu_f32(&hidden->u, &z->u);
    report("c_setup_hidden", s);
    values(hidden)[3] = 42.0f;
    report("overwritten_hidden", _mlir_ciface_runtime_sum_f32(&total->u, &hidden->u, KINA_ALL_AXES, 0));

    /* A watched input, changed after watch and then read. */
    values(p->param[0])[0] += 1.0f;
    report("overwritten_watched", _mlir_ciface_runtime_gpu_matmul_f32(&z->u, &p->x->u, &p->param[0]->u));
    values(p->param[0])[0] -= 1.0f;
    report("free_recording", kina_tape_free(tape));
    release(z);
    release(hidden);
    release(total);
}

/* ---- misuse of the tape ABI ---- */

typedef struct {
    kina_tape_t tape;
    kina_unranked_memref_t *buffer;
    int32_t watch_status, end_status, free_status;
    char watch_error[512];
} thread_probe_t;

static void *other_thread(void *arg)
{
    thread_probe_t *probe = arg;
    probe->watch_status = kina_tape_watch(probe->tape, probe->buffer, KINA_DTYPE_F32);
    snprintf(probe->watch_error, sizeof probe->watch_error, "%s", kina_last_error());
    probe->end_status = kina_tape_end(probe->tape);
    probe->free_status = kina_tape_free(probe->tape);
    return NULL;
}

static void bad_inputs(problem_t *p)
{
    kina_tape_t tape, other;
    buffer_t *w1 = p->param[0], *b1 = p->param[1];
    buffer_t *z = f32(2, N, H), *zcot = f32(2, N, H), *xcot = f32(2, N, D), *gw1 = f32(2, D, H);
    buffer_t *gx = f32(2, N, D), *gwrong = f32(2, H, D);
    for (int64_t k = 0; k < zcot->count; k++)
        values(zcot)[k] = 1.0f;
    for (int64_t k = 0; k < xcot->count; k++)
        values(xcot)[k] = 1.0f;

    report("begin_bad_flags", kina_tape_begin(7, &tape));
    report("null_out_tape", kina_tape_begin(KINA_TAPE_STRICT, NULL));
    report("mlir_null_out_handle", _mlir_ciface_kina_tape_begin(NULL, KINA_TAPE_STRICT));
    report("foreign_handle", kina_tape_watch(12345, &w1->u, KINA_DTYPE_F32));
    report("zero_handle", kina_tape_end(0));

    /* A tape recording z = x @ w1, as in mlp.mlir's @bad_inputs. */
    int32_t s = kina_tape_begin(KINA_TAPE_STRICT, &tape);
    if (s == 0)
        s = kina_tape_watch(tape, &w1->u, KINA_DTYPE_F32);
    if (s == 0)
        s = kina_tape_constant(tape, &p->x->u, KINA_DTYPE_F32);
    if (s == 0)
        s = _mlir_ciface_runtime_gpu_matmul_f32(&z->u, &p->x->u, &w1->u);
    report("setup", s);

    report("watch_int64", kina_tape_watch(tape, &p->labels->u, KINA_DTYPE_I64));
    report("bad_dtype_code", kina_tape_watch(tape, &b1->u, 99));
    report("watch_twice", kina_tape_watch(tape, &w1->u, KINA_DTYPE_F32));
    report("null_buffer", kina_tape_watch(tape, NULL, KINA_DTYPE_F32));
    kina_unranked_memref_t no_descriptor = {2, NULL};
    report("null_descriptor", kina_tape_constant(tape, &no_descriptor, KINA_DTYPE_F32));

    /* Another OS thread may not touch this thread's tape. */
    thread_probe_t probe = {.tape = tape, .buffer = &b1->u};
    pthread_t thread;
    pthread_create(&thread, NULL, other_thread, &probe);
    pthread_join(thread, NULL);
    printf("status wrong_thread %d\nerror wrong_thread: %s\n", probe.watch_status, probe.watch_error);
    printf("status wrong_thread_end %d\n", probe.end_status);
    printf("status wrong_thread_free %d\n", probe.free_status);

    /* The tape of an inner begin is the innermost handler: the outer cannot end first. */
    s = kina_tape_begin(KINA_TAPE_STRICT, &other);
    report("begin_nested", s);
    report("end_not_innermost", kina_tape_end(tape));
    report("end_nested", kina_tape_end(other));
    report("free_nested", kina_tape_free(other));

    report("backward_before_end", kina_tape_backward(tape, &z->u, &zcot->u));
    kina_tape_end(tape);
    report("end_twice", kina_tape_end(tape));
    report("watch_after_end", kina_tape_watch(tape, &b1->u, KINA_DTYPE_F32));
    report("grad_before_backward", kina_tape_grad(tape, &w1->u, &gw1->u));
    report("backward_not_produced", kina_tape_backward(tape, &p->x->u, &xcot->u));
    report("cotangent_shape", kina_tape_backward(tape, &z->u, &xcot->u));
    report("null_cotangent", kina_tape_backward(tape, &z->u, NULL));
    report("backward_ok", kina_tape_backward(tape, &z->u, &zcot->u));
    report("grad_unwatched", kina_tape_grad(tape, &p->x->u, &gx->u));
    report("grad_out_shape", kina_tape_grad(tape, &w1->u, &gwrong->u));
    report("null_out_grad", kina_tape_grad(tape, &w1->u, NULL));
    report("grad_ok", kina_tape_grad(tape, &w1->u, &gw1->u));
    report("free_ok", kina_tape_free(tape));
    report("stale_handle", kina_tape_watch(tape, &w1->u, KINA_DTYPE_F32));
    report("freed_twice", kina_tape_free(tape));

    release(z);
    release(zcot);
    release(xcot);
    release(gw1);
    release(gx);
    release(gwrong);
}

int main(void)
{
    problem_t p;
    p.x = f32(2, N, D);
    p.labels = buffer(sizeof(int64_t), 1, N, 0);
    p.param[0] = f32(2, D, H);
    p.param[1] = f32(1, H, 0);
    p.param[2] = f32(2, H, C);
    p.param[3] = f32(1, C, 0);
    p.loss = f32(0, 0, 0);
    p.one = f32(0, 0, 0);
    values(p.one)[0] = 1.0f;
    report("problem", _mlir_ciface_mlp_problem(ranked(p.x), ranked(p.labels), ranked(p.param[0]),
                                               ranked(p.param[1]), ranked(p.param[2]), ranked(p.param[3])));

    buffer_t *grads[4], *dir[4], *hvp[4];
    for (int i = 0; i < 4; i++) {
        grads[i] = like(p.param[i]);
        hvp[i] = like(p.param[i]);
        dir[i] = like(p.param[i]);
        /* The direction of the Hessian-vector product: ((k mod 7) - 3) / 8. */
        for (int64_t k = 0; k < dir[i]->count; k++)
            values(dir[i])[k] = (float)((k % 7) - 3) / 8.0f;
    }

    report("c_grads", gradients(&p, _mlir_ciface_mlp_loss, KINA_TAPE_STRICT, grads));
    printf("value loss 0 %.9g\n", (double)values(p.loss)[0]);
    for (int i = 0; i < 4; i++)
        print_values(grad_names[i], grads[i]);

    report("c_hvp", hessian_vector_product(&p, dir, hvp));
    for (int i = 0; i < 4; i++)
        print_values(hvp_names[i], hvp[i]);

    /* Strict mode refuses the forward whose relu runs in MLIR loops; a lenient
     * tape accepts it and (silently) treats the hidden activation as a constant. */
    report("c_strict_loops", gradients(&p, _mlir_ciface_mlp_loss_loops, KINA_TAPE_STRICT, grads));
    report("c_lenient_loops", gradients(&p, _mlir_ciface_mlp_loss_loops, KINA_TAPE_LENIENT, grads));
    for (int i = 0; i < 4; i++)
        print_values(lenient_names[i], grads[i]);

    overwrites(&p);
    bad_inputs(&p);

    for (int i = 0; i < 4; i++) {
        release(grads[i]);
        release(hvp[i]);
        release(dir[i]);
        release(p.param[i]);
    }
    release(p.x);
    release(p.labels);
    release(p.loss);
    release(p.one);
    printf("tape host: done\n");
    return 0;
}
