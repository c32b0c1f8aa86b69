/* kernels.c: float32 loops NumPy has no fused form of: the logistic function in
 * one pass (speedups.logistic_f32), and softmax cross-entropy and its gradient
 * over rows (cross_entropy_sum_f32, cross_entropy_grad_f32: below), and softmax
 * and log_softmax over rows (softmax_rows_f32).
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
#include <math.h>
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

/* Whether an output buffer may be written from an input one element by
 * element: the same memory (in place) or none shared. */
static int
same_or_apart(const Py_buffer *in, const Py_buffer *out)
{
    uintptr_t ib = (uintptr_t)in->buf, ob = (uintptr_t)out->buf;
    return ib == ob || ib + (uintptr_t)in->len <= ob || ob + (uintptr_t)out->len <= ib;
}

/* logistic_f32(x, out) */
static PyObject *
logistic_into(PyObject *x_obj, PyObject *out_obj)
{
    Py_buffer out, x;
    if (!kfx_two_buffers(out_obj, PyBUF_WRITABLE | PyBUF_FORMAT, x_obj, PyBUF_FORMAT, &out, &x))
        Py_RETURN_NOTIMPLEMENTED;
    int ok = native_float32(&x) && native_float32(&out) && x.len == out.len && same_or_apart(&x, &out);
    if (ok)
        KFX_WITHOUT_GIL_IF_LONG(x.len, logistic_loop(x.buf, out.buf, x.len / 4));
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

/* ---- softmax cross-entropy over rows of float32 logits ----------------------------
 *
 * gpu_ops.cross_entropy and cross_entropy_grad compute, per row of classes,
 * the maximum, the shifted exponentials and their sum with NumPy: five or six
 * ufunc calls per block, each a microsecond of dispatch.  A training step's
 * logits are small (batch x classes), so the dispatch was most of the op: a
 * 16 x 10 loss and its gradient took 11 us each, the same formula written by
 * hand in NumPy 10 and 8.  These loops make one call of it, and are also
 * the blocks of large inputs (kernel_threads splits the rows).  The NumPy
 * formula stays the reference (KINA_FX_PURE_PYTHON=1, other types, strided
 * buffers); the two agree to a few units in the last place. */

/* e^d for d <= 0: 0 where it is below the smallest normal float32, as the
 * softmax kernels document (d = -inf gives 0). */
static inline float
exp_nonpositive(float d)
{
    float c = d > -KFX_LOG_FLT_MIN_INV ? d : -KFX_LOG_FLT_MIN_INV;
    float e = exp_in_range(c);
    return d < -KFX_LOG_FLT_MIN_INV ? 0.0f : e;
}

/* Sixteen lanes, combined: a tree, not a chain of sixteen dependent adds. */
static inline float
sum16(float *acc)
{
    for (int width = 8; width; width >>= 1)
        for (int k = 0; k < width; k++)
            acc[k] += acc[k + width];
    return acc[0];
}

static inline float
max16(float *acc)
{
    for (int width = 8; width; width >>= 1)
        for (int k = 0; k < width; k++)
            acc[k] = acc[k + width] > acc[k] ? acc[k + width] : acc[k];
    return acc[0];
}

/* The maximum of x[0..n) (n >= 1), NaN if any element is NaN: sixteen
 * running maxima (GCC vectorises no float reduction, nor one whose result
 * depends on the order), the last partial sixteen padded with -inf.  The row
 * helpers are inlined into the loops over rows, which carry the vector
 * clones: a call through a clone's resolver costs more than a short row. */
static inline float
row_max(const float *x, Py_ssize_t n)
{
    float acc[16];
    int nan = 0;
    for (int k = 0; k < 16; k++)
        acc[k] = -INFINITY;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) {
            float v = x[i + k];
            nan |= v != v;
            acc[k] = v > acc[k] ? v : acc[k];
        }
    for (Py_ssize_t k = 0; i + k < n; k++) {
        float v = x[i + k];
        nan |= v != v;
        acc[k] = v > acc[k] ? v : acc[k];
    }
    float m = max16(acc);
    return nan ? NAN : m;
}

/* e[i] = e^(x[i] - m) for i < n (e may be x), and their sum: sixteen partial
 * sums (as NumPy's pairwise sum, not one running sum), the last partial
 * sixteen computed padded with -inf (whose exponential is 0). */
static inline float
shifted_exp(const float *x, float *e, Py_ssize_t n, float m)
{
    float acc[16] = {0};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) {
            float v = exp_nonpositive(x[i + k] - m);
            e[i + k] = v;
            acc[k] += v;
        }
    Py_ssize_t rest = n - i;
    if (rest) {
        float tail[16];
        for (int k = 0; k < 16; k++)
            tail[k] = k < rest ? x[i + k] : -INFINITY;
        for (int k = 0; k < 16; k++) {
            tail[k] = exp_nonpositive(tail[k] - m);
            acc[k] += tail[k];
        }
        memcpy(e + i, tail, (size_t)rest * sizeof(float));
    }
    return sum16(acc);
}

/* p[i] = (p[i] / s - (i == label)) * scale: softmax's division, the one-hot
 * subtraction and the scaling, each rounded as the NumPy formula rounds it. */
static inline void
softmax_minus_one_hot(float *p, Py_ssize_t n, float s, Py_ssize_t label, float scale)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float q = p[i] / s;
        q = i == label ? q - 1.0f : q;
        p[i] = q * scale;
    }
}

/* Whether every label is a class index (0 <= label < classes). */
static int
labels_in_range(const int64_t *labels, Py_ssize_t rows, Py_ssize_t classes)
{
    for (Py_ssize_t r = 0; r < rows; r++)
        if ((uint64_t)labels[r] >= (uint64_t)classes)
            return 0;
    return 1;
}

/* Rows of fewer than SHORT_ROW classes go sixteen at a time, transposed: a
 * class of sixteen rows is one vector, so the maxima, the exponentials and
 * the sums take a vector operation per class where row by row they take a
 * padded vector per row (ten classes: 150 cycles a row). */
#define SHORT_ROW 16

/* ``count`` (<= 16) rows from ``x`` (``classes`` < SHORT_ROW each) transposed
 * into t[class][row] (rows past ``count`` are zeros), their maxima m (NaN for
 * a row with a NaN) and the sums s of their shifted exponentials, which t
 * then holds.  Every short row takes this path, however the rows are cut
 * into blocks: a row's result does not depend on its neighbours. */
static inline void
short_rows_exp(const float *x, Py_ssize_t count, Py_ssize_t classes, float t[SHORT_ROW][16],
               float m[16], float s[16])
{
    int nan[16] = {0};
    if (count < 16)
        memset(t, 0, sizeof(float[SHORT_ROW][16]));
    for (Py_ssize_t k = 0; k < count; k++)
        for (Py_ssize_t j = 0; j < classes; j++)
            t[j][k] = x[k * classes + j];
    for (int k = 0; k < 16; k++) {
        m[k] = -INFINITY;
        s[k] = 0.0f;
    }
    for (Py_ssize_t j = 0; j < classes; j++)
        for (int k = 0; k < 16; k++) {
            float v = t[j][k];
            nan[k] |= v != v;
            m[k] = v > m[k] ? v : m[k];
        }
    for (int k = 0; k < 16; k++)
        m[k] = nan[k] ? NAN : m[k];
    for (Py_ssize_t j = 0; j < classes; j++)
        for (int k = 0; k < 16; k++) {
            float e = exp_nonpositive(t[j][k] - m[k]);
            t[j][k] = e;
            s[k] += e;
        }
}

/* t[class][row] (short_rows_exp's layout) back into ``count`` rows at ``out``. */
static inline void
store_short_rows(float *out, float t[SHORT_ROW][16], Py_ssize_t count, Py_ssize_t classes)
{
    for (Py_ssize_t k = 0; k < count; k++)
        for (Py_ssize_t j = 0; j < classes; j++)
            out[k * classes + j] = t[j][k];
}

/* The maximum of ``row``; where it is NaN or infinite, the whole row of the
 * result is NaN (as the formula gives): ``orow`` is filled with it. */
static inline float
row_max_else_nan_row(const float *row, float *orow, Py_ssize_t classes)
{
    float m = row_max(row, classes);
    if (!isfinite(m))
        for (Py_ssize_t i = 0; i < classes; i++)
            orow[i] = NAN;
    return m;
}

/* sum over rows of logsumexp(row) - row[label], in double; NaN for a row
 * whose maximum is NaN or infinite, as the formula gives.  ``scratch``
 * holds one row's exponentials. */
KFX_VECTOR_CLONES static double
cross_entropy_rows(const float *x, const int64_t *labels, Py_ssize_t rows, Py_ssize_t classes,
                   float *scratch)
{
    double total = 0.0;
    if (classes < SHORT_ROW) {
        for (Py_ssize_t r = 0; r < rows; r += 16) {
            Py_ssize_t count = rows - r < 16 ? rows - r : 16;
            float t[SHORT_ROW][16], m[16], s[16];
            const float *block = x + r * classes;
            short_rows_exp(block, count, classes, t, m, s);
            for (Py_ssize_t k = 0; k < count; k++)
                total += isfinite(m[k])
                    ? (log((double)s[k]) + (double)m[k]) - (double)block[k * classes + labels[r + k]]
                    : NAN;
        }
        return total;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *row = x + r * classes;
        float m = row_max(row, classes);
        if (!isfinite(m)) {
            total += NAN;
            continue;
        }
        float s = shifted_exp(row, scratch, classes, m);
        total += (log((double)s) + (double)m) - (double)row[labels[r]];
    }
    return total;
}

KFX_VECTOR_CLONES static void
cross_entropy_grad_rows(const float *x, const int64_t *labels, Py_ssize_t rows, Py_ssize_t classes,
                        float scale, float *out)
{
    if (classes < SHORT_ROW) {
        for (Py_ssize_t r = 0; r < rows; r += 16) {
            Py_ssize_t count = rows - r < 16 ? rows - r : 16;
            float t[SHORT_ROW][16], m[16], s[16];
            int64_t label[16];
            short_rows_exp(x + r * classes, count, classes, t, m, s);
            for (int k = 0; k < 16; k++)
                label[k] = k < count ? labels[r + k] : -1;
            for (Py_ssize_t j = 0; j < classes; j++)
                for (int k = 0; k < 16; k++) {
                    float q = t[j][k] / s[k];
                    q = j == label[k] ? q - 1.0f : q;
                    t[j][k] = isfinite(m[k]) ? q * scale : NAN;
                }
            store_short_rows(out + r * classes, t, count, classes);
        }
        return;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *row = x + r * classes;
        float *orow = out + r * classes;
        float m = row_max_else_nan_row(row, orow, classes);
        if (!isfinite(m))
            continue;
        float s = shifted_exp(row, orow, classes, m);
        softmax_minus_one_hot(orow, classes, s, (Py_ssize_t)labels[r], scale);
    }
}

/* softmax (log_softmax: ``log``) of each row of x into out: the formula's
 * steps in its order and roundings, the exponentials in out (softmax) or in
 * ``scratch`` (log_softmax); a row whose maximum is NaN or infinite is NaN. */
KFX_VECTOR_CLONES static void
softmax_rows(const float *x, float *out, Py_ssize_t rows, Py_ssize_t classes, int log,
             float *scratch)
{
    if (classes < SHORT_ROW) {
        for (Py_ssize_t r = 0; r < rows; r += 16) {
            Py_ssize_t count = rows - r < 16 ? rows - r : 16;
            float t[SHORT_ROW][16], m[16], s[16], lse[16];
            const float *block = x + r * classes;
            float *oblock = out + r * classes;
            short_rows_exp(block, count, classes, t, m, s);
            if (log) {
                for (int k = 0; k < 16; k++)
                    lse[k] = isfinite(m[k]) ? logf(s[k]) + m[k] : NAN;
                for (Py_ssize_t k = 0; k < count; k++)
                    for (Py_ssize_t j = 0; j < classes; j++)
                        oblock[k * classes + j] = block[k * classes + j] - lse[k];
                continue;
            }
            for (Py_ssize_t j = 0; j < classes; j++)
                for (int k = 0; k < 16; k++)
                    t[j][k] = isfinite(m[k]) ? t[j][k] / s[k] : NAN;
            store_short_rows(oblock, t, count, classes);
        }
        return;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *row = x + r * classes;
        float *orow = out + r * classes;
        float m = row_max_else_nan_row(row, orow, classes);
        if (!isfinite(m))
            continue;
        if (log) {
            float lse = logf(shifted_exp(row, scratch, classes, m)) + m;
            for (Py_ssize_t i = 0; i < classes; i++)
                orow[i] = row[i] - lse;
        } else {
            float s = shifted_exp(row, orow, classes, m);
            for (Py_ssize_t i = 0; i < classes; i++)
                orow[i] = orow[i] / s;
        }
    }
}

static int
native_int64(const Py_buffer *view)
{
    return view->itemsize == 8 && view->format != NULL
        && (strcmp(view->format, "l") == 0 || strcmp(view->format, "q") == 0);
}

/* The logits' buffer as rows x classes, with labels one per row: 1, or 0
 * (nothing held) when they are not C-contiguous float32 logits of rank >= 1
 * with at least one row and one class and C-contiguous int64 labels, one
 * per row. */
static int
logits_and_labels(PyObject *logits_obj, PyObject *labels_obj, Py_buffer *x, Py_buffer *labels,
                  Py_ssize_t *rows, Py_ssize_t *classes)
{
    if (!kfx_two_buffers(logits_obj, PyBUF_FORMAT, labels_obj, PyBUF_FORMAT, x, labels))
        return 0;
    if (native_float32(x) && native_int64(labels) && x->ndim >= 1 && x->shape[x->ndim - 1] > 0) {
        *classes = x->shape[x->ndim - 1];
        *rows = x->len / 4 / *classes;
        if (*rows > 0 && labels->len / 8 == *rows)
            return 1;
    }
    PyBuffer_Release(x);
    PyBuffer_Release(labels);
    return 0;
}

/* cross_entropy_sum_f32(logits, labels) */
static PyObject *
cross_entropy_sum(PyObject *logits_obj, PyObject *labels_obj)
{
    Py_buffer x, labels;
    Py_ssize_t rows, classes;
    if (!logits_and_labels(logits_obj, labels_obj, &x, &labels, &rows, &classes))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *result = NULL;
    /* a row's exponentials, for rows taken one at a time */
    float *scratch = classes < SHORT_ROW ? NULL : PyMem_RawMalloc((size_t)classes * sizeof(float));
    if (classes >= SHORT_ROW && scratch == NULL)
        PyErr_NoMemory();
    else if (!labels_in_range(labels.buf, rows, classes))
        result = Py_NewRef(Py_None);
    else {
        double total;
        KFX_WITHOUT_GIL_IF_LONG(x.len, total = cross_entropy_rows(x.buf, labels.buf, rows, classes, scratch));
        result = PyFloat_FromDouble(total);
    }
    PyMem_RawFree(scratch);
    PyBuffer_Release(&x);
    PyBuffer_Release(&labels);
    return result;
}

PyDoc_STRVAR(cross_entropy_sum_f32_doc,
"cross_entropy_sum_f32(logits, labels)\n--\n\n"
"The sum over rows of logsumexp(row) - row[label] (a float, summed in double),\n"
"for C-contiguous float32 logits of rank >= 1 (classes last, at least one row and\n"
"one class) and C-contiguous int64 labels, one per row; None when a label is not\n"
"in [0, classes); NotImplemented for any other buffers.  A row whose maximum is\n"
"NaN or infinite counts NaN.");

KFX_FASTCALL2(cross_entropy_sum_f32, cross_entropy_sum)

/* cross_entropy_grad_f32(logits, labels, scale, out) */
static PyObject *
cross_entropy_grad_f32(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError,
                            "cross_entropy_grad_f32() takes 4 arguments (%zd given)", nargs);
    double scale = PyFloat_AsDouble(args[2]);
    if (scale == -1.0 && PyErr_Occurred())
        return NULL;
    Py_buffer x, labels, out;
    Py_ssize_t rows, classes;
    if (!logits_and_labels(args[0], args[1], &x, &labels, &rows, &classes))
        Py_RETURN_NOTIMPLEMENTED;
    if (PyObject_GetBuffer(args[3], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&x);
        PyBuffer_Release(&labels);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result;
    if (!(native_float32(&out) && out.len == x.len && same_or_apart(&x, &out)))
        result = Py_NewRef(Py_NotImplemented);
    else if (!labels_in_range(labels.buf, rows, classes))
        result = Py_NewRef(Py_None);
    else {
        KFX_WITHOUT_GIL_IF_LONG(x.len, cross_entropy_grad_rows(x.buf, labels.buf, rows, classes,
                                                               (float)scale, out.buf));
        result = Py_NewRef(Py_True);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&labels);
    PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(cross_entropy_grad_f32_doc,
"cross_entropy_grad_f32(logits, labels, scale, out)\n--\n\n"
"Write (softmax(row) - one_hot(label)) * scale into out row by row and return\n"
"True, for logits and labels as cross_entropy_sum_f32 takes them and a\n"
"C-contiguous float32 out of the logits' length that is the same memory or\n"
"shares none; None, having written nothing, when a label is not in\n"
"[0, classes); NotImplemented, having written nothing, for any other buffers.\n"
"A row whose maximum is NaN or infinite is NaN.");

/* softmax_rows_f32(x, out, log) */
static PyObject *
softmax_rows_f32(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "softmax_rows_f32() takes 3 arguments (%zd given)", nargs);
    int log = PyObject_IsTrue(args[2]);
    if (log < 0)
        return NULL;
    Py_buffer out, x;
    if (!kfx_two_buffers(args[1], PyBUF_WRITABLE | PyBUF_FORMAT, args[0], PyBUF_FORMAT, &out, &x))
        Py_RETURN_NOTIMPLEMENTED;
    int ok = native_float32(&x) && native_float32(&out) && x.len == out.len && same_or_apart(&x, &out)
        && x.ndim >= 1 && x.shape[x.ndim - 1] > 0;
    PyObject *result = Py_NotImplemented;
    float *scratch = NULL;
    if (ok) {
        Py_ssize_t classes = x.shape[x.ndim - 1], rows = x.len / 4 / classes;
        /* log_softmax's exponentials of a row taken alone (softmax's go to out) */
        int needs_scratch = log && classes >= SHORT_ROW;
        scratch = needs_scratch ? PyMem_RawMalloc((size_t)classes * sizeof(float)) : NULL;
        if (needs_scratch && scratch == NULL)
            result = PyErr_NoMemory();
        else {
            KFX_WITHOUT_GIL_IF_LONG(x.len, softmax_rows(x.buf, out.buf, rows, classes, log, scratch));
            result = Py_True;
        }
    }
    PyMem_RawFree(scratch);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return Py_XNewRef(result);
}

PyDoc_STRVAR(softmax_rows_f32_doc,
"softmax_rows_f32(x, out, log)\n--\n\n"
"Write the softmax (log_softmax when log is true) of each row of x (the last\n"
"axis) into out and return True, for C-contiguous float32 buffers of the same\n"
"length, rank >= 1 and at least one class, that are the same memory or share\n"
"none; NotImplemented, having written nothing, for any others.  A row whose\n"
"maximum is NaN or infinite is NaN.");

/* labels_in_range_i64(labels, classes) */
static PyObject *
labels_in_range_i64(PyObject *labels_obj, PyObject *classes_obj)
{
    Py_ssize_t classes = PyLong_AsSsize_t(classes_obj);
    if (classes == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer labels;
    if (PyObject_GetBuffer(labels_obj, &labels, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = native_int64(&labels)
        ? PyBool_FromLong(labels_in_range(labels.buf, labels.len / 8, classes))
        : Py_NewRef(Py_NotImplemented);
    PyBuffer_Release(&labels);
    return result;
}

PyDoc_STRVAR(labels_in_range_i64_doc,
"labels_in_range_i64(labels, classes)\n--\n\n"
"Whether every label of a C-contiguous int64 buffer is in [0, classes);\n"
"NotImplemented for any other buffer.");

KFX_FASTCALL2(labels_in_range_i64_call, labels_in_range_i64)

PyMethodDef kfx_kernels_methods[] = {
    {"labels_in_range_i64", (PyCFunction)(void (*)(void))labels_in_range_i64_call, METH_FASTCALL,
     labels_in_range_i64_doc},
    {"softmax_rows_f32", (PyCFunction)(void (*)(void))softmax_rows_f32, METH_FASTCALL, softmax_rows_f32_doc},
    {"logistic_f32", (PyCFunction)(void (*)(void))logistic_f32, METH_FASTCALL, logistic_f32_doc},
    {"cross_entropy_sum_f32", (PyCFunction)(void (*)(void))cross_entropy_sum_f32, METH_FASTCALL,
     cross_entropy_sum_f32_doc},
    {"cross_entropy_grad_f32", (PyCFunction)(void (*)(void))cross_entropy_grad_f32, METH_FASTCALL,
     cross_entropy_grad_f32_doc},
    {NULL, NULL, 0, NULL},
};
