/* The distributed exports (kina_fx.distributed, docs/distributed.md), in the
 * X(exported name, Python callback name, (parameters), (arguments)) form of
 * KINA_EXPORTS (kina_runtime.c).  Keep one entry per line: build.py parses
 * these lines.  Callbacks: kina_fx/ffi/distributed.py. */
#define KINA_DISTRIBUTED_EXPORTS(X) \
    X(kina_distributed_init, kina_py_distributed_init, (int32_t flags), (flags)) \
    X(kina_distributed_finalize, kina_py_distributed_finalize, (void), ()) \
    X(kina_distributed_rank, kina_py_distributed_rank, (int32_t *out_rank), (out_rank)) \
    X(kina_distributed_size, kina_py_distributed_size, (int32_t *out_size), (out_size)) \
    X(kina_distributed_barrier, kina_py_distributed_barrier, (void), ()) \
    X(kina_distributed_abort, kina_py_distributed_abort, (int32_t code), (code))
