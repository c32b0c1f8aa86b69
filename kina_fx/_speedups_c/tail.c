/* tail.c: the tail-resume check, compiled.
 *
 * What it mirrors: handlers._returns_straight_to_driver_py over
 * kina_fx/tailcalls.py (returns_straight_to): is the caller of a resume a
 * chain of frames that return the resume's result unchanged to the driver
 * loop?  The per-code tables are still computed and cached in Python
 * (tailcalls.tail_calls, which this calls on a miss).
 *
 * The one difference: the driver loop is C here (round_trip.c's rt_drive),
 * which has no frame of its own.  The frame that called it stands for it:
 * the Python reference stops at a frame running handlers._drive_py's code,
 * this at the frame the innermost C driver loop of the running fiber was
 * called from (kfx_drives_from, round_trip.c).  Every Python frame that loop
 * calls directly (a clause) has that frame as its f_back, as the Python
 * loop's clauses have its frame.
 */
#include "speedups.h"

/* ---- the tail-resume check ------------------------------------------------------ */

/* tailcalls.returns_straight_to, transcribed (it is the largest single cost
 * of an ``on`` perform+resume round trip in Python: ~15%).  The per-code
 * tables stay in Python (tailcalls.tail_calls fills
 * tailcalls.tail_calls_by_code, read here), and so does names_function. */

/* ``tailcalls.tail_calls(code)`` (new reference): the cached table when its
 * entry is for this very code object, else the Python function (which fills
 * the cache). */
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

#if PY_VERSION_HEX >= 0x030B0000
/* The first frame's (code, f_lasti) of the last check whose first link was
 * a resume call (see straight_to_driver; 3.11+, where PyFrame_GetLasti is cheap). */
static PyObject *first_code;
static int first_lasti = -1;
#endif

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
        if (kfx_drives_from(frame)) {
            answer = 1;
            break;
        }
        PyObject *code = (PyObject *)PyFrame_GetCode((PyFrameObject *)frame);
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
"returns_straight_to_driver($module, frame, /)\n--\n\n"
"Compiled kina_fx.handlers._returns_straight_to_driver_py: does ``frame`` (the\n"
"caller of a resume) return the resume's result unchanged to a driver loop?");

static PyObject *
returns_straight_to_driver(PyObject *Py_UNUSED(module), PyObject *frame)
{
    if (!KFX_READY())
        return NULL;
    int r = straight_to_driver(frame);
    if (r < 0)
        return NULL;
    return Py_NewRef(r ? Py_True : Py_False);
}

PyDoc_STRVAR(drives_from_doc,
"drives_from($module, frame, /)\n--\n\n"
"True while a compiled driver loop called from ``frame`` runs: what the\n"
"compiled tail check takes for the driver's frame.");

static PyObject *
drives_from(PyObject *Py_UNUSED(module), PyObject *frame)
{
    return Py_NewRef(kfx_drives_from(frame) ? Py_True : Py_False);
}

PyMethodDef kfx_tail_methods[] = {
    {"returns_straight_to_driver", returns_straight_to_driver, METH_O, straight_doc},
    {"drives_from", drives_from, METH_O, drives_from_doc},
    {NULL, NULL, 0, NULL},
};
