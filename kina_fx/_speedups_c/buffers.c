/* buffers.c: the byte comparison behind a tape's overwrite check, its copy, and
 * the ranked memref descriptor over a buffer (below).
 *
 * Transcribes the C-contiguous cases of kina_fx.autograd.memory._unchanged
 * and of the tracer's write of a result into its output buffer (whose NumPy
 * comparison and assignment stay the references, and what runs under
 * KINA_FX_PURE_PYTHON=1): a tape compares every buffer a recorded op reads
 * with the values it recorded, bit for bit, and writes every result.  NumPy's
 * ``(a.view(u) == b.view(u)).all()`` makes a boolean temporary and two passes,
 * and costs microseconds of dispatch on the small buffers of a typical op;
 * memcmp makes one pass and none.
 */
#include "speedups.h"

#include <string.h>

/* The buffers of ``first`` (C-contiguous, and ``first_flags``) and ``second``
 * (C-contiguous, and ``second_flags``): 1 when both are held (the caller
 * releases them), 0 when either is not such a buffer (nothing held, no error:
 * the caller answers NotImplemented).  Also kernels.c's. */
int
kfx_two_buffers(PyObject *first, int first_flags, PyObject *second, int second_flags,
                Py_buffer *a, Py_buffer *b)
{
    if (PyObject_GetBuffer(first, a, PyBUF_C_CONTIGUOUS | first_flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyObject_GetBuffer(second, b, PyBUF_C_CONTIGUOUS | second_flags) < 0) {
        PyErr_Clear();
        PyBuffer_Release(a);
        return 0;
    }
    return 1;
}

/* Whether C-contiguous buffers ``first`` and ``second`` hold the same bytes:
 * 1 / 0, or KFX_NOT_BUFFERS (either is not such a buffer; no error set).
 * Also the tape clauses' overwrite check (tape_calls.c). */
int
kfx_same_bytes(PyObject *first, PyObject *second)
{
    Py_buffer a, b;
    if (!kfx_two_buffers(first, 0, second, 0, &a, &b))
        return KFX_NOT_BUFFERS;
    int same;
    if (a.len != b.len)
        same = 0;
    else if (a.buf == b.buf || a.len == 0)
        same = 1;
    else
        KFX_WITHOUT_GIL_IF_LONG(a.len, same = memcmp(a.buf, b.buf, (size_t)a.len) == 0);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return same;
}

/* Copy C-contiguous buffer ``second`` into C-contiguous writable buffer
 * ``first`` of the same length: 1, or KFX_NOT_BUFFERS having written nothing
 * (no error set). */
int
kfx_copy_bytes(PyObject *first, PyObject *second)
{
    Py_buffer dst, src;
    if (!kfx_two_buffers(first, PyBUF_WRITABLE, second, 0, &dst, &src))
        return KFX_NOT_BUFFERS;
    int same_length = dst.len == src.len;
    if (same_length && dst.buf != src.buf && dst.len > 0)
        KFX_WITHOUT_GIL_IF_LONG(dst.len, memmove(dst.buf, src.buf, (size_t)dst.len));
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return same_length ? 1 : KFX_NOT_BUFFERS;
}

/* same_bytes(a, b) */
static PyObject *
compare_bytes(PyObject *first, PyObject *second)
{
    int same = kfx_same_bytes(first, second);
    if (same == KFX_NOT_BUFFERS)
        Py_RETURN_NOTIMPLEMENTED;
    return PyBool_FromLong(same);
}

/* copy_bytes(dst, src) */
static PyObject *
copy_into(PyObject *first, PyObject *second)
{
    if (kfx_copy_bytes(first, second) == KFX_NOT_BUFFERS)
        Py_RETURN_NOTIMPLEMENTED;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(same_bytes_doc,
"same_bytes(a, b)\n--\n\n"
"Whether two C-contiguous buffers hold the same bytes (memcmp).  NotImplemented\n"
"when either is not a C-contiguous buffer (a strided view, a device array):\n"
"the caller compares them another way.  The caller checks shape and type.");

PyDoc_STRVAR(copy_bytes_doc,
"copy_bytes(dst, src)\n--\n\n"
"Copy the bytes of C-contiguous buffer src into C-contiguous writable buffer dst of\n"
"the same length (memmove) and return True; NotImplemented, having written\n"
"nothing, when either is not such a buffer or their lengths differ.  The caller\n"
"checks shape and type.");

KFX_FASTCALL2(same_bytes, compare_bytes)
KFX_FASTCALL2(copy_bytes, copy_into)

/* ---- a ranked memref descriptor over a buffer --------------------------------
 *
 * Transcribes memref.from_numpy and UnrankedMemref.identity for the ranked
 * descriptor a compiled function's ``kina_memref_descriptor_t *`` parameter
 * takes (memref.ranked_descriptor, whose Python form stays the reference): a
 * CompiledFunction makes one for every array it has not seen, a training
 * step's fresh output and batch each call, and the Python form (the array
 * interface's dict, two cffi allocations, the words read back for the
 * identity) cost 5 us, three times that with the caches a step leaves. */

/* ``(first, identity)``, identity memref.identity's tuple: (the address of
 * the first element, the shape, the strides in elements, the dtype string). */
static PyObject *
with_identity(PyObject *first, unsigned long long address, PyObject *shape, PyObject *strides,
              PyObject *dtype_str)
{
    PyObject *key = Py_BuildValue("(KOOO)", address, shape, strides, dtype_str);
    if (key == NULL)
        return NULL;
    PyObject *pair = PyTuple_Pack(2, first, key);
    Py_DECREF(key);
    return pair;
}

/* ranked_descriptor_words(array, strides, dtype_str) */
static PyObject *
ranked_descriptor_words(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError,
                            "ranked_descriptor_words() takes 3 arguments (%zd given)", nargs);
    if (!PyTuple_CheckExact(args[1]))
        return PyErr_Format(PyExc_TypeError, "ranked_descriptor_words(): strides must be a tuple");
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    /* The byte strides are the array's own (``array.strides``): the buffer
     * protocol's may differ along a dimension of length 0 or 1. */
    Py_ssize_t rank = v.ndim, item = v.itemsize;
    int64_t byte_strides[64];
    int empty = 0, fits = item > 0 && rank <= 64 && PyTuple_GET_SIZE(args[1]) == rank;
    for (Py_ssize_t d = 0; d < rank && fits; d++) {
        long long st = PyLong_AsLongLong(PyTuple_GET_ITEM(args[1], d));
        if (st == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&v);
            return NULL;
        }
        byte_strides[d] = st;
        fits = st % item == 0;
        empty |= v.shape[d] == 0;
    }
    if (!fits) {
        PyBuffer_Release(&v);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *words = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)((3 + 2 * rank) * sizeof(int64_t)));
    PyObject *shape = PyTuple_New(rank), *strides = PyTuple_New(rank), *result = NULL;
    if (words == NULL || shape == NULL || strides == NULL)
        goto done;
    int64_t *w = (int64_t *)PyByteArray_AS_STRING(words);
    int64_t address = (int64_t)(intptr_t)v.buf;
    w[0] = w[1] = address;
    w[2] = 0;
    for (Py_ssize_t d = 0; d < rank; d++) {
        int64_t size = v.shape[d], stride = byte_strides[d] / item;
        w[3 + d] = size;
        w[3 + rank + d] = stride;
        /* the identity's strides: a length-1 dimension's counts as 0, and all of an empty array's */
        PyObject *n = PyLong_FromLongLong(size);
        PyObject *st = PyLong_FromLongLong(empty || size == 1 ? 0 : stride);
        if (n == NULL || st == NULL) {
            Py_XDECREF(n);
            Py_XDECREF(st);
            goto done;
        }
        PyTuple_SET_ITEM(shape, d, n);
        PyTuple_SET_ITEM(strides, d, st);
    }
    result = with_identity(words, empty ? 0 : (unsigned long long)(uintptr_t)v.buf, shape, strides,
                           args[2]);
done:
    Py_XDECREF(words);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    PyBuffer_Release(&v);
    return result;
}

PyDoc_STRVAR(ranked_descriptor_words_doc,
"ranked_descriptor_words(array, strides, dtype_str)\n--\n\n"
"(words, identity) of a buffer with byte strides ``strides`` (the array's own):\n"
"words a bytearray holding the ranked memref descriptor over it (allocated =\n"
"aligned = the address of its first element, offset 0, sizes, strides in\n"
"elements), identity memref.identity's tuple with dtype_str as its type.\n"
"NotImplemented for an object without a strided buffer, of rank above 64, or\n"
"with a stride that is not a multiple of the item size.");

/* ---- a NumPy view over a ranked memref descriptor --------------------------
 *
 * Transcribes ViewCache._miss for the common case (memref._decode,
 * _extent, numpy_view and _descriptor_identity, whose Python forms stay the
 * reference): a runtime op's export makes a view of every buffer it has not
 * seen, a training loop's fresh batch and labels each step, and the Python
 * form costs 6 us a view, twice that with the caches a step leaves.  Anything
 * else -- an empty or over-large memref, a null data pointer, addresses
 * outside the address space, an output whose layout is not plainly distinct
 * -- is declined, and the Python form raises its ValidationError. */

/* The byte range [*lo, *lo + *span) the view covers, and its first element at
 * *start bytes into it: 1, or 0 when the descriptor is not the common case. */
static int
view_extent(uint64_t aligned, int64_t offset, const int64_t *sizes, const int64_t *strides,
            Py_ssize_t rank, int64_t item, uint64_t *lo, uint64_t *span, uint64_t *start)
{
    int64_t bytes = item, low = offset, high = offset, step;
    if (aligned == 0)
        return 0;
    for (Py_ssize_t d = 0; d < rank; d++) {
        if (sizes[d] <= 0 || __builtin_mul_overflow(bytes, sizes[d], &bytes)
                || __builtin_mul_overflow(sizes[d] - 1, strides[d], &step)
                || __builtin_add_overflow(step < 0 ? low : high, step, step < 0 ? &low : &high))
            return 0;
    }
    int64_t low_bytes, end_bytes, offset_bytes;
    if (__builtin_mul_overflow(low, item, &low_bytes) || __builtin_add_overflow(high, 1, &high)
            || __builtin_mul_overflow(high, item, &end_bytes)
            || __builtin_mul_overflow(offset, item, &offset_bytes))
        return 0;
    /* addresses as unsigned 64-bit, the range inside [1, 2^64) (aligned > 0 and the
     * first test keep its low end off address 0) and under 2^63 bytes long */
    if ((low_bytes < 0 && (uint64_t)0 - (uint64_t)low_bytes >= aligned)
            || (end_bytes > 0 && (uint64_t)end_bytes > UINT64_MAX - aligned))
        return 0;                                    /* below address 1, or past 2^64 */
    *lo = aligned + (uint64_t)low_bytes;
    uint64_t hi = aligned + (uint64_t)end_bytes;
    if (hi <= *lo || hi - *lo > (uint64_t)INT64_MAX)
        return 0;
    *span = hi - *lo;
    *start = (uint64_t)(offset_bytes - low_bytes);    /* in [0, span): the extent holds element 0 */
    return 1;
}

/* Whether an output's elements are distinct by the simplest argument: in
 * dimension order, each dimension of length > 1 steps forward by more than
 * all the dimensions after it span together (row-major, and every stepped
 * row-major layout).  Others (column-major, reversed, permuted) go to
 * check_output_layout. */
static int
plainly_distinct(const int64_t *sizes, const int64_t *strides, Py_ssize_t rank)
{
    int64_t span = 0;
    for (Py_ssize_t d = rank - 1; d >= 0; d--) {
        if (sizes[d] == 1)
            continue;
        int64_t reach;
        if (strides[d] <= span || __builtin_mul_overflow(strides[d], sizes[d] - 1, &reach)
                || __builtin_add_overflow(span, reach, &span))
            return 0;
    }
    return 1;
}

/* view_of_descriptor(raw, rank, spec): spec = (ndarray, dtype, itemsize, dtype_str, output) */
static PyObject *
view_of_descriptor(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyTuple_CheckExact(args[2])
            || PyTuple_GET_SIZE(args[2]) != 5)
        return PyErr_Format(PyExc_TypeError, "view_of_descriptor(raw, rank, spec)");
    Py_ssize_t rank = PyLong_AsSsize_t(args[1]);
    if (rank == -1 && PyErr_Occurred())
        return NULL;
    PyObject *ndarray = PyTuple_GET_ITEM(args[2], 0), *dtype = PyTuple_GET_ITEM(args[2], 1);
    int64_t item = PyLong_AsLongLong(PyTuple_GET_ITEM(args[2], 2));
    int output = PyObject_IsTrue(PyTuple_GET_ITEM(args[2], 4));
    if ((item == -1 && PyErr_Occurred()) || output < 0)
        return NULL;
    if (rank < 0 || rank > 32 || item <= 0
            || PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)((3 + 2 * rank) * sizeof(int64_t)))
        Py_RETURN_NOTIMPLEMENTED;
    int64_t w[3 + 2 * 32];
    memcpy(w, PyBytes_AS_STRING(args[0]), (size_t)PyBytes_GET_SIZE(args[0]));
    const int64_t *sizes = w + 3, *strides = w + 3 + rank;
    uint64_t aligned = (uint64_t)w[1], lo, span, start;
    if (!view_extent(aligned, w[2], sizes, strides, rank, item, &lo, &span, &start)
            || (output && !plainly_distinct(sizes, strides, rank)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *shape = PyTuple_New(rank), *byte_strides = PyTuple_New(rank);
    PyObject *key_strides = PyTuple_New(rank), *memory = NULL, *view = NULL, *result = NULL;
    if (shape == NULL || byte_strides == NULL || key_strides == NULL)
        goto done;
    for (Py_ssize_t d = 0; d < rank; d++) {
        /* a length-1 dimension's stride never moves: 0, in the view and the identity */
        int64_t stride = sizes[d] == 1 ? 0 : strides[d];
        PyObject *n = PyLong_FromLongLong(sizes[d]), *b = PyLong_FromLongLong(stride * item);
        PyObject *k = PyLong_FromLongLong(stride);
        if (n == NULL || b == NULL || k == NULL) {
            Py_XDECREF(n);
            Py_XDECREF(b);
            Py_XDECREF(k);
            goto done;
        }
        PyTuple_SET_ITEM(shape, d, n);
        PyTuple_SET_ITEM(byte_strides, d, b);
        PyTuple_SET_ITEM(key_strides, d, k);
    }
    memory = PyMemoryView_FromMemory((char *)(uintptr_t)lo, (Py_ssize_t)span, PyBUF_WRITE);
    if (memory == NULL)
        goto done;
    PyObject *offset = PyLong_FromUnsignedLongLong(start);
    if (offset == NULL)
        goto done;
    PyObject *call[5] = {shape, dtype, memory, offset, byte_strides};
    view = PyObject_Vectorcall(ndarray, call, 5, NULL);
    Py_DECREF(offset);
    if (view == NULL)
        goto done;
    result = with_identity(view, (unsigned long long)(lo + start), shape, key_strides,
                           PyTuple_GET_ITEM(args[2], 3));
done:
    Py_XDECREF(shape);
    Py_XDECREF(byte_strides);
    Py_XDECREF(key_strides);
    Py_XDECREF(memory);
    Py_XDECREF(view);
    return result;
}

PyDoc_STRVAR(view_of_descriptor_doc,
"view_of_descriptor(raw, rank, spec)\n--\n\n"
"(view, identity) of the ranked memref descriptor whose bytes are ``raw``:\n"
"view a writable ndarray over its memory (spec = (numpy.ndarray, dtype,\n"
"itemsize, dtype.str, output)), identity memref.identity's tuple.\n"
"NotImplemented for an empty or over-large memref, a null data pointer,\n"
"addresses outside the address space, or an output whose layout is not\n"
"plainly distinct: memref.ViewCache's Python form decides those.");

PyMethodDef kfx_buffers_methods[] = {
    {"same_bytes", (PyCFunction)(void (*)(void))same_bytes, METH_FASTCALL, same_bytes_doc},
    {"copy_bytes", (PyCFunction)(void (*)(void))copy_bytes, METH_FASTCALL, copy_bytes_doc},
    {"ranked_descriptor_words", (PyCFunction)(void (*)(void))ranked_descriptor_words, METH_FASTCALL,
     ranked_descriptor_words_doc},
    {"view_of_descriptor", (PyCFunction)(void (*)(void))view_of_descriptor, METH_FASTCALL,
     view_of_descriptor_doc},
    {NULL, NULL, 0, NULL},
};
