/* round_trip.c: an ``on`` perform + resume round trip, compiled.
 *
 * What it mirrors: handlers._suspend_perform with fibers.post / suspend /
 * _switch (rt_suspend), fibers.switch_into (rt_switch_into), the loop of
 * handlers._drive_py (rt_drive, whose eager abort calls the Python
 * handlers._abort_unless_kept), Continuation.resume with handlers._resume_from
 * (rt_resume, the ``resume`` ContinuationData gives its subclasses) and
 * Continuation.__del__ (ContinuationData's finalizer).  The details are below.
 */
#include "speedups.h"

/* ---- the round trip: suspend, switch_into, resume ------------------------------ *
 *
 * Why: an ``on`` perform + ``return k.resume(x)`` round trip in Python goes
 * through ~16 Python calls (handlers._suspend_perform, Continuation(),
 * fibers.post, fibers.suspend, fibers._switch, fibers.switch_into, _switch,
 * Continuation.resume, _resume_from, Chain(), _TailResume()...) around two
 * greenlet switches that are most of what it has to do.  These are the
 * transcriptions of those steps; the Python functions stay the references
 * (and what runs under KINA_FX_PURE_PYTHON=1), and every case these do not
 * transcribe exactly falls back to them before changing anything:
 *
 *   rt_suspend      handlers._suspend_perform + fibers.post + fibers.suspend
 *                   + fibers._switch (the perform side; called by perform()'s
 *                   ``on`` branch).
 *   rt_switch_into  fibers.switch_into + fibers._switch (the resumer side;
 *                   the driver loop and Stepper._step call it).
 *   rt_resume       Continuation.resume (the method ContinuationData gives
 *                   each class deriving from it, which comes before the
 *                   reference, handlers._ContinuationReference.resume, in
 *                   Continuation's MRO): the one-shot/shallow/thread checks,
 *                   then handlers._resume_from with the tail check.
 *   rt_drive        the loop of handlers._drive_py.
 *
 * The cases each hands to its Python reference are the rows of the table
 * "What the C core hands to Python" in docs/effects.md, named at each place
 * below (``fallback: <row>``).
 *
 * Invariants kept (fibers.py has them in full):
 * - The message travels through ThreadState.mail, never as a switch()
 *   argument.  rt_suspend writes the message straight into ``mail`` (what
 *   post() then suspend() leave there; ``outbox`` is None before and after
 *   either way).
 * - No suspended frame holds its own continuation: across the switch the
 *   C frame of rt_suspend holds only the greenlet it switches to (as
 *   _switch's ``glet``), plus the caller's effect and arguments; the
 *   continuation, the fibers and the handler are owned by the message alone.
 * - A GreenletExit that is not an Unwind, raised by the switch, means
 *   greenlet is killing this greenlet: fibers._begin_unwind_here runs, as in
 *   _switch, and the exception propagates.
 * - Fields are read and written as struct fields on exact Fiber / ThreadState /
 *   Chain / Continuation / _TailResume instances only; a write that drops the
 *   last reference of something runs its finalizer at the same point as the
 *   Python attribute store it transcribes.
 */

/* greenlet's C API (greenlet._C_API; its greenlet.h numbers the entries and
 * promises they do not change): greenlet.switch without a method lookup. */
#define GREENLET_TYPE_NUM 0
#define GREENLET_SWITCH_NUM 6
static PyTypeObject *g_greenlet_t;
static PyObject *(*g_greenlet_switch)(PyObject *glet, PyObject *args, PyObject *kwargs);

int
kfx_init_round_trip(void)
{
    void **api = PyCapsule_Import("greenlet._C_API", 0);
    if (api == NULL) {
        PyErr_Clear();               /* the method call still works */
        return 0;
    }
    g_greenlet_switch = (PyObject *(*)(PyObject *, PyObject *, PyObject *))api[GREENLET_SWITCH_NUM];
    g_greenlet_t = g_greenlet_switch != NULL ? (PyTypeObject *)api[GREENLET_TYPE_NUM] : NULL;
    return 0;
}

/* obj.<slot at off> = v (v borrowed). */
static inline void
set_slot(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = Py_NewRef(v);
    Py_XDECREF(old);
}

/* Same int (thread serials): identity, else ==. */
static inline int
same_serial(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (a == NULL || b == NULL)
        return 0;
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0) {
        PyErr_Clear();           /* the Python fallback meets the error again */
        return 0;
    }
    return r;
}

/* fibers._switch(glet); steals ``glet``.  Returns the mail (new reference). */
static PyObject *
rt_switch(PyObject *glet)
{
    PyObject *r = Py_TYPE(glet) == g_greenlet_t ? g_greenlet_switch(glet, NULL, NULL)
                                                : PyObject_CallMethodNoArgs(glet, s_switch);
    Py_DECREF(glet);
    if (r == NULL) {
        if (PyErr_ExceptionMatches(g_gexit) && !PyErr_ExceptionMatches(g_unwind)) {
            /* greenlet is killing this greenlet: unwind detached (_switch) */
            PyObject *exc = exc_save();
            PyObject *st = PyObject_GetAttr(g_local, s_state);
            PyObject *x = st == NULL ? NULL : PyObject_CallOneArg(g_begin_unwind, st);
            Py_XDECREF(st);
            if (x == NULL) {
                Py_XDECREF(exc);
                return NULL;
            }
            Py_DECREF(x);
            exc_restore(exc);
        }
        return NULL;
    }
    Py_DECREF(r);
    PyObject *st = thread_state();
    if (st == NULL)
        return NULL;
    PyObject *mail = SLOT(st, off_mail);
    SLOT(st, off_mail) = Py_NewRef(Py_None);
    Py_DECREF(st);
    return mail != NULL ? mail : Py_NewRef(Py_None);
}

/* Chains and continuations that the switch consumed and nobody else holds are
 * kept for reuse: a round trip then allocates and finalizes neither (a kept
 * object has never been finalized: its refcount never reached zero). */
#define CHAIN_CACHE 16
static PyObject *cont_cache[CHAIN_CACHE], *chain_cache[CHAIN_CACHE];
static int conts_cached, chains_cached;

void
kfx_release_chain(PyObject *chain)
{
    PyTypeObject *tp = Py_TYPE(chain);
    if (Py_REFCNT(chain) == 1 && (tp == g_cont_t || tp == g_chain_t)
            && SLOT(chain, off_top) == Py_None && SLOT(chain, off_base) == Py_None) {
        int *n = tp == g_cont_t ? &conts_cached : &chains_cached;
        PyObject **cache = tp == g_cont_t ? cont_cache : chain_cache;
        if (*n < CHAIN_CACHE) {
            SLOT(chain, off_top) = SLOT(chain, off_base) = NULL;   /* were None: no decref */
            if (tp == g_cont_t)
                Py_CLEAR(SLOT(chain, off_k_shallow));
            cache[(*n)++] = chain;
            return;
        }
    }
    Py_DECREF(chain);
}

/* A new instance of g_cont_t / g_chain_t with its fields unset. */
static PyObject *
new_chain_object(PyTypeObject *tp)
{
    if (tp == g_cont_t && conts_cached > 0)
        return cont_cache[--conts_cached];
    if (tp == g_chain_t && chains_cached > 0)
        return chain_cache[--chains_cached];
    return tp->tp_alloc(tp, 0);
}

/* The small tuples of the protocol (a send pair, the two tuples of a perform
 * message, a perform's arguments) are kept for reuse once a C reader is done
 * with them and nobody else holds them; kfx_tuple(n, ...) makes one (n <= 3)
 * from the cache or anew. */
#define TUPLE_CACHE 16
static PyObject *tuple_cache[4][TUPLE_CACHE];
static int tuples_cached[4];

PyObject *
kfx_tuple(Py_ssize_t n, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *t;
    if (tuples_cached[n] > 0) {
        t = tuple_cache[n][--tuples_cached[n]];
        if (!PyObject_GC_IsTracked(t))     /* the collector may have untracked it */
            PyObject_GC_Track(t);
    }
    else if ((t = PyTuple_New(n)) == NULL)
        return NULL;
    PyObject *items[3] = {a, b, c};
    for (Py_ssize_t k = 0; k < n; k++)
        PyTuple_SET_ITEM(t, k, Py_NewRef(items[k]));
    return t;
}

/* Drop a reference to ``t``, keeping it for kfx_tuple if it was the last. */
void
kfx_release_tuple(PyObject *t)
{
    Py_ssize_t n = PyTuple_CheckExact(t) ? PyTuple_GET_SIZE(t) : 0;
    if (Py_REFCNT(t) != 1 || n < 1 || n > 3 || tuples_cached[n] >= TUPLE_CACHE) {
        Py_DECREF(t);
        return;
    }
    PyObject *items[3];
    for (Py_ssize_t k = 0; k < n; k++) {
        items[k] = PyTuple_GET_ITEM(t, k);
        PyTuple_SET_ITEM(t, k, NULL);
    }
    tuple_cache[n][tuples_cached[n]++] = t;    /* consistent before any decref runs code */
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(items[k]);
}

/* _TailResume objects the driver loop is done with, kept for reuse. */
static PyObject *tail_cache[CHAIN_CACHE];
static int tails_cached;

/* _TailResume(chain, send) (steals both). */
static PyObject *
new_tail_resume(PyObject *chain, PyObject *send)
{
    PyObject *tr = tails_cached > 0 ? tail_cache[--tails_cached] : g_tail_t->tp_alloc(g_tail_t, 0);
    if (tr == NULL) {
        Py_DECREF(chain);
        Py_DECREF(send);
        return NULL;
    }
    SLOT(tr, off_tr_chain) = chain;
    SLOT(tr, off_tr_send) = send;
    return tr;
}

/* Drop the driver's reference to a _TailResume whose fields it took. */
static inline void
release_tail_resume(PyObject *tr)
{
    if (Py_REFCNT(tr) == 1 && Py_TYPE(tr) == g_tail_t && tails_cached < CHAIN_CACHE) {
        PyObject *chain = SLOT(tr, off_tr_chain), *send = SLOT(tr, off_tr_send);
        SLOT(tr, off_tr_chain) = SLOT(tr, off_tr_send) = NULL;
        tail_cache[tails_cached++] = tr;
        Py_XDECREF(chain);
        Py_XDECREF(send);
        return;
    }
    Py_DECREF(tr);
}

/* ``if send[0]: raise send[1]`` / ``return send[1]``; steals ``send``. */
static PyObject *
rt_answer(PyObject *send)
{
    if (!PyTuple_CheckExact(send) || PyTuple_GET_SIZE(send) != 2) {
        PyErr_Format(PyExc_TypeError, "kina_fx: bad resume message %R", send);
        Py_DECREF(send);
        return NULL;
    }
    int raise = PyObject_IsTrue(PyTuple_GET_ITEM(send, 0));
    PyObject *v = Py_NewRef(PyTuple_GET_ITEM(send, 1));
    kfx_release_tuple(send);
    if (raise == 0)
        return v;
    if (raise > 0)
        kfx_raise(v);
    Py_DECREF(v);
    return NULL;
}


/* handlers._suspend_perform with post/suspend/_switch inlined.  Steals f, h. */
PyObject *
rt_suspend(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h)
{
    if (Py_TYPE(f) != g_fiber_t)     /* fallback: "not the exact kina_fx types" */
        return suspend_py(effect, args, n, f, h);
    PyObject *parent = SLOT(f, off_parent), *shallow = SLOT(f, off_shallow);
    if (parent == NULL || Py_TYPE(parent) != g_fiber_t || shallow == NULL ||
            SLOT(parent, off_glet) == NULL)     /* fallback: "a chain being unwound performs" */
        return suspend_py(effect, args, n, f, h);
    PyObject *st = thread_state();
    if (st == NULL)
        goto fail;
    PyObject *cur = SLOT(st, off_current);
    if (cur == NULL || Py_TYPE(cur) != g_fiber_t) {  /* fallback: "not the exact kina_fx types" */
        Py_DECREF(st);
        return suspend_py(effect, args, n, f, h);
    }
    int is_shallow = PyObject_IsTrue(shallow);
    if (is_shallow < 0) {
        Py_DECREF(st);
        goto fail;
    }
    /* k = Continuation(st.current, f, f.shallow) */
    PyObject *k = new_chain_object(g_cont_t);
    if (k == NULL) {
        Py_DECREF(st);
        goto fail;
    }
    SLOT(k, off_top) = Py_NewRef(cur);
    SLOT(k, off_base) = Py_NewRef(f);
    SLOT(k, off_k_shallow) = Py_NewRef(shallow);
    /* message = (PERFORMED, h, (effect, args, k)) */
    PyObject *payload = n >= 1 && n <= 3 ? kfx_tuple(n, args[0], n > 1 ? args[1] : NULL,
                                                      n > 2 ? args[2] : NULL)
                                         : args_tuple(args, n);
    PyObject *inner = payload == NULL ? NULL : kfx_tuple(3, effect, payload, k);
    PyObject *message = inner == NULL ? NULL : kfx_tuple(3, g_performed, h, inner);
    Py_XDECREF(payload);
    Py_XDECREF(inner);
    if (message == NULL) {
        /* k never escaped: empty it so that its __del__ unwinds nothing */
        set_slot(k, off_top, Py_None);
        set_slot(k, off_base, Py_None);
        Py_DECREF(k);
        Py_DECREF(st);
        goto fail;
    }
    Py_DECREF(k);
    if (is_shallow)
        set_slot(f, off_handler, Py_None);
    Py_DECREF(h);
    /* post(f, message); suspend() */
    PyObject *old = SLOT(st, off_mail);
    SLOT(st, off_mail) = message;
    Py_XDECREF(old);
    PyObject *resumer = SLOT(f, off_parent);     /* re-read: see the finalizers note */
    if (resumer == NULL || Py_TYPE(resumer) != g_fiber_t || SLOT(resumer, off_glet) == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kina_fx: the resumer vanished during suspend");
        Py_DECREF(st);
        Py_DECREF(f);
        return NULL;
    }
    Py_INCREF(resumer);
    set_slot(f, off_parent, Py_None);
    kfx_set_current(st, resumer);
    PyObject *glet = Py_NewRef(SLOT(resumer, off_glet));
    Py_DECREF(resumer);
    Py_DECREF(f);
    Py_DECREF(st);
    PyObject *send = rt_switch(glet);
    if (send == NULL)
        return NULL;
    return rt_answer(send);

fail:
    Py_DECREF(f);
    Py_DECREF(h);
    return NULL;
}

/* fibers.switch_into(chain, send) + _switch: the message sent back (new ref). */
PyObject *
rt_switch_into(PyObject *chain, PyObject *send)
{
    Py_INCREF(send);
    return kfx_switch_into_stealing(chain, send);
}

/* rt_switch_into taking the caller's reference to ``send``: the fiber that
 * reads it is then its only holder, and can reuse the pair. */
PyObject *
kfx_switch_into_stealing(PyObject *chain, PyObject *send)
{
    if (kfx_materialize() < 0) {     /* no pending marker crosses a switch */
        Py_DECREF(send);
        return NULL;
    }
    if (!KFX_READY()) {
        Py_DECREF(send);
        return NULL;
    }
    PyTypeObject *ct = Py_TYPE(chain);
    if (ct != g_chain_t && ct != g_cont_t)       /* fallback: "not the exact kina_fx types" */
        goto py;
    PyObject *st = thread_state();
    if (st == NULL) {
        Py_DECREF(send);
        return NULL;
    }
    PyObject *dropped = SLOT(st, off_dropped), *me = SLOT(st, off_current);
    PyObject *top = SLOT(chain, off_top), *base = SLOT(chain, off_base);
    if (dropped == NULL || !PyList_CheckExact(dropped) || PyList_GET_SIZE(dropped) != 0 ||
            me == NULL || top == NULL || base == NULL || Py_TYPE(me) != g_fiber_t ||
            Py_TYPE(top) != g_fiber_t || Py_TYPE(base) != g_fiber_t ||
            SLOT(top, off_job) != Py_None || SLOT(top, off_glet) == NULL ||
            SLOT(top, off_glet) == Py_None ||
            !same_serial(SLOT(top, off_thread), SLOT(me, off_thread))) {
        /* fallback: "chains dropped by other threads", "not the exact kina_fx
         * types", "a consumed chain", "a fiber's first start", "another
         * thread's chain" */
        Py_DECREF(st);
        goto py;
    }
    Py_INCREF(me);
    Py_INCREF(top);
    Py_INCREF(base);
    set_slot(chain, off_top, Py_None);
    set_slot(chain, off_base, Py_None);
    set_slot(base, off_parent, me);
    PyObject *old_mail = SLOT(st, off_mail);
    SLOT(st, off_mail) = send;       /* ours, moved into the mailbox */
    Py_XDECREF(old_mail);
    kfx_set_current(st, top);
    PyObject *glet = Py_NewRef(SLOT(top, off_glet));
    Py_DECREF(me);
    Py_DECREF(top);
    Py_DECREF(base);
    Py_DECREF(st);
    return rt_switch(glet);

py:;
    PyObject *call[2] = {chain, send};
    PyObject *r = PyObject_Vectorcall(g_switch_into_py, call, 2, NULL);
    Py_DECREF(send);
    return r;
}

PyDoc_STRVAR(switch_into_doc,
"switch_into($module, chain, send, /)\n--\n\n"
"Compiled kina_fx.fibers.switch_into: resume ``chain`` from the running fiber;\n"
"return the message sent back.");

KFX_FASTCALL2(switch_into, rt_switch_into)

/* Continuation.resume(self, value=None), then handlers._resume_from. */
static PyObject *
rt_resume(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!KFX_READY())
        return NULL;
    /* fallback: "keyword arguments", "a subclass of Continuation" */
    if (kwnames != NULL || nargs > 1 || Py_TYPE(self) != g_cont_t)
        goto py;
    PyObject *top = SLOT(self, off_top), *base = SLOT(self, off_base);
    if (top == NULL || base == NULL || Py_TYPE(top) != g_fiber_t ||
            SLOT(self, off_k_shallow) != Py_False)
        goto py;                     /* fallback: "a resume that raises" */
    PyObject *st = thread_state();
    if (st == NULL)
        return NULL;
    int mine = same_serial(SLOT(top, off_thread), SLOT(st, off_serial));
    Py_DECREF(st);
    PyFrameObject *caller = PyEval_GetFrame();       /* borrowed: our caller */
    /* fallback: "a resume that raises", "no Python caller" */
    if (!mine || caller == NULL)
        goto py;
    Py_INCREF(caller);
    /* chain = Chain(k.top, k.base); k.top = k.base = None */
    PyObject *chain = new_chain_object(g_chain_t);
    if (chain != NULL) {
        SLOT(chain, off_top) = Py_NewRef(top);
        SLOT(chain, off_base) = Py_NewRef(base);
    }
    if (chain == NULL) {
        Py_DECREF(caller);
        return NULL;
    }
    set_slot(self, off_top, Py_None);
    set_slot(self, off_base, Py_None);
    PyObject *send = kfx_tuple(2, Py_False, nargs ? args[0] : Py_None, NULL);
    if (send == NULL) {
        Py_DECREF(caller);
        Py_DECREF(chain);
        return NULL;
    }
    int tail = straight_to_driver((PyObject *)caller);
    Py_DECREF(caller);
    if (tail < 0) {
        Py_DECREF(chain);
        Py_DECREF(send);
        return NULL;
    }
    if (tail)                        /* _TailResume(chain, send) for the driver */
        return new_tail_resume(chain, send);
    return kfx_nest_drive(chain, send);

py:;
    /* The reference method (it raises the matching error); its
     * sys._getframe(1) is our caller too, a C method having no frame. */
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *stack[8];
    if (nargs + nkw > 7) {
        PyErr_SetString(PyExc_TypeError, "resume() takes at most 1 argument");
        return NULL;
    }
    stack[0] = self;
    for (Py_ssize_t j = 0; j < nargs + nkw; j++)
        stack[j + 1] = args[j];
    return PyObject_Vectorcall(g_resume_py, stack, nargs + 1, kwnames);
}

static PyMethodDef resume_def = {
    "resume", (PyCFunction)(void (*)(void))rt_resume, METH_FASTCALL | METH_KEYWORDS,
    "resume($self, value=None, /)\n--\n\n"
    "OCaml ``continue k value``: returns what the handler returns.  (Compiled;\n"
    "kina_fx.handlers._ContinuationReference.resume is the reference.)"};

/* ContinuationData.__init_subclass__: each class deriving from it gets the
 * compiled resume as its own method.  Why its own: CPython (3.11+) calls a C
 * method by its specialized path only when the receiver's class is exactly
 * the method's; inherited from ContinuationData, every k.resume(x) would take
 * the generic path (~170 instructions more a round trip).  A class that
 * defines its own resume keeps it.  Then the next __init_subclass__ of the
 * MRO (typing.Generic's, object's) runs, as for any class. */
static PyObject *
continuation_init_subclass(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    PyObject *name = PyUnicode_InternFromString(resume_def.ml_name);
    if (name == NULL)
        return NULL;
    int own = PyDict_Contains(((PyTypeObject *)cls)->tp_dict, name);
    if (own == 0) {
        PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, &resume_def);
        own = descr == NULL ? -1 : PyObject_SetAttr(cls, name, descr);
        Py_XDECREF(descr);
    }
    Py_DECREF(name);
    if (own < 0)
        return NULL;
    PyObject *next = PyObject_CallFunctionObjArgs((PyObject *)&PySuper_Type,
                                                  (PyObject *)&KContinuation_Type, cls, NULL);
    PyObject *init = next == NULL ? NULL : PyObject_GetAttrString(next, "__init_subclass__");
    Py_XDECREF(next);
    PyObject *r = init == NULL ? NULL : PyObject_Call(init, args, kwargs);
    Py_XDECREF(init);
    return r;
}

PyMethodDef kfx_continuation_methods[] = {
    {"__init_subclass__", (PyCFunction)(void (*)(void))continuation_init_subclass,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Give the new class the compiled resume as its own method (round_trip.c)."},
    {NULL, NULL, 0, NULL},
};

/* The eager abort of handlers._drive: after a clause returned ``*result`` (or
 * raised: *result NULL) without using its continuation ``*k`` (``k.top`` is
 * not None), hand ``[k]`` (our reference, stolen: *k becomes NULL) and the
 * result to handlers._abort_unless_kept, which aborts k unless something else
 * keeps it, and returns the clause's result: *result is replaced by it (a tail
 * resume of another continuation has then run to its end).  Returns -1 when
 * that raised (its exception, now set, replaces the clause's result or
 * exception), 0 otherwise (any exception of the clause unchanged). */
static int
abort_unless_kept(PyObject **k, PyObject *handler, PyObject **result)
{
    PyObject *exc = *result == NULL ? exc_save() : NULL;
    PyObject *top = Py_TYPE(*k) == g_cont_t ? Py_XNewRef(SLOT(*k, off_top))
                                            : PyObject_GetAttrString(*k, "top");
    if (top == NULL) {
        Py_XDECREF(exc);
        Py_CLEAR(*result);
        return -1;
    }
    int unused = top != Py_None;
    Py_DECREF(top);
    if (!unused) {
        if (exc != NULL)
            exc_restore(exc);
        return 0;
    }
    PyObject *box = PyList_New(1);
    if (box == NULL) {
        Py_XDECREF(exc);
        Py_CLEAR(*result);
        return -1;
    }
    PyList_SET_ITEM(box, 0, *k);
    *k = NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(g_abort_unless_kept, box, handler,
                                               exc != NULL ? exc : Py_None,
                                               *result != NULL ? *result : Py_None, NULL);
    Py_DECREF(box);
    if (r == NULL) {
        Py_XDECREF(exc);
        Py_CLEAR(*result);
        return -1;
    }
    if (exc != NULL) {
        Py_DECREF(r);
        exc_restore(exc);
    }
    else
        Py_SETREF(*result, r);
    return 0;
}

/* handlers._drive_py's loop.  Call it through drive_from_here, never
 * directly: the tail check must know it runs.  Steals chain and send: the
 * first ones are handed over by drive() out of the list it empties (as
 * _drive_py empties its own) or by kfx_nest_drive, and those of tail resumes
 * are dropped as soon as the switch has taken them.  (A send may hold an
 * exception thrown into the body, whose traceback holds the frames it goes
 * through and what they reference: a clause's continuation would look kept,
 * and not be aborted.)  Inlined into its callers, as drive_from_here is. */
static inline __attribute__((always_inline)) PyObject *
rt_drive(PyObject *chain, PyObject *send)
{
    for (;;) {
        PyObject *msg = kfx_switch_into_stealing(chain, send);
        kfx_release_chain(chain);
        if (msg == NULL)
            return NULL;
        if (!PyTuple_CheckExact(msg) || PyTuple_GET_SIZE(msg) != 3) {
            PyErr_Format(PyExc_TypeError, "kina_fx: bad fiber message %R", msg);
            Py_DECREF(msg);
            return NULL;
        }
        PyObject *kind = PyTuple_GET_ITEM(msg, 0), *handler = Py_NewRef(PyTuple_GET_ITEM(msg, 1));
        PyObject *payload = Py_NewRef(PyTuple_GET_ITEM(msg, 2));
        PyObject *result = NULL;
        if (kind == g_performed) {
            kfx_release_tuple(msg);
            /* effect, args, k = payload; handler.on[effect](k, *args) */
            if (!PyTuple_CheckExact(payload) || PyTuple_GET_SIZE(payload) != 3 ||
                    !PyTuple_CheckExact(PyTuple_GET_ITEM(payload, 1))) {
                PyErr_SetString(PyExc_TypeError, "kina_fx: bad perform message");
                Py_DECREF(payload);
                Py_DECREF(handler);
                return NULL;
            }
            PyObject *effect = Py_NewRef(PyTuple_GET_ITEM(payload, 0));
            PyObject *args = Py_NewRef(PyTuple_GET_ITEM(payload, 1));
            PyObject *k = Py_NewRef(PyTuple_GET_ITEM(payload, 2));
            kfx_release_tuple(payload);
            PyObject *on = get_handler_attr(handler, g_handler_on, off_on, s_on);
            PyObject *clause = on == NULL ? NULL : PyObject_GetItem(on, effect);
            Py_XDECREF(on);
            Py_DECREF(effect);
            if (clause != NULL) {
                Py_ssize_t n = PyTuple_GET_SIZE(args);
                PyObject *small[8], **vec = small;
                if (n + 2 > 8)
                    vec = PyMem_Malloc((n + 2) * sizeof(PyObject *));
                if (vec == NULL)
                    PyErr_NoMemory();
                else {
                    vec[1] = k;
                    for (Py_ssize_t j = 0; j < n; j++)
                        vec[j + 2] = PyTuple_GET_ITEM(args, j);
                    result = PyObject_Vectorcall(clause, vec + 1,
                                                 (n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                    if (vec != small)
                        PyMem_Free(vec);
                }
                Py_DECREF(clause);
            }
            /* The usual case, k used, needs no call. */
            int used = Py_TYPE(k) == g_cont_t && SLOT(k, off_top) == Py_None;
            if (!used && abort_unless_kept(&k, handler, &result) < 0)
                result = NULL;
            Py_DECREF(handler);
            Py_DECREF(args);
            Py_XDECREF(k);
        }
        else if (kind == g_returned || kind == g_raised) {
            /* the return clause (none: the value), or the exception clause
             * (none, or not an Exception: raised on) */
            int raised = kind == g_raised;
            Py_DECREF(msg);
            PyObject *clause = PyObject_GetAttr(handler, raised ? s_exc : s_ret);
            Py_DECREF(handler);
            if (clause == Py_None ||
                    (raised && clause != NULL && !PyObject_TypeCheck(payload, (PyTypeObject *)PyExc_Exception)))
                result = raised ? kfx_raise(payload) : Py_NewRef(payload);
            else if (clause != NULL)
                result = PyObject_CallOneArg(clause, payload);
            Py_XDECREF(clause);
            Py_DECREF(payload);
        }
        else {
            PyErr_Format(PyExc_TypeError, "kina_fx: unknown fiber message kind %R", kind);
            Py_DECREF(msg);
            Py_DECREF(handler);
            Py_DECREF(payload);
        }
        if (result == NULL)
            return NULL;
        if (Py_TYPE(result) != g_tail_t)
            return result;
        /* a tail resume: chain, send = result.chain, result.send; go round */
        chain = SLOT(result, off_tr_chain);
        send = SLOT(result, off_tr_send);
        if (chain == NULL || send == NULL) {
            PyErr_SetString(PyExc_TypeError, "kina_fx: incomplete _TailResume");
            Py_DECREF(result);
            return NULL;
        }
        Py_INCREF(chain);
        Py_INCREF(send);
        release_tail_resume(result);
    }
}

/* ---- which frame a driver loop was called from -------------------------------- *
 *
 * The tail check (tail.c) stops at the driver loop's frame.  The C loop has
 * none, so the frame it was called from stands for it while it runs: it is
 * the f_back of every clause the loop calls, as the Python loop's frame is.
 * A walk up from a resume meets the innermost running loop's frame before
 * any outer one's (each is an ancestor of the next), and every frame of the
 * walk belongs to the running fiber, whose stack is last in, first out: so
 * the fiber keeps just that innermost frame (KFiber.driver_frame), and a loop
 * restores the one it found when it ends.  The frame is borrowed: its own
 * execution, stopped in the call of the loop, keeps it alive meanwhile, and
 * it is only ever compared. */

/* rt_drive, with the frame of its caller as this fiber's driver frame while
 * it runs (no Python caller: no frame; its clauses' resumes then nest).
 * Steals chain and send, as rt_drive does.  Inlined: one C frame less on the
 * stack greenlet saves at each switch. */
static inline __attribute__((always_inline)) PyObject *
drive_from_here(PyObject *chain, PyObject *send)
{
    KFiber *fiber = kfx_current;
    PyObject *frame = (PyObject *)PyEval_GetFrame();      /* borrowed */
    if (frame == NULL && PyErr_Occurred()) {
        Py_DECREF(chain);
        Py_DECREF(send);
        return NULL;
    }
    if (fiber == NULL)
        return rt_drive(chain, send);
    Py_INCREF(fiber);
    PyObject *outer = fiber->driver_frame;
    fiber->driver_frame = frame;
    fiber->drivers++;
    PyObject *r = rt_drive(chain, send);
    fiber->drivers--;
    fiber->driver_frame = outer;
    Py_DECREF(fiber);
    return r;
}

/* handlers._stack_is_deep_py: the stack of this greenlet is deeper than
 * _HOP_DEPTH frames.  The Python frames as the thread state counts calls,
 * and the C driver loops running on this fiber, one frame each: where the
 * reference has a frame of _drive_py, so that deep chains of non-tail
 * resumes hop to a fresh stack as often (the C stack that every greenlet
 * switch copies stays as short). */
static int
stack_is_deep(void)
{
    PyThreadState *ts = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030C0000
    int depth = ts->py_recursion_limit - ts->py_recursion_remaining;
#elif PY_VERSION_HEX >= 0x030B0000
    int depth = ts->recursion_limit - ts->recursion_remaining;
#else
    int depth = ts->recursion_depth;
#endif
    if (kfx_current != NULL)
        depth += kfx_current->drivers;
    return depth > g_hop_depth;
}

PyDoc_STRVAR(stack_is_deep_doc,
"stack_is_deep($module, /)\n--\n\n"
"Compiled kina_fx.handlers._stack_is_deep_py, counting each C driver loop\n"
"running on this fiber as the frame of _drive_py it stands for.");

static PyObject *
stack_is_deep_fn(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    if (!KFX_READY())
        return NULL;
    return Py_NewRef(stack_is_deep() ? Py_True : Py_False);
}

/* A resume not in tail position nests a driver loop here (handlers._resume_from):
 * past _HOP_DEPTH frames on a fresh helper fiber (handlers._drive_on_fresh_stack,
 * given [chain, send] to empty as the driver loop does).  Steals chain and send. */
PyObject *
kfx_nest_drive(PyObject *chain, PyObject *send)
{
    if (!stack_is_deep())
        return drive_from_here(chain, send);
    PyObject *step = kfx_list2(chain, send);
    if (step == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(g_drive_fresh, step);
    Py_DECREF(step);
    return r;
}

PyDoc_STRVAR(drive_doc,
"drive($module, step, /)\n--\n\n"
"Compiled kina_fx.handlers._drive_py: resume the chain of ``step``, a list\n"
"[chain, send] that it empties, and run the clauses of whichever handlers it\n"
"stops at; return the handler's result.");

static PyObject *
drive(PyObject *Py_UNUSED(module), PyObject *step)
{
    if (!PyList_CheckExact(step) || PyList_GET_SIZE(step) != 2) {
        PyErr_SetString(PyExc_TypeError, "drive() takes a list [chain, send]");
        return NULL;
    }
    if (!KFX_READY())
        return NULL;
    /* The list's references taken over and the list left empty, without a
     * call (its two slots stay allocated until it goes, as a list may have
     * more room than items): no reference stays with the caller (see
     * rt_drive). */
    PyObject *chain = PyList_GET_ITEM(step, 0), *send = PyList_GET_ITEM(step, 1);
    Py_SET_SIZE(step, 0);
    return drive_from_here(chain, send);
}

/* Continuation.__del__ as ContinuationData's tp_finalize (the reference is
 * handlers._ContinuationReference.__del__, after it in Continuation's MRO):
 * a continuation dropped unused is unwound, except at interpreter exit.
 * Every round trip frees one continuation; here that costs no method lookup
 * and no call. */
void
kfx_continuation_finalize(PyObject *self)
{
    PyObject *top = ((KChain *)self)->top;
#if PY_VERSION_HEX >= 0x030D0000
    int finalizing = Py_IsFinalizing();
#else
    int finalizing = _Py_IsFinalizing();
#endif
    if (top == NULL || top == Py_None || finalizing)
        return;
    PyObject *pending = exc_save();  /* a finalizer keeps the exception being raised */
    PyObject *r = KFX_READY() ? PyObject_CallOneArg(g_unwind_fn, self) : NULL;
    if (r == NULL)
        PyErr_WriteUnraisable(self);
    Py_XDECREF(r);
    exc_restore(pending);
}

PyMethodDef kfx_round_trip_methods[] = {
    {"switch_into", (PyCFunction)(void (*)(void))switch_into, METH_FASTCALL, switch_into_doc},
    {"drive", drive, METH_O, drive_doc},
    {"stack_is_deep", stack_is_deep_fn, METH_NOARGS, stack_is_deep_doc},
    {NULL, NULL, 0, NULL},
};
