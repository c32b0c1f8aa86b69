/* c_abi.c: kina_perform from C with the GIL (the part of its fast
 * path that nogil.c cannot do without it; kina_fast_api.h).
 *
 * What it mirrors: ffi.effects.kina_py_perform (argument reading, answer
 * conversion, error reporting) with ffi.effects.CClause.__call__ (the C call)
 * and CClause._outcome (what a return code other than HANDLED / FORWARD
 * means), over the search of perform.c (handlers._perform_py).
 */
#include "speedups.h"
#include "kina_fast_api.h"

#include <errno.h>

/* ---- kina_perform from C, with the GIL ---------------------------------------- *
 *
 * c_fibers.c's fast path of kina_perform tries the search without the
 * GIL first (nogil.c); where it stops, it takes the GIL and calls
 * kfx_perform_after_nogil (or, if it could not even start, kina_fast_perform,
 * from the top of the running fiber's stack).  Both run perform_loop: the
 * search of perform_at, in which a clause that is an ffi.effects.CClause (the
 * clause of a kina_push_handler handler) is called right here:
 *
 *   _Skip(f, i) pushed; fn(ctx, effect_id, args, nargs, &answer) called with
 *   the GIL released (as cffi does); the marker removed by identity;
 *   KINA_HANDLED: the answer is the perform's value; KINA_FORWARD: the search
 *   goes on below that handler (a CClause further out is called directly too);
 *   anything else: CClause._outcome(rc, answer, args), the Python clause's own
 *   code (suspend_to_host for KINA_SUSPEND, exception_for for a status), is
 *   called before the marker is removed, as inside the Python clause
 *   (after_c_call, which also finishes the calls nogil.c made).
 *
 * Anything else the search finds (a Python ``fun`` clause, an ``on`` clause,
 * nothing) is done as handlers.perform does it for kina_py_perform: the
 * arguments were validated as kina_py_perform validates them (invalid ones
 * decline before anything is read), a value is converted as it converts it
 * (exact int64 here, any other through ffi.effects._answer_to_int64) and an
 * exception becomes a status and kina_last_error through
 * ffi.effects._report_error (kina_fx.ffi._onerror, cffi's hook for the
 * Python path).  Only an exception during the search before any C handler
 * ran declines (the Python path meets it again and reports it).  On once
 * ffi.effects has attached the library (set_c_abi_fast_paths, module.c),
 * which happens only when this compiled implementation is the one in use. */


#define FAST_MAX_ARGS KFX_MAX_ARGS
#define C_HANDLED 0
#define C_FORWARD (-1)

typedef int32_t (*c_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                int32_t nargs, int64_t *out_value);

/* The effect (an interned handlers.Effect) and id of this thread's last
 * kina_perform that suspended: c_step (c_fibers.c) reads the id
 * from here instead of ``effect.id`` when it is that effect. */
KFX_TLS PyObject *kfx_hint_effect;
KFX_TLS int32_t kfx_hint_effect_id;

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

static int perform_loop(PyObject *st, PyObject *f, Py_ssize_t i, PyObject *effect, int32_t effect_id,
                        const int64_t *args, int32_t n, int64_t *out, int32_t *status,
                        int *errno_out, int called);

/* What is left of a C handler's call once it returned rc / answer: the
 * clause's own code for rc other than HANDLED and FORWARD (CClause._outcome,
 * inside the marker), then the marker off (``skip``, pushed by perform_loop,
 * or the materialized marker ``token`` of nogil.c), as
 * CClause.__call__ and handlers._run_fun_clause do.  KINA_FAST_DONE with
 * *status set, or 0 with *go_on: the handler declined (search on below it). */
static int
after_c_call(PyObject *st, PyObject *clause, PyObject *skip, uint64_t token, int32_t rc,
             int64_t answer, const int64_t *args, int32_t n, PyObject *effect, int64_t *out,
             int32_t *status, int *go_on)
{
    PyObject *result = NULL;
    if (rc != C_HANDLED && rc != C_FORWARD) {
        /* Inside the clause, as CClause.__call__: _outcome(rc, answer, args). */
        PyObject *t = PyTuple_New(n);
        if (t != NULL && box_args(args, n, &PyTuple_GET_ITEM(t, 0)) < 0)
            Py_CLEAR(t);
        PyObject *o_rc = t == NULL ? NULL : PyLong_FromLong(rc);
        PyObject *o_answer = o_rc == NULL ? NULL : PyLong_FromLongLong(answer);
        if (o_answer != NULL && clause == NULL)
            PyErr_SetString(PyExc_SystemError, "kina_fx: a C handler lost its clause");
        else if (o_answer != NULL) {
            PyObject *call[4] = {clause, o_rc, o_answer, t};
            result = PyObject_VectorcallMethod(s_outcome, call, 4, NULL);
        }
        Py_XDECREF(o_answer);
        Py_XDECREF(o_rc);
        Py_XDECREF(t);
    }
    /* finally: the marker comes off (handlers._remove_marker) */
    PyObject *pending = (rc != C_HANDLED && rc != C_FORWARD && result == NULL) ? exc_save() : NULL;
    int popped_ok;
    if (skip != NULL) {
        PyObject *popped = pop_marker(st, skip);
        popped_ok = popped != NULL;
        Py_XDECREF(popped);          /* ``skip`` (ours) or None: still alive */
        release_entry(skip);         /* back to the cache unless someone kept it */
    }
    else
        popped_ok = kfx_pop_materialized(token) == 0;
    if (!popped_ok) {
        Py_XDECREF(result);
        kfx_raise_in_context(pending);
        *status = kfx_report_exception();
        return KINA_FAST_DONE;
    }
    if (pending != NULL) {           /* the clause raised */
        exc_restore(pending);
        *status = kfx_report_exception();
        return KINA_FAST_DONE;
    }
    if (rc == C_HANDLED) {
        *out = answer;
        *status = 0;
        return KINA_FAST_DONE;
    }
    if (rc != C_FORWARD && result != g_forward)
        return fast_finish(effect, result, out, status);
    Py_XDECREF(result);
    *go_on = 1;
    return 0;
}

/* The entry below (f, i) (f owned, replaced): 1, 0 at the end of the chain
 * (f is None), -1 on error. */
static int
below(PyObject **f, Py_ssize_t *i)
{
    *i -= 1;
    if (*i >= -1)
        return 1;
    Py_SETREF(*f, get_slot(*f, g_fiber_t, off_parent, s_parent));
    if (*f == NULL)
        return -1;
    if (*f == Py_None)
        return 0;
    return top_index(*f, i) < 0 ? -1 : 1;
}

/* int kina_fast_perform(effect_id, args, nargs, out, status, errno_out): see
 * above; the search from the top of the running fiber's stack.  The caller
 * holds the GIL. */
int
kina_fast_perform(int32_t effect_id, const int64_t *c_args, int32_t nargs, int64_t *out,
                  int32_t *status, int *errno_out)
{
    if (!kfx_c_abi_on || out == NULL || status == NULL
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
    int done = KINA_FAST_DECLINED;
    PyObject *st = thread_state();
    PyObject *f = st == NULL ? NULL : get_slot(st, g_tstate_t, off_current, s_current);
    Py_ssize_t i = 0;
    if (f != NULL && top_index(f, &i) == 0)
        done = perform_loop(st, f, i, effect, effect_id, args, nargs, out, status, errno_out, 0);
    else {
        PyErr_Clear();
        Py_XDECREF(f);
        Py_XDECREF(st);
    }
    Py_DECREF(effect);
    Py_LeaveRecursiveCall();
    return done;
}

/* kina_perform with the GIL where nogil.c stopped (ns): the rest of
 * the call of the C handler it called (its outcome with ``outcome``, its
 * materialized marker off with ``pop_only``), and / or the search on from
 * (ns->f, ns->i).  The caller holds the GIL and has materialized the pending
 * markers.  Once a C handler ran (ns->called) nothing declines any more. */
int
kfx_perform_after_nogil(int32_t effect_id, int32_t nargs, int64_t *out, int32_t *status,
                        int *errno_out, const kfx_nogil_state *ns, int pop_only)
{
    if (!PyList_CheckExact(g_effects_by_id) || effect_id <= 0
            || effect_id >= PyList_GET_SIZE(g_effects_by_id)) {
        PyErr_SetString(PyExc_SystemError, "kina_fx: bad effect id after the search without the GIL");
        goto not_run;
    }
    PyObject *effect = PyList_GET_ITEM(g_effects_by_id, effect_id);
    if (effect == Py_None) {             /* (only if nothing ran: no handler has this id) */
        PyErr_SetString(PyExc_SystemError, "kina_fx: no effect with that id");
        goto not_run;
    }
    Py_INCREF(effect);
    if (Py_EnterRecursiveCall(" in kina_perform")) {
        Py_DECREF(effect);
        goto not_run;
    }
    int done;
    PyObject *st = thread_state();
    PyObject *f = Py_NewRef((PyObject *)ns->f);
    Py_ssize_t i = ns->i;
    if (st == NULL) {
        Py_DECREF(f);
        *status = kfx_report_exception();
        done = KINA_FAST_DONE;
        goto out;
    }
    if (ns->outcome || pop_only) {
        /* the C handler at (f, i) ran: finish its call here */
        PyObject *clause = NULL;
        if (ns->outcome) {
            PyObject *stack = ((KFiber *)f)->stack;
            PyObject *entry = stack != NULL && PyList_CheckExact(stack) && i >= 0 && i < PyList_GET_SIZE(stack)
                              ? PyList_GET_ITEM(stack, i) : NULL;
            if (entry != NULL && kfx_find_fun(entry, effect, &clause) <= 0)
                clause = NULL;
            PyErr_Clear();
        }
        int go_on = 0;
        done = after_c_call(st, clause, NULL, ns->token, ns->rc, ns->answer, ns->args, nargs, effect,
                            out, status, &go_on);
        Py_XDECREF(clause);
        if (!go_on) {
            Py_DECREF(f);
            Py_DECREF(st);
            goto out;
        }
        int r = below(&f, &i);
        if (r <= 0) {
            PyObject *box[FAST_MAX_ARGS];
            PyObject *result = NULL;
            Py_DECREF(st);
            if (r == 0 && box_args(ns->args, nargs, box) == 0) {
                result = unhandled(effect, box, nargs);
                unbox_args(box, nargs);
            }
            Py_XDECREF(f);
            done = fast_finish(effect, result, out, status);
            goto out;
        }
    }
    done = perform_loop(st, f, i, effect, effect_id, ns->args, nargs, out, status, errno_out,
                        ns->called);
out:
    Py_DECREF(effect);
    Py_LeaveRecursiveCall();
    return done;

not_run:
    if (!ns->called) {                   /* nothing ran: the Python path does it all */
        PyErr_Clear();
        return KINA_FAST_DECLINED;
    }
    *status = kfx_report_exception();
    return KINA_FAST_DONE;
}

/* The search and the C handler calls from (f, i) (steals st and f).  With
 * ``called`` (a C handler already ran) it never declines. */
static int
perform_loop(PyObject *st, PyObject *f, Py_ssize_t i, PyObject *effect, int32_t effect_id,
             const int64_t *args, int32_t n, int64_t *out, int32_t *status, int *errno_out,
             int called)
{
    PyObject *box[FAST_MAX_ARGS];
    PyObject *clause = NULL, *result;
    for (;;) {
        PyObject *h = NULL;
        int found = find_clause(&f, &i, effect, &clause, &h);
        if (found < 0)
            goto error;
        if (found == FOUND_ON) {         /* an ``on`` clause: suspend, here (perform_at) */
            if (box_args(args, n, box) < 0) {
                Py_DECREF(h);
                called = 1;
                goto error;
            }
            Py_DECREF(st);
            kfx_hint_effect = effect;    /* what c_step will want to know */
            kfx_hint_effect_id = effect_id;
            result = rt_suspend(effect, box, n, f, h);   /* steals f and h */
            unbox_args(box, n);
            return fast_finish(effect, result, out, status);
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
        PyObject *skip = push_skip(st, f, i);
        if (skip == NULL)
            goto error;
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
        /* Same shape as kina_fast_perform's end of a nogil.c call on purpose:
         * the ownership is the same, but a decline at the end of the chain
         * goes to the general path here, and is unhandled there. */
        int go_on = 0;
        int done = after_c_call(st, clause, skip, 0, rc, answer, args, n, effect, out, status, &go_on);
        Py_CLEAR(clause);
        if (!go_on) {
            Py_DECREF(f);
            Py_DECREF(st);
            return done;
        }
        /* Declined: go on with the handlers below its own. */
        int r = below(&f, &i);
        if (r < 0)
            goto error;
        if (r == 0)
            goto general;
    }

general:
    /* A Python clause, or nothing handles it: what perform_at does, from
     * (f, i), as handlers.perform does for kina_py_perform (the arguments were
     * validated as it validates them, the answer converts as it converts). */
    called = 1;
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
    return fast_finish(effect, result, out, status);

error:
    /* An exception while searching: the Python path meets it again and
     * reports it, unless a C handler already ran. */
    Py_XDECREF(f);
    Py_XDECREF(clause);
    Py_DECREF(st);
    if (!called) {
        PyErr_Clear();
        return KINA_FAST_DECLINED;
    }
    *status = kfx_report_exception();
    return KINA_FAST_DONE;
}
