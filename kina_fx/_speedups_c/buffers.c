/* buffers.c: the byte comparison behind a tape's overwrite check, and its copy.
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
    else if (a.len < KFX_RELEASE_GIL_BYTES)
        same = memcmp(a.buf, b.buf, (size_t)a.len) == 0;
    else {
        Py_BEGIN_ALLOW_THREADS
        same = memcmp(a.buf, b.buf, (size_t)a.len) == 0;
        Py_END_ALLOW_THREADS
    }
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
    if (same_length && dst.buf != src.buf && dst.len > 0) {
        if (dst.len < KFX_RELEASE_GIL_BYTES)
            memmove(dst.buf, src.buf, (size_t)dst.len);
        else {
            Py_BEGIN_ALLOW_THREADS
            memmove(dst.buf, src.buf, (size_t)dst.len);
            Py_END_ALLOW_THREADS
        }
    }
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

PyMethodDef kfx_buffers_methods[] = {
    {"same_bytes", (PyCFunction)(void (*)(void))same_bytes, METH_FASTCALL, same_bytes_doc},
    {"copy_bytes", (PyCFunction)(void (*)(void))copy_bytes, METH_FASTCALL, copy_bytes_doc},
    {NULL, NULL, 0, NULL},
};
