/* perform.c: perform, compiled (kina_fx._speedups.perform).
 *
 * ``perform`` is the effects runtime's hot path: every autograd primitive and
 * every tail-resumptive (``fun``) clause goes through it.  In pure Python the
 * search of the handler stack plus the skip-marker push/pop costs about 15
 * plain calls; here it costs about two.
 *
 * What it mirrors
 * ---------------
 * ``_perform_py`` in kina_fx/handlers.py is the reference; this file is a
 * line-by-line transcription of it (with handlers._run_fun_clause and
 * handlers._remove_marker) and must change whenever it changes:
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
 * The ``on`` branch is rt_suspend (round_trip.c), the transcription
 * of handlers._suspend_perform and the fibers.py switch it makes; in the
 * cases it does not transcribe it calls handlers._suspend_perform(effect,
 * args, found) with found = [base fiber, handler], a list the callee empties
 * (suspend_py below): like the Python frame, this C frame keeps no reference
 * to the fibers or the continuation while the chain is suspended (see the
 * comments in fibers.py).  The search (find_clause) is shared with the C ABI
 * fast path (c_abi.c).
 *
 * One difference the C frame needs compensating for: the tail-resume check
 * (handlers._returns_straight_to_driver) walks Python frames only.  The Python
 * perform frame, being inside try/finally, stops that walk, so a resume done
 * by a ``fun`` clause nests inside the clause with the skip marker still in
 * place.  This C frame is invisible; the walk checks each link's callee by
 * name, which rejects it, except when the clause function is itself named
 * ``perform``.  Then a _TailResume comes back through here, and we drive it
 * right here, before popping the marker (kfx_nest_drive): what the Python
 * version does (tests/effects/test_speedups.py has the case).
 *
 * Assumptions (checked when module.c imports them): Fiber, ThreadState and _Skip derive
 * from the C core's data types (types.c, through fibers.data_type)
 * without shadowing a field; the fields of instances of exactly those classes
 * are read and written as struct fields (others go through getattr).  Handler
 * entries may be any object: ``fun`` and ``on`` are read as fields only when
 * the entry's type resolves the name to HandlerData's own member descriptor
 * with the generic getattr (else a normal attribute lookup); ``fun``/``on``
 * are used through the dict API only when they are exact dicts (else
 * ``.get`` / the ``in`` protocol).
 */
#include "speedups.h"


/* ``fibers.local.state`` is created once per OS thread and never replaced.
 * Reading it through threading.local costs about as much as the rest of a
 * perform, so each thread's state is also kept in that thread's own
 * PyThreadState dict (under a key made at import: a strong reference that lives
 * as long as the thread), and the last thread's in a borrowed one-entry cache
 * keyed by the thread state's unique id (ids are never reused, so a stale
 * entry never matches). */
PyObject *state_key;               /* a private object (module.c makes it)      */
uint64_t cached_tid;               /* 0: nothing cached                         */
PyObject *cached_state;            /* borrowed; owned by that thread's dict     */

/* A few _Skip markers kept for reuse: a perform that finds a fun clause
 * allocates none when its marker was not kept alive by anyone else. */
PyObject *skip_cache[SKIP_CACHE];
int skip_cached;

/* ---- attribute access ----------------------------------------------------- */

#define FIELD_CACHE 8
static struct {
    PyTypeObject *tp;
    unsigned int tag;
    PyObject *name;
    int keeps;
} field_cache[FIELD_CACHE];

static inline int
version_tag_valid(PyTypeObject *tp)
{
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    return PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag != 0;
#else
    return tp->tp_version_tag != 0;
#endif
}

int
kfx_type_keeps_field(PyTypeObject *tp, PyObject *name, PyObject *descr)
{
    if (tp->tp_getattro != PyObject_GenericGetAttr)
        return 0;
    /* the one type that nearly every entry is: handlers.Handler, unchanged */
    static PyTypeObject *handler_tp;
    static unsigned int handler_tag;
    if (tp == handler_tp && tp->tp_version_tag == handler_tag && version_tag_valid(tp))
        return 1;
    size_t k = (((uintptr_t)tp >> 4) ^ ((uintptr_t)name >> 4)) % FIELD_CACHE;
    if (field_cache[k].tp == tp && field_cache[k].name == name && version_tag_valid(tp)
            && field_cache[k].tag == tp->tp_version_tag)
        return field_cache[k].keeps;
    int keeps = _PyType_Lookup(tp, name) == descr;    /* assigns a version tag if it can */
    if (keeps && tp == g_handler_t && version_tag_valid(tp)
            && _PyType_Lookup(tp, name == s_fun ? s_on : s_fun) == (name == s_fun ? g_handler_on : g_handler_fun)) {
        handler_tp = tp;             /* both fields are its own */
        handler_tag = tp->tp_version_tag;
    }
    if (version_tag_valid(tp)) {      /* borrowed: a type freed and another made at its
                                       * address gets a new version tag */
        field_cache[k].tp = tp;
        field_cache[k].tag = tp->tp_version_tag;
        field_cache[k].name = name;
        field_cache[k].keeps = keeps;
    }
    return keeps;
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
        if (PyDict_GET_SIZE(fun) == 0) {     /* a Stepper's handler, an on-only one */
            Py_DECREF(fun);
            return 0;
        }
        /* an Effect hashes by identity: the dict lookup without the call */
        Py_hash_t hash = Py_TYPE(effect)->tp_hash == PyBaseObject_Type.tp_hash
                         ? _Py_HashPointer(effect) : PyObject_Hash(effect);
        c = hash == -1 ? NULL : _PyDict_GetItem_KnownHash(fun, effect, hash);
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

int
kfx_find_fun(PyObject *h, PyObject *effect, PyObject **clause)
{
    return find_fun(h, effect, clause);
}

/* ``effect in h.on``; a Stepper's handlers._Catch table is read here
 * (``_Catch.__contains__``: effects None, or effect in effects, or the
 * private _SUSPEND_TO_HOST effect). */
static int
in_on(PyObject *h, PyObject *effect)
{
    PyObject *on = get_handler_attr(h, g_handler_on, off_on, s_on);
    if (on == NULL)
        return -1;
    int r;
    PyObject *effects = Py_TYPE(on) == g_catch_t ? ((KCatch *)on)->effects : NULL;
    if (PyDict_CheckExact(on))
        r = PyDict_Contains(on, effect);
    else if (effects == Py_None)
        r = 1;
    else if (effects != NULL && PyFrozenSet_CheckExact(effects)) {
        r = PySet_Contains(effects, effect);
        if (r == 0)
            r = effect == g_suspend_to_host;
    }
    else
        r = PySequence_Contains(on, effect);
    Py_DECREF(on);
    return r;
}


/* ``fibers.local.state`` (new reference). */
PyObject *
thread_state(void)
{
    if (kfx_thread_state != NULL)    /* this thread's (types.c keeps it) */
        return Py_NewRef(kfx_thread_state);
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
int
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
    if (st == kfx_thread_state && kfx_current != NULL && kfx_current->stack != NULL)
        return Py_NewRef(kfx_current->stack);       /* this thread's running fiber */
    PyObject *cur = get_slot(st, g_tstate_t, off_current, s_current);
    if (cur == NULL)
        return NULL;
    PyObject *stack = get_slot(cur, g_fiber_t, off_stack, s_stack);
    Py_DECREF(cur);
    return stack;
}

/* ``_Skip(f, i)`` (new reference): the slots are filled directly (_Skip has
 * no __new__ or __init__ logic beyond that), reusing a cached marker if any. */
PyObject *
new_skip(PyObject *f, Py_ssize_t i)
{
    PyObject *skip;
    if (skip_cached > 0)
        skip = skip_cache[--skip_cached];
    else if ((skip = g_skip_t->tp_alloc(g_skip_t, 0)) == NULL)
        return NULL;
    SLOT(skip, off_skip_fiber) = Py_NewRef(f);
    ((KSkip *)skip)->index_c = i;    /* ``index`` is made from it when Python reads it */
    ((KSkip *)skip)->index_is_c = 1;
    return skip;
}

/* ``st.current.stack.append(skip)``; 0 or -1. */
int
push_marker(PyObject *st, PyObject *skip)
{
    PyObject *stack = current_stack(st);
    if (stack == NULL)
        return -1;
    int r;
    Py_ssize_t n = PyList_CheckExact(stack) ? PyList_GET_SIZE(stack) : -1;
    if (n >= 0 && ((PyListObject *)stack)->allocated > n) {
        /* list.append without a call: there is room (pop_marker keeps it) */
        PyList_SET_ITEM(stack, n, Py_NewRef(skip));
        Py_SET_SIZE(stack, n + 1);
        r = 0;
    }
    else if (n >= 0)
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
PyObject *
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
        /* Not a list (never, from kina_fx itself): the reference does it
         * (fallback: "a handler stack that is not a list"). */
        PyObject *call[2] = {stack, marker};
        item = PyObject_Vectorcall(g_remove_marker, call, 2, NULL);
    }
    Py_DECREF(stack);
    return item;
}

/* Drop a popped entry; a marker nobody else refers to goes back to the cache. */
void
release_entry(PyObject *item)
{
    if (Py_TYPE(item) == g_skip_t && Py_REFCNT(item) == 1 && skip_cached < SKIP_CACHE) {
        PyObject *fiber = SLOT(item, off_skip_fiber);
        PyObject *index = SLOT(item, off_skip_index);
        SLOT(item, off_skip_fiber) = NULL;
        SLOT(item, off_skip_index) = NULL;
        ((KSkip *)item)->index_is_c = 0;
        skip_cache[skip_cached++] = item;
        Py_XDECREF(index);
        Py_XDECREF(fiber);       /* may run arbitrary code: the cache is consistent */
        return;
    }
    Py_DECREF(item);
}

/* ---- perform ----------------------------------------------------------------- */

PyObject *
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
PyObject *
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
    kfx_raise(exc);
    Py_DECREF(exc);
    return NULL;
}

/* ``effect in h.on``: hand the chain up to ``f`` to handlers._suspend_perform.
 * Steals the references to f and h. */
PyObject *
suspend_py(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h)
{
    PyObject *found = kfx_list2(f, h);
    if (found == NULL)
        return NULL;
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
int
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
                if (nf == NULL) {
                    Py_DECREF(entry);
                    goto out;
                }
                Py_ssize_t ni = ((KSkip *)entry)->index_c;
                if (!((KSkip *)entry)->index_is_c && SLOT(entry, off_skip_index) == NULL)
                    ni = -3;             /* unset: getattr raises below */
                if (ni < -1) {           /* not a C index: the attribute, as Python reads it */
                    PyObject *index = get_slot(entry, g_skip_t, off_skip_index, s_index);
                    ni = index == NULL ? -1 : PyLong_AsSsize_t(index);
                    Py_XDECREF(index);
                    if (index == NULL || (ni == -1 && PyErr_Occurred())) {
                        Py_DECREF(nf);
                        Py_DECREF(entry);
                        goto out;
                    }
                }
                Py_DECREF(entry);
                Py_SETREF(f, nf);
                i = ni - 1;
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


PyDoc_STRVAR(perform_doc,
"perform($module, effect, /, *args)\n--\n\n"
"Perform ``effect`` with ``args``; return the value the handler resumes with.\n\n"
"Raises :class:`Unhandled` here, at the perform site, when no handler in\n"
"scope handles ``effect`` and it has no ``default``.  (Compiled version of\n"
"kina_fx.handlers._perform_py.)");

/* perform(E, key=1): the error names the effect, in the words of the Python
   perform (kina_fx.handlers.keyword_arguments_error, the one source). */
static PyObject *
refuse_keywords(PyObject *effect, PyObject *kwnames)
{
    PyObject *call[2] = {effect, kwnames};
    PyObject *exc = PyObject_Vectorcall(g_keyword_arguments_error, call, 2, NULL);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Where a perform's search starts: ``*f`` (a new reference) is the running
 * fiber of thread state ``st``, ``*i`` its innermost handler entry.  0 / -1. */
static inline int
search_start(PyObject *st, PyObject **f, Py_ssize_t *i)
{
    KFiber *cur = st == kfx_thread_state ? kfx_current : NULL;
    if (cur != NULL && cur->stack != NULL && PyList_CheckExact(cur->stack)) {   /* the usual case */
        *f = Py_NewRef((PyObject *)cur);
        *i = PyList_GET_SIZE(cur->stack) - 1;
        return 0;
    }
    *f = get_slot(st, g_tstate_t, off_current, s_current);
    if (*f == NULL || top_index(*f, i) < 0) {
        Py_CLEAR(*f);
        return -1;
    }
    return 0;
}

static PyObject *
perform(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "perform() missing 1 required positional argument: 'effect'");
        return NULL;
    }
    if (!KFX_READY())
        return NULL;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)
        return refuse_keywords(args[0], kwnames);
    PyObject *effect = args[0];
    PyObject *const *cargs = args + 1;
    Py_ssize_t n = nargs - 1;
    if (kfx_materialize() < 0)       /* a C handler's marker, before Python searches */
        return NULL;

    PyObject *st = thread_state();
    if (st == NULL)
        return NULL;
    PyObject *f;
    Py_ssize_t i;
    if (search_start(st, &f, &i) < 0) {
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
PyObject *
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
    PyObject *skip = push_skip(st, f, i);
    if (skip == NULL)
        goto error;
    PyObject *result = PyObject_Vectorcall(clause, cargs, n, NULL);
    Py_CLEAR(clause);
    if (result != NULL && Py_TYPE(result) == g_tail_t) {
        /* see the top of this file: nest as the Python frame would have */
        PyObject *chain = Py_XNewRef(SLOT(result, off_tr_chain)), *send = Py_XNewRef(SLOT(result, off_tr_send));
        Py_DECREF(result);
        if (chain == NULL || send == NULL) {
            Py_XDECREF(chain);
            Py_XDECREF(send);
            PyErr_SetString(PyExc_TypeError, "kina_fx: incomplete _TailResume");
            result = NULL;
        }
        else
            result = kfx_nest_drive(chain, send);
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
        kfx_raise_in_context(pending);
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

/* The search ``perform(effect, ...)`` would make here (C handlers' markers
 * first): find_clause from where perform starts.  ``*st`` and ``*f`` are new
 * references (NULL when the search could not start: -1); the caller
 * releases them and ``*clause`` / ``*on``. */
static int
search_here(PyObject *effect, PyObject **st, PyObject **f, Py_ssize_t *i, PyObject **clause,
            PyObject **on)
{
    *st = *f = *clause = *on = NULL;
    if (kfx_materialize() < 0 || (*st = thread_state()) == NULL)
        return -1;
    if (search_start(*st, f, i) < 0)
        return -1;
    return find_clause(f, i, effect, clause, on);
}

/* Whether ``perform(effect, ...)`` would find no handler here, and so run
 * the effect's default.  1 / 0 / -1 (error).  The runtime ops' direct calls
 * (op_calls.c) stand in for the default only then. */
int
kfx_effect_unhandled(PyObject *effect)
{
    PyObject *st, *f, *clause, *on;
    Py_ssize_t i;
    int found = search_here(effect, &st, &f, &i, &clause, &on);
    Py_XDECREF(clause);
    Py_XDECREF(on);
    Py_XDECREF(f);
    Py_XDECREF(st);
    return found < 0 ? -1 : found == FOUND_NONE;
}

/* Whether ``perform(effect, ...)`` here would run the fun clause of
 * ``handler`` (an entry of a fiber's handler stack, not a control handler),
 * and a perform made by that clause would find nothing beyond it and run the
 * effect's default: the handler is the only one in scope for the effect.
 * 1 / 0 / -1 (error).  The tape's compiled clause (tape_calls.c) records an
 * autograd primitive itself only then, as that handler's clause would. */
int
kfx_sole_handler(PyObject *effect, PyObject *handler)
{
    PyObject *st, *f, *clause, *on;
    Py_ssize_t i;
    int found = search_here(effect, &st, &f, &i, &clause, &on);
    int sole = found < 0 ? -1 : 0;
    if (found == FOUND_FUN && i >= 0) {
        PyObject *entry = stack_item(f, i);
        if (entry == NULL)
            sole = -1;
        else if (entry == handler) {
            /* the search a perform inside that clause makes: below its entry */
            Py_CLEAR(clause);
            i -= 1;
            found = find_clause(&f, &i, effect, &clause, &on);
            sole = found < 0 ? -1 : found == FOUND_NONE;
        }
        Py_XDECREF(entry);
    }
    Py_XDECREF(clause);
    Py_XDECREF(on);
    Py_XDECREF(f);
    Py_XDECREF(st);
    return sole;
}

PyMethodDef kfx_perform_methods[] = {
    {"perform", (PyCFunction)(void (*)(void))perform, METH_FASTCALL | METH_KEYWORDS, perform_doc},
    {NULL, NULL, 0, NULL},
};
