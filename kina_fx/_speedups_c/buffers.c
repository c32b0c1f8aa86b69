/* buffers.c: the byte comparison behind a tape's overwrite check, and its copy.
 *
 * Transcribes the C-contiguous cases of kina_fx.autograd.memory._unchanged
 * and of the tracer's write of a result into its output buffer (whose NumPy
 * comparison and assignment stay the references, and what runs under
 * KINA_FX_PURE_PYTHON=1): a tape compares every buffer a recorded op reads
 * with the values it recorded, bit for bit, and writes every result.  NumPy's ``(a.view(u) ==
 * b.view(u)).all()`` makes a boolean temporary and two passes, and costs
 * microseconds of dispatch on the small buffers of a typical op; memcmp
 * makes one pass and none.
 */
#include "speedups.h"

#include <string.h>

/* Large comparisons release the GIL: other threads (the kernels' pool) go on. */
#define KFX_RELEASE_GIL_BYTES (1 << 16)

PyDoc_STRVAR(same_bytes_doc,
"same_bytes(a, b)\n--\n\n"
"Whether two C-contiguous buffers hold the same bytes (memcmp).  NotImplemented\n"
"when either is not a C-contiguous buffer (a strided view, a device array):\n"
"the caller compares them another way.  The caller checks shape and type.");

/* Both arguments' buffers, C-contiguous (the first with ``first_flags`` too):
 * 1 when both are held (the caller releases them), 0 when either is not such
 * a buffer (nothing held, no error: the caller answers NotImplemented), -1
 * with an exception set for a wrong number of arguments. */
static int
two_buffers(const char *name, PyObject *const *args, Py_ssize_t nargs, int first_flags,
            Py_buffer *a, Py_buffer *b)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s takes 2 arguments, got %zd", name, nargs);
        return -1;
    }
    if (PyObject_GetBuffer(args[0], a, PyBUF_C_CONTIGUOUS | first_flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyObject_GetBuffer(args[1], b, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyBuffer_Release(a);
        return 0;
    }
    return 1;
}

static PyObject *
same_bytes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer a, b;
    int held = two_buffers("same_bytes", args, nargs, 0, &a, &b);
    if (held <= 0)
        return held < 0 ? NULL : Py_NewRef(Py_NotImplemented);
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

PyDoc_STRVAR(copy_bytes_doc,
"copy_bytes(dst, src)\n--\n\n"
"Copy the bytes of C-contiguous buffer src into C-contiguous writable buffer dst of\n"
"the same length (memmove) and return True; NotImplemented, having written\n"
"nothing, when either is not such a buffer or their lengths differ.  The caller\n"
"checks shape and type.");

static PyObject *
copy_bytes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer dst, src;
    int held = two_buffers("copy_bytes", args, nargs, PyBUF_WRITABLE, &dst, &src);
    if (held <= 0)
        return held < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    int same = dst.len == src.len;
    if (same && dst.buf != src.buf && dst.len > 0) {
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
    if (!same)
        Py_RETURN_NOTIMPLEMENTED;
    Py_RETURN_TRUE;
}

PyMethodDef kfx_buffers_methods[] = {
    {"same_bytes", (PyCFunction)(void (*)(void))same_bytes, METH_FASTCALL, same_bytes_doc},
    {"copy_bytes", (PyCFunction)(void (*)(void))copy_bytes, METH_FASTCALL, copy_bytes_doc},
    {NULL, NULL, 0, NULL},
};
