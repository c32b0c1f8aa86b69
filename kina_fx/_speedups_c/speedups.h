/* speedups.h: what the files of kina_fx._speedups share.
 *
 * kina_fx._speedups is the compiled copy of the hot paths of the effects
 * runtime; the Python functions of kina_fx/handlers.py and kina_fx/fibers.py
 * stay the readable reference (and what runs under KINA_FX_PURE_PYTHON=1).
 * One file per concern, each saying which Python it transcribes:
 *
 *   perform.c     perform: the handler-stack search, fun clauses and
 *                          their skip markers (handlers._perform_py)
 *   c_abi.c       kina_perform from C answered by C handlers
 *                          (ffi.effects.kina_py_perform + CClause)
 *   tail.c        the tail-resume check
 *                          (handlers._returns_straight_to_driver_py)
 *   round_trip.c  an ``on`` perform + resume: suspend, switch_into,
 *                          the driver loop, Continuation.resume / __del__
 *   c_fibers.c    the C ABI's host fibers (handlers.Stepper._step and the
 *                          kina_py_* getters of ffi.effects)
 *   nogil.c       kina_perform's search over C handlers without the GIL
 *   op_calls.c    a runtime op export called from C, CPU backend
 *                          (the CPU path of ffi.ops' callbacks)
 *   tape_calls.c  a tape over memory's clause for a runtime op
 *                          (autograd.memory.BufferTracer.apply)
 *   tape_clauses.c an autograd Tape's clause for an elementwise or
 *                          binary primitive (autograd.tape's factories)
 *   buffers.c     the byte comparison of a tape's overwrite check
 *                          (autograd.memory._unchanged)
 *   types.c       the data of the protocol's types (the classes' fields)
 *   module.c      the module: the Python collaborators it imports (at
 *                          first use), the method table, the _C_API capsule
 *
 * Where the C core hands a case to the Python reference instead: the table
 * "What the C core hands to Python" in docs/effects.md (each such place
 * in the C files names its row there, ``fallback: <row>``).
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

#include "kina_fast_api.h"

#pragma GCC visibility push(hidden)

/* Thread-local data of this extension: the initial-exec model (no
 * __tls_get_addr call per access; a few bytes of the static TLS block). */
#define KFX_TLS __thread __attribute__((tls_model("initial-exec")))

/* ---- the protocol's data (types.c) ---------------------------------- *
 * Field order matters: a type's PyObject * fields follow the head (and its
 * base's fields) without gaps; the weak reference list, if any, comes last. */

typedef struct {
    PyObject_HEAD
    PyObject *stack, *handler, *shallow, *parent, *thread, *job, *glet, *unwinder;
    PyObject *weakreflist;
    int performs;                       /* kina_performs nested on this fiber's stack */
    /* The frame the innermost C driver loop running on this fiber was called
     * from (round_trip.c), or NULL: borrowed, only ever compared. */
    PyObject *driver_frame;
    int drivers;                        /* C driver loops running on this fiber */
} KFiber;

typedef struct {
    PyObject_HEAD
    PyObject *serial, *current, *mail, *outbox, *pool, *to_start, *trampoline, *dropped;
    PyObject *weakreflist;
} KThreadState;

typedef struct {
    PyObject_HEAD
    PyObject *top, *base;
} KChain;

typedef struct {
    KChain chain;
    PyObject *shallow;
} KContinuation;

typedef struct {
    PyObject_HEAD
    PyObject *fiber, *index;
    Py_ssize_t index_c;                 /* ``index`` as a C value (-2: not an index)  */
    int index_is_c;                     /* ``index`` unset: made from index_c on read */
} KSkip;

typedef struct {
    PyObject_HEAD
    PyObject *chain, *send;
} KTailResume;

typedef struct {
    PyObject_HEAD
    PyObject *on, *fun, *ret, *exc;
} KHandler;

#define KFX_MAX_ARGS 16                 /* KINA_MAX_ARGS */

typedef struct {
    PyObject_HEAD
    PyObject *handler, *chain, *state, *effect, *args, *result, *error, *thread;
    /* C-only (c_fibers.c): the pending perform and the result as C
     * values, for the C ABI's paths that run without the GIL; valid while
     * c_valid (any write of ``state`` from Python clears it). */
    int c_valid;
    int args_ok;                        /* every argument fits an int64_t */
    int result_ok;
    int32_t effect_id;
    int32_t nargs;
    int64_t args_c[KFX_MAX_ARGS];
    int64_t result_c;
    int64_t thread_serial;              /* ``thread`` as a C value (0: none) */
} KStepper;

/* ffi.effects.CHandler: a C handler on a handler stack.  The C-only part is
 * what the search without the GIL reads (nogil.c): set once by
 * describe_c_handler, never changed. */
#define KFX_HANDLER_EFFECTS 8

typedef struct {
    KHandler handler;
    PyObject *thread;
    PyObject *weakreflist;
    int c_ready;                        /* the fields below are set             */
    int32_t neffects;
    int32_t effects[KFX_HANDLER_EFFECTS];
    void *fn, *ctx;
} KCHandler;

/* handlers._Catch: which effects suspend a Stepper's fiber. */
typedef struct {
    PyObject_HEAD
    PyObject *effects;
} KCatch;

/* This thread's fibers.ThreadState (borrowed; its dealloc clears these), its
 * token, and its running fiber (borrowed from ThreadState.current): what the
 * paths without the GIL start from.  Set by the fields' setters, on the
 * thread that owns the ThreadState (the only one that writes them). */
extern KFX_TLS PyObject *kfx_thread_state;
extern KFX_TLS int64_t kfx_thread_serial;
extern KFX_TLS KFiber *kfx_current;
/* st.current = fiber (fiber borrowed), keeping kfx_current in step. */
void kfx_set_current(PyObject *st, PyObject *fiber);

/* ffi.effects.CClause: the fun clause of a C handler. */
typedef struct {
    PyObject_HEAD
    PyObject *fn, *ctx, *effect, *effect_id, *fn_address, *ctx_address, *buffers;
} KCClause;

extern PyTypeObject KFiber_Type, KThreadState_Type, KChain_Type, KContinuation_Type, KSkip_Type,
                    KTailResume_Type, KHandler_Type, KStepper_Type, KCatch_Type, KCClause_Type,
                    KCHandler_Type;
void kfx_data_dealloc(PyObject *self);
int kfx_add_data_types(PyObject *module);

/* ---- the collaborators (module.c imports them at the first call) ---------- */

extern int kfx_ready;              /* kfx_import_collaborators succeeded        */
extern int kfx_c_abi_on;           /* the C ABI's fast paths are on             */
/* Import every collaborator below, once; 0, or -1 with an exception. */
int kfx_import_collaborators(void);
#define KFX_READY() (kfx_ready || kfx_import_collaborators() == 0)

/* Repeated on purpose, one line a collaborator, each saying what it holds:
 * the declarations of module.c's table (which fills them) for every file. */
extern PyObject *g_local;          /* fibers.local (a threading.local)          */
extern PyTypeObject *g_fiber_t;    /* fibers.Fiber                              */
extern PyTypeObject *g_tstate_t;   /* fibers.ThreadState                        */
extern PyTypeObject *g_skip_t;     /* handlers._Skip                            */
extern PyTypeObject *g_handler_t;  /* handlers.Handler                          */
extern PyTypeObject *g_tail_t;     /* handlers._TailResume                      */
extern PyObject *g_handler_fun;    /* HandlerData's "fun" member descriptor     */
extern PyObject *g_handler_on;     /* HandlerData's "on"                        */
extern PyObject *g_unhandled;      /* errors.Unhandled                          */
extern PyObject *g_cancelled;      /* errors.Cancelled                          */
extern PyObject *g_effect_t;       /* handlers.Effect                           */
extern PyObject *g_effects_by_id;  /* handlers.Effect._by_id                    */
extern PyObject *g_suspend;        /* handlers._suspend_perform                 */
extern PyObject *g_keyword_arguments_error; /* handlers.keyword_arguments_error */
extern PyObject *g_remove_marker;  /* handlers._remove_marker                   */
extern PyObject *g_forward;        /* handlers.FORWARD                          */
extern PyObject *g_gexit;          /* greenlet.GreenletExit                     */
extern PyObject *g_unwind;         /* fibers.Unwind                             */
extern PyObject *g_begin_unwind;   /* fibers._begin_unwind_here                 */
extern PyObject *g_switch_into_py; /* fibers.switch_into                        */
extern PyObject *g_unwind_fn;      /* fibers.unwind                             */
extern PyObject *g_resume_py;      /* handlers._ContinuationReference.resume    */
extern PyObject *g_abort_unless_kept; /* handlers._abort_unless_kept            */
extern PyObject *g_drive_fresh;    /* handlers._drive_on_fresh_stack            */
extern int g_hop_depth;            /* handlers._HOP_DEPTH                       */
extern Py_ssize_t t_max_frames;    /* tailcalls.MAX_TAIL_FRAMES                 */
extern PyObject *t_resume_names;   /* tailcalls.RESUME_NAMES                    */
extern PyObject *t_cache;          /* tailcalls.tail_calls_by_code              */
extern PyObject *t_tail_calls;     /* tailcalls.tail_calls                      */
extern PyObject *t_names_function; /* tailcalls.names_function                  */
extern PyObject *g_answer_fn;      /* ffi.effects._answer_to_int64 (C ABI)      */
extern PyObject *g_report_fn;      /* ffi.effects._report_error (C ABI)         */
extern PyObject *g_op_rows;        /* ffi.ops.FAST_ROWS (runtime op exports)    */
extern PyObject *g_cpu_selected;   /* ffi.ops._cpu_selected                     */
extern PyObject *g_op_perform;     /* ffi.ops._fast_perform                     */
extern PyObject *kfx_perform_fn;   /* this module's perform (module.c sets it)   */
extern PyObject *g_op_fp_context;  /* gpu_ops.QUIET_FP_CONTEXT                  */
extern PyObject *g_device_inputs;  /* gpu_ops.DEVICE_INPUTS                     */
extern PyObject *g_op_last_direct; /* ffi.ops.FAST_LAST_DIRECT                  */
extern PyObject *g_op_last_views;  /* ffi.ops.FAST_LAST_VIEWS                   */
/* Read those once kina_fx.ffi.ops is imported: 1, 0 (not yet), -1. */
int kfx_import_op_collaborators(void);

/* Stepper.NEW, RUNNING, SUSPENDED, DONE, FAILED, CANCELLED: their index is the
 * KINA_FIBER_* value (ffi.effects.FIBER_STATES). */
enum { ST_NEW, ST_RUNNING, ST_SUSPENDED, ST_DONE, ST_FAILED, ST_CANCELLED, N_STATES };
extern PyObject *g_states[N_STATES];

/* Where the fields are (SLOT(obj, off_...)), on instances of the types above. */
#define off_stack offsetof(KFiber, stack)
#define off_handler offsetof(KFiber, handler)
#define off_parent offsetof(KFiber, parent)
#define off_glet offsetof(KFiber, glet)
#define off_thread offsetof(KFiber, thread)
#define off_job offsetof(KFiber, job)
#define off_shallow offsetof(KFiber, shallow)
#define off_current offsetof(KThreadState, current)
#define off_mail offsetof(KThreadState, mail)
#define off_serial offsetof(KThreadState, serial)
#define off_dropped offsetof(KThreadState, dropped)
#define off_skip_fiber offsetof(KSkip, fiber)
#define off_skip_index offsetof(KSkip, index)
#define off_fun offsetof(KHandler, fun)
#define off_on offsetof(KHandler, on)
#define off_top offsetof(KChain, top)
#define off_base offsetof(KChain, base)
#define off_k_shallow offsetof(KContinuation, shallow)
#define off_tr_chain offsetof(KTailResume, chain)
#define off_tr_send offsetof(KTailResume, send)
#define off_cc_fn offsetof(KCClause, fn_address)
#define off_cc_ctx offsetof(KCClause, ctx_address)
#define off_cc_effect_id offsetof(KCClause, effect_id)

/* Interned attribute names (PyInit__speedups). */
extern PyObject *s_state, *s_current, *s_stack, *s_handler, *s_parent, *s_fiber, *s_index;
extern PyObject *s_fun, *s_on, *s_get, *s_default, *s_append, *s_outcome, *s_switch,
                *s_ret, *s_exc, *s_id;

/* perform.c: the per-thread state cache and the marker cache. */
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

/* Does ``tp`` resolve ``name`` to ``descr`` (HandlerData's own field) with the
 * generic getattr?  Remembered per type while the type is unchanged (its
 * version tag), since every perform asks it of every handler it passes. */
int kfx_type_keeps_field(PyTypeObject *tp, PyObject *name, PyObject *descr);

/* handler.fun / handler.on (new reference), as a field when the entry's type
 * resolves the name to HandlerData's own member descriptor. */
static inline PyObject *
get_handler_attr(PyObject *h, PyObject *descr, Py_ssize_t off, PyObject *name)
{
    if (kfx_type_keeps_field(Py_TYPE(h), name, descr)) {
        PyObject *v = SLOT(h, off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(h, name);
}

/* [a, b]: a new list that steals both references (released if it fails). */
static inline PyObject *
kfx_list2(PyObject *a, PyObject *b)
{
    PyObject *list = PyList_New(2);
    if (list == NULL) {
        Py_DECREF(a);
        Py_DECREF(b);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, a);
    PyList_SET_ITEM(list, 1, b);
    return list;
}

/* A module function of exactly two positional arguments (METH_FASTCALL, no
 * argument tuple): ``name(a, b)`` returns ``impl(a, b)``. */
#define KFX_FASTCALL2(name, impl)                                                              \
    static PyObject *                                                                        \
    name(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)               \
    {                                                                                        \
        if (nargs != 2)                                                                      \
            return PyErr_Format(PyExc_TypeError, #name "() takes 2 arguments (%zd given)", nargs); \
        return impl(args[0], args[1]);                                                       \
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
exc_restore(PyObject *exc)          /* NULL: nothing to restore (as 3.12's) */
{
    if (exc != NULL)
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
}
#endif

/* Python's ``raise v``: an exception instance or class is set, anything else
 * is the TypeError Python raises.  Always NULL, for ``return kfx_raise(v)``. */
static inline PyObject *
kfx_raise(PyObject *v)
{
    if (PyExceptionInstance_Check(v))
        PyErr_SetObject((PyObject *)Py_TYPE(v), v);
    else if (PyExceptionClass_Check(v))
        PyErr_SetNone(v);
    else
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    return NULL;
}

/* The end of a ``finally`` that raised while ``pending`` (stolen; NULL: none)
 * was propagating: as in Python, the new exception gets ``pending`` as its
 * __context__; with no new exception set, ``pending`` is raised again. */
static inline void
kfx_raise_in_context(PyObject *pending)
{
    if (pending == NULL)
        return;
    PyObject *exc = exc_save();
    if (exc != NULL) {
        PyException_SetContext(exc, pending);
        exc_restore(exc);
    }
    else
        exc_restore(pending);
}


/* ---- perform.c ------------------------------------------------------ */

/* What find_clause found. */
enum { FOUND_NONE = 0, FOUND_FUN = 1, FOUND_ON = 2 };

PyObject *thread_state(void);
int top_index(PyObject *f, Py_ssize_t *i);
PyObject *new_skip(PyObject *f, Py_ssize_t i);
int push_marker(PyObject *st, PyObject *skip);
/* A new ``_Skip(f, i)`` pushed on ``st.current.stack`` (push_marker): the
 * marker a clause run in place of its handler needs.  Returns our reference
 * (kept until pop_marker has removed it: a clause may take it off the stack
 * itself, and the identity must stay valid), or NULL with an exception.
 * Inline: the ``fun`` perform's hot path. */
static inline PyObject *
push_skip(PyObject *st, PyObject *f, Py_ssize_t i)
{
    PyObject *skip = new_skip(f, i);
    if (skip != NULL && push_marker(st, skip) < 0)
        Py_CLEAR(skip);
    return skip;
}
PyObject *pop_marker(PyObject *st, PyObject *marker);
void release_entry(PyObject *item);
PyObject *args_tuple(PyObject *const *args, Py_ssize_t n);
PyObject *unhandled(PyObject *effect, PyObject *const *args, Py_ssize_t n);
PyObject *suspend_py(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h);
int find_clause(PyObject **fp, Py_ssize_t *ip, PyObject *effect, PyObject **clause, PyObject **on);
int kfx_effect_unhandled(PyObject *effect);
int kfx_sole_handler(PyObject *effect, PyObject *handler);

/* buffers.c */
#define KFX_NOT_BUFFERS (-2)
int kfx_same_bytes(PyObject *first, PyObject *second);
int kfx_copy_bytes(PyObject *dst, PyObject *src);

/* tape_calls.c */
int kfx_add_tape_calls(PyObject *module);
PyObject *kfx_new_with_fields(PyObject *type, PyObject *const names[3], PyObject *const values[3]);

/* tape_clauses.c */
int kfx_add_tape_clauses(PyObject *module);
PyObject *perform_at(PyObject *st, PyObject *f, Py_ssize_t i, PyObject *effect,
                     PyObject *const *cargs, Py_ssize_t n);
extern PyMethodDef kfx_perform_methods[];

/* ---- c_abi.c ---------------------------------------------------------- */

/* Call with the GIL held; errno after the last C handler goes to *errno_out. */
int kina_fast_perform(int32_t effect_id, const int64_t *c_args, int32_t nargs, int64_t *out,
                      int32_t *status, int *errno_out);
/* The exception being raised as a status, with kina_last_error set (through
 * kina_fx.ffi's onerror hook); clears it. */
int32_t kfx_report_exception(void);
extern PyTypeObject *g_cclause_t;  /* ffi.effects.CClause (read when the fast paths are turned on) */
extern KFX_TLS PyObject *kfx_hint_effect;
extern KFX_TLS int32_t kfx_hint_effect_id;

/* ---- nogil.c ------------------------------------------------------------ */

/* Where kfx_nogil_perform stopped, for the rest of the perform with the GIL. */
typedef struct {
    int called;                     /* a C handler ran (then nothing declines)    */
    int outcome;                    /* the handler at (f, i) returned rc / answer */
    int32_t rc;
    int64_t answer;
    uint64_t token;                 /* its marker                                  */
    KFiber *f;                      /* where the search goes on (borrowed)        */
    Py_ssize_t i;
    int64_t args[KFX_MAX_ARGS];     /* the arguments, read once (zero past nargs) */
} kfx_nogil_state;

#define KFX_NEED_GIL 2              /* go on with the GIL from ns                  */
#define KFX_NEED_GIL_POP 3          /* the same, the handler's marker to remove first */

extern PyTypeObject *g_chandler_t; /* ffi.effects.CHandler (the same) */
/* No GIL: KINA_FAST_DONE, KINA_FAST_DECLINED (nothing done) or KFX_NEED_GIL*. */
int kfx_nogil_perform(int32_t effect, const int64_t *args, int32_t nargs, int64_t *out,
                      int32_t *status, kfx_nogil_state *ns);
/* With the GIL: the pending skip markers become _Skip objects (0 / -1). */
int kfx_materialize(void);
int kfx_pop_materialized(uint64_t token);
/* No GIL: takes it to materialize, when there is anything to. */
void kfx_prepare_for_python(void);
PyObject *kfx_describe_c_handler(PyObject *args);

/* c_abi.c: the rest of a perform after kfx_nogil_perform, with the GIL. */
int kfx_perform_after_nogil(int32_t effect_id, int32_t nargs, int64_t *out, int32_t *status,
                            int *errno_out, const kfx_nogil_state *ns, int pop_only);
/* perform.c: ``h.fun.get(effect)`` (1 with *clause, 0, -1). */
int kfx_find_fun(PyObject *h, PyObject *effect, PyObject **clause);

/* ---- c_fibers.c --------------------------------------------------------- */

/* The GIL around a fast path called from C: kfx_gil_enter takes it (1) or
 * declines (0: the thread has no Python thread state yet); kfx_gil_leave
 * releases it unless the caller held it, and restores errno. */
typedef struct {
    PyThreadState *ts;
    int held;                        /* the caller already held it */
    int saved_errno;
} kfx_gil_call;
int kfx_gil_enter(kfx_gil_call *g);
void kfx_gil_leave(kfx_gil_call *g);

extern PyTypeObject *g_stepper_t, *g_catch_t;
extern PyObject *g_suspend_to_host;
/* The fiber handle mirror and describe_c_handler, added to the module. */
int kfx_add_c_fibers(PyObject *module);
extern const kina_fast_api kfx_fast_api;     /* the capsule _C_API points to it */

/* ---- tail.c ----------------------------------------------------------- */

int straight_to_driver(PyObject *frame);
extern PyMethodDef kfx_tail_methods[];

/* ---- round_trip.c ------------------------------------------------------ */

PyObject *rt_suspend(PyObject *effect, PyObject *const *args, Py_ssize_t n, PyObject *f, PyObject *h);
PyObject *rt_switch_into(PyObject *chain, PyObject *send);
PyObject *kfx_switch_into_stealing(PyObject *chain, PyObject *send);
void kfx_release_chain(PyObject *chain);
PyObject *kfx_tuple(Py_ssize_t n, PyObject *a, PyObject *b, PyObject *c);
void kfx_release_tuple(PyObject *t);
void kfx_continuation_finalize(PyObject *self);
extern PyMethodDef kfx_continuation_methods[];    /* ContinuationData.__init_subclass__ */
/* greenlet's C API, imported when the module is (0 / -1). */
int kfx_init_round_trip(void);
/* A resume that is not a tail resume: a driver loop nested here (rt_drive,
 * or past handlers._HOP_DEPTH frames handlers._drive_on_fresh_stack).
 * Steals chain and send. */
PyObject *kfx_nest_drive(PyObject *chain, PyObject *send);
/* Is ``frame`` the one the innermost C driver loop of the running fiber was
 * called from (1 / 0)?  (round_trip.c says why that is the driver's frame.) */
static inline int
kfx_drives_from(PyObject *frame)
{
    return kfx_current != NULL && frame != NULL && kfx_current->driver_frame == frame;
}
extern PyTypeObject *g_chain_t, *g_cont_t;
extern PyObject *g_performed, *g_returned, *g_raised;
extern PyMethodDef kfx_round_trip_methods[];

/* ---- op_calls.c --------------------------------------------------------- */

int kfx_fast_runtime_op(int32_t op, void *const *memrefs, int32_t nmem, const int32_t *params,
                        int32_t nparams, int32_t *status);
int kfx_check_op_rows(PyObject *rows);

/* ---- buffers.c ---------------------------------------------------------- */

extern PyMethodDef kfx_buffers_methods[];
int kfx_two_buffers(PyObject *first, int first_flags, PyObject *second, int second_flags,
                    Py_buffer *a, Py_buffer *b);
/* Longer memory loops than this release the GIL: other threads (the kernels' pool) go on. */
#define KFX_RELEASE_GIL_BYTES (1 << 16)
/* ``statement`` (which touches no Python object) over ``nbytes`` of memory,
 * without the GIL when that is KFX_RELEASE_GIL_BYTES or more. */
#define KFX_WITHOUT_GIL_IF_LONG(nbytes, statement)                                           \
    do {                                                                                   \
        if ((nbytes) < KFX_RELEASE_GIL_BYTES) {                                            \
            statement;                                                                     \
        } else {                                                                           \
            Py_BEGIN_ALLOW_THREADS                                                         \
            statement;                                                                     \
            Py_END_ALLOW_THREADS                                                           \
        }                                                                                  \
    } while (0)

/* ---- kernels.c ---------------------------------------------------------- */

extern PyMethodDef kfx_kernels_methods[];

#pragma GCC visibility pop

#endif /* KINA_SPEEDUPS_H */
