/* Several host threads race on the first call (which starts Python) and keep
 * calling: every call must succeed with the right result, and each thread's
 * kina_last_error must hold its own failure.
 *
 *   cc threads_host.c $(kina-fx config --cflags --libs) -lpthread -o threads_host && env -i ./threads_host
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kina_fx.h"

#define THREADS 4
#define CALLS 300

typedef struct {
    void *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
} desc2_t;

static pthread_barrier_t start;
static int failures[THREADS];

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    float a[4] = {1, 2, 3, (float)id}, b[4] = {1, 0, 0, 1}, out[4];
    desc2_t da = {a, a, 0, {2, 2}, {2, 1}}, db = {b, b, 0, {2, 2}, {2, 1}}, dout = {out, out, 0, {2, 2}, {2, 1}};
    kina_unranked_memref_t ua = {2, &da}, ub = {2, &db}, uo = {2, &dout};
    char mine[64];
    snprintf(mine, sizeof mine, "axis %d", 100 + id);
    pthread_barrier_wait(&start); /* all threads make the first call together */
    for (int i = 0; i < CALLS; i++) {
        memset(out, 0, sizeof out);
        if (_mlir_ciface_runtime_gpu_matmul_f32(&uo, &ua, &ub) != 0 || memcmp(out, a, sizeof a) != 0) {
            failures[id]++;
            continue;
        }
        /* a failure whose message names this thread's axis */
        if (_mlir_ciface_runtime_gpu_softmax_f32(&uo, &ua, 100 + id) != KINA_STATUS_VALIDATION ||
            strstr(kina_last_error(), mine) == NULL)
            failures[id]++;
    }
    return NULL;
}

int main(void)
{
    pthread_t threads[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i);
    int total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        total += failures[i];
    }
    printf("threads_host: %d threads x %d calls, %d failures\n", THREADS, CALLS, total);
    return total != 0;
}
