/* The tape ABI's exports (autograd tapes over memrefs, docs/autograd-abi.md), in
 * the X(exported name, Python callback name, (parameters), (arguments)) form of
 * KINA_EXPORTS (kina_runtime.c).  Keep one entry per line: build.py parses
 * these lines.  Callbacks: kina_fx/ffi/tapes.py. */
#define KINA_TAPE_EXPORTS(X) \
    X(kina_tape_begin, kina_py_tape_begin, (int32_t flags, kina_tape_t *out_tape), (flags, out_tape)) \
    X(kina_tape_watch, kina_py_tape_watch, (kina_tape_t tape, kina_unranked_memref_t *buffer, int32_t dtype), (tape, buffer, dtype)) \
    X(kina_tape_constant, kina_py_tape_constant, (kina_tape_t tape, kina_unranked_memref_t *buffer, int32_t dtype), (tape, buffer, dtype)) \
    X(kina_tape_end, kina_py_tape_end, (kina_tape_t tape), (tape)) \
    X(kina_tape_backward, kina_py_tape_backward, (kina_tape_t tape, kina_unranked_memref_t *output, kina_unranked_memref_t *cotangent), (tape, output, cotangent)) \
    X(kina_tape_grad, kina_py_tape_grad, (kina_tape_t tape, kina_unranked_memref_t *watched, kina_unranked_memref_t *out_grad), (tape, watched, out_grad)) \
    X(kina_tape_free, kina_py_tape_free, (kina_tape_t tape), (tape)) \
    X(_mlir_ciface_kina_tape_begin, kina_py_mlir_tape_begin, (kina_unranked_memref_t *out_handle, int32_t flags), (out_handle, flags)) \
    X(_mlir_ciface_kina_tape_watch_f32, kina_py_mlir_tape_watch_f32, (int64_t tape, kina_unranked_memref_t *buffer), (tape, buffer)) \
    X(_mlir_ciface_kina_tape_constant_f32, kina_py_mlir_tape_constant_f32, (int64_t tape, kina_unranked_memref_t *buffer), (tape, buffer)) \
    X(_mlir_ciface_kina_tape_constant_i64, kina_py_mlir_tape_constant_i64, (int64_t tape, kina_unranked_memref_t *buffer), (tape, buffer)) \
    X(_mlir_ciface_kina_tape_backward_f32, kina_py_mlir_tape_backward_f32, (int64_t tape, kina_unranked_memref_t *output, kina_unranked_memref_t *cotangent), (tape, output, cotangent)) \
    X(_mlir_ciface_kina_tape_grad_f32, kina_py_mlir_tape_grad_f32, (int64_t tape, kina_unranked_memref_t *watched, kina_unranked_memref_t *out_grad), (tape, watched, out_grad))
