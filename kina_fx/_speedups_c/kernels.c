/* kernels.c: the float32 logistic function in one pass (speedups.logistic_f32).
 *
 * gpu_ops.sigmoid computes 1 / (1 + e^-x) for large arrays with NumPy's
 * ufuncs, four passes over each cached block (negate, exp, add, divide):
 * about twice a copy's time, where PyTorch's fused loop takes a copy's.
 * NumPy has no fused logistic function, so this file has one: the same
 * formula in one pass, e^-x by its own vectorisable polynomial.  The NumPy
 * formula (gpu_ops._logistic_formula) stays the reference, and what runs
 * under KINA_FX_PURE_PYTHON=1, for float64, and for buffers this function
 * declines; the two agree to a few units in the last place
 * (tests/abi/test_kernel_blocks.py).
 *
 * Results: NaN for NaN, 1 for +inf and large x, and 0 wherever the logistic
 * function is below the smallest normal float32 (x < -87.34), as the
 * sigmoid kernel documents.  Floating-point conditions raise no flags
 * anyone reads: the polynomial never overflows (its argument is clamped).
 */
#include "speedups.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

/* Vector clones for the machine it runs on (GCC's function multiversioning,
 * resolved when the module loads); elsewhere the compiler's own choice.  GCC
 * vectorises the loop at -O2 only when told to (its default cost model there
 * refuses a loop that needs a check that ``x`` and ``out`` do not overlap):
 * built with a Python whose CFLAGS say -O2, the loop was scalar, ~10x slower. */
#if defined(__GNUC__) && !defined(__clang__)
#define KFX_VECTORISE optimize("tree-vectorize", "vect-cost-model=dynamic")
#if defined(__x86_64__) && defined(__linux__)
#define KFX_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), KFX_VECTORISE))
#else
#define KFX_VECTOR_CLONES __attribute__((KFX_VECTORISE))
#endif
#else
#define KFX_VECTOR_CLONES
#endif

/* ln(2^126): e^x of a larger x makes the logistic function of -x subnormal. */
#define KFX_LOG_FLT_MIN_INV 87.33654f

/* e^x for -87.34 <= x <= 87.34: x = n ln2 + r with |r| <= ln2 / 2 (Cody and
 * Waite's two-part ln2, exact products for |n| <= 126), e^r by its Taylor
 * polynomial of degree 7 (remainder below 1.2e-8 relative), 2^n from the
 * exponent bits. */
static inline float
exp_in_range(float x)
{
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float shift = 12582912.0f;             /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * log2e + shift;
    float n = t - shift;
    float r = x - n * ln2_hi;
    r = r - n * ln2_lo;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);              /* t's low mantissa bits hold n */
    uint32_t scale_bits = (bits - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

/* The clamp is written as min and max (``a < b ? a : b``, NaN -> the bound),
 * so every element takes the same steps and the special cases are selected
 * at the end: clamped the other way round, GCC's if-conversion computed the
 * division twice, under two masks. */
KFX_VECTOR_CLONES static void
logistic_loop(const float *x, float *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float v = x[i];
        float m = -v;
        float c = m < KFX_LOG_FLT_MIN_INV ? m : KFX_LOG_FLT_MIN_INV;
        c = c > -KFX_LOG_FLT_MIN_INV ? c : -KFX_LOG_FLT_MIN_INV;
        float s = 1.0f / (1.0f + exp_in_range(c));
        s = m > KFX_LOG_FLT_MIN_INV ? 0.0f : s;
        s = s < FLT_MIN ? 0.0f : s;
        out[i] = v != v ? v : s;
    }
}

static int
native_float32(const Py_buffer *view)
{
    return view->itemsize == 4 && view->format != NULL && strcmp(view->format, "f") == 0;
}

/* logistic_f32(x, out) */
static PyObject *
logistic_into(PyObject *x_obj, PyObject *out_obj)
{
    Py_buffer out, x;
    if (!kfx_two_buffers(out_obj, PyBUF_WRITABLE | PyBUF_FORMAT, x_obj, PyBUF_FORMAT, &out, &x))
        Py_RETURN_NOTIMPLEMENTED;
    /* the same length, and either the same memory (in place) or none shared */
    uintptr_t xb = (uintptr_t)x.buf, ob = (uintptr_t)out.buf;
    int apart = xb == ob || xb + (uintptr_t)x.len <= ob || ob + (uintptr_t)out.len <= xb;
    int ok = native_float32(&x) && native_float32(&out) && x.len == out.len && apart;
    if (ok) {
        Py_ssize_t n = x.len / 4;
        if (x.len < KFX_RELEASE_GIL_BYTES)
            logistic_loop(x.buf, out.buf, n);
        else {
            Py_BEGIN_ALLOW_THREADS
            logistic_loop(x.buf, out.buf, n);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        Py_RETURN_NOTIMPLEMENTED;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(logistic_f32_doc,
"logistic_f32(x, out)\n--\n\n"
"Write 1 / (1 + exp(-x)) into out, one pass over C-contiguous float32 buffers of\n"
"the same length that are the same memory or share none, and return True;\n"
"NotImplemented, having written nothing, for any other buffers (the caller\n"
"computes the NumPy formula).  Within a few units in the last place of that\n"
"formula; 0 where the result is below the smallest normal float32.");

KFX_FASTCALL2(logistic_f32, logistic_into)

PyMethodDef kfx_kernels_methods[] = {
    {"logistic_f32", (PyCFunction)(void (*)(void))logistic_f32, METH_FASTCALL, logistic_f32_doc},
    {NULL, NULL, 0, NULL},
};
