/* kina_fx.h -- the C ABI of libkina_fx.so (the Kina runtime, Python implementation).
 *
 * Link with:  cc host.c $(kina-fx config --cflags --libs)
 *
 * Every function that can fail returns an int32_t status (KINA_STATUS_*).  On a
 * non-zero status, kina_last_error() returns a message describing the failure
 * (thread-local, valid until the next failure on the same thread).  No failure
 * unwinds into the caller and nothing is printed.  See docs/abi.md.
 */
#ifndef KINA_FX_H
#define KINA_FX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: major * 1000 + minor.  Minor bumps only add functions. */
#define KINA_ABI_VERSION_MAJOR 1
#define KINA_ABI_VERSION_MINOR 0
#define KINA_ABI_VERSION (KINA_ABI_VERSION_MAJOR * 1000 + KINA_ABI_VERSION_MINOR)

/* Status codes: mirror kina_fx/errors.py Status (checked by tests/test_abi_header.py). */
#define KINA_STATUS_SUCCESS 0
#define KINA_STATUS_VALIDATION 1
#define KINA_STATUS_RESOURCE 2
#define KINA_STATUS_GPU 3
#define KINA_STATUS_UNIMPLEMENTED 4
#define KINA_STATUS_INTERNAL 5
#define KINA_STATUS_TYPE 6
#define KINA_STATUS_CANCELLED 7
#define KINA_STATUS_UNHANDLED 8

/* Largest rank a memref may have (larger ranks are a validation error). */
#define KINA_MAX_RANK 32

/* MLIR's unranked memref as passed by `llvm.emit_c_interface`:
 * `descriptor` points to a ranked descriptor (kina_memref_descriptor_t). */
typedef struct {
    int64_t rank;
    void *descriptor;
} kina_unranked_memref_t;

/* MLIR's ranked (strided) memref descriptor.  `sizes_and_strides` holds
 * sizes[rank] followed by strides[rank], strides counted in elements. */
typedef struct {
    void *allocated;
    void *aligned;
    int64_t offset;
    int64_t sizes_and_strides[];
} kina_memref_descriptor_t;

/* ---- library ---------------------------------------------------------- */
int32_t kina_abi_version(void);
const char *kina_last_error(void);

/* ---- memref runtime (shared/seeds/000, 001) ---------------------------- */
/* dst <- src (same shape, any strides); `device` is the CUDA device ordinal
 * (0 on the CPU backend), anything else is KINA_STATUS_VALIDATION. */
int32_t _mlir_ciface_runtime_copy_to_device_f32(kina_unranked_memref_t *dst,
                                                kina_unranked_memref_t *src, int32_t device);
int32_t _mlir_ciface_runtime_copy_to_device_f16(kina_unranked_memref_t *dst,
                                                kina_unranked_memref_t *src, int32_t device);
/* dst (host) <- src (device or host), same shape. */
int32_t _mlir_ciface_runtime_copy_to_host_f32(kina_unranked_memref_t *dst,
                                              kina_unranked_memref_t *src);
/* out = a @ b with NumPy's matmul rules (batched for rank >= 3). */
int32_t _mlir_ciface_runtime_gpu_matmul_f32(kina_unranked_memref_t *out,
                                            kina_unranked_memref_t *a,
                                            kina_unranked_memref_t *b);
/* out = values[indices]: rows of `values`; out.shape = indices.shape + values.shape[1:]. */
int32_t _mlir_ciface_runtime_gpu_gather_f32(kina_unranked_memref_t *out,
                                            kina_unranked_memref_t *values,
                                            kina_unranked_memref_t *indices);
/* out = softmax(x) along `axis` (negative counts from the end); out may alias x. */
int32_t _mlir_ciface_runtime_gpu_softmax_f32(kina_unranked_memref_t *out,
                                             kina_unranked_memref_t *x, int32_t axis);
/* out = x with every element repeated `reps` times along `axis`. */
int32_t _mlir_ciface_runtime_gpu_repeat_interleave_f32(kina_unranked_memref_t *out,
                                                       kina_unranked_memref_t *x,
                                                       int32_t axis, int32_t reps);
/* Fill the nested descriptor of `memref` (sizes set, no storage) in place:
 * allocated/aligned/offset/row-major strides of a new buffer of
 * product(sizes) * element_size bytes; element_size must be 2, 4 or 8. */
int32_t _mlir_ciface_runtime_gpu_alloc_unranked(kina_unranked_memref_t *memref,
                                                int32_t element_size);
/* Free every buffer runtime_gpu_alloc_unranked returned; safe to repeat. */
int32_t runtime_gpu_free_all(void);

/* ## Effects C ABI: added by a later version (see docs/abi.md). */

#ifdef __cplusplus
}
#endif
#endif /* KINA_FX_H */
