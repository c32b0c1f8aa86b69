/* speedups.h: what the files of kina_fx._speedups share.
 *
 * kina_fx._speedups is the compiled copy of the hot paths of the effects
 * runtime; the Python functions of kina_fx/handlers.py and kina_fx/fibers.py
 * stay the readable reference (and what runs under KINA_FX_PURE_PYTHON=1).
 * One file per concern, each saying which Python it transcribes:
 *
 *   speedups_perform.c     perform: the handler-stack search, fun clauses and
 *                          their skip markers (handlers._perform_py)
 *   speedups_c_abi.c       kina_perform from C answered by C handlers
 *                          (ffi_effects.kina_py_perform + CClause)
 *   speedups_tail.c        the tail-resume check
 *                          (handlers._returns_straight_to_driver)
 *   speedups_round_trip.c  an ``on`` perform + resume: suspend, switch_into,
 *                          the driver loop, Continuation.resume / __del__
 *   speedups_module.c      the module: binding (what handlers.py hands over at
 *                          import), the method table, the _C_API capsule
 *
 * The module state is process-global and the GIL protects it (one
 * interpreter; no free-threaded build).  Every shared symbol is hidden: the
 * extension exports PyInit__speedups only.
 */
#ifndef KINA_SPEEDUPS_H
#define KINA_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* ---- bound by _bind() (speedups_module.c) ---------------------------------- */

extern PyObject *g_local;          /* fibers.local (a threading.local)          */
extern PyTypeObject *g_fiber_t;    /* fibers.Fiber                              */
extern PyTypeObject *g_tstate_t;   /* fibers.ThreadState                        */
extern PyTypeObject *g_skip_t;     /* handlers._Skip                            */
extern PyTypeObject *g_tail_t;     /* handlers._TailResume                      */
extern PyObject *g_handler_fun;    /* Handler.__dict__["fun"] (member descr)    */
extern PyObject *g_handler_on;     /* Handler.__dict__["on"]                    */
extern PyObject *g_unhandled;      /* errors.Unhandled                          */
extern PyObject *g_effect_t;       /* handlers.Effect                           */
extern PyObject *g_suspend;        /* handlers._suspend_perform                 */
extern PyObject *g_nested;         /* handlers._resume_nested                   */
extern PyObject *g_forward;        /* handlers.FORWARD (set by _bind_forward)    */

extern Py_ssize_t off_stack, off_handler, off_parent;   /* Fiber slots        */
extern Py_ssize_t off_current;                          /* ThreadState.current */
extern Py_ssize_t off_skip_fiber, off_skip_index;       /* _Skip slots         */
extern Py_ssize_t off_fun, off_on;                      /* Handler slots       */

/* Interned attribute names (PyInit__speedups). */
extern PyObject *s_state, *s_current, *s_stack, *s_handler, *s_parent, *s_fiber, *s_index;
extern PyObject *s_fun, *s_on, *s_get, *s_default, *s_append, *s_outcome, *s_switch,
                *s_ret, *s_exc;

/* speedups_perform.c: the per-thread state cache and the marker cache, reset
 * by _bind. */
extern PyObject *state_key;
extern uint64_t cached_tid;
extern PyObject *cached_state;
#define SKIP_CACHE 16
extern PyObject *skip_cache[SKIP_CACHE];
extern int skip_cached;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

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

/* ---- exceptions ---------------------------------------------------------------- */

#if PY_VERSION_HEX >= 0x030C0000
static inline PyObject *exc_save(void) { return PyErr_GetRaisedException(); }
static inline void exc_restore(PyObject *exc) { PyErr_SetRaisedException(exc); }
#else
static inline PyObject *
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

static inline void
exc_restore(PyObject *exc)
{
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
}
#endif


/* ---- speedups_perform.c ------------------------------------------------------ */

/* What find_clause found. */
enum { FOUND_NONE = 0, FOUND_FUN = 1, FOUND_ON = 2 };

PyObject *thread_state(void);
int top_index(PyObject *f, Py_ssize_t *i);
PyObject *new_skip(PyObject *f, Py_ssize_t i);
int push_marker(PyObject *st, PyObject *skip);
PyObject *pop_marker(PyObject *st, PyObject *marker);
void release_entry(PyObject *item);
PyObject *args_tuple(PyObject *const *args, Py_ssize_t n);
PyObject *unhandled(PyObject *effect, PyObject *const *args, Py_ssize_t n);
PyObject *suspend_py(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h);
int find_clause(PyObject **fp, Py_ssize_t *ip, PyObject *effect, PyObject **clause, PyObject **on);
PyObject *perform_at(PyObject *st, PyObject *f, Py_ssize_t i, PyObject *effect,
                     PyObject *const *cargs, Py_ssize_t n);
extern PyMethodDef kfx_perform_methods[];

/* ---- speedups_c_abi.c ---------------------------------------------------------- */

int kina_fast_perform(int32_t effect_id, const int64_t *c_args, int32_t nargs, int64_t *out,
                      int32_t *status);
extern PyMethodDef kfx_c_abi_methods[];

/* ---- speedups_tail.c ----------------------------------------------------------- */

int straight_to_driver(PyObject *frame);
extern PyMethodDef kfx_tail_methods[];

/* ---- speedups_round_trip.c ------------------------------------------------------ */

PyObject *rt_suspend(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h);
PyObject *rt_switch_into(PyObject *chain, PyObject *send);
extern PyMethodDef kfx_round_trip_methods[];

/* ---- speedups_module.c ---------------------------------------------------------- */

int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *off, PyObject **descr_out);
int check_type(PyObject *obj, const char *what);

#pragma GCC visibility pop

#endif /* KINA_SPEEDUPS_H */
