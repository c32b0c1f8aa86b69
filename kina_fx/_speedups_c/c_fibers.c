/* c_fibers.c: the C ABI's host fibers without cffi (the fast paths
 * of kina_resume_fiber, kina_get_perform_id, kina_get_perform_args,
 * kina_fiber_state and kina_fiber_result; kina_fast_api.h).
 *
 * What it mirrors
 * ---------------
 * ffi.effects.kina_py_resume_fiber with handlers.Stepper._step for
 * ``step(value)`` (c_step below, line by line), and the kina_py_* getters of
 * ffi.effects.  A host fiber is a handlers.Stepper (kina_fiber_create makes
 * it, in Python) whose fields the C core owns (StepperData,
 * types.c); ffi.effects.fiber_handles tells this file about every
 * handle it adds or removes (the mirror below), so a handle is found without
 * Python objects.
 *
 * What runs without the GIL: the handle lookup, and the getters, which read
 * the C copy of the pending perform that c_step writes (effect id, int64
 * arguments, result).  Any write of Stepper.state from Python (the Python
 * Stepper's own code: cancel, a step from Python) makes that copy stale, and
 * the getters then decline.  kina_resume_fiber takes the GIL once, steps the
 * fiber in C and releases it.  Everything unusual declines before changing
 * anything, and ffi.effects does it (validation and error texts included):
 * a handle that is not mirrored (past the mirror's 16M slots), of
 * another thread, a fiber that is not new or suspended, NULL out-pointers...
 *
 * Threads.  A fiber belongs to one OS thread, the only one that may use or
 * free its handle (ffi.effects checks the owner before removing one).  A
 * mirror slot holds the handle, the owner's thread token and a borrowed
 * pointer to the Stepper (ffi.effects.fiber_handles holds the reference);
 * a reader takes the pointer only when the slot's handle and token are the
 * caller's and reads the handle again afterwards, so another thread's slot
 * being reused at the same time is never dereferenced.
 */
#include "speedups.h"
#include "kina_fast_api.h"

#include <errno.h>

static PyObject *g_empty;            /* ()                                        */

static int
state_index(PyObject *state)
{
    for (int k = 0; k < N_STATES; k++)
        if (state == g_states[k] && state != NULL)
            return k;
    return -1;
}

/* ---- the fiber handle mirror -------------------------------------------------- */

#define MIRROR_PAGE 256
#define MIRROR_PAGES 65536           /* handles of slots past 16M are not mirrored */

typedef struct {
    uint64_t handle;                 /* 0: empty                                  */
    int64_t owner;                   /* the owner thread's token                 */
    PyObject *stepper;               /* borrowed: fiber_handles holds it         */
} mirror_slot;

static mirror_slot *mirror_pages[MIRROR_PAGES];

static mirror_slot *
mirror_slot_of(uint64_t handle, int create)
{
    uint64_t index = (handle & 0xFFFFFFFFu) - 1;
    if ((handle & 0xFFFFFFFFu) == 0 || index >= (uint64_t)MIRROR_PAGES * MIRROR_PAGE)
        return NULL;
    mirror_slot *page = __atomic_load_n(&mirror_pages[index / MIRROR_PAGE], __ATOMIC_ACQUIRE);
    if (page == NULL && create) {
        page = PyMem_RawCalloc(MIRROR_PAGE, sizeof(mirror_slot));   /* never freed */
        if (page == NULL)
            return NULL;
        __atomic_store_n(&mirror_pages[index / MIRROR_PAGE], page, __ATOMIC_RELEASE);
    }
    return page == NULL ? NULL : &page[index % MIRROR_PAGE];
}

/* The running thread's Stepper for ``handle``, or NULL.  No GIL needed. */
static KStepper *
lookup(uint64_t handle)
{
    int64_t me = kfx_thread_serial;
    mirror_slot *slot = me == 0 ? NULL : mirror_slot_of(handle, 0);
    if (slot == NULL || __atomic_load_n(&slot->handle, __ATOMIC_ACQUIRE) != handle
            || __atomic_load_n(&slot->owner, __ATOMIC_ACQUIRE) != me)
        return NULL;
    KStepper *s = (KStepper *)__atomic_load_n(&slot->stepper, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&slot->handle, __ATOMIC_ACQUIRE) != handle || s == NULL
            || s->thread_serial != me)
        return NULL;
    return s;
}

static void
mirror_clear(mirror_slot *slot)
{
    __atomic_store_n(&slot->handle, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&slot->stepper, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&slot->owner, 0, __ATOMIC_RELEASE);
}

/* A C object with note / forget / forget_all: the module's
 * ``fiber_handle_mirror``, which ffi.effects keeps up to date with its fiber
 * handle table. */
typedef struct {
    PyObject_HEAD
} KMirror;

static PyObject *
mirror_note(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "note(handle, stepper)");
        return NULL;
    }
    uint64_t handle = PyLong_AsUnsignedLongLong(args[0]);
    if (handle == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    PyObject *s = args[1];
    mirror_slot *slot = mirror_slot_of(handle, 1);
    if (slot == NULL || g_stepper_t == NULL || Py_TYPE(s) != g_stepper_t
            || ((KStepper *)s)->thread_serial == 0) {
        if (slot != NULL)
            mirror_clear(slot);
        PyErr_Clear();
        Py_RETURN_FALSE;              /* not mirrored: ffi.effects serves it */
    }
    mirror_clear(slot);
    __atomic_store_n(&slot->stepper, s, __ATOMIC_RELEASE);
    __atomic_store_n(&slot->owner, ((KStepper *)s)->thread_serial, __ATOMIC_RELEASE);
    __atomic_store_n(&slot->handle, handle, __ATOMIC_RELEASE);
    Py_RETURN_TRUE;
}

static PyObject *
mirror_forget(PyObject *self, PyObject *handle_obj)
{
    uint64_t handle = PyLong_AsUnsignedLongLong(handle_obj);
    if (handle == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    mirror_slot *slot = mirror_slot_of(handle, 0);
    if (slot != NULL && slot->handle == handle)
        mirror_clear(slot);
    Py_RETURN_NONE;
}

static PyObject *
mirror_forget_all(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    for (size_t p = 0; p < MIRROR_PAGES; p++)
        if (mirror_pages[p] != NULL)
            for (size_t k = 0; k < MIRROR_PAGE; k++)
                mirror_clear(&mirror_pages[p][k]);
    Py_RETURN_NONE;
}

static PyMethodDef mirror_methods[] = {
    {"note", (PyCFunction)(void (*)(void))mirror_note, METH_FASTCALL,
     "note(handle, stepper): the C fast paths may find ``stepper`` by ``handle``."},
    {"forget", mirror_forget, METH_O, "forget(handle): the handle was removed."},
    {"forget_all", mirror_forget_all, METH_NOARGS, "forget_all(): every handle was removed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KMirror_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kina_fx._speedups.FiberHandleMirror",
    .tp_basicsize = sizeof(KMirror),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What the C ABI's fast paths know of ffi.effects' fiber handles: which\n"
              "Stepper each one is.",
    .tp_methods = mirror_methods,
};

/* ---- the GIL and errno around a fast path ----------------------------------------- */

/* Take the GIL for this call (1), or decline (0): no thread state yet. */
typedef kfx_gil_call gil_call;

static int
gil_enter(gil_call *g)
{
    g->saved_errno = errno;
    g->ts = PyGILState_GetThisThreadState();
    if (g->ts == NULL)
        return 0;
    g->held = PyGILState_Check();
    if (!g->held)
        PyEval_RestoreThread(g->ts);
    if (kfx_materialize() < 0)       /* a C handler's pending markers, first */
        PyErr_Clear();               /* (out of memory: they stay records) */
    return 1;
}

/* Release; errno as the caller saw it before the call (what cffi's path
 * leaves, around callbacks that call no C function). */
static void
gil_leave(gil_call *g)
{
    if (!g->held)
        (void)PyEval_SaveThread();
    errno = g->saved_errno;
}

/* The same two for the other files' fast paths (op_calls.c). */
int
kfx_gil_enter(kfx_gil_call *g)
{
    return gil_enter(g);
}

void
kfx_gil_leave(kfx_gil_call *g)
{
    gil_leave(g);
}

/* ---- the step: handlers.Stepper._step((False, value)) --------------------------- */

static inline void
set_field(PyObject **field, PyObject *value)     /* value borrowed */
{
    PyObject *old = *field;
    *field = Py_NewRef(value);
    Py_XDECREF(old);
}

/* The same for Stepper.args: the tuple it held goes back to the cache if
 * nobody else holds it. */
static inline void
set_args_field(PyObject **field, PyObject *value)
{
    PyObject *old = *field;
    *field = Py_NewRef(value);
    if (old != NULL)
        kfx_release_tuple(old);
}

/* Record the C copy of what the fiber stopped in (the Stepper's fields are set). */
static void
cache_outcome(KStepper *s, int state)
{
    s->c_valid = 0;
    s->args_ok = s->result_ok = 0;
    if (state == ST_SUSPENDED) {
        int overflow = 0;
        long long v;
        if (s->effect == kfx_hint_effect && kfx_hint_effect != NULL)
            v = kfx_hint_effect_id;      /* a kina_perform from C suspended */
        else {
            PyObject *id = PyObject_GetAttr(s->effect, s_id);
            v = id != NULL && PyLong_CheckExact(id) ? PyLong_AsLongLongAndOverflow(id, &overflow) : 0;
            Py_XDECREF(id);
            PyErr_Clear();
        }
        if (overflow || v <= 0 || v > INT32_MAX)
            return;                  /* the getters decline: ffi.effects reports */
        s->effect_id = (int32_t)v;
        PyObject *args = s->args;
        if (PyTuple_CheckExact(args) && PyTuple_GET_SIZE(args) <= KFX_MAX_ARGS) {
            Py_ssize_t n = PyTuple_GET_SIZE(args);
            s->args_ok = 1;
            for (Py_ssize_t k = 0; k < n && s->args_ok; k++) {
                PyObject *a = PyTuple_GET_ITEM(args, k);
                long long x = PyLong_CheckExact(a) ? PyLong_AsLongLongAndOverflow(a, &overflow) : 0;
                if (!PyLong_CheckExact(a) || overflow || (x == -1 && PyErr_Occurred())) {
                    PyErr_Clear();
                    s->args_ok = 0;
                }
                s->args_c[k] = x;
            }
            s->nargs = (int32_t)n;
        }
    }
    else if (state == ST_DONE && PyLong_CheckExact(s->result)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(s->result, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred()))
            PyErr_Clear();
        else {
            s->result_c = v;
            s->result_ok = 1;
        }
    }
    s->c_valid = 1;
}

/* 1: stepped (the state says how it ended; -1 with an exception raised:
 * the fiber failed, state FAILED), 0: declined having changed nothing. */
static int
c_step(KStepper *s, int64_t value)
{
    int state = state_index(s->state);
    PyObject *chain = s->chain;
    if ((state != ST_NEW && state != ST_SUSPENDED) || chain == NULL
            || (Py_TYPE(chain) != g_chain_t && Py_TYPE(chain) != g_cont_t))
        return 0;
    PyObject *top = ((KChain *)chain)->top;
    if (top == NULL || Py_TYPE(top) != g_fiber_t)
        return 0;
    /* fibers.check_owner(self._chain.top) */
    if (((KFiber *)top)->thread == NULL || !PyLong_CheckExact(((KFiber *)top)->thread)
            || PyLong_AsLongLong(((KFiber *)top)->thread) != kfx_thread_serial) {
        PyErr_Clear();
        return 0;
    }
    PyObject *v = PyLong_FromLongLong(value);
    PyObject *send = v == NULL ? NULL : kfx_tuple(2, Py_False, v, NULL);
    Py_XDECREF(v);
    if (send == NULL)
        return -1;                   /* MemoryError before anything changed */
    /* chain, self._chain = self._chain, None; state RUNNING; no pending perform */
    chain = s->chain;
    s->chain = Py_NewRef(Py_None);
    s->c_valid = 0;
    set_field(&s->state, g_states[ST_RUNNING]);
    set_field(&s->effect, Py_None);
    set_args_field(&s->args, g_empty);
    PyObject *msg = kfx_switch_into_stealing(chain, send);
    kfx_release_chain(chain);
    PyObject *kind = NULL, *payload = NULL;
    if (msg != NULL) {
        if (PyTuple_CheckExact(msg) && PyTuple_GET_SIZE(msg) == 3) {
            kind = PyTuple_GET_ITEM(msg, 0);   /* an interned kind: stays alive */
            payload = Py_NewRef(PyTuple_GET_ITEM(msg, 2));
        }
        else
            PyErr_Format(PyExc_TypeError, "kina_fx: bad fiber message %R", msg);
        kfx_release_tuple(msg);
    }
    if (payload == NULL) {           /* except BaseException: FAILED, re-raise */
        PyObject *exc = exc_save();
        set_field(&s->state, g_states[ST_FAILED]);
        if (exc != NULL)
            set_field(&s->error, exc);
        exc_restore(exc);
        return -1;
    }
    int done;
    if (kind == g_performed) {
        /* effect, args, self._chain = payload (a tuple made by rt_suspend or
         * handlers._suspend_perform) */
        if (!PyTuple_CheckExact(payload) || PyTuple_GET_SIZE(payload) != 3) {
            PyErr_SetString(PyExc_TypeError, "kina_fx: bad perform message");
            Py_DECREF(payload);
            return -1;
        }
        PyObject *effect = PyTuple_GET_ITEM(payload, 0), *args = PyTuple_GET_ITEM(payload, 1);
        set_field(&s->chain, PyTuple_GET_ITEM(payload, 2));
        if (effect == g_suspend_to_host && PyTuple_CheckExact(args) && PyTuple_GET_SIZE(args) == 2) {
            effect = PyTuple_GET_ITEM(args, 0);
            args = PyTuple_GET_ITEM(args, 1);
        }
        set_field(&s->effect, effect);
        set_args_field(&s->args, args);
        done = ST_SUSPENDED;
        kfx_release_tuple(payload);
        payload = NULL;
    }
    else if (kind == g_returned) {
        set_field(&s->result, payload);
        done = ST_DONE;
    }
    else {
        set_field(&s->error, payload);
        int c = PyObject_IsInstance(payload, g_cancelled);
        if (c < 0)
            PyErr_Clear();
        done = c > 0 ? ST_CANCELLED : ST_FAILED;
    }
    Py_XDECREF(payload);
    set_field(&s->state, g_states[done]);
    cache_outcome(s, done);
    return 1;
}

/* ---- the fast paths (kina_fast_api) ----------------------------------------------- */

static int32_t report_exception(void);     /* below */

static int
fast_resume_fiber(uint64_t handle, int64_t value, int32_t *out_state, int32_t *status)
{
    if (!kfx_c_abi_on)
        return KINA_FAST_DECLINED;
    KStepper *s = lookup(handle);
    int state = s == NULL ? -1 : state_index(s->state);
    if (state != ST_SUSPENDED && state != ST_NEW)
        return KINA_FAST_DECLINED;
    gil_call g;
    if (!gil_enter(&g))
        return KINA_FAST_DECLINED;
    Py_INCREF(s);
    int r = c_step(s, value);
    if (r == 0) {
        Py_DECREF(s);
        gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    /* finally: if out_state and state != RUNNING: out_state = FIBER_STATES[state] */
    int now = state_index(s->state);
    if (out_state != NULL && now >= 0 && now != ST_RUNNING)
        *out_state = now;
    if (r < 0)
        *status = report_exception();
    else if (now == ST_FAILED) {     /* _report: raise stepper.error */
        PyObject *err = Py_XNewRef(s->error);
        kfx_raise(err != NULL ? err : Py_None);
        Py_XDECREF(err);
        *status = report_exception();
    }
    else
        *status = 0;
    Py_DECREF(s);
    gil_leave(&g);
    return KINA_FAST_DONE;
}

static int
fast_get_perform_id(uint64_t handle, int32_t *out_effect, int32_t *status)
{
    KStepper *s = kfx_c_abi_on && out_effect != NULL ? lookup(handle) : NULL;
    if (s == NULL || !s->c_valid || s->state != g_states[ST_SUSPENDED])
        return KINA_FAST_DECLINED;
    *out_effect = s->effect_id;
    *status = 0;
    return KINA_FAST_DONE;
}

static int
fast_get_perform_args(uint64_t handle, int64_t *out_args, int32_t cap, int32_t *out_nargs,
                      int32_t *status)
{
    KStepper *s = kfx_c_abi_on && out_nargs != NULL ? lookup(handle) : NULL;
    if (s == NULL || !s->c_valid || !s->args_ok || s->state != g_states[ST_SUSPENDED]
            || s->nargs > cap || (s->nargs > 0 && out_args == NULL))
        return KINA_FAST_DECLINED;   /* ffi.effects reports what is wrong */
    *out_nargs = s->nargs;
    for (int32_t k = 0; k < s->nargs; k++)
        out_args[k] = s->args_c[k];
    *status = 0;
    return KINA_FAST_DONE;
}

static int
fast_fiber_state(uint64_t handle, int32_t *out_state, int32_t *status)
{
    KStepper *s = kfx_c_abi_on && out_state != NULL ? lookup(handle) : NULL;
    int state = s == NULL ? -1 : state_index(s->state);
    if (state < 0)
        return KINA_FAST_DECLINED;
    *out_state = state;
    *status = 0;
    return KINA_FAST_DONE;
}

static int
fast_fiber_result(uint64_t handle, int64_t *out_value, int32_t *status)
{
    KStepper *s = kfx_c_abi_on && out_value != NULL ? lookup(handle) : NULL;
    if (s == NULL || !s->c_valid || !s->result_ok || s->state != g_states[ST_DONE])
        return KINA_FAST_DECLINED;
    *out_value = s->result_c;
    *status = 0;
    return KINA_FAST_DONE;
}

/* kina_perform: the search without the GIL (nogil.c), then, if it
 * stopped short, the rest with the GIL (c_abi.c). */
static int fast_perform_counted(int32_t effect, const int64_t *args, int32_t nargs,
                                int64_t *out_value, int32_t *status);

/* C handlers that perform again nest C frames on the fiber's stack: past this
 * many kina_performs nested on one fiber, kina_perform fails with status 5
 * (a RecursionError, as Python's limit ends the cffi path), not a crash,
 * whatever that Python's C recursion limit is. */
#define PERFORM_DEPTH 1000

static int
fast_perform(int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value, int32_t *status)
{
    KFiber *fiber = kfx_current;
    if (!kfx_c_abi_on || fiber == NULL)
        return KINA_FAST_DECLINED;
    if (fiber->performs >= PERFORM_DEPTH) {
        gil_call g;
        if (!gil_enter(&g))
            return KINA_FAST_DECLINED;
        PyErr_SetString(PyExc_RecursionError, "maximum recursion depth exceeded in kina_perform");
        *status = kfx_report_exception();
        gil_leave(&g);
        return KINA_FAST_DONE;
    }
    fiber->performs++;               /* the fiber is alive while it runs this */
    int done = fast_perform_counted(effect, args, nargs, out_value, status);
    fiber->performs--;
    return done;
}

static int
fast_perform_counted(int32_t effect, const int64_t *args, int32_t nargs, int64_t *out_value,
                     int32_t *status)
{
    kfx_nogil_state ns;
    int r = kfx_nogil_perform(effect, args, nargs, out_value, status, &ns);
    if (r == KINA_FAST_DONE)
        return KINA_FAST_DONE;
    gil_call g;                      /* errno now: at entry, or as the last handler left it */
    if (!gil_enter(&g))
        return KINA_FAST_DECLINED;   /* (no handler ran: this thread never had Python) */
    int done;
    if (r == KINA_FAST_DECLINED)     /* it did not even start: from the top */
        done = kina_fast_perform(effect, args, nargs, out_value, status, &g.saved_errno);
    else                             /* from where it stopped */
        done = kfx_perform_after_nogil(effect, nargs, out_value, status, &g.saved_errno, &ns,
                                       r == KFX_NEED_GIL_POP);
    gil_leave(&g);
    return done;
}

/* Before the cffi path of an export runs Python code on this thread. */
static void
fast_prepare(void)
{
    kfx_prepare_for_python();
}

/* The exception being raised as a status, with kina_last_error set. */
static int32_t
report_exception(void)
{
    return kfx_report_exception();
}

const kina_fast_api kfx_fast_api = {
    KINA_FAST_API_VERSION,
    fast_perform,
    fast_resume_fiber,
    fast_get_perform_id,
    fast_get_perform_args,
    fast_fiber_state,
    fast_fiber_result,
    fast_prepare,
    kfx_fast_runtime_op,
};

/* ---- the module's part ------------------------------------------------------- */

PyDoc_STRVAR(describe_doc,
"describe_c_handler($module, handler, fn_address, ctx_address, effect_ids, /)\n--\n\n"
"Record what a C handler (ffi.effects.CHandler) calls, for kina_perform's\n"
"search without the GIL (nogil.c); False when it cannot be described.");

static PyObject *
describe_c_handler(PyObject *Py_UNUSED(module), PyObject *args)
{
    return kfx_describe_c_handler(args);
}

static PyMethodDef c_fibers_methods[] = {
    {"describe_c_handler", describe_c_handler, METH_VARARGS, describe_doc},
    {NULL, NULL, 0, NULL},
};

/* describe_c_handler and ``fiber_handle_mirror`` (the one KMirror). */
int
kfx_add_c_fibers(PyObject *module)
{
    if (PyType_Ready(&KMirror_Type) < 0 || PyModule_AddFunctions(module, c_fibers_methods) < 0)
        return -1;
    if (g_empty == NULL && (g_empty = PyTuple_New(0)) == NULL)
        return -1;
    PyObject *mirror = PyType_GenericNew(&KMirror_Type, NULL, NULL);
    if (mirror == NULL || PyModule_AddObject(module, "fiber_handle_mirror", mirror) < 0) {
        Py_XDECREF(mirror);
        return -1;
    }
    return 0;
}
