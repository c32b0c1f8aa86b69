/* types.c: the data of the protocol's types, owned by C.
 *
 * What it mirrors: the __slots__ of kina_fx/fibers.py (Fiber, ThreadState,
 * Chain) and kina_fx/handlers.py (Handler, _Skip, _TailResume, the fields a
 * Continuation adds to a Chain, Stepper) and kina_fx/ffi/effects.py (CClause,
 * CHandler).  With kina_fx._speedups in use,
 * fibers.data_type(name, fields) returns the type of that name defined here
 * and the Python class derives from it, adding methods only; without it, the
 * same call makes a plain class with those __slots__ (the reference).  So the
 * C files read and write these structs' fields, never a Python class's
 * layout, and the Python functions work on either.
 *
 * Every field is a PyObject * member with the slot semantics (T_OBJECT_EX:
 * unset is NULL and reads raise AttributeError); a type's fields come right
 * after PyObject_HEAD (and its base type's fields), so one traverse / clear /
 * dealloc serves all of them.  tests/effects/test_speedups.py checks that the field
 * names here are the ones fibers.py and handlers.py declare.
 */
#include "speedups.h"

/* Where the PyObject * fields of a C type's instances end: its weak
 * reference list, the C-only fields of a Stepper, or the end of the object. */
static Py_ssize_t
objects_end(PyTypeObject *tp)
{
    if (tp == &KStepper_Type)
        return offsetof(KStepper, c_valid);
    if (tp == &KSkip_Type)
        return offsetof(KSkip, index_c);
    return tp->tp_weaklistoffset ? tp->tp_weaklistoffset : tp->tp_basicsize;
}

/* The PyObject * fields of ``self`` (a C type's or a subclass's instance). */
static inline PyObject **
fields_of(PyObject *self, Py_ssize_t *n)
{
    PyTypeObject *tp = Py_TYPE(self);
    while (tp->tp_dealloc != kfx_data_dealloc)   /* the first C type up the chain */
        tp = tp->tp_base;
    *n = (objects_end(tp) - (Py_ssize_t)sizeof(PyObject)) / (Py_ssize_t)sizeof(PyObject *);
    return (PyObject **)((char *)self + sizeof(PyObject));
}

static int
data_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_ssize_t n;
    PyObject **f = fields_of(self, &n);
    for (Py_ssize_t k = 0; k < n; k++)
        Py_VISIT(f[k]);
    return 0;       /* (subtype_traverse visits a heap subclass's type itself) */
}

static int
data_clear(PyObject *self)
{
    Py_ssize_t n;
    PyObject **f = fields_of(self, &n);
    for (Py_ssize_t k = 0; k < n; k++)
        Py_CLEAR(f[k]);
    return 0;
}

void
kfx_data_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self == kfx_thread_state) {      /* this thread's state is going away */
        kfx_thread_state = NULL;
        kfx_current = NULL;
        kfx_thread_serial = 0;
    }
    PyTypeObject *own = tp;
    while (own->tp_dealloc != kfx_data_dealloc)
        own = own->tp_base;
    if (own->tp_weaklistoffset)
        PyObject_ClearWeakRefs(self);
    data_clear(self);
    tp->tp_free(self);
}

#define FIELD(type, name) {#name, T_OBJECT_EX, offsetof(type, name), 0, NULL}
#define FIELD_AS(type, cname, pyname) {pyname, T_OBJECT_EX, offsetof(type, cname), 0, NULL}

static PyMemberDef fiber_members[] = {
    FIELD(KFiber, stack), FIELD(KFiber, handler), FIELD(KFiber, shallow), FIELD(KFiber, parent),
    FIELD(KFiber, thread), FIELD(KFiber, job), FIELD(KFiber, glet), FIELD(KFiber, unwinder),
    {NULL}};
static PyMemberDef tstate_members[] = {
    FIELD(KThreadState, mail),
    FIELD(KThreadState, outbox), FIELD(KThreadState, pool), FIELD(KThreadState, to_start),
    FIELD(KThreadState, trampoline), FIELD(KThreadState, dropped), {NULL}};
static PyMemberDef chain_members[] = {FIELD(KChain, top), FIELD(KChain, base), {NULL}};
static PyMemberDef cont_members[] = {FIELD(KContinuation, shallow), {NULL}};
static PyMemberDef skip_members[] = {FIELD(KSkip, fiber), {NULL}};
static PyMemberDef chandler_members[] = {FIELD(KCHandler, thread), {NULL}};
static PyMemberDef tail_members[] = {FIELD(KTailResume, chain), FIELD(KTailResume, send), {NULL}};
static PyMemberDef handler_members[] = {
    FIELD(KHandler, on), FIELD(KHandler, fun), FIELD(KHandler, ret), FIELD(KHandler, exc), {NULL}};
static PyMemberDef stepper_members[] = {
    FIELD_AS(KStepper, handler, "_handler"), FIELD_AS(KStepper, chain, "_chain"),
    FIELD(KStepper, effect), FIELD(KStepper, args), FIELD(KStepper, result), FIELD(KStepper, error),
    {NULL}};
static PyMemberDef catch_members[] = {FIELD(KCatch, effects), {NULL}};
static PyMemberDef cclause_members[] = {
    FIELD(KCClause, fn), FIELD(KCClause, ctx), FIELD(KCClause, effect), FIELD(KCClause, effect_id),
    FIELD(KCClause, fn_address), FIELD(KCClause, ctx_address), FIELD_AS(KCClause, buffers, "_buffers"),
    {NULL}};

/* A field with the slot semantics whose writes also update C-only data. */
static PyObject *
field_get(PyObject *value, const char *name)
{
    if (value == NULL)
        return PyErr_Format(PyExc_AttributeError, "%s", name);
    return Py_NewRef(value);
}

static int
field_set(PyObject **field, PyObject *value, const char *name)
{
    if (value == NULL && *field == NULL) {
        PyErr_Format(PyExc_AttributeError, "%s", name);
        return -1;
    }
    Py_XINCREF(value);
    Py_XSETREF(*field, value);
    return 0;
}

/* A thread token (fibers.thread_token(): an int >= 1) as a C int64, 0 if not one. */
static int64_t
serial_of(PyObject *v)
{
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    return overflow || s <= 0 ? 0 : (int64_t)s;
}

/* What the paths without the GIL start from (speedups.h): set when this
 * thread's fibers.ThreadState gets its serial (it is made on its own thread,
 * by fibers.local, and is the only ThreadState there), and whenever its
 * ``current`` changes. */
KFX_TLS PyObject *kfx_thread_state;
KFX_TLS int64_t kfx_thread_serial;
KFX_TLS KFiber *kfx_current;

static PyObject *tstate_get_serial(PyObject *self, void *c) { return field_get(((KThreadState *)self)->serial, "serial"); }

static int
tstate_set_serial(PyObject *self, PyObject *value, void *c)
{
    if (field_set(&((KThreadState *)self)->serial, value, "serial") < 0)
        return -1;
    kfx_thread_state = self;
    kfx_thread_serial = serial_of(value);
    PyObject *cur = ((KThreadState *)self)->current;
    kfx_current = cur != NULL && PyObject_TypeCheck(cur, &KFiber_Type) ? (KFiber *)cur : NULL;
    return 0;
}

static PyObject *tstate_get_current(PyObject *self, void *c) { return field_get(((KThreadState *)self)->current, "current"); }

static int
tstate_set_current(PyObject *self, PyObject *value, void *c)
{
    if (value == NULL && ((KThreadState *)self)->current == NULL) {
        PyErr_SetString(PyExc_AttributeError, "current");
        return -1;
    }
    kfx_set_current(self, value);
    return 0;
}

void
kfx_set_current(PyObject *st, PyObject *fiber)
{
    if (st == kfx_thread_state)          /* written first, before anything can run */
        kfx_current = fiber != NULL && PyObject_TypeCheck(fiber, &KFiber_Type) ? (KFiber *)fiber : NULL;
    PyObject *old = ((KThreadState *)st)->current;
    ((KThreadState *)st)->current = Py_XNewRef(fiber);
    Py_XDECREF(old);
}

static PyGetSetDef tstate_getset[] = {
    {"serial", tstate_get_serial, tstate_set_serial, NULL, NULL},
    {"current", tstate_get_current, tstate_set_current, NULL, NULL}, {NULL}};

/* _Skip.index: also kept as a C value, for the search without the GIL. */
static PyObject *
skip_get_index(PyObject *self, void *c)
{
    KSkip *sk = (KSkip *)self;
    if (sk->index == NULL && sk->index_is_c)     /* made by C: the object on demand */
        sk->index = PyLong_FromSsize_t(sk->index_c);
    return field_get(sk->index, "index");
}

static int
skip_set_index(PyObject *self, PyObject *value, void *c)
{
    Py_ssize_t i = -2;                   /* not an index: that search takes the GIL */
    if (value != NULL && PyLong_CheckExact(value)) {
        i = PyLong_AsSsize_t(value);
        if (i == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            i = -2;
        }
    }
    if (value == NULL && ((KSkip *)self)->index_is_c)
        ((KSkip *)self)->index = PyLong_FromSsize_t(((KSkip *)self)->index_c);  /* then del */
    if (field_set(&((KSkip *)self)->index, value, "index") < 0)
        return -1;
    ((KSkip *)self)->index_c = i;
    ((KSkip *)self)->index_is_c = 0;
    return 0;
}

static PyGetSetDef skip_getset[] = {{"index", skip_get_index, skip_set_index, NULL, NULL}, {NULL}};

/* Stepper.state: any write (the Python Stepper's own code) makes the C copy
 * of the pending perform stale; only the C step (c_fibers.c)
 * writes the field directly and validates its copy. */
static PyObject *stepper_get_state(PyObject *self, void *c) { return field_get(((KStepper *)self)->state, "state"); }

static int
stepper_set_state(PyObject *self, PyObject *value, void *c)
{
    ((KStepper *)self)->c_valid = 0;
    return field_set(&((KStepper *)self)->state, value, "state");
}

static PyObject *stepper_get_thread(PyObject *self, void *c) { return field_get(((KStepper *)self)->thread, "thread"); }

static int
stepper_set_thread(PyObject *self, PyObject *value, void *c)
{
    if (field_set(&((KStepper *)self)->thread, value, "thread") < 0)
        return -1;
    ((KStepper *)self)->thread_serial = serial_of(value);
    return 0;
}

static PyGetSetDef stepper_getset[] = {
    {"state", stepper_get_state, stepper_set_state, NULL, NULL},
    {"thread", stepper_get_thread, stepper_set_thread, NULL, NULL}, {NULL}};

#define DATA_TYPE_GS(var, name, ctype, members, getset, weak, base)                          \
    PyTypeObject var = {                                                                     \
        PyVarObject_HEAD_INIT(NULL, 0)                                                       \
        .tp_name = "kina_fx._speedups." name,                                                \
        .tp_basicsize = sizeof(ctype),                                                       \
        .tp_dealloc = kfx_data_dealloc,                                                      \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,            \
        .tp_doc = "The fields of a kina_fx type (kina_fx._speedups owns them: types.c).", \
        .tp_traverse = data_traverse,                                                        \
        .tp_clear = data_clear,                                                              \
        .tp_weaklistoffset = (weak),                                                         \
        .tp_members = members,                                                               \
        .tp_getset = getset,                                                                 \
        .tp_base = (base),                                                                   \
        .tp_new = PyType_GenericNew,                                                         \
    }

#define DATA_TYPE(var, name, ctype, members, weak, base)                                     \
    DATA_TYPE_GS(var, name, ctype, members, NULL, weak, base)

DATA_TYPE(KFiber_Type, "FiberData", KFiber, fiber_members, offsetof(KFiber, weakreflist), NULL);
DATA_TYPE_GS(KThreadState_Type, "ThreadStateData", KThreadState, tstate_members, tstate_getset,
             offsetof(KThreadState, weakreflist), NULL);
DATA_TYPE(KChain_Type, "ChainData", KChain, chain_members, 0, NULL);
DATA_TYPE(KContinuation_Type, "ContinuationData", KContinuation, cont_members, 0, &KChain_Type);
DATA_TYPE_GS(KSkip_Type, "SkipData", KSkip, skip_members, skip_getset, 0, NULL);
DATA_TYPE(KTailResume_Type, "TailResumeData", KTailResume, tail_members, 0, NULL);
DATA_TYPE(KHandler_Type, "HandlerData", KHandler, handler_members, 0, NULL);
DATA_TYPE_GS(KStepper_Type, "StepperData", KStepper, stepper_members, stepper_getset, 0, NULL);
DATA_TYPE(KCatch_Type, "CatchData", KCatch, catch_members, 0, NULL);
DATA_TYPE(KCClause_Type, "CClauseData", KCClause, cclause_members, 0, NULL);
DATA_TYPE(KCHandler_Type, "CHandlerData", KCHandler, chandler_members, offsetof(KCHandler, weakreflist),
          &KHandler_Type);

static PyTypeObject *const data_types[] = {
    &KFiber_Type, &KThreadState_Type, &KChain_Type, &KContinuation_Type, &KSkip_Type,
    &KTailResume_Type, &KHandler_Type, &KStepper_Type, &KCatch_Type, &KCClause_Type,
    &KCHandler_Type, NULL};

/* PyType_Ready each type and add it to the module under its short name. */
int
kfx_add_data_types(PyObject *module)
{
    /* Continuation's compiled __del__ and resume (round_trip.c: the class
     * gets resume from __init_subclass__), before the reference methods
     * (handlers.py) in its MRO. */
    KContinuation_Type.tp_finalize = kfx_continuation_finalize;
    KContinuation_Type.tp_methods = kfx_continuation_methods;
    for (PyTypeObject *const *t = data_types; *t != NULL; t++) {
        if (PyType_Ready(*t) < 0)
            return -1;
        const char *name = strrchr((*t)->tp_name, '.') + 1;
        Py_INCREF(*t);
        if (PyModule_AddObject(module, name, (PyObject *)*t) < 0) {
            Py_DECREF(*t);
            return -1;
        }
    }
    return 0;
}
