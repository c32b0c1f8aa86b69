/* op_calls.c: a runtime op export called from C, on the CPU backend.
 *
 * Transcribes the CPU path of the callbacks of kina_fx/ffi/ops.py
 * (_make_callback): each memref operand becomes the NumPy view that
 * kina_fx.memref.ViewCache holds for its exact descriptor bytes, and the op's
 * effect is performed with the views and the int32 parameters; an exception
 * becomes a status and kina_last_error through ffi.effects._report_error, as
 * cffi's onerror hook makes it on the Python path.  The views are read from
 * the ViewCaches' own dicts (ffi.ops.FAST_ROWS names them), so a view is
 * made, checked and cached in one place, by Python.
 *
 * What it saves: the cffi callback's entry and argument boxing, and reading
 * each descriptor through cffi cdata (about a microsecond per operand).
 *
 * Anything out of the ordinary declines before anything is done, and the
 * export's cffi path (the reference) then does everything, error texts
 * included: the C ABI's fast paths off (KINA_FX_PURE_PYTHON=1, or turned
 * off), ffi.ops not imported yet (its first call takes the cffi path, which
 * imports it; the next one reads its FAST_ROWS), a null memref or descriptor, a rank out of range, a
 * descriptor whose view is not cached yet (the cffi path makes it), another
 * backend selected (KINA_FX_DEVICE), an op whose row is not bound (those
 * checking a device ordinal), or a thread without a Python thread state.
 */
#include "speedups.h"

typedef struct {
    int64_t rank;
    void *descriptor;
} kfx_unranked_memref;

#define KFX_OP_MAX_OPERANDS 8
#define KFX_OP_MAX_PARAMS 8
#define KFX_OP_MAX_RANK 32        /* kina_fx.h: KINA_MAX_RANK */

/* ffi.ops.FAST_ROWS (1) when it has the expected shape: per op, None or
 * (effect, (the ViewCache dict of each memref operand, ...)); else 0. */
int
kfx_check_op_rows(PyObject *rows)
{
    if (!PyTuple_Check(rows))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rows); i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (row == Py_None)
            continue;
        PyObject *dicts = PyTuple_Check(row) && PyTuple_GET_SIZE(row) == 2 ? PyTuple_GET_ITEM(row, 1) : NULL;
        int ok = dicts != NULL && PyTuple_Check(dicts) && PyTuple_GET_SIZE(dicts) >= 1
            && PyTuple_GET_SIZE(dicts) <= KFX_OP_MAX_OPERANDS;
        for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(dicts); k++)
            ok = PyDict_CheckExact(PyTuple_GET_ITEM(dicts, k));
        if (!ok)
            return 0;
    }
    return 1;
}

int
kfx_fast_runtime_op(int32_t op, void *const *memrefs, int32_t nmem, const int32_t *params,
                    int32_t nparams, int32_t *status)
{
    if (!kfx_c_abi_on || op < 0 || nmem < 1
            || nmem > KFX_OP_MAX_OPERANDS || nparams < 0 || nparams > KFX_OP_MAX_PARAMS)
        return KINA_FAST_DECLINED;
    Py_ssize_t bytes[KFX_OP_MAX_OPERANDS];
    for (int32_t k = 0; k < nmem; k++) {
        const kfx_unranked_memref *m = memrefs[k];
        if (m == NULL || m->rank < 0 || m->rank > KFX_OP_MAX_RANK || m->descriptor == NULL)
            return KINA_FAST_DECLINED;
        bytes[k] = (Py_ssize_t)(8 * (3 + 2 * m->rank));
    }
    kfx_gil_call g;
    if (!kfx_gil_enter(&g))
        return KINA_FAST_DECLINED;
    if (kfx_import_op_collaborators() <= 0) {        /* ffi.ops not imported yet */
        PyErr_Clear();
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *rows = Py_XNewRef(g_op_rows);
    PyObject *row = rows != NULL && op < PyTuple_GET_SIZE(rows) ? PyTuple_GET_ITEM(rows, op) : Py_None;
    if (row == Py_None || PyTuple_GET_SIZE(PyTuple_GET_ITEM(row, 1)) != nmem) {
        Py_XDECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *selected = Py_NewRef(g_cpu_selected);
    PyObject *cpu = PyObject_CallNoArgs(selected);
    Py_DECREF(selected);
    int on_cpu = cpu == Py_True;
    Py_XDECREF(cpu);
    if (!on_cpu) {
        PyErr_Clear();               /* the cffi path raises it again, properly */
        Py_DECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *dicts = PyTuple_GET_ITEM(row, 1);
    PyObject *args[1 + KFX_OP_MAX_OPERANDS + KFX_OP_MAX_PARAMS];
    Py_ssize_t n = 0;
    args[n++] = Py_NewRef(PyTuple_GET_ITEM(row, 0));
    int declined = 0;
    for (int32_t k = 0; k < nmem && !declined; k++) {
        const kfx_unranked_memref *m = memrefs[k];
        PyObject *key = PyBytes_FromStringAndSize((const char *)m->descriptor, bytes[k]);
        PyObject *view = key == NULL ? NULL : PyDict_GetItemWithError(PyTuple_GET_ITEM(dicts, k), key);
        Py_XDECREF(key);
        if (view == NULL)
            declined = 1;            /* not cached (or out of memory): the cffi path */
        else
            args[n++] = Py_NewRef(view);
    }
    for (int32_t j = 0; j < nparams && !declined; j++) {
        PyObject *p = PyLong_FromLong(params[j]);
        if (p == NULL)
            declined = 1;
        else
            args[n++] = p;
    }
    if (declined) {
        PyErr_Clear();
        while (n > 0)
            Py_DECREF(args[--n]);
        Py_DECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *perform = Py_NewRef(g_op_perform);
    PyObject *result = PyObject_Vectorcall(perform, args, (size_t)n, NULL);
    Py_DECREF(perform);
    while (n > 0)
        Py_DECREF(args[--n]);
    Py_DECREF(rows);
    if (result == NULL)
        *status = kfx_report_exception();
    else {
        Py_DECREF(result);
        *status = 0;
    }
    kfx_gil_leave(&g);
    return KINA_FAST_DONE;
}
