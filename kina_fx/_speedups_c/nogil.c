/* nogil.c: kina_perform answered by C handlers without the GIL.
 *
 * What it mirrors: the search of handlers._perform_py (perform.c's
 * find_clause) and the C call of ffi.effects.CClause, over what the C core
 * can read without the GIL: the running fiber (kfx_current), the handler
 * stacks (exact lists, read and never written here), C handler entries
 * (ffi.effects.CHandler, whose C part, KCHandler, is fixed when it is made)
 * and _Skip markers (their fiber and C index).  The first time the search
 * meets anything else (a Python handler, a fiber's control handler, the end
 * of the chain) it stops and c_fibers.c goes on from there with the
 * GIL, as c_abi.c does.  So does a C handler's return code other
 * than KINA_HANDLED / KINA_FORWARD: CClause._outcome runs, with the GIL.
 *
 * Why this is safe without the GIL: a fiber's handler stack is written only
 * by the thread that owns it, with the GIL, and this thread is the owner and
 * runs no Python code while it searches; other threads only read these
 * objects (the cycle collector's traversal), and every object read is kept
 * alive by the running fiber chain.  Nothing here touches a reference count.
 *
 * The skip marker.  While a C handler runs, the Python search must see a
 * _Skip(f, i) on top of the running fiber's stack (handlers._run_fun_clause).
 * Without the GIL no object can be made, so the marker is first only a
 * record in a small per-thread array (a "pending marker": the fiber whose
 * stack it belongs on, the stack's length then, and the (f, i) it stands
 * for).  A search without the GIL that starts under it starts at the record.
 * Before any Python code of kina_fx runs on this thread (every path that
 * takes the GIL calls kfx_materialize: the fast paths, the cffi exports
 * through kina_fast_api.prepare, perform, the round trip), the pending
 * markers become real _Skip objects, put where they would have been; the
 * handler's frame, when it returns, then removes its _Skip with the GIL (as
 * handlers._remove_marker) instead of dropping the record.  A C handler that
 * runs Python code through the Python C API directly (not through a kina_*
 * call) sees the stack without its marker.
 *
 * Records are values (no pointer into a C stack, which a greenlet switch
 * moves away), named by a token: a frame finds its own record by token
 * wherever it is, or its _Skip in the table of materialized markers.
 */
#include "speedups.h"

#include <errno.h>

#define C_HANDLED 0
#define C_FORWARD (-1)

typedef int32_t (*c_handler_fn)(void *ctx, int32_t effect, const int64_t *args,
                                int32_t nargs, int64_t *out_value);

/* ---- pending markers -------------------------------------------------------------- */

typedef struct {
    uint64_t token;
    KFiber *cur;                     /* the fiber whose stack it goes on (borrowed)   */
    KFiber *f;                       /* _Skip(f, i)                                  */
    Py_ssize_t i;
    Py_ssize_t height;               /* len(cur.stack) when it was pushed            */
} pending_mark;

#define MARKS 8                      /* more pending at once take the GIL path       */
/* C handlers that perform again nest C frames: past this many nested calls
 * here, the GIL path goes on, where Python's recursion limit counts them
 * (a RecursionError, not a crash). */
#define NOGIL_DEPTH 200
static KFX_TLS int nogil_depth;
static __thread pending_mark marks_storage[MARKS];
static KFX_TLS pending_mark *marks;  /* this thread's marks_storage                  */
static KFX_TLS int nmarks;
static KFX_TLS uint64_t next_token;

/* Materialized markers by token (a dict, with the GIL): the _Skip each stands
 * for, until its frame removes it. */
static PyObject *g_materialized;

static inline Py_ssize_t
stack_len(KFiber *f)
{
    PyObject *stack = f->stack;
    return stack != NULL && PyList_CheckExact(stack) ? PyList_GET_SIZE(stack) : -1;
}

/* With the GIL: every pending marker of this thread becomes a _Skip on its
 * fiber's stack, at the height it was pushed at (nested ones above the
 * earlier ones).  0, or -1 with an exception (the records then stay). */
int
kfx_materialize(void)
{
    if (nmarks == 0)
        return 0;
    if (g_materialized == NULL && (g_materialized = PyDict_New()) == NULL)
        return -1;
    for (int k = 0; k < nmarks; k++) {
        pending_mark *m = &marks[k];
        Py_ssize_t at = m->height;
        for (int j = 0; j < k; j++)  /* earlier ones already put on that stack, at or below */
            if (marks[j].cur == m->cur && marks[j].height <= m->height)
                at++;
        PyObject *stack = m->cur->stack;
        PyObject *skip = new_skip((PyObject *)m->f, m->i);
        PyObject *key = skip == NULL ? NULL : PyLong_FromUnsignedLongLong(m->token);
        int r = -1;
        if (key != NULL && stack != NULL && PyList_Check(stack)) {
            Py_ssize_t n = PyList_GET_SIZE(stack);
            r = PyList_Insert(stack, at < 0 ? n : at > n ? n : at, skip);
        }
        else if (key != NULL)
            PyErr_SetString(PyExc_TypeError, "kina_fx: a fiber's handler stack is not a list");
        if (r == 0)
            r = PyDict_SetItem(g_materialized, key, skip);
        Py_XDECREF(key);
        Py_XDECREF(skip);
        if (r < 0) {
            /* keep the rest pending: drop the ones done from the array */
            memmove(marks, marks + k, (nmarks - k) * sizeof *marks);
            nmarks -= k;
            return -1;
        }
    }
    nmarks = 0;
    return 0;
}

/* Without the GIL: materialize this thread's pending markers, if any,
 * before Python code of kina_fx runs here through cffi. */
void
kfx_prepare_for_python(void)
{
    if (nmarks == 0 || PyGILState_GetThisThreadState() == NULL)
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    if (kfx_materialize() < 0)
        PyErr_Clear();
    PyGILState_Release(gil);
}

/* Push a record for the C handler at (f, i); its token, or 0 when the array
 * is full (the caller takes the GIL path). */
static inline uint64_t
push_mark(KFiber *cur, KFiber *f, Py_ssize_t i)
{
    if (marks == NULL)
        marks = marks_storage;
    if (nmarks >= MARKS)
        return 0;
    pending_mark *m = &marks[nmarks++];
    /* unique in the process: g_materialized is shared by every thread */
    m->token = ((uint64_t)kfx_thread_serial << 40) | (++next_token & ((UINT64_C(1) << 40) - 1));
    m->cur = cur;
    m->f = f;
    m->i = i;
    m->height = stack_len(cur);
    return m->token;
}

/* Remove the marker with ``token``: its record, without the GIL, if it is
 * still pending (1); else 0: it was materialized, and pop_materialized must
 * remove its _Skip with the GIL. */
static inline int
pop_pending(uint64_t token)
{
    if (nmarks > 0 && marks[nmarks - 1].token == token) {
        nmarks--;                    /* the usual case: the innermost */
        return 1;
    }
    for (int k = nmarks - 2; k >= 0; k--)
        if (marks[k].token == token) {
            memmove(marks + k, marks + k + 1, (nmarks - k - 1) * sizeof *marks);
            nmarks--;
            return 1;
        }
    return 0;
}

/* With the GIL: remove a materialized marker's _Skip from the running
 * fiber's stack (handlers._remove_marker).  0, or -1 with an exception. */
int
kfx_pop_materialized(uint64_t token)
{
    PyObject *key = PyLong_FromUnsignedLongLong(token);
    PyObject *skip = key == NULL || g_materialized == NULL ? NULL : PyDict_GetItemWithError(g_materialized, key);
    if (skip == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "kina_fx: a skip marker went missing");
        Py_XDECREF(key);
        return -1;
    }
    Py_INCREF(skip);
    int r = PyDict_DelItem(g_materialized, key);
    Py_DECREF(key);
    PyObject *st = r < 0 ? NULL : thread_state();
    PyObject *popped = st == NULL ? NULL : pop_marker(st, skip);
    Py_XDECREF(st);
    if (popped != NULL)
        Py_DECREF(popped);
    release_entry(skip);
    return popped == NULL ? -1 : 0;
}

/* ---- the search -------------------------------------------------------------------- */

static inline int
handles(KCHandler *h, int32_t effect)
{
    for (int32_t k = 0; k < h->neffects; k++)
        if (h->effects[k] == effect)
            return 1;
    return 0;
}

/* The entry below (f, i): i - 1, or the top of the parent's stack.  0 when
 * only the GIL path can go on (the chain ends, or something unusual). */
static inline int
step_below(KFiber **fp, Py_ssize_t *ip)
{
    if (*ip >= 0) {
        --*ip;
        return 1;
    }
    PyObject *parent = (*fp)->parent;
    Py_ssize_t top = parent != NULL && Py_TYPE(parent) == g_fiber_t ? stack_len((KFiber *)parent) - 1 : -2;
    *ip = -1;                        /* on failure: past (*fp)'s own entries */
    if (top < -1)
        return 0;                    /* None: unhandled (Python knows the default) */
    *fp = (KFiber *)parent;
    *ip = top;
    return 1;
}

int
kfx_nogil_perform(int32_t effect, const int64_t *c_args, int32_t nargs, int64_t *out,
                  int32_t *status, kfx_nogil_state *ns)
{
    ns->called = ns->outcome = 0;
    KFiber *cur = kfx_current, *f = cur;
    if (f == NULL || !kfx_c_abi_on || out == NULL || nargs < 0 || nargs > KFX_MAX_ARGS
            || (nargs > 0 && c_args == NULL) || effect <= 0)
        return KINA_FAST_DECLINED;
    /* The arguments are read once, as kina_py_perform reads them, into what a
     * C handler gets: 16 slots, zero past nargs (as from the Python clause). */
    int64_t *buf = ns->args;
    for (int32_t k = 0; k < nargs; k++)
        buf[k] = c_args[k];
    int zeroed = 0;                  /* the slots past nargs, before a handler sees them */
    Py_ssize_t i = -1;
    if (marks != NULL && nmarks > 0 && marks[nmarks - 1].cur == cur) {
        /* under a marker that is not on the stack yet: start where it points */
        pending_mark *m = &marks[nmarks - 1];
        if (m->height != stack_len(cur))
            return KINA_FAST_DECLINED;   /* the stack changed under it: from the top, with
                                          * the GIL, once the marker is in place */
        f = m->f;
        i = m->i;
        if (!step_below(&f, &i))
            goto gil;
    }
    else if ((i = stack_len(f) - 1) < -1)
        return KINA_FAST_DECLINED;
    for (;;) {
        if (i < 0) {                 /* f's control handler */
            PyObject *h = f->handler;
            if (h != NULL && h != Py_None)
                goto gil;
            if (!step_below(&f, &i))
                goto gil;
            continue;
        }
        PyObject *stack = f->stack;
        if (stack == NULL || !PyList_CheckExact(stack) || i >= PyList_GET_SIZE(stack))
            goto gil;
        PyObject *e = PyList_GET_ITEM(stack, i);
        PyTypeObject *tp = Py_TYPE(e);
        if (tp == g_skip_t) {
            PyObject *nf = ((KSkip *)e)->fiber;
            Py_ssize_t ni = ((KSkip *)e)->index_c;
            if (!((KSkip *)e)->index_is_c && ((KSkip *)e)->index == NULL)
                ni = -3;             /* unset: the GIL path raises as Python does */
            if (nf == NULL || Py_TYPE(nf) != g_fiber_t || ni < -1)
                goto gil;
            f = (KFiber *)nf;
            i = ni;
            if (!step_below(&f, &i))
                goto gil;
            continue;
        }
        if (tp != g_chandler_t || !((KCHandler *)e)->c_ready)
            goto gil;                /* a Python handler: it may handle the effect */
        KCHandler *h = (KCHandler *)e;
        if (!handles(h, effect)) {
            if (!step_below(&f, &i))
                goto gil;
            continue;
        }
        /* The clause: run the C handler outside itself (the marker). */
        uint64_t token = nogil_depth < NOGIL_DEPTH ? push_mark(cur, f, i) : 0;
        if (token == 0)
            goto gil;
        if (!zeroed) {
            for (int32_t k = nargs; k < KFX_MAX_ARGS; k++)
                buf[k] = 0;
            zeroed = 1;
        }
        int64_t answer = 0;
        nogil_depth++;
        int32_t rc = ((c_handler_fn)h->fn)(h->ctx, effect, buf, nargs, &answer);
        nogil_depth--;
        ns->called = 1;              /* errno stays as the handler left it */
        if (rc != C_HANDLED && rc != C_FORWARD) {
            /* CClause._outcome runs with the GIL, the marker still in place */
            ns->outcome = 1;
            ns->rc = rc;
            ns->answer = answer;
            ns->token = token;
            ns->f = f;
            ns->i = i;
            return KFX_NEED_GIL;
        }
        if (!pop_pending(token)) {   /* materialized while the handler ran */
            ns->outcome = 0;
            ns->token = token;       /* the caller removes its _Skip, with the GIL */
            ns->rc = rc;
            ns->answer = answer;
            ns->f = f;
            ns->i = i;
            return KFX_NEED_GIL_POP;
        }
        if (rc == C_HANDLED) {
            *out = answer;
            *status = 0;
            return KINA_FAST_DONE;
        }
        if (!step_below(&f, &i))     /* KINA_FORWARD: on with the handlers below */
            goto gil;
    }
gil:
    ns->f = f;
    ns->i = i;
    return KFX_NEED_GIL;
}

/* FastPaths.describe_c_handler(handler, fn_address, ctx_address, effect_ids):
 * record what a C handler (ffi.effects.CHandler) calls, once.  False when it
 * cannot be described (more than 8 effects): it is then found with the GIL. */
PyObject *
kfx_describe_c_handler(PyObject *args)
{
    PyObject *handler, *ids;
    unsigned long long fn, ctx;
    if (!PyArg_ParseTuple(args, "OKKO!:describe_c_handler", &handler, &fn, &ctx, &PyTuple_Type, &ids))
        return NULL;
    if (!PyObject_TypeCheck(handler, &KCHandler_Type)) {
        PyErr_SetString(PyExc_TypeError, "describe_c_handler: not a C handler");
        return NULL;
    }
    KCHandler *h = (KCHandler *)handler;
    Py_ssize_t n = PyTuple_GET_SIZE(ids);
    if (h->c_ready || n == 0 || n > KFX_HANDLER_EFFECTS || fn == 0)
        Py_RETURN_FALSE;
    for (Py_ssize_t k = 0; k < n; k++) {
        long id = PyLong_AsLong(PyTuple_GET_ITEM(ids, k));
        if (id == -1 && PyErr_Occurred())
            return NULL;
        if (id <= 0 || id > INT32_MAX)
            Py_RETURN_FALSE;
        h->effects[k] = (int32_t)id;
    }
    h->neffects = (int32_t)n;
    h->fn = (void *)(uintptr_t)fn;
    h->ctx = (void *)(uintptr_t)ctx;
    h->c_ready = 1;
    Py_RETURN_TRUE;
}

