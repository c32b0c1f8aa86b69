/* round_trip.c: an ``on`` perform + resume round trip, compiled.
 *
 * What it mirrors: handlers._suspend_perform with fibers.post / suspend /
 * _switch (rt_suspend), fibers.switch_into (rt_switch_into), the loop of
 * handlers._drive (rt_drive, whose eager abort calls the Python
 * handlers._abort_unless_kept), Continuation.resume with handlers._resume_from
 * (rt_resume) and Continuation.__del__ (rt_del).  The details are below.
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
 *                   ``on`` branch).  Falls back when the base fiber has no
 *                   resumer (a chain being unwound) or an object is not of
 *                   the exact kina_fx type.
 *   rt_switch_into  fibers.switch_into + fibers._switch (the resumer side;
 *                   handlers._drive and Stepper._step call it).  Falls back
 *                   for a chain whose top fiber has not started yet (it needs
 *                   a worker from the trampoline), a fiber of another thread,
 *                   a consumed chain (InternalError) and pending dropped
 *                   chains of other threads (_unwind_dropped).
 *   rt_resume       Continuation.resume (installed on the class as a method
 *                   descriptor): the one-shot/shallow/thread checks, then
 *                   handlers._resume_from with the tail check.  Keyword
 *                   arguments, subclasses and every failing check call the
 *                   Python method (kept as handlers._resume_py), which raises.
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

static int rt_bound;

/* greenlet's C API (greenlet._C_API; its greenlet.h numbers the entries and
 * promises they do not change): greenlet.switch without a method lookup. */
#define GREENLET_TYPE_NUM 0
#define GREENLET_SWITCH_NUM 6
static PyTypeObject *g_greenlet_t;
static PyObject *(*g_greenlet_switch)(PyObject *glet, PyObject *args, PyObject *kwargs);

static void
bind_greenlet_api(void)
{
    void **api = PyCapsule_Import("greenlet._C_API", 0);
    if (api == NULL) {
        PyErr_Clear();               /* the method call still works */
        return;
    }
    g_greenlet_switch = (PyObject *(*)(PyObject *, PyObject *, PyObject *))api[GREENLET_SWITCH_NUM];
    g_greenlet_t = g_greenlet_switch != NULL ? (PyTypeObject *)api[GREENLET_TYPE_NUM] : NULL;
}
PyTypeObject *g_chain_t;      /* fibers.Chain                             */
PyTypeObject *g_cont_t;       /* handlers.Continuation                    */
static PyObject *g_gexit;            /* greenlet.GreenletExit                    */
static PyObject *g_unwind;           /* fibers.Unwind                            */
static PyObject *g_begin_unwind;     /* fibers._begin_unwind_here                */
static PyObject *g_switch_into_py;   /* fibers.switch_into                       */
static PyObject *g_resume_py;        /* the Python Continuation.resume           */
PyObject *g_performed;        /* handlers.PERFORMED                       */
PyObject *g_returned, *g_raised; /* fibers.RETURNED, fibers.RAISED        */

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

static void
flush_chain_caches(void)
{
    while (conts_cached > 0)
        Py_DECREF(cont_cache[--conts_cached]);
    while (chains_cached > 0)
        Py_DECREF(chain_cache[--chains_cached]);
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
static void
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

/* A resume not in tail position nests a driver (handlers._resume_from):
 * handlers._drive (the one-line Python frame the tail check looks for), or
 * past _HOP_DEPTH frames handlers._drive_on_fresh_stack.  Bound by
 * _bind_drive; without it rt_resume calls handlers._resume_nested. */
static PyObject *g_drive_fn, *g_drive_fresh;
static int g_hop_depth;

/* handlers._stack_is_deep: the Python stack of this greenlet is deeper than
 * _HOP_DEPTH frames, as the thread state counts calls. */
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
    return depth > g_hop_depth;
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
    if (raise > 0) {
        if (PyExceptionInstance_Check(v))
            PyErr_SetObject((PyObject *)Py_TYPE(v), v);
        else if (PyExceptionClass_Check(v))
            PyErr_SetNone(v);
        else
            PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    }
    Py_DECREF(v);
    return NULL;
}


/* handlers._suspend_perform with post/suspend/_switch inlined.  Steals f, h. */
PyObject *
rt_suspend(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h)
{
    if (!rt_bound || Py_TYPE(f) != g_fiber_t)
        return suspend_py(effect, args, n, f, h);
    PyObject *parent = SLOT(f, off_parent), *shallow = SLOT(f, off_shallow);
    if (parent == NULL || Py_TYPE(parent) != g_fiber_t || shallow == NULL ||
            SLOT(parent, off_glet) == NULL)
        return suspend_py(effect, args, n, f, h);    /* no resumer: being unwound */
    PyObject *st = thread_state();
    if (st == NULL)
        goto fail;
    PyObject *cur = SLOT(st, off_current);
    if (cur == NULL || Py_TYPE(cur) != g_fiber_t) {
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
    PyTypeObject *ct = Py_TYPE(chain);
    if (!rt_bound || (ct != g_chain_t && ct != g_cont_t))
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

static PyObject *
switch_into(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "switch_into(chain, send) takes 2 arguments");
        return NULL;
    }
    return rt_switch_into(args[0], args[1]);
}

/* Continuation.resume(self, value=None), then handlers._resume_from. */
static PyObject *
rt_resume(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL || nargs > 1 || Py_TYPE(self) != g_cont_t || !rt_bound)
        goto py;
    PyObject *top = SLOT(self, off_top), *base = SLOT(self, off_base);
    if (top == NULL || base == NULL || Py_TYPE(top) != g_fiber_t ||
            SLOT(self, off_k_shallow) != Py_False)
        goto py;
    PyObject *st = thread_state();
    if (st == NULL)
        return NULL;
    int mine = same_serial(SLOT(top, off_thread), SLOT(st, off_serial));
    Py_DECREF(st);
    PyFrameObject *caller = PyEval_GetFrame();       /* borrowed: our caller */
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
    /* not a tail resume: nest (the deep-stack hop, or _drive) */
    PyObject *r;
    if (g_drive_fn != NULL) {
        PyObject *call[2] = {chain, send};
        r = PyObject_Vectorcall(stack_is_deep() ? g_drive_fresh : g_drive_fn, call, 2, NULL);
        kfx_release_chain(chain);
        Py_DECREF(send);
    }
    else {
        PyObject *tr = new_tail_resume(chain, send);
        r = tr == NULL ? NULL : PyObject_CallOneArg(g_nested, tr);
        Py_XDECREF(tr);
    }
    return r;

py:;
    /* The Python method (it raises the matching error); its sys._getframe(1)
     * is our caller too, a C method having no frame. */
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
    "OCaml ``continue k value``: returns what the handler returns.  (Compiled\n"
    "Continuation.resume; kina_fx.handlers._resume_py is the reference.)"};

/* The eager abort of handlers._drive: after a clause returned ``*result`` (or
 * raised: *result NULL) without using its continuation ``*k`` (``k.top`` is
 * not None), hand ``[k]`` (our reference, stolen: *k becomes NULL) to
 * handlers._abort_unless_kept, which aborts k unless something else keeps it.
 * Returns -1 when that raised (the cleanup's exception, now set, replaces the
 * clause's result or exception), 0 otherwise (*result and any exception of the
 * clause unchanged). */
static PyObject *g_abort_unless_kept;  /* handlers._abort_unless_kept (_bind_abort) */

static int
abort_unless_kept(PyObject **k, PyObject *handler, PyObject **result)
{
    if (g_abort_unless_kept == NULL)
        return 0;
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
                                               exc != NULL ? exc : Py_None, NULL);
    Py_DECREF(box);
    if (r == NULL) {
        Py_XDECREF(exc);
        Py_CLEAR(*result);
        return -1;
    }
    Py_DECREF(r);
    if (exc != NULL)
        exc_restore(exc);
    return 0;
}

PyDoc_STRVAR(bind_abort_doc,
"_bind_abort($module, abort_unless_kept, /)\n--\n\n"
"Called by kina_fx.handlers: the driver loop's eager abort (handlers._abort_unless_kept).");

static PyObject *
bind_abort(PyObject *Py_UNUSED(module), PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "_bind_abort needs a callable");
        return NULL;
    }
    Py_XSETREF(g_abort_unless_kept, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* handlers._drive's loop (the Python function of that name is the reference).
 * handlers binds it behind a one-line Python ``_drive`` frame, so that the
 * clauses called from here still have a driver frame to return to (the tail
 * check looks for its code).  That frame hands over the first (chain, send)
 * in a list that drive() empties, as the Python _drive keeps neither; the
 * chains and sends of later tail resumes are dropped here as soon as the
 * switch has taken them.  (A send may hold an exception thrown into the body,
 * whose traceback holds the frames it goes through and what they reference:
 * a clause's continuation would look kept, and not be aborted.)
 * Steals chain and send. */
static PyObject *
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
            if (abort_unless_kept(&k, handler, &result) < 0)
                result = NULL;
            Py_DECREF(handler);
            Py_DECREF(args);
            Py_XDECREF(k);
        }
        else if (kind == g_returned) {
            Py_DECREF(msg);
            PyObject *ret = PyObject_GetAttr(handler, s_ret);
            Py_DECREF(handler);
            if (ret == Py_None)
                result = Py_NewRef(payload);
            else if (ret != NULL)
                result = PyObject_CallOneArg(ret, payload);
            Py_XDECREF(ret);
            Py_DECREF(payload);
        }
        else if (kind == g_raised) {
            Py_DECREF(msg);
            PyObject *exc = PyObject_GetAttr(handler, s_exc);
            Py_DECREF(handler);
            if (exc != NULL) {
                if (exc == Py_None || !PyObject_TypeCheck(payload, (PyTypeObject *)PyExc_Exception)) {
                    if (PyExceptionInstance_Check(payload))
                        PyErr_SetObject((PyObject *)Py_TYPE(payload), payload);
                    else
                        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
                }
                else
                    result = PyObject_CallOneArg(exc, payload);
                Py_DECREF(exc);
            }
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

PyDoc_STRVAR(drive_doc,
"drive($module, step, /)\n--\n\n"
"Compiled loop of kina_fx.handlers._drive, given [chain, send] (emptied) or\n"
"chain, send (call it from a frame running the driver code bound with _bind_tail).");

static PyObject *
drive(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (!rt_bound) {
        PyErr_SetString(PyExc_RuntimeError, "kina_fx._speedups: _bind_round_trip was not called");
        return NULL;
    }
    if (nargs == 1 && PyList_CheckExact(args[0]) && PyList_GET_SIZE(args[0]) == 2) {
        /* drive([chain, send]): taken out of the list, which is left empty */
        PyObject *step = args[0];
        PyObject *chain = Py_NewRef(PyList_GET_ITEM(step, 0));
        PyObject *send = Py_NewRef(PyList_GET_ITEM(step, 1));
        if (PyList_SetSlice(step, 0, 2, NULL) < 0) {
            Py_DECREF(chain);
            Py_DECREF(send);
            return NULL;
        }
        return rt_drive(chain, send);
    }
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "drive([chain, send]) or drive(chain, send)");
        return NULL;
    }
    return rt_drive(Py_NewRef(args[0]), Py_NewRef(args[1]));
}

/* Continuation.__del__ as ContinuationData's tp_finalize (the Python method
 * is kept as handlers._del_py; handlers deletes it from the class so that
 * this runs): a continuation dropped unused is unwound, except at
 * interpreter exit.  Every round trip frees one continuation; here that
 * costs no method lookup and no call. */
static PyObject *g_unwind_fn;        /* fibers.unwind                            */

void
kfx_continuation_finalize(PyObject *self)
{
    PyObject *top = ((KChain *)self)->top;
#if PY_VERSION_HEX >= 0x030D0000
    int finalizing = Py_IsFinalizing();
#else
    int finalizing = _Py_IsFinalizing();
#endif
    if (g_unwind_fn == NULL || top == NULL || top == Py_None || finalizing)
        return;
    PyObject *pending = exc_save();  /* a finalizer keeps the exception being raised */
    PyObject *r = PyObject_CallOneArg(g_unwind_fn, self);
    if (r == NULL)
        PyErr_WriteUnraisable(self);
    Py_XDECREF(r);
    exc_restore(pending);
}

PyDoc_STRVAR(bind_round_trip_doc,
"_bind_round_trip(Chain, Continuation, GreenletExit, Unwind, begin_unwind_here, switch_into,\n"
"                 resume, PERFORMED, RETURNED, RAISED, unwind)\n--\n\n"
"Called by kina_fx.handlers after _bind: what the compiled round trip works with.\n"
"Returns the compiled ``resume`` method descriptor for Continuation (its\n"
"__del__ is ContinuationData's finalizer once the class has none of its own).");

static PyObject *
bind_round_trip(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *chain_t, *cont_t, *gexit, *unwind_t, *begin, *sw, *res, *performed, *returned, *raised,
             *unwind_fn;
    if (!PyArg_ParseTuple(args, "O!O!OOOOOOOOO:_bind_round_trip", &PyType_Type, &chain_t,
                          &PyType_Type, &cont_t, &gexit, &unwind_t, &begin, &sw, &res, &performed,
                          &returned, &raised, &unwind_fn))
        return NULL;
    if (g_fiber_t == NULL || g_tstate_t == NULL || g_tail_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_bind_round_trip: call _bind first");
        return NULL;
    }
    if (!PyCallable_Check(begin) || !PyCallable_Check(sw) || !PyCallable_Check(res) ||
            !PyCallable_Check(unwind_fn) ||
            !PyExceptionClass_Check(gexit) || !PyExceptionClass_Check(unwind_t)) {
        PyErr_SetString(PyExc_TypeError, "_bind_round_trip: bad arguments");
        return NULL;
    }
    if (check_data_type(chain_t, &KChain_Type, "Chain") ||
            check_data_type(cont_t, &KContinuation_Type, "Continuation"))
        return NULL;
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cont_t, &resume_def);
    if (descr == NULL)
        return NULL;
    Py_XSETREF(g_chain_t, (PyTypeObject *)Py_NewRef(chain_t));
    Py_XSETREF(g_cont_t, (PyTypeObject *)Py_NewRef(cont_t));
    Py_XSETREF(g_gexit, Py_NewRef(gexit));
    Py_XSETREF(g_unwind, Py_NewRef(unwind_t));
    Py_XSETREF(g_begin_unwind, Py_NewRef(begin));
    Py_XSETREF(g_switch_into_py, Py_NewRef(sw));
    Py_XSETREF(g_resume_py, Py_NewRef(res));
    Py_XSETREF(g_performed, Py_NewRef(performed));
    Py_XSETREF(g_returned, Py_NewRef(returned));
    Py_XSETREF(g_raised, Py_NewRef(raised));
    Py_XSETREF(g_unwind_fn, Py_NewRef(unwind_fn));
    if (g_greenlet_t == NULL)
        bind_greenlet_api();
    flush_chain_caches();            /* rebinding: of the old classes */
    rt_bound = 1;
    return descr;
}

PyDoc_STRVAR(bind_drive_doc,
"_bind_drive(drive, drive_on_fresh_stack, hop_depth)\n--\n\n"
"Called by kina_fx.handlers: what a resume that is not in tail position calls\n"
"(handlers._drive, handlers._drive_on_fresh_stack past hop_depth frames).");

static PyObject *
bind_drive(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *drive_fn, *fresh;
    int hop;
    if (!PyArg_ParseTuple(args, "OOi:_bind_drive", &drive_fn, &fresh, &hop))
        return NULL;
    if (!PyCallable_Check(drive_fn) || !PyCallable_Check(fresh)) {
        PyErr_SetString(PyExc_TypeError, "_bind_drive: drive and drive_on_fresh_stack must be callable");
        return NULL;
    }
    Py_XSETREF(g_drive_fn, Py_NewRef(drive_fn));
    Py_XSETREF(g_drive_fresh, Py_NewRef(fresh));
    g_hop_depth = hop;
    while (tails_cached > 0)         /* rebinding: of the old class */
        Py_DECREF(tail_cache[--tails_cached]);
    Py_RETURN_NONE;
}

PyMethodDef kfx_round_trip_methods[] = {
    {"_bind_drive", bind_drive, METH_VARARGS, bind_drive_doc},
    {"_bind_round_trip", bind_round_trip, METH_VARARGS, bind_round_trip_doc},
    {"_bind_abort", bind_abort, METH_O, bind_abort_doc},
    {"switch_into", (PyCFunction)(void (*)(void))switch_into, METH_FASTCALL, switch_into_doc},
    {"drive", (PyCFunction)(void (*)(void))drive, METH_FASTCALL, drive_doc},
    {NULL, NULL, 0, NULL},
};
