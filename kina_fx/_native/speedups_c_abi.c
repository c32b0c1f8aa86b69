/* speedups_c_abi.c: kina_perform from C answered by C handlers, without
 * entering Python through cffi (kina_fast_perform, exported through the
 * capsule kina_fx._speedups._C_API to libkina_fx.so's kina_runtime.c).
 *
 * What it mirrors: ffi_effects.kina_py_perform (argument reading, answer
 * conversion, error reporting) with ffi_effects.CClause.__call__ (the C call)
 * and CClause._outcome (what a return code other than HANDLED / FORWARD
 * means), over the search of speedups_perform.c (handlers._perform_py).
 */
#include "speedups.h"
#include "kina_fast_api.h"

#include <errno.h>

/* ---- kina_perform from C: C handlers called directly ------------------------- *
 *
 * libkina_fx.so's kina_perform (kina_runtime.c) first calls kina_fast_perform
 * (through the capsule kina_fx._speedups._C_API), with the GIL held, before
 * its cffi ``extern "Python"`` path (ffi_effects.kina_py_perform, which boxes
 * everything, runs perform and calls a C handler back through cffi).  It runs
 * the search of perform_at; a clause that is an ffi_effects.CClause (the
 * clause of a kina_push_handler handler) is called right here:
 *
 *   _Skip(f, i) pushed; fn(ctx, effect_id, args, nargs, &answer) called with
 *   the GIL released (as cffi does); the marker removed by identity;
 *   KINA_HANDLED: the answer is the perform's value; KINA_FORWARD: the search
 *   goes on below that handler (a CClause further out is called directly too);
 *   anything else: CClause._outcome(rc, answer, args), the Python clause's own
 *   code (suspend_to_host for KINA_SUSPEND, exception_for for a status), is
 *   called before the marker is removed, as inside the Python clause.
 *
 * The first time the search reaches anything else (a Python ``fun`` clause, an
 * ``on`` clause, the bottom of the stacks) or meets an error:
 *   - if no C handler ran yet, it returns KINA_FAST_DECLINED having done
 *     nothing (the search only reads): kina_perform takes the Python path,
 *     which also validates every argument and reports its own errors;
 *   - else the perform goes on in perform_at (boxing the arguments) from that
 *     entry, as the Python path would have.
 * A value is converted as kina_py_perform converts it (exact int64 here, any
 * other through ffi_effects._answer_to_int64); an exception becomes a status
 * and kina_last_error through ffi_effects._report_error (kina_fx.ffi._onerror,
 * cffi's hook for the slow path).  Either way it returns KINA_FAST_DONE with
 * *status set.  Bound by ffi_effects (_bind_c_abi) only when this compiled
 * perform is the one in use. */


#define FAST_MAX_ARGS KFX_MAX_ARGS
#define C_HANDLED 0
#define C_FORWARD (-1)

typedef int32_t (*c_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                int32_t nargs, int64_t *out_value);

PyTypeObject *g_cclause_t;  /* ffi_effects.CClause                       */
static PyObject *g_effects_by_id;  /* handlers.Effect._by_id                    */
static PyObject *g_answer_fn;      /* ffi_effects._answer_to_int64              */
static PyObject *g_report_fn;      /* ffi_effects._report_error                 */

/* An int slot of a CClause as a C value; 0 when unset or out of range. */
static int
clause_int(PyObject *clause, Py_ssize_t off, int is_pointer, void **ptr, long *value)
{
    PyObject *v = SLOT(clause, off);
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    if (is_pointer)
        *ptr = PyLong_AsVoidPtr(v);
    else
        *value = PyLong_AsLong(v);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The C arguments as Python ints, into box[0..n); 0 or -1. */
static int
box_args(const int64_t *args, int32_t n, PyObject **box)
{
    for (int32_t k = 0; k < n; k++) {
        box[k] = PyLong_FromLongLong(args[k]);
        if (box[k] == NULL) {
            while (k-- > 0)
                Py_CLEAR(box[k]);
            return -1;
        }
    }
    return 0;
}

static void
unbox_args(PyObject **box, int32_t n)
{
    for (int32_t k = 0; k < n; k++)
        Py_CLEAR(box[k]);
}

/* The exception being raised as a status, kina_last_error set (by Python). */
int32_t
kfx_report_exception(void)
{
    PyObject *exc = exc_save();
    if (exc == NULL)
        return 5;                        /* KINA_STATUS_INTERNAL */
    PyObject *r = PyObject_CallOneArg(g_report_fn, exc);
    Py_DECREF(exc);
    long status = r == NULL ? -1 : PyLong_AsLong(r);
    Py_XDECREF(r);
    if (PyErr_Occurred() || status < INT32_MIN || status > INT32_MAX) {
        PyErr_Clear();
        return 5;
    }
    return (int32_t)status;
}

/* A perform's value (stolen) or NULL with an exception: *out and *status. */
static int
fast_finish(PyObject *effect, PyObject *result, int64_t *out, int32_t *status)
{
    if (result != NULL && !PyLong_CheckExact(result)) {
        PyObject *call[2] = {effect, result};
        Py_SETREF(result, PyObject_Vectorcall(g_answer_fn, call, 2, NULL));
    }
    if (result == NULL) {
        *status = kfx_report_exception();
        return KINA_FAST_DONE;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(result, &overflow);
    if (overflow) {                      /* _answer_to_int64 raises the slow path's error */
        PyObject *call[2] = {effect, result};
        PyObject *r = PyObject_Vectorcall(g_answer_fn, call, 2, NULL);
        Py_DECREF(result);
        if (r == NULL) {
            *status = kfx_report_exception();
            return KINA_FAST_DONE;
        }
        result = r;
        v = PyLong_AsLongLongAndOverflow(result, &overflow);
    }
    Py_DECREF(result);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_OverflowError, "the answer does not fit in int64_t");
        *status = kfx_report_exception();
        return KINA_FAST_DONE;
    }
    *out = (int64_t)v;
    *status = 0;
    return KINA_FAST_DONE;
}

static int fast_perform(PyObject *effect, const int64_t *args, int32_t nargs, int64_t *out,
                        int32_t *status, int *errno_out);

/* int kina_fast_perform(effect_id, args, nargs, out, status): see above.  The
 * caller holds the GIL. */
int
kina_fast_perform(int32_t effect_id, const int64_t *c_args, int32_t nargs, int64_t *out,
                  int32_t *status, int *errno_out)
{
    if (g_cclause_t == NULL || g_local == NULL || out == NULL || status == NULL
            || nargs < 0 || nargs > FAST_MAX_ARGS || (nargs > 0 && c_args == NULL)
            || !PyList_CheckExact(g_effects_by_id)
            || effect_id <= 0 || effect_id >= PyList_GET_SIZE(g_effects_by_id))
        return KINA_FAST_DECLINED;
    PyObject *effect = PyList_GET_ITEM(g_effects_by_id, effect_id);
    if (effect == Py_None)
        return KINA_FAST_DECLINED;
    /* The arguments are read once, first, as kina_py_perform reads them. */
    int64_t args[FAST_MAX_ARGS];
    for (int32_t k = 0; k < nargs; k++)
        args[k] = c_args[k];
    /* Handlers that perform again nest C frames only: count them as the
     * Python path's frames are counted (a RecursionError, not a crash). */
    if (Py_EnterRecursiveCall(" in kina_perform")) {
        PyErr_Clear();
        return KINA_FAST_DECLINED;
    }
    Py_INCREF(effect);
    int done = fast_perform(effect, args, nargs, out, status, errno_out);
    Py_DECREF(effect);
    Py_LeaveRecursiveCall();
    return done;
}

static int
fast_perform(PyObject *effect, const int64_t *args, int32_t nargs, int64_t *out, int32_t *status,
             int *errno_out)
{
    Py_INCREF(effect);

    PyObject *box[FAST_MAX_ARGS];
    PyObject *clause = NULL, *result;
    int called = 0;                      /* a C handler ran: no declining any more */
    int32_t n = nargs;
    Py_ssize_t i = 0;
    PyObject *st = thread_state();
    if (st == NULL) {
        PyErr_Clear();
        Py_DECREF(effect);
        return KINA_FAST_DECLINED;
    }
    PyObject *f = get_slot(st, g_tstate_t, off_current, s_current);
    if (f == NULL || top_index(f, &i) < 0)
        goto error;

    for (;;) {
        PyObject *h = NULL;
        int found = find_clause(&f, &i, effect, &clause, &h);
        if (found < 0)
            goto error;
        if (found == FOUND_ON) {         /* an ``on`` clause: suspend, here */
            Py_DECREF(h);
            called = 1;
            goto general;
        }
        if (found == FOUND_NONE)         /* f is None: unhandled, the general path */
            goto general;

        /* A clause at (f, i). */
        void *fn = NULL, *ctx = NULL;
        long eid = 0;
        if (Py_TYPE(clause) != g_cclause_t
                || !clause_int(clause, off_cc_fn, 1, &fn, NULL) || fn == NULL
                || !clause_int(clause, off_cc_ctx, 1, &ctx, NULL)
                || !clause_int(clause, off_cc_effect_id, 0, NULL, &eid)
                || eid < INT32_MIN || eid > INT32_MAX) {
            Py_CLEAR(clause);
            goto general;                /* perform_at finds it again and calls it */
        }
        PyObject *skip = new_skip(f, i);
        if (skip == NULL)
            goto error;
        if (push_marker(st, skip) < 0) {
            Py_DECREF(skip);
            goto error;
        }
        int64_t buf[FAST_MAX_ARGS] = {0};  /* what the Python clause passes: 16 slots */
        for (int32_t k = 0; k < n; k++)
            buf[k] = args[k];
        int64_t answer = 0;
        int32_t rc;
        called = 1;
        Py_BEGIN_ALLOW_THREADS
        rc = ((c_handler_fn)fn)(ctx, (int32_t)eid, buf, n, &answer);
        *errno_out = errno;              /* the host sees errno as the handler left it */
        Py_END_ALLOW_THREADS
        result = NULL;
        if (rc != C_HANDLED && rc != C_FORWARD) {
            /* Inside the clause, as CClause.__call__: _outcome(rc, answer, args). */
            PyObject *t = PyTuple_New(n);
            if (t != NULL && box_args(args, n, &PyTuple_GET_ITEM(t, 0)) < 0)
                Py_CLEAR(t);
            PyObject *o_rc = t == NULL ? NULL : PyLong_FromLong(rc);
            PyObject *o_answer = o_rc == NULL ? NULL : PyLong_FromLongLong(answer);
            if (o_answer != NULL) {
                PyObject *call[4] = {clause, o_rc, o_answer, t};
                result = PyObject_VectorcallMethod(s_outcome, call, 4, NULL);
            }
            Py_XDECREF(o_answer);
            Py_XDECREF(o_rc);
            Py_XDECREF(t);
        }
        Py_CLEAR(clause);
        /* finally: the marker comes off (handlers._remove_marker) */
        PyObject *pending = (rc != C_HANDLED && rc != C_FORWARD && result == NULL) ? exc_save() : NULL;
        PyObject *popped = pop_marker(st, skip);
        if (popped != NULL)
            Py_DECREF(popped);
        release_entry(skip);
        if (popped == NULL) {
            Py_XDECREF(result);
            if (pending != NULL) {
                PyObject *exc = exc_save();
                if (exc != NULL) {
                    PyException_SetContext(exc, pending);
                    exc_restore(exc);
                }
                else
                    exc_restore(pending);
            }
            goto error;
        }
        if (pending != NULL) {           /* the clause raised */
            Py_DECREF(f);
            Py_DECREF(st);
            exc_restore(pending);
            *status = kfx_report_exception();
            Py_DECREF(effect);
            return KINA_FAST_DONE;
        }
        if (rc == C_HANDLED) {
            Py_DECREF(f);
            Py_DECREF(st);
            Py_DECREF(effect);
            *out = answer;
            *status = 0;
            return KINA_FAST_DONE;
        }
        if (rc != C_FORWARD && result != g_forward) {
            Py_DECREF(f);
            Py_DECREF(st);
            int done = fast_finish(effect, result, out, status);
            Py_DECREF(effect);
            return done;
        }
        Py_XDECREF(result);
        /* Declined: go on with the handlers below its own. */
        i -= 1;
        if (i < -1) {
            Py_SETREF(f, get_slot(f, g_fiber_t, off_parent, s_parent));
            if (f == NULL)
                goto error;
            if (f == Py_None)
                goto general;
            if (top_index(f, &i) < 0)
                goto error;
        }
    }

general:
    /* Something only perform_at does, from (f, i): the Python path if nothing
     * ran yet, else here (a C handler forwarded to it). */
    if (!called) {
        Py_DECREF(f);
        Py_DECREF(st);
        Py_DECREF(effect);
        return KINA_FAST_DECLINED;
    }
    if (box_args(args, n, box) < 0)
        goto error;
    if (f == Py_None) {
        Py_DECREF(f);
        Py_DECREF(st);
        result = unhandled(effect, box, n);
    }
    else
        result = perform_at(st, f, i, effect, box, n);   /* steals st and f */
    unbox_args(box, n);
    {
        int done = fast_finish(effect, result, out, status);
        Py_DECREF(effect);
        return done;
    }

error:
    /* An exception while searching: the Python path meets it again and
     * reports it, unless a C handler already ran. */
    Py_XDECREF(f);
    Py_XDECREF(clause);
    Py_DECREF(st);
    if (!called) {
        PyErr_Clear();
        Py_DECREF(effect);
        return KINA_FAST_DECLINED;
    }
    *status = kfx_report_exception();
    Py_DECREF(effect);
    return KINA_FAST_DONE;
}

PyDoc_STRVAR(bind_c_abi_doc,
"_bind_c_abi(CClause, effects_by_id, answer_to_int64, report_error)\n--\n\n"
"Called by kina_fx.ffi_effects: enables kina_fast_perform (the C fast path of\n"
"libkina_fx.so's kina_perform for C handlers); _bind_c_abi(None) disables it.");

static PyObject *
bind_c_abi(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *cclause_t, *by_id = NULL, *answer_fn = NULL, *report_fn = NULL;
    if (PyTuple_GET_SIZE(args) == 1 && PyTuple_GET_ITEM(args, 0) == Py_None) {
        Py_CLEAR(g_cclause_t);           /* _bind_c_abi(None): the fast path is off */
        Py_RETURN_NONE;
    }
    if (!PyArg_ParseTuple(args, "OO!OO:_bind_c_abi", &cclause_t, &PyList_Type, &by_id,
                          &answer_fn, &report_fn))
        return NULL;
    if (check_data_type(cclause_t, &KCClause_Type, "CClause"))
        return NULL;
    if (!PyCallable_Check(answer_fn) || !PyCallable_Check(report_fn)) {
        PyErr_SetString(PyExc_TypeError, "_bind_c_abi: answer_to_int64 and report_error must be callable");
        return NULL;
    }
    Py_XSETREF(g_effects_by_id, Py_NewRef(by_id));
    Py_XSETREF(g_answer_fn, Py_NewRef(answer_fn));
    Py_XSETREF(g_report_fn, Py_NewRef(report_fn));
    Py_XSETREF(g_cclause_t, (PyTypeObject *)Py_NewRef(cclause_t));
    Py_RETURN_NONE;
}

PyMethodDef kfx_c_abi_methods[] = {
    {"_bind_c_abi", bind_c_abi, METH_VARARGS, bind_c_abi_doc},
    {NULL, NULL, 0, NULL},
};
