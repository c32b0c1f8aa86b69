/* tail.c: the tail-resume check, compiled.
 *
 * What it mirrors: handlers._returns_straight_to_driver (kept as
 * handlers._returns_straight_to_driver_py) over kina_fx/tailcalls.py: is the
 * caller of a resume a chain of frames that return the resume's result
 * unchanged to the driver loop?  The per-code tables are still computed and
 * cached in Python (tailcalls.tail_calls, which this calls on a miss).
 */
#include "speedups.h"

/* ---- the tail-resume check ------------------------------------------------------ */

/* handlers._returns_straight_to_driver, transcribed (it is the largest single
 * cost of an ``on`` perform+resume round trip in Python: ~15%).  Bound by
 * _bind_tail; the per-code tables stay in Python (handlers._tail_calls fills
 * handlers._tail_calls_by_code, read here), and so does _names_function. */
static PyObject *t_drive_code;     /* handlers._DRIVE_CODE                          */
static Py_ssize_t t_max_frames;    /* handlers._MAX_TAIL_FRAMES                     */
static PyObject *t_resume_names;   /* handlers._RESUME_NAMES (a frozenset)          */
static PyObject *t_cache;          /* handlers._tail_calls_by_code (a dict)         */
static PyObject *t_tail_calls;     /* handlers._tail_calls                          */
static PyObject *t_names_function; /* handlers._names_function                      */

/* ``_tail_calls(code)`` (new reference): the cached table when its entry is for
 * this very code object, else the Python function (which fills the cache). */
static PyObject *
tail_calls(PyObject *code)
{
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(t_cache, key);
    Py_DECREF(key);
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 &&
            PyTuple_GET_ITEM(entry, 0) == code)
        return Py_NewRef(PyTuple_GET_ITEM(entry, 1));
    if (entry == NULL && PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(t_tail_calls, code);
}

static PyObject *
frame_lasti(PyFrameObject *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyLong_FromLong(PyFrame_GetLasti(frame));
#else
    return PyObject_GetAttrString((PyObject *)frame, "f_lasti");
#endif
}

/* The first frame's (code, f_lasti) of the last check whose first link was
 * a resume call (see straight_to_driver). */
static PyObject *first_code;
static int first_lasti = -1;

/* 1 / 0 / -1 (error) */
int
straight_to_driver(PyObject *frame_arg)
{
    PyObject *frame = Py_NewRef(frame_arg);
    PyObject *callee_code = NULL;
    int answer = 0;
    for (Py_ssize_t n = 0; n < t_max_frames; n++) {
        if (frame == Py_None)
            break;
        if (!PyFrame_Check(frame)) {
            PyErr_Format(PyExc_TypeError, "expected a frame, not %R", frame);
            answer = -1;
            break;
        }
        PyObject *code = (PyObject *)PyFrame_GetCode((PyFrameObject *)frame);
        if (code == t_drive_code) {
            Py_DECREF(code);
            answer = 1;
            break;
        }
#if PY_VERSION_HEX >= 0x030B0000
        /* The first frame (the clause calling resume) is nearly always the
         * same code stopped at the same call as last time: that pair's table
         * entry was a resume name then, and tables never change (code objects
         * are immutable; first_code keeps this one alive). */
        if (callee_code == NULL && code == first_code &&
                PyFrame_GetLasti((PyFrameObject *)frame) == first_lasti) {
            callee_code = code;
            PyObject *back = (PyObject *)PyFrame_GetBack((PyFrameObject *)frame);
            Py_SETREF(frame, back == NULL ? Py_NewRef(Py_None) : back);
            continue;
        }
#endif
        PyObject *calls = tail_calls(code);
        PyObject *lasti = calls == NULL ? NULL : frame_lasti((PyFrameObject *)frame);
        PyObject *callee = NULL;
        if (lasti != NULL) {
            callee = PyDict_CheckExact(calls) ? Py_XNewRef(PyDict_GetItemWithError(calls, lasti))
                                              : PyObject_CallMethod(calls, "get", "O", lasti);
            if (callee == Py_None)
                Py_CLEAR(callee);
        }
        Py_XDECREF(lasti);
        Py_XDECREF(calls);
        if (callee == NULL) {
            Py_DECREF(code);
            answer = PyErr_Occurred() ? -1 : 0;
            break;
        }
        PyObject *name, *plain;
        if (!PyTuple_CheckExact(callee) || PyTuple_GET_SIZE(callee) != 2) {
            PyErr_SetString(PyExc_TypeError, "_tail_calls entries must be (name, plain) pairs");
            Py_DECREF(callee);
            Py_DECREF(code);
            answer = -1;
            break;
        }
        name = PyTuple_GET_ITEM(callee, 0);
        plain = PyTuple_GET_ITEM(callee, 1);
        int ok;
        if (callee_code == NULL)
            ok = PySequence_Contains(t_resume_names, name);
        else {
            ok = PyObject_RichCompareBool(name, ((PyCodeObject *)callee_code)->co_name, Py_EQ);
            if (ok == 0) {
                ok = PyObject_IsTrue(plain);
                if (ok > 0) {
                    PyObject *args[3] = {frame, name, callee_code};
                    PyObject *r = PyObject_Vectorcall(t_names_function, args, 3, NULL);
                    ok = r == NULL ? -1 : PyObject_IsTrue(r);
                    Py_XDECREF(r);
                }
            }
        }
        Py_DECREF(callee);
        if (ok <= 0) {
            Py_DECREF(code);
            answer = ok;
            break;
        }
#if PY_VERSION_HEX >= 0x030B0000
        if (callee_code == NULL) {
            Py_XSETREF(first_code, Py_NewRef(code));
            first_lasti = PyFrame_GetLasti((PyFrameObject *)frame);
        }
#endif
        Py_XSETREF(callee_code, code);
        PyObject *back = (PyObject *)PyFrame_GetBack((PyFrameObject *)frame);
        Py_SETREF(frame, back == NULL ? Py_NewRef(Py_None) : back);
    }
    Py_DECREF(frame);
    Py_XDECREF(callee_code);
    return answer;
}

PyDoc_STRVAR(straight_doc,
"_returns_straight_to_driver($module, frame, /)\n--\n\n"
"Compiled kina_fx.handlers._returns_straight_to_driver.");

static PyObject *
returns_straight_to_driver(PyObject *Py_UNUSED(module), PyObject *frame)
{
    if (t_cache == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kina_fx._speedups: _bind_tail was not called");
        return NULL;
    }
    int r = straight_to_driver(frame);
    if (r < 0)
        return NULL;
    return Py_NewRef(r ? Py_True : Py_False);
}

PyDoc_STRVAR(bind_tail_doc,
"_bind_tail(drive_code, max_frames, resume_names, cache, tail_calls, names_function)\n--\n\n"
"Called once by kina_fx.handlers: what _returns_straight_to_driver works with.");

static PyObject *
bind_tail(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *drive_code, *resume_names, *cache, *tc, *nf;
    Py_ssize_t max_frames;
    if (!PyArg_ParseTuple(args, "O!nO!O!OO:_bind_tail", &PyCode_Type, &drive_code, &max_frames,
                          &PyFrozenSet_Type, &resume_names, &PyDict_Type, &cache, &tc, &nf))
        return NULL;
    if (!PyCallable_Check(tc) || !PyCallable_Check(nf)) {
        PyErr_SetString(PyExc_TypeError, "_bind_tail: tail_calls and names_function must be callable");
        return NULL;
    }
    Py_XSETREF(t_drive_code, Py_NewRef(drive_code));
    Py_XSETREF(t_resume_names, Py_NewRef(resume_names));
    Py_XSETREF(t_cache, Py_NewRef(cache));
    Py_XSETREF(t_tail_calls, Py_NewRef(tc));
    Py_XSETREF(t_names_function, Py_NewRef(nf));
    t_max_frames = max_frames;
    Py_CLEAR(first_code);
    first_lasti = -1;
    Py_RETURN_NONE;
}

PyMethodDef kfx_tail_methods[] = {
    {"_returns_straight_to_driver", returns_straight_to_driver, METH_O, straight_doc},
    {"_bind_tail", bind_tail, METH_VARARGS, bind_tail_doc},
    {NULL, NULL, 0, NULL},
};
