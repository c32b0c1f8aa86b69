/* buffers.c: the byte comparison behind a tape's overwrite check.
 *
 * Transcribes the C-contiguous case of kina_fx.autograd.memory._unchanged
 * (whose NumPy comparison stays the reference, and what runs under
 * KINA_FX_PURE_PYTHON=1): a tape compares every buffer a recorded op reads
 * with the values it recorded, bit for bit.  NumPy's ``(a.view(u) ==
 * b.view(u)).all()`` makes a boolean temporary and two passes, and costs
 * microseconds of dispatch on the small buffers of a typical op; memcmp
 * makes one pass and none.
 */
#include "speedups.h"

#include <string.h>

/* Large comparisons release the GIL: other threads (the kernels' pool) go on. */
#define KFX_RELEASE_GIL_BYTES (1 << 16)

/* same_bytes(a, b) */
static PyObject *
compare_bytes(PyObject *first, PyObject *second)
{
    Py_buffer a, b;
    if (PyObject_GetBuffer(first, &a, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (PyObject_GetBuffer(second, &b, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&a);
        Py_RETURN_NOTIMPLEMENTED;
    }
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
    return PyBool_FromLong(same);
}

PyDoc_STRVAR(same_bytes_doc,
"same_bytes(a, b)\n--\n\n"
"Whether two C-contiguous buffers hold the same bytes (memcmp).  NotImplemented\n"
"when either is not a C-contiguous buffer (a strided view, a device array):\n"
"the caller compares them another way.  The caller checks shape and type.");

KFX_FASTCALL2(same_bytes, compare_bytes)

PyMethodDef kfx_buffers_methods[] = {
    {"same_bytes", (PyCFunction)(void (*)(void))same_bytes, METH_FASTCALL, same_bytes_doc},
    {NULL, NULL, 0, NULL},
};
