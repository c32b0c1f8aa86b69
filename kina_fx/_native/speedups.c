/* kina_fx._speedups: the compiled fast path of kina_fx.handlers.perform.
 *
 * Why this exists
 * ---------------
 * ``perform`` is the effects runtime's hot path: every autograd primitive and
 * every tail-resumptive (``fun``) clause goes through it.  In pure Python the
 * search of the handler stack plus the skip-marker push/pop costs about 15
 * plain calls; here it costs about two.  Also here: the tail-resume check
 * (_returns_straight_to_driver), and the hot steps of an ``on``
 * perform+resume round trip: suspending a perform, fibers.switch_into, the
 * driver loop, Continuation.resume and Continuation.__del__ (see "the round
 * trip" below; the Python functions stay the references).  libkina_fx.so's
 * kina_perform uses the same search through kina_fast_perform (exported in
 * the capsule _C_API) to call C handlers without entering Python (see
 * "kina_perform from C" below).
 *
 * What it must mirror
 * -------------------
 * ``_perform_py`` in kina_fx/handlers.py is the reference; this file is a
 * line-by-line transcription of it and must change whenever it changes:
 *
 *   st = fibers.local.state; f = st.current; i = len(f.stack) - 1
 *   walk f.stack[i], i-1, ... (innermost last):
 *       a _Skip(fiber, index) entry jumps to fiber.stack[index-1]
 *       (index -1: past that fiber's control handler, on to its parent);
 *       any other entry: entry.fun.get(effect) is the clause when not None;
 *   then f.handler: h.fun.get(effect), or ``effect in h.on`` -> suspend;
 *   then f = f.parent (None: effect.default(*args) or raise Unhandled).
 *   A fun clause runs here (handlers._run_fun_clause) with _Skip(f, i)
 *   pushed on st.current.stack and removed by identity whatever happens
 *   (handlers._remove_marker); a clause returning handlers.FORWARD declines:
 *   the search goes on below its handler.
 *
 * The ``on`` branch is rt_suspend (below), the transcription of
 * handlers._suspend_perform and the fibers.py switch it makes; in the cases it
 * does not transcribe it calls handlers._suspend_perform(effect, args, found)
 * with found = [base fiber, handler], a list the callee empties: like the
 * Python frame, this C frame keeps no reference to the fibers or the
 * continuation while the chain is suspended (see the comments in fibers.py).
 *
 * _returns_straight_to_driver mirrors handlers.py's function of that name
 * (its Python definition is the reference, kept as
 * handlers._returns_straight_to_driver_py); the per-code tables are still
 * computed and cached by handlers._tail_calls, which it calls on a miss.
 *
 * One difference the C frame needs compensating for: the tail-resume check
 * (handlers._returns_straight_to_driver) walks Python frames only.  The Python
 * perform frame, being inside try/finally, stops that walk, so a resume done
 * by a ``fun`` clause nests inside the clause with the skip marker still in
 * place.  This C frame is invisible; the walk checks each link's callee by
 * name, which rejects it, except when the clause function is itself named
 * ``perform``.  Then a _TailResume comes back through here, and we drive it
 * right here, before popping the marker (handlers._resume_nested): what the
 * Python version does (tests/test_speedups.py has the case).
 *
 * Assumptions (checked once, in _bind): Fiber, ThreadState and _Skip are the
 * kina_fx.fibers/handlers classes with their __slots__ member descriptors;
 * their instances are read and written by slot offset (private classes whose
 * slots are never replaced).  Handler entries may be any object: ``fun`` and
 * ``on`` are read by offset only when the entry's type resolves the name to
 * Handler's own member descriptor with the generic getattr (else a normal
 * attribute lookup); ``fun``/``on`` are used through the dict API only when
 * they are exact dicts (else ``.get`` / the ``in`` protocol).
 *
 * The module state is process-global and the GIL protects it (one
 * interpreter; no free-threaded build).  KINA_FX_PURE_PYTHON=1 makes
 * handlers.py ignore this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

/* ---- bound once by _bind() ------------------------------------------------ */

static PyObject *g_local;          /* fibers.local (a threading.local)          */
static PyTypeObject *g_fiber_t;    /* fibers.Fiber                              */
static PyTypeObject *g_tstate_t;   /* fibers.ThreadState                        */
static PyTypeObject *g_skip_t;     /* handlers._Skip                            */
static PyTypeObject *g_tail_t;     /* handlers._TailResume                      */
static PyObject *g_handler_fun;    /* Handler.__dict__["fun"] (member descr)    */
static PyObject *g_handler_on;     /* Handler.__dict__["on"]                    */
static PyObject *g_unhandled;      /* errors.Unhandled                          */
static PyObject *g_effect_t;       /* handlers.Effect                           */
static PyObject *g_suspend;        /* handlers._suspend_perform                 */
static PyObject *g_nested;         /* handlers._resume_nested                   */
static PyObject *g_forward;        /* handlers.FORWARD (set by _bind_forward)    */

static Py_ssize_t off_stack, off_handler, off_parent;   /* Fiber slots        */
static Py_ssize_t off_current;                          /* ThreadState.current */
static Py_ssize_t off_skip_fiber, off_skip_index;       /* _Skip slots         */
static Py_ssize_t off_fun, off_on;                      /* Handler slots       */

static PyObject *s_state, *s_current, *s_stack, *s_handler, *s_parent, *s_fiber, *s_index;
static PyObject *s_fun, *s_on, *s_get, *s_default, *s_append;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* ``fibers.local.state`` is created once per OS thread and never replaced.
 * Reading it through threading.local costs about as much as the rest of a
 * perform, so each thread's state is also kept in that thread's own
 * PyThreadState dict (under a key made by _bind: a strong reference that lives
 * as long as the thread), and the last thread's in a borrowed one-entry cache
 * keyed by the thread state's unique id (ids are never reused, so a stale
 * entry never matches). */
static PyObject *state_key;        /* new object per _bind                      */
static uint64_t cached_tid;        /* 0: nothing cached                         */
static PyObject *cached_state;     /* borrowed; owned by that thread's dict     */

/* A few _Skip markers kept for reuse: a perform that finds a fun clause
 * allocates none when its marker was not kept alive by anyone else. */
#define SKIP_CACHE 16
static PyObject *skip_cache[SKIP_CACHE];
static int skip_cached;

/* ---- attribute access ----------------------------------------------------- */

/* obj.<name> (new reference).  Reads the slot at ``off`` when obj's type is
 * ``type`` exactly and the slot is set; otherwise a normal getattr (which also
 * raises the right AttributeError for an unset slot). */
static inline PyObject *
get_slot(PyObject *obj, PyTypeObject *type, Py_ssize_t off, PyObject *name)
{
    if (Py_TYPE(obj) == type) {
        PyObject *v = SLOT(obj, off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);
}

/* handler.fun / handler.on (new reference), by offset when the entry's type
 * resolves the name to Handler's own member descriptor. */
static inline PyObject *
get_handler_attr(PyObject *h, PyObject *descr, Py_ssize_t off, PyObject *name)
{
    PyTypeObject *tp = Py_TYPE(h);
    if (tp->tp_getattro == PyObject_GenericGetAttr && _PyType_Lookup(tp, name) == descr) {
        PyObject *v = SLOT(h, off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(h, name);
}

/* ``h.fun.get(effect)``: 1 and a new reference in *clause when it is not
 * None, 0 when it is, -1 on error. */
static int
find_fun(PyObject *h, PyObject *effect, PyObject **clause)
{
    PyObject *fun = get_handler_attr(h, g_handler_fun, off_fun, s_fun);
    if (fun == NULL)
        return -1;
    PyObject *c;
    if (PyDict_CheckExact(fun)) {
        c = PyDict_GetItemWithError(fun, effect);
        if (c == NULL) {
            Py_DECREF(fun);
            return PyErr_Occurred() ? -1 : 0;
        }
        Py_INCREF(c);
    }
    else {
        c = PyObject_CallMethodOneArg(fun, s_get, effect);
        if (c == NULL) {
            Py_DECREF(fun);
            return -1;
        }
    }
    Py_DECREF(fun);
    if (c == Py_None) {
        Py_DECREF(c);
        return 0;
    }
    *clause = c;
    return 1;
}

/* ``effect in h.on`` */
static int
in_on(PyObject *h, PyObject *effect)
{
    PyObject *on = get_handler_attr(h, g_handler_on, off_on, s_on);
    if (on == NULL)
        return -1;
    int r = PyDict_CheckExact(on) ? PyDict_Contains(on, effect) : PySequence_Contains(on, effect);
    Py_DECREF(on);
    return r;
}


/* ``fibers.local.state`` (new reference). */
static PyObject *
thread_state(void)
{
    PyThreadState *ts = PyThreadState_Get();
    uint64_t tid = PyThreadState_GetID(ts);
    if (tid == cached_tid && cached_state != NULL)
        return Py_NewRef(cached_state);
    PyObject *tdict = PyThreadState_GetDict();       /* borrowed */
    PyObject *st = NULL;
    if (tdict != NULL) {
        st = PyDict_GetItemWithError(tdict, state_key);
        if (st != NULL)
            Py_INCREF(st);
        else if (PyErr_Occurred())
            return NULL;
    }
    if (st == NULL) {
        st = PyObject_GetAttr(g_local, s_state);
        if (st == NULL)
            return NULL;
        if (tdict == NULL || PyDict_SetItem(tdict, state_key, st) < 0) {
            PyErr_Clear();           /* no caching for this thread: still correct */
            return st;
        }
    }
    cached_tid = tid;
    cached_state = st;
    return st;
}

/* ---- the handler stack ------------------------------------------------------ */

/* ``len(f.stack) - 1`` into *i; -1 on error. */
static int
top_index(PyObject *f, Py_ssize_t *i)
{
    PyObject *stack = get_slot(f, g_fiber_t, off_stack, s_stack);
    if (stack == NULL)
        return -1;
    Py_ssize_t n = PyList_CheckExact(stack) ? PyList_GET_SIZE(stack) : PyObject_Size(stack);
    Py_DECREF(stack);
    if (n < 0)
        return -1;
    *i = n - 1;
    return 0;
}

/* ``f.stack[i]`` (new reference), i >= 0. */
static PyObject *
stack_item(PyObject *f, Py_ssize_t i)
{
    PyObject *stack = get_slot(f, g_fiber_t, off_stack, s_stack);
    if (stack == NULL)
        return NULL;
    PyObject *entry;
    if (PyList_CheckExact(stack)) {
        if (i < PyList_GET_SIZE(stack))
            entry = Py_NewRef(PyList_GET_ITEM(stack, i));
        else {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            entry = NULL;
        }
    }
    else {
        PyObject *key = PyLong_FromSsize_t(i);
        entry = key == NULL ? NULL : PyObject_GetItem(stack, key);
        Py_XDECREF(key);
    }
    Py_DECREF(stack);
    return entry;
}

/* ``st.current.stack`` (new reference). */
static PyObject *
current_stack(PyObject *st)
{
    PyObject *cur = get_slot(st, g_tstate_t, off_current, s_current);
    if (cur == NULL)
        return NULL;
    PyObject *stack = get_slot(cur, g_fiber_t, off_stack, s_stack);
    Py_DECREF(cur);
    return stack;
}

/* ``_Skip(f, i)`` (new reference): the slots are filled directly (_Skip has
 * no __new__ or __init__ logic beyond that), reusing a cached marker if any. */
static PyObject *
new_skip(PyObject *f, Py_ssize_t i)
{
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL)
        return NULL;
    PyObject *skip;
    if (skip_cached > 0)
        skip = skip_cache[--skip_cached];
    else {
        skip = g_skip_t->tp_alloc(g_skip_t, 0);
        if (skip == NULL) {
            Py_DECREF(index);
            return NULL;
        }
    }
    SLOT(skip, off_skip_fiber) = Py_NewRef(f);
    SLOT(skip, off_skip_index) = index;
    return skip;
}

/* ``st.current.stack.append(skip)``; 0 or -1. */
static int
push_marker(PyObject *st, PyObject *skip)
{
    PyObject *stack = current_stack(st);
    if (stack == NULL)
        return -1;
    int r;
    if (PyList_CheckExact(stack))
        r = PyList_Append(stack, skip);
    else {
        PyObject *v = PyObject_CallMethodOneArg(stack, s_append, skip);
        r = v == NULL ? -1 : 0;
        Py_XDECREF(v);
    }
    Py_DECREF(stack);
    return r;
}

/* Remove ``marker`` from ``st.current.stack`` (handlers._remove_marker): it is
 * normally on top; a clause may have left a handler pushed above it.  Returns
 * the removed entry (new reference), None if it is gone, or NULL on error. */
static PyObject *
pop_marker(PyObject *st, PyObject *marker)
{
    PyObject *stack = current_stack(st);
    if (stack == NULL)
        return NULL;
    PyObject *item;
    if (PyList_CheckExact(stack) && PyList_GET_SIZE(stack) > 0
        && PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1) != marker) {
        item = Py_NewRef(Py_None);
        for (Py_ssize_t j = PyList_GET_SIZE(stack) - 2; j >= 0; j--) {
            if (PyList_GET_ITEM(stack, j) == marker) {
                Py_SETREF(item, Py_NewRef(marker));
                if (PyList_SetSlice(stack, j, j + 1, NULL) < 0)
                    Py_CLEAR(item);
                break;
            }
        }
    }
    else if (PyList_CheckExact(stack)) {
        Py_ssize_t n = PyList_GET_SIZE(stack);
        if (n == 0) {
            PyErr_SetString(PyExc_IndexError, "pop from empty list");
            item = NULL;
        }
        else if (n - 1 >= (((PyListObject *)stack)->allocated >> 2)
                 || ((PyListObject *)stack)->allocated <= 64) {
            /* list.pop() without a reallocation: just drop the last item,
             * whose reference passes to us.  (list.pop() shrinks below half
             * the capacity; a marker is pushed again soon, so we shrink only
             * a large list below a quarter, sparing a realloc per perform.) */
            item = PyList_GET_ITEM(stack, n - 1);
            Py_SET_SIZE(stack, n - 1);
        }
        else {
            item = Py_NewRef(PyList_GET_ITEM(stack, n - 1));
            if (PyList_SetSlice(stack, n - 1, n, NULL) < 0)
                Py_CLEAR(item);
        }
    }
    else {
        /* Not a list (never, from kina_fx itself): the reference does it. */
        PyObject *mod = PyImport_ImportModule("kina_fx.handlers");
        PyObject *fn = mod == NULL ? NULL : PyObject_GetAttrString(mod, "_remove_marker");
        Py_XDECREF(mod);
        PyObject *call[2] = {stack, marker};
        item = fn == NULL ? NULL : PyObject_Vectorcall(fn, call, 2, NULL);
        Py_XDECREF(fn);
    }
    Py_DECREF(stack);
    return item;
}

/* Drop a popped entry; a marker nobody else refers to goes back to the cache. */
static void
release_entry(PyObject *item)
{
    if (Py_TYPE(item) == g_skip_t && Py_REFCNT(item) == 1 && skip_cached < SKIP_CACHE) {
        PyObject *fiber = SLOT(item, off_skip_fiber);
        PyObject *index = SLOT(item, off_skip_index);
        SLOT(item, off_skip_fiber) = NULL;
        SLOT(item, off_skip_index) = NULL;
        skip_cache[skip_cached++] = item;
        Py_XDECREF(index);
        Py_XDECREF(fiber);       /* may run arbitrary code: the cache is consistent */
        return;
    }
    Py_DECREF(item);
}

/* ---- exceptions ---------------------------------------------------------------- */

#if PY_VERSION_HEX >= 0x030C0000
static PyObject *exc_save(void) { return PyErr_GetRaisedException(); }
static void exc_restore(PyObject *exc) { PyErr_SetRaisedException(exc); }
#else
static PyObject *
exc_save(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
        Py_DECREF(tb);
    }
    Py_DECREF(type);
    return value;
}

static void
exc_restore(PyObject *exc)
{
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
}
#endif

/* ---- perform ----------------------------------------------------------------- */

static PyObject *
args_tuple(PyObject *const *args, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++)
        PyTuple_SET_ITEM(t, k, Py_NewRef(args[k]));
    return t;
}

/* Nothing handles the effect: ``effect.default(*args)`` or ``raise Unhandled(effect, args)``. */
static PyObject *
unhandled(PyObject *effect, PyObject *const *args, Py_ssize_t n)
{
    int is_effect = PyObject_IsInstance(effect, g_effect_t);
    if (is_effect <= 0) {
        if (is_effect == 0)
            PyErr_Format(PyExc_TypeError, "perform needs an Effect, not %R", effect);
        return NULL;
    }
    PyObject *dflt = PyObject_GetAttr(effect, s_default);
    if (dflt == NULL)
        return NULL;
    if (dflt != Py_None) {
        PyObject *r = PyObject_Vectorcall(dflt, args, n, NULL);
        Py_DECREF(dflt);
        return r;
    }
    Py_DECREF(dflt);
    PyObject *payload = args_tuple(args, n);
    if (payload == NULL)
        return NULL;
    PyObject *call[2] = {effect, payload};
    PyObject *exc = PyObject_Vectorcall(g_unhandled, call, 2, NULL);
    Py_DECREF(payload);
    if (exc == NULL)
        return NULL;
    if (PyExceptionInstance_Check(exc))
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    Py_DECREF(exc);
    return NULL;
}

/* ``effect in h.on``: hand the chain up to ``f`` to handlers._suspend_perform.
 * Steals the references to f and h. */
static PyObject *
suspend_py(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h)
{
    PyObject *found = PyList_New(2);
    if (found == NULL) {
        Py_DECREF(f);
        Py_DECREF(h);
        return NULL;
    }
    PyList_SET_ITEM(found, 0, f);
    PyList_SET_ITEM(found, 1, h);
    PyObject *payload = args_tuple(args, n);
    if (payload == NULL) {
        Py_DECREF(found);
        return NULL;
    }
    PyObject *call[3] = {effect, payload, found};
    PyObject *r = PyObject_Vectorcall(g_suspend, call, 3, NULL);
    Py_DECREF(payload);
    Py_DECREF(found);
    return r;
}

/* The search perform_at and kina_fast_perform share (handlers._perform_py's
 * loop): from entry ``*ip`` of fiber ``*fp`` (-1: its control handler)
 * outwards, the first handler with a clause for ``effect``.  ``*fp`` is an
 * owned reference that moves along (NULL after an error).  Returns FOUND_FUN
 * (``*clause`` set, a new reference, at (*fp, *ip)), FOUND_ON (``*on`` = the
 * control handler of *fp, new reference), FOUND_NONE (*fp is None) or -1. */
enum { FOUND_NONE = 0, FOUND_FUN = 1, FOUND_ON = 2 };

static int
find_clause(PyObject **fp, Py_ssize_t *ip, PyObject *effect, PyObject **clause, PyObject **on)
{
    PyObject *f = *fp;
    Py_ssize_t i = *ip;
    int found = -1;
    for (;;) {
        if (i >= 0) {
            PyObject *entry = stack_item(f, i);
            if (entry == NULL)
                goto out;
            if (Py_TYPE(entry) == g_skip_t) {
                PyObject *nf = get_slot(entry, g_skip_t, off_skip_fiber, s_fiber);
                PyObject *index = nf == NULL ? NULL : get_slot(entry, g_skip_t, off_skip_index, s_index);
                Py_DECREF(entry);
                if (index == NULL) {
                    Py_XDECREF(nf);
                    goto out;
                }
                Py_SETREF(f, nf);
                i = PyLong_AsSsize_t(index);
                Py_DECREF(index);
                if (i == -1 && PyErr_Occurred())
                    goto out;
                i -= 1;
                if (i >= -1)
                    continue;
            }
            else {
                int r = find_fun(entry, effect, clause);
                Py_DECREF(entry);
                if (r < 0)
                    goto out;
                if (r) {
                    found = FOUND_FUN;
                    goto out;
                }
                i -= 1;
                continue;
            }
        }
        else {
            PyObject *h = get_slot(f, g_fiber_t, off_handler, s_handler);
            if (h == NULL)
                goto out;
            if (h != Py_None) {
                int r = find_fun(h, effect, clause);
                if (r > 0) {
                    Py_DECREF(h);
                    found = FOUND_FUN;
                    goto out;
                }
                if (r == 0)
                    r = in_on(h, effect);
                if (r < 0) {
                    Py_DECREF(h);
                    goto out;
                }
                if (r) {
                    *on = h;
                    found = FOUND_ON;
                    goto out;
                }
            }
            Py_DECREF(h);
        }
        Py_SETREF(f, get_slot(f, g_fiber_t, off_parent, s_parent));
        if (f == NULL)
            goto out;
        if (f == Py_None) {
            found = FOUND_NONE;
            goto out;
        }
        if (top_index(f, &i) < 0)
            goto out;
    }
out:
    *fp = f;
    *ip = i;
    return found;
}

static PyObject *perform_at(PyObject *st, PyObject *f, Py_ssize_t i, PyObject *effect,
                            PyObject *const *cargs, Py_ssize_t n);
static PyObject *rt_suspend(PyObject *effect, PyObject *const *args, Py_ssize_t n,
                            PyObject *f, PyObject *h);

PyDoc_STRVAR(perform_doc,
"perform($module, effect, /, *args)\n--\n\n"
"Perform ``effect`` with ``args``; return the value the handler resumes with.\n\n"
"Raises :class:`Unhandled` here, at the perform site, when no handler in\n"
"scope handles ``effect`` and it has no ``default``.  (Compiled version of\n"
"kina_fx.handlers._perform_py.)");

static PyObject *
perform(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "perform() missing 1 required positional argument: 'effect'");
        return NULL;
    }
    if (g_local == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kina_fx._speedups is not bound (kina_fx.handlers binds it)");
        return NULL;
    }
    PyObject *effect = args[0];
    PyObject *const *cargs = args + 1;
    Py_ssize_t n = nargs - 1;

    PyObject *st = thread_state();
    if (st == NULL)
        return NULL;
    PyObject *f = get_slot(st, g_tstate_t, off_current, s_current);
    Py_ssize_t i;
    if (f == NULL || top_index(f, &i) < 0) {
        Py_XDECREF(f);
        Py_DECREF(st);
        return NULL;
    }
    return perform_at(st, f, i, effect, cargs, n);
}

/* The search and the clause calls of perform, from entry ``i`` of fiber
 * ``f``'s stack on (i == -1: f's control handler).  Steals the references to
 * ``st`` (fibers.local.state) and ``f``.  kina_fast_perform continues here
 * when a C handler it called directly forwarded to something it does not
 * call itself. */
static PyObject *
perform_at(PyObject *st, PyObject *f, Py_ssize_t i, PyObject *effect,
           PyObject *const *cargs, Py_ssize_t n)
{
    PyObject *clause = NULL;

search:
    {
        PyObject *h = NULL;
        switch (find_clause(&f, &i, effect, &clause, &h)) {
        case FOUND_FUN:
            break;
        case FOUND_ON:
            Py_DECREF(st);
            return rt_suspend(effect, cargs, n, f, h);
        case FOUND_NONE:
            Py_DECREF(f);
            Py_DECREF(st);
            return unhandled(effect, cargs, n);
        default:
            goto error;
        }
    }

    /* A tail-resumptive clause: run it here, outside its own handler.  ``f``
     * and ``i`` stay: a clause returning FORWARD resumes the search below. */
    PyObject *skip = new_skip(f, i);
    if (skip == NULL)
        goto error;
    /* We keep our reference to ``skip`` until it is removed: a clause may take
     * it off the stack itself, and the identity must stay valid. */
    if (push_marker(st, skip) < 0) {
        Py_DECREF(skip);
        goto error;
    }
    PyObject *result = PyObject_Vectorcall(clause, cargs, n, NULL);
    Py_CLEAR(clause);
    if (result != NULL && Py_TYPE(result) == g_tail_t) {
        /* see the top of this file: nest as the Python frame would have */
        Py_SETREF(result, PyObject_CallOneArg(g_nested, result));
    }
    /* finally: st.current.stack.pop() */
    PyObject *pending = result == NULL ? exc_save() : NULL;
    PyObject *popped = pop_marker(st, skip);
    if (popped != NULL)
        Py_DECREF(popped);       /* ``skip`` (ours) or None: still alive */
    release_entry(skip);         /* back to the cache unless someone kept it */
    if (popped == NULL) {
        Py_DECREF(st);
        Py_DECREF(f);
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
        return NULL;
    }
    if (pending != NULL) {
        Py_DECREF(f);
        Py_DECREF(st);
        exc_restore(pending);
        return result;
    }
    if (result == g_forward && g_forward != NULL) {
        /* The clause declined: go on with the handlers below its own. */
        Py_DECREF(result);
        i -= 1;
        if (i < -1) {
            Py_SETREF(f, get_slot(f, g_fiber_t, off_parent, s_parent));
            if (f == NULL)
                goto error;
            if (f == Py_None) {
                Py_DECREF(f);
                Py_DECREF(st);
                return unhandled(effect, cargs, n);
            }
            if (top_index(f, &i) < 0)
                goto error;
        }
        goto search;
    }
    Py_DECREF(f);
    Py_DECREF(st);
    return result;

error:
    Py_XDECREF(f);
    Py_XDECREF(clause);
    Py_DECREF(st);
    return NULL;
}

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

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *off, PyObject **descr_out);
static int check_type(PyObject *obj, const char *what);

#define KINA_FAST_DECLINED 0
#define KINA_FAST_DONE 1
#define FAST_MAX_ARGS 16                /* KINA_MAX_ARGS */
#define C_HANDLED 0
#define C_FORWARD (-1)

typedef int32_t (*c_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                int32_t nargs, int64_t *out_value);

static PyTypeObject *g_cclause_t;  /* ffi_effects.CClause                       */
static PyObject *g_effects_by_id;  /* handlers.Effect._by_id                    */
static PyObject *g_answer_fn;      /* ffi_effects._answer_to_int64              */
static PyObject *g_report_fn;      /* ffi_effects._report_error                 */
static Py_ssize_t off_cc_fn, off_cc_ctx, off_cc_effect_id;   /* CClause slots  */
static PyObject *s_outcome;

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
static int32_t
fast_report(void)
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
        *status = fast_report();
        return KINA_FAST_DONE;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(result, &overflow);
    if (overflow) {                      /* _answer_to_int64 raises the slow path's error */
        PyObject *call[2] = {effect, result};
        PyObject *r = PyObject_Vectorcall(g_answer_fn, call, 2, NULL);
        Py_DECREF(result);
        if (r == NULL) {
            *status = fast_report();
            return KINA_FAST_DONE;
        }
        result = r;
        v = PyLong_AsLongLongAndOverflow(result, &overflow);
    }
    Py_DECREF(result);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_OverflowError, "the answer does not fit in int64_t");
        *status = fast_report();
        return KINA_FAST_DONE;
    }
    *out = (int64_t)v;
    *status = 0;
    return KINA_FAST_DONE;
}

static int fast_perform(PyObject *effect, const int64_t *args, int32_t nargs, int64_t *out,
                        int32_t *status);

/* int kina_fast_perform(effect_id, args, nargs, out, status): see above.  The
 * caller holds the GIL. */
static int
kina_fast_perform(int32_t effect_id, const int64_t *c_args, int32_t nargs, int64_t *out,
                  int32_t *status)
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
    int done = fast_perform(effect, args, nargs, out, status);
    Py_DECREF(effect);
    Py_LeaveRecursiveCall();
    return done;
}

static int
fast_perform(PyObject *effect, const int64_t *args, int32_t nargs, int64_t *out, int32_t *status)
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
        if (found == FOUND_ON) {         /* an ``on`` clause: the general path */
            Py_DECREF(h);
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
            *status = fast_report();
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
    *status = fast_report();
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
    if (check_type(cclause_t, "CClause"))
        return NULL;
    if (!PyCallable_Check(answer_fn) || !PyCallable_Check(report_fn)) {
        PyErr_SetString(PyExc_TypeError, "_bind_c_abi: answer_to_int64 and report_error must be callable");
        return NULL;
    }
    Py_ssize_t o_fn, o_ctx, o_eid;
    PyTypeObject *ct = (PyTypeObject *)cclause_t;
    if (slot_offset(ct, "fn_address", &o_fn, NULL) || slot_offset(ct, "ctx_address", &o_ctx, NULL)
            || slot_offset(ct, "effect_id", &o_eid, NULL))
        return NULL;
    off_cc_fn = o_fn;
    off_cc_ctx = o_ctx;
    off_cc_effect_id = o_eid;
    Py_XSETREF(g_effects_by_id, Py_NewRef(by_id));
    Py_XSETREF(g_answer_fn, Py_NewRef(answer_fn));
    Py_XSETREF(g_report_fn, Py_NewRef(report_fn));
    Py_XSETREF(g_cclause_t, (PyTypeObject *)Py_NewRef(cclause_t));
    Py_RETURN_NONE;
}

/* ---- binding ------------------------------------------------------------------ */

/* The offset of ``type.<name>``, a writable object slot (__slots__ entry). */
static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *off, PyObject **descr_out)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    if (Py_TYPE(descr) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", type->tp_name, name);
        Py_DECREF(descr);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", type->tp_name, name);
        Py_DECREF(descr);
        return -1;
    }
    *off = m->offset;
    if (descr_out != NULL)
        *descr_out = descr;
    else
        Py_DECREF(descr);
    return 0;
}

static int
check_type(PyObject *obj, const char *what)
{
    if (!PyType_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "_bind: %s must be a class", what);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(bind_forward_doc,
"_bind_forward(FORWARD)\n--\n\n"
"The sentinel a fun clause returns to decline an effect (handlers.FORWARD).");

static PyObject *
bind_forward(PyObject *Py_UNUSED(module), PyObject *forward)
{
    Py_XSETREF(g_forward, Py_NewRef(forward));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(bind_doc,
"_bind(local, Fiber, ThreadState, Effect, Handler, Skip, TailResume, Unhandled, suspend, nested)\n--\n\n"
"Called once by kina_fx.handlers: the objects perform() works with.");

static PyObject *
bind(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *local, *fiber_t, *tstate_t, *effect_t, *handler_t, *skip_t, *tail_t, *unhandled_t,
             *susp, *nested;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO:_bind", &local, &fiber_t, &tstate_t, &effect_t,
                          &handler_t, &skip_t, &tail_t, &unhandled_t, &susp, &nested))
        return NULL;
    if (check_type(fiber_t, "Fiber") || check_type(tstate_t, "ThreadState") ||
            check_type(effect_t, "Effect") ||
            check_type(handler_t, "Handler") || check_type(skip_t, "Skip") ||
            check_type(tail_t, "TailResume") || check_type(unhandled_t, "Unhandled"))
        return NULL;
    if (!PyCallable_Check(susp) || !PyCallable_Check(nested)) {
        PyErr_SetString(PyExc_TypeError, "_bind: suspend and nested must be callable");
        return NULL;
    }
    Py_ssize_t o_stack, o_handler, o_parent, o_current, o_fiber, o_index, o_fun, o_on;
    PyObject *d_fun = NULL, *d_on = NULL;
    PyTypeObject *ft = (PyTypeObject *)fiber_t, *tt = (PyTypeObject *)tstate_t,
                 *ht = (PyTypeObject *)handler_t, *kt = (PyTypeObject *)skip_t;
    if (slot_offset(ft, "stack", &o_stack, NULL) || slot_offset(ft, "handler", &o_handler, NULL) ||
            slot_offset(ft, "parent", &o_parent, NULL) || slot_offset(tt, "current", &o_current, NULL) ||
            slot_offset(kt, "fiber", &o_fiber, NULL) || slot_offset(kt, "index", &o_index, NULL))
        return NULL;
    if (slot_offset(ht, "fun", &o_fun, &d_fun))
        return NULL;
    if (slot_offset(ht, "on", &o_on, &d_on)) {
        Py_DECREF(d_fun);
        return NULL;
    }
    /* Rebinding (tests reload handlers) replaces everything, caches included. */
    PyObject *key = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (key == NULL) {
        Py_DECREF(d_fun);
        Py_DECREF(d_on);
        return NULL;
    }
    Py_XSETREF(state_key, key);
    cached_tid = 0;
    cached_state = NULL;
    while (skip_cached > 0)
        Py_DECREF(skip_cache[--skip_cached]);
    Py_XSETREF(g_local, Py_NewRef(local));
    Py_XSETREF(g_fiber_t, (PyTypeObject *)Py_NewRef(fiber_t));
    Py_XSETREF(g_tstate_t, (PyTypeObject *)Py_NewRef(tstate_t));
    Py_XSETREF(g_skip_t, (PyTypeObject *)Py_NewRef(skip_t));
    Py_XSETREF(g_tail_t, (PyTypeObject *)Py_NewRef(tail_t));
    Py_XSETREF(g_handler_fun, d_fun);
    Py_XSETREF(g_handler_on, d_on);
    Py_XSETREF(g_unhandled, Py_NewRef(unhandled_t));
    Py_XSETREF(g_effect_t, Py_NewRef(effect_t));
    Py_XSETREF(g_suspend, Py_NewRef(susp));
    Py_XSETREF(g_nested, Py_NewRef(nested));
    off_stack = o_stack;
    off_handler = o_handler;
    off_parent = o_parent;
    off_current = o_current;
    off_skip_fiber = o_fiber;
    off_skip_index = o_index;
    off_fun = o_fun;
    off_on = o_on;
    Py_RETURN_NONE;
}

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
static int
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
 * - Slots are read and written by offset on exact Fiber / ThreadState /
 *   Chain / Continuation / _TailResume instances only; a write that drops the
 *   last reference of something runs its finalizer at the same point as the
 *   Python attribute store it transcribes.
 */

static int rt_bound;
static PyTypeObject *g_chain_t;      /* fibers.Chain                             */
static PyTypeObject *g_cont_t;       /* handlers.Continuation                    */
static PyObject *g_gexit;            /* greenlet.GreenletExit                    */
static PyObject *g_unwind;           /* fibers.Unwind                            */
static PyObject *g_begin_unwind;     /* fibers._begin_unwind_here                */
static PyObject *g_switch_into_py;   /* fibers.switch_into                       */
static PyObject *g_resume_py;        /* the Python Continuation.resume           */
static PyObject *g_performed;        /* handlers.PERFORMED                       */
static PyObject *g_returned, *g_raised; /* fibers.RETURNED, fibers.RAISED        */
static PyObject *s_ret, *s_exc;
static Py_ssize_t off_glet, off_thread, off_job, off_shallow;   /* Fiber        */
static Py_ssize_t off_mail, off_serial, off_dropped;            /* ThreadState  */
static Py_ssize_t off_top, off_base, off_k_shallow;             /* Continuation */
static Py_ssize_t off_tr_chain, off_tr_send;                    /* _TailResume  */
static PyObject *s_switch;

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
    PyObject *r = PyObject_CallMethodNoArgs(glet, s_switch);
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
    Py_DECREF(send);
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

static PyObject *suspend_py(PyObject *effect, PyObject *const *args, Py_ssize_t n,
                            PyObject *f, PyObject *h);

/* handlers._suspend_perform with post/suspend/_switch inlined.  Steals f, h. */
static PyObject *
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
    PyObject *k = g_cont_t->tp_alloc(g_cont_t, 0);
    if (k == NULL) {
        Py_DECREF(st);
        goto fail;
    }
    SLOT(k, off_top) = Py_NewRef(cur);
    SLOT(k, off_base) = Py_NewRef(f);
    SLOT(k, off_k_shallow) = Py_NewRef(shallow);
    /* message = (PERFORMED, h, (effect, args, k)) */
    PyObject *payload = args_tuple(args, n);
    PyObject *inner = payload == NULL ? NULL : PyTuple_Pack(3, effect, payload, k);
    PyObject *message = inner == NULL ? NULL : PyTuple_Pack(3, g_performed, h, inner);
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
    set_slot(st, off_current, resumer);
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
static PyObject *
rt_switch_into(PyObject *chain, PyObject *send)
{
    PyTypeObject *ct = Py_TYPE(chain);
    if (!rt_bound || (ct != g_chain_t && ct != g_cont_t))
        goto py;
    PyObject *st = thread_state();
    if (st == NULL)
        return NULL;
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
    set_slot(st, off_mail, send);
    set_slot(st, off_current, top);
    PyObject *glet = Py_NewRef(SLOT(top, off_glet));
    Py_DECREF(me);
    Py_DECREF(top);
    Py_DECREF(base);
    Py_DECREF(st);
    return rt_switch(glet);

py:;
    PyObject *call[2] = {chain, send};
    return PyObject_Vectorcall(g_switch_into_py, call, 2, NULL);
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

/* ``obj`` of heap type ``tp`` with two slots set (steals a, b). */
static PyObject *
new_pair(PyTypeObject *tp, Py_ssize_t off_a, PyObject *a, Py_ssize_t off_b, PyObject *b)
{
    PyObject *obj = tp->tp_alloc(tp, 0);
    if (obj == NULL) {
        Py_DECREF(a);
        Py_DECREF(b);
        return NULL;
    }
    SLOT(obj, off_a) = a;
    SLOT(obj, off_b) = b;
    return obj;
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
    PyObject *chain = new_pair(g_chain_t, off_top, Py_NewRef(top), off_base, Py_NewRef(base));
    if (chain == NULL) {
        Py_DECREF(caller);
        return NULL;
    }
    set_slot(self, off_top, Py_None);
    set_slot(self, off_base, Py_None);
    PyObject *send = PyTuple_Pack(2, Py_False, nargs ? args[0] : Py_None);
    if (send == NULL) {
        Py_DECREF(caller);
        Py_DECREF(chain);
        return NULL;
    }
    int tail = straight_to_driver((PyObject *)caller);
    Py_DECREF(caller);
    PyObject *tr = tail < 0 ? NULL : new_pair(g_tail_t, off_tr_chain, chain, off_tr_send, send);
    if (tail < 0) {
        Py_DECREF(chain);
        Py_DECREF(send);
    }
    if (tr == NULL || tail)
        return tr;                   /* _TailResume(chain, send) for the driver */
    /* not a tail resume: nest (_resume_nested: the deep-stack hop, then _drive) */
    PyObject *r = PyObject_CallOneArg(g_nested, tr);
    Py_DECREF(tr);
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

/* handlers._drive's loop (the Python function of that name is the reference).
 * handlers binds it behind a one-line Python ``_drive`` frame, so that the
 * clauses called from here still have a driver frame to return to (the tail
 * check looks for its code).  That frame holds the first (chain, send), as
 * the callers of the Python _drive do; the chains and sends of later tail
 * resumes are dropped here as soon as the switch has taken them. */
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

static PyObject *
rt_drive(PyObject *chain, PyObject *send)
{
    Py_INCREF(chain);
    Py_INCREF(send);
    for (;;) {
        PyObject *msg = rt_switch_into(chain, send);
        Py_DECREF(chain);
        Py_DECREF(send);
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
            Py_DECREF(msg);
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
            Py_DECREF(payload);
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
        Py_DECREF(result);
    }
}

PyDoc_STRVAR(drive_doc,
"drive($module, chain, send, /)\n--\n\n"
"Compiled loop of kina_fx.handlers._drive (call it from a frame running the\n"
"driver code bound with _bind_tail).");

static PyObject *
drive(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "drive(chain, send) takes 2 arguments");
        return NULL;
    }
    if (!rt_bound) {
        PyErr_SetString(PyExc_RuntimeError, "kina_fx._speedups: _bind_round_trip was not called");
        return NULL;
    }
    return rt_drive(args[0], args[1]);
}

/* getattr(self, "top", None) (new reference or NULL in *out); -1 on error. */
static int
PyObject_GetOptionalAttr_compat(PyObject *self, PyObject **out)
{
    *out = PyObject_GetAttrString(self, "top");
    if (*out == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    return 0;
}

/* Continuation.__del__ (the Python method is kept as handlers._del_py): a
 * continuation dropped unused is unwound, except at interpreter exit.  Every
 * round trip frees one continuation; in C that costs no Python frame. */
static PyObject *g_unwind_fn;        /* fibers.unwind                            */

static PyObject *
rt_del(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *top;
    if (Py_TYPE(self) == g_cont_t)
        top = Py_XNewRef(SLOT(self, off_top));
    else if (PyObject_GetOptionalAttr_compat(self, &top) < 0)
        return NULL;
    int live = top != NULL && top != Py_None;
    Py_XDECREF(top);
#if PY_VERSION_HEX >= 0x030D0000
    int finalizing = Py_IsFinalizing();
#else
    int finalizing = _Py_IsFinalizing();
#endif
    if (!live || finalizing)
        Py_RETURN_NONE;
    return PyObject_CallOneArg(g_unwind_fn, self);
}

static PyMethodDef del_def = {
    "__del__", rt_del, METH_NOARGS,
    "Dropped without being used: run its cleanup (compiled Continuation.__del__)."};

PyDoc_STRVAR(bind_round_trip_doc,
"_bind_round_trip(Chain, Continuation, GreenletExit, Unwind, begin_unwind_here, switch_into,\n"
"                 resume, PERFORMED, RETURNED, RAISED, unwind)\n--\n\n"
"Called by kina_fx.handlers after _bind: what the compiled round trip works with.\n"
"Returns the compiled ``resume`` and ``__del__`` method descriptors for Continuation.");

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
    Py_ssize_t o_glet, o_thread, o_job, o_shallow, o_mail, o_serial, o_dropped, o_top, o_base,
               o_kshallow, o_ctop, o_cbase, o_trc, o_trs;
    if (slot_offset(g_fiber_t, "glet", &o_glet, NULL) || slot_offset(g_fiber_t, "thread", &o_thread, NULL) ||
            slot_offset(g_fiber_t, "job", &o_job, NULL) || slot_offset(g_fiber_t, "shallow", &o_shallow, NULL) ||
            slot_offset(g_tstate_t, "mail", &o_mail, NULL) || slot_offset(g_tstate_t, "serial", &o_serial, NULL) ||
            slot_offset(g_tstate_t, "dropped", &o_dropped, NULL) ||
            slot_offset((PyTypeObject *)cont_t, "top", &o_top, NULL) ||
            slot_offset((PyTypeObject *)cont_t, "base", &o_base, NULL) ||
            slot_offset((PyTypeObject *)cont_t, "shallow", &o_kshallow, NULL) ||
            slot_offset((PyTypeObject *)chain_t, "top", &o_ctop, NULL) ||
            slot_offset((PyTypeObject *)chain_t, "base", &o_cbase, NULL) ||
            slot_offset(g_tail_t, "chain", &o_trc, NULL) || slot_offset(g_tail_t, "send", &o_trs, NULL))
        return NULL;
    if (o_ctop != o_top || o_cbase != o_base ||
            !PyType_IsSubtype((PyTypeObject *)cont_t, (PyTypeObject *)chain_t)) {
        PyErr_SetString(PyExc_TypeError, "_bind_round_trip: Continuation must extend Chain's slots");
        return NULL;
    }
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cont_t, &resume_def);
    PyObject *del = descr == NULL ? NULL : PyDescr_NewMethod((PyTypeObject *)cont_t, &del_def);
    PyObject *pair = del == NULL ? NULL : PyTuple_Pack(2, descr, del);
    Py_XDECREF(descr);
    Py_XDECREF(del);
    if (pair == NULL)
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
    off_glet = o_glet;
    off_thread = o_thread;
    off_job = o_job;
    off_shallow = o_shallow;
    off_mail = o_mail;
    off_serial = o_serial;
    off_dropped = o_dropped;
    off_top = o_top;
    off_base = o_base;
    off_k_shallow = o_kshallow;
    off_tr_chain = o_trc;
    off_tr_send = o_trs;
    Py_XSETREF(g_unwind_fn, Py_NewRef(unwind_fn));
    rt_bound = 1;
    return pair;
}

static PyMethodDef methods[] = {
    {"perform", (PyCFunction)(void (*)(void))perform, METH_FASTCALL, perform_doc},
    {"_bind", bind, METH_VARARGS, bind_doc},
    {"_returns_straight_to_driver", returns_straight_to_driver, METH_O, straight_doc},
    {"_bind_tail", bind_tail, METH_VARARGS, bind_tail_doc},
    {"_bind_forward", bind_forward, METH_O, bind_forward_doc},
    {"_bind_c_abi", bind_c_abi, METH_VARARGS, bind_c_abi_doc},
    {"_bind_round_trip", bind_round_trip, METH_VARARGS, bind_round_trip_doc},
    {"_bind_abort", bind_abort, METH_O, bind_abort_doc},
    {"switch_into", (PyCFunction)(void (*)(void))switch_into, METH_FASTCALL, switch_into_doc},
    {"drive", (PyCFunction)(void (*)(void))drive, METH_FASTCALL, drive_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "kina_fx._speedups",
    "Compiled fast path of kina_fx.handlers.perform (see kina_fx/_native/speedups.c).",
    -1,
    methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_state, "state");
    INTERN(s_current, "current");
    INTERN(s_stack, "stack");
    INTERN(s_handler, "handler");
    INTERN(s_parent, "parent");
    INTERN(s_fiber, "fiber");
    INTERN(s_index, "index");
    INTERN(s_fun, "fun");
    INTERN(s_on, "on");
    INTERN(s_get, "get");
    INTERN(s_default, "default");
    INTERN(s_append, "append");
    INTERN(s_outcome, "_outcome");
    INTERN(s_switch, "switch");
    INTERN(s_ret, "ret");
    INTERN(s_exc, "exc");
#undef INTERN
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    /* For libkina_fx.so's kina_perform (kina_runtime.c): the address of
     * int kina_fast_perform(int32_t, const int64_t *, int32_t, int64_t *, int32_t *). */
    PyObject *capi = PyCapsule_New((void *)kina_fast_perform, "kina_fx._speedups._C_API", NULL);
    if (capi == NULL || PyModule_AddObject(m, "_C_API", capi) < 0) {
        Py_XDECREF(capi);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
