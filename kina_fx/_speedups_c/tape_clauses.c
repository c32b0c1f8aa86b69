/* tape_clauses.c: an autograd Tape's clause for an elementwise or binary
 * primitive, compiled (speedups.TapeClause).
 *
 * A Tape (kina_fx/autograd/tape.py) is a handler with one clause per
 * primitive.  The clauses of the one-input elementwise primitives (tanh,
 * exp, ...: _elementwise_factory) and of the binary ones (add, mul, ...:
 * _binary_factory) run once per op of every traced program; in a chain of
 * small ops their Python frame is a large part of the op's cost.  This
 * clause does what those two do in the common case, and calls the Python
 * clause it wraps (the reference, and what runs under KINA_FX_PURE_PYTHON=1)
 * for every other call, before it has done anything.
 *
 * It mirrors, and must change with, the two factories' clauses: the node
 * tuples they append, the box they return (tensor._box), and the order of
 * their steps (perform first; then the id, the node, the box).  It reads the
 * fields tape.py and tensor.py define by name: a recorder's ``tape``; a
 * Tensor's ``_value``, ``_trace`` and ``_id``; a Tape's ``_n`` and
 * ``_nodes``.
 *
 * The common case (else the Python clause runs):
 *   - no keyword arguments, and one argument (elementwise) or two (binary);
 *   - elementwise: the argument is exactly a Tensor boxed by the recorder's
 *     tape;
 *   - binary: each argument is exactly a Tensor boxed by the recorder's tape,
 *     or a constant of class float or int (the node then takes the scalar
 *     rule, and a Python number is never complex); at least one is a box.
 * (tests/autodiff/test_tape_clauses.py compares the recorded nodes and
 * the gradients of both clauses on generated programs.)
 */
#include "speedups.h"

enum { SPEC_NIN, SPEC_EFFECT, SPEC_PRIM, SPEC_RULE, SPEC_RULE_A, SPEC_RULE_B, SPEC_SCALAR_A, SPEC_SCALAR_B,
       SPEC_TENSOR, SPEC_SIZE };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fallback;       /* the Python clause */
    PyObject *recorder;       /* tape._Recorder: its ``tape`` records now */
    PyObject *spec;           /* the tuple tape._compiled_clause builds (SPEC_*) */
    /* borrowed from spec (None where the kind has none): */
    PyObject *effect, *prim, *rule, *rule_a, *rule_b, *scalar_a, *scalar_b, *tensor_type;
    int nin;                  /* 1: elementwise, 2: binary */
} KTapeClause;

static PyObject *n_tape, *n_value_, *n_trace_, *n_id_, *n_n_, *n_nodes_, *no_args;

#define DECLINE 1             /* not the common case: nothing done */

/* ``(id, value)`` of ``x`` (new references) when it is exactly a Tensor boxed
 * by ``tape``: 0; DECLINE when it is not; -1 on error. */
static int
own_box(KTapeClause *c, PyObject *x, PyObject *tape, PyObject **id, PyObject **value)
{
    *id = *value = NULL;
    if ((PyObject *)Py_TYPE(x) != c->tensor_type)
        return DECLINE;
    PyObject *trace = PyObject_GetAttr(x, n_trace_);
    if (trace == NULL)
        return -1;
    Py_DECREF(trace);                /* compared by identity only */
    if (trace != tape)
        return DECLINE;
    if ((*id = PyObject_GetAttr(x, n_id_)) == NULL)
        return -1;
    if ((*value = PyObject_GetAttr(x, n_value_)) == NULL) {
        Py_CLEAR(*id);
        return -1;
    }
    return 0;
}

/* A constant the binary clause takes its scalar rule for: a float or an int. */
static int
python_number(PyObject *x)
{
    return PyFloat_CheckExact(x) || PyLong_CheckExact(x);
}

/* ``perform(effect, *args)`` from this clause, as the Python clause performs it. */
static PyObject *
perform_outward(KTapeClause *c, PyObject *const *args, Py_ssize_t n)
{
    PyObject *call[3] = {c->effect, args[0], n > 1 ? args[1] : NULL};
    return PyObject_Vectorcall(kfx_perform_fn, call, (size_t)(n + 1), NULL);
}

/* The node ``(rule, i, ids, u, v, out, prim)`` appended for ``i = tape._n``
 * and ``tape._n`` bumped (the clauses' state after, whichever order they
 * take), then the box ``_box(out, tape, i)`` (new reference), or NULL. */
static PyObject *
record(KTapeClause *c, PyObject *tape, PyObject *rule, PyObject *ids, PyObject *u, PyObject *v,
       PyObject *out)
{
    PyObject *index = PyObject_GetAttr(tape, n_n_), *next = NULL, *nodes = NULL, *node = NULL;
    PyObject *box = NULL;
    if (index == NULL)
        return NULL;
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if ((i == -1 && PyErr_Occurred()) || (next = PyLong_FromSsize_t(i + 1)) == NULL
            || (nodes = PyObject_GetAttr(tape, n_nodes_)) == NULL
            || (node = PyTuple_Pack(7, rule, index, ids, u, v, out, c->prim)) == NULL)
        goto done;
    if (PyList_CheckExact(nodes)) {
        if (PyList_Append(nodes, node) < 0)
            goto done;
    }
    else {
        PyObject *r = PyObject_CallMethodOneArg(nodes, s_append, node);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (PyObject_SetAttr(tape, n_n_, next) < 0)
        goto done;
    PyObject *const names[3] = {n_value_, n_trace_, n_id_}, *const values[3] = {out, tape, index};
    box = kfx_new_with_fields(c->tensor_type, names, values);
done:
    Py_DECREF(index);
    Py_XDECREF(next);
    Py_XDECREF(nodes);
    Py_XDECREF(node);
    return box;
}

/* _elementwise_factory's clause: 0 (*result: the box), DECLINE, or -1. */
static int
elementwise(KTapeClause *c, PyObject *tape, PyObject *x, PyObject **result)
{
    PyObject *id, *value;
    int status = own_box(c, x, tape, &id, &value);
    if (status != 0)
        return status;
    PyObject *out = perform_outward(c, &value, 1);
    if (out != NULL) {
        *result = record(c, tape, c->rule, id, value, Py_None, out);
        Py_DECREF(out);
    }
    Py_DECREF(id);
    Py_DECREF(value);
    return *result == NULL ? -1 : 0;
}

/* _binary_factory's clause: 0 (*result: the box), DECLINE, or -1. */
static int
binary(KTapeClause *c, PyObject *tape, PyObject *a, PyObject *b, PyObject **result)
{
    PyObject *ia = NULL, *va = NULL, *ib = NULL, *vb = NULL;
    int sa = own_box(c, a, tape, &ia, &va);
    if (sa < 0)
        return -1;
    int sb = own_box(c, b, tape, &ib, &vb);
    int status = DECLINE;
    if (sb < 0) {
        status = -1;
        goto done;
    }
    if ((sa == DECLINE && (sb == DECLINE || !python_number(a))) || (sb == DECLINE && !python_number(b)))
        goto done;                   /* no box, or an operand other than a box or a number */
    PyObject *values[2] = {sa == 0 ? va : a, sb == 0 ? vb : b};
    PyObject *out = perform_outward(c, values, 2);
    if (out == NULL) {
        status = -1;
        goto done;
    }
    if (sa == 0 && sb == 0) {
        PyObject *ids = PyTuple_Pack(2, ia, ib), *inputs = ids == NULL ? NULL : PyTuple_Pack(2, va, vb);
        if (inputs != NULL)
            *result = record(c, tape, c->rule, ids, inputs, no_args, out);
        Py_XDECREF(ids);
        Py_XDECREF(inputs);
    }
    else if (sa == 0)                /* b a float or an int */
        *result = record(c, tape, c->scalar_a, ia, values[0], values[1], out);
    else
        *result = record(c, tape, c->scalar_b, ib, values[0], values[1], out);
    Py_DECREF(out);
    status = *result == NULL ? -1 : 0;
done:
    Py_XDECREF(ia);
    Py_XDECREF(va);
    Py_XDECREF(ib);
    Py_XDECREF(vb);
    return status;
}

static PyObject *
tape_clause_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    KTapeClause *c = (KTapeClause *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && nargs == c->nin) {
        PyObject *tape = PyObject_GetAttr(c->recorder, n_tape), *result = NULL;
        if (tape == NULL)
            return NULL;
        int status = tape == Py_None ? DECLINE
                   : c->nin == 1 ? elementwise(c, tape, args[0], &result)
                   : binary(c, tape, args[0], args[1], &result);
        Py_DECREF(tape);
        if (status <= 0)
            return status == 0 ? result : NULL;
    }
    return PyObject_Vectorcall(c->fallback, args, nargsf, kwnames);
}

static PyObject *
tape_clause_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *fallback, *recorder, *spec;
    static char *names[] = {"fallback", "recorder", "spec", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!:TapeClause", names, &fallback, &recorder,
                                     &PyTuple_Type, &spec))
        return NULL;
    if (PyTuple_GET_SIZE(spec) != SPEC_SIZE || !PyCallable_Check(fallback)
            || !PyType_Check(PyTuple_GET_ITEM(spec, SPEC_TENSOR))) {
        PyErr_SetString(PyExc_TypeError, "TapeClause: a spec as tape._compiled_clause builds it");
        return NULL;
    }
    long nin = PyLong_AsLong(PyTuple_GET_ITEM(spec, SPEC_NIN));
    if (nin != 1 && nin != 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "TapeClause: one or two inputs");
        return NULL;
    }
    if (kfx_perform_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "TapeClause: kina_fx._speedups.perform is not set up");
        return NULL;
    }
    if (n_tape == NULL) {
#define NAME(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
        NAME(n_tape, "tape");
        NAME(n_value_, "_value");
        NAME(n_trace_, "_trace");
        NAME(n_id_, "_id");
        NAME(n_n_, "_n");
        NAME(n_nodes_, "_nodes");
#undef NAME
        if ((no_args = PyTuple_New(0)) == NULL)
            return NULL;
    }
    KTapeClause *c = (KTapeClause *)type->tp_alloc(type, 0);
    if (c == NULL)
        return NULL;
    c->vectorcall = tape_clause_call;
    c->nin = (int)nin;
    c->fallback = Py_NewRef(fallback);
    c->recorder = Py_NewRef(recorder);
    c->spec = Py_NewRef(spec);
#define ITEM(k) PyTuple_GET_ITEM(spec, k)
    c->effect = ITEM(SPEC_EFFECT);
    c->prim = ITEM(SPEC_PRIM);
    c->rule = ITEM(SPEC_RULE);
    c->rule_a = ITEM(SPEC_RULE_A);
    c->rule_b = ITEM(SPEC_RULE_B);
    c->scalar_a = ITEM(SPEC_SCALAR_A);
    c->scalar_b = ITEM(SPEC_SCALAR_B);
    c->tensor_type = ITEM(SPEC_TENSOR);
#undef ITEM
    return (PyObject *)c;
}

static int
tape_clause_traverse(PyObject *self, visitproc visit, void *arg)
{
    KTapeClause *c = (KTapeClause *)self;
    Py_VISIT(c->fallback);
    Py_VISIT(c->recorder);
    Py_VISIT(c->spec);
    return 0;
}

static int
tape_clause_clear(PyObject *self)
{
    KTapeClause *c = (KTapeClause *)self;
    Py_CLEAR(c->fallback);
    Py_CLEAR(c->recorder);
    Py_CLEAR(c->spec);
    return 0;
}

static void
tape_clause_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    tape_clause_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *
tape_clause_repr(PyObject *self)
{
    KTapeClause *c = (KTapeClause *)self;
    return PyUnicode_FromFormat("<TapeClause of %R>", c->fallback);
}

static PyMemberDef tape_clause_members[] = {
    {"fallback", T_OBJECT, offsetof(KTapeClause, fallback), READONLY,
     "The Python clause every call outside the common case goes to."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(tape_clause_doc,
"TapeClause(fallback, recorder, spec)\n--\n\n"
"An autograd Tape's clause for one elementwise or binary primitive: records\n"
"the common case in C and calls ``fallback`` (the Python clause) for every\n"
"other call (kina_fx/_speedups_c/tape_clauses.c; kina_fx.autograd.tape builds it).");

static PyTypeObject KTapeClause_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kina_fx._speedups.TapeClause",
    .tp_basicsize = sizeof(KTapeClause),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = tape_clause_doc,
    .tp_new = tape_clause_new,
    .tp_dealloc = tape_clause_dealloc,
    .tp_traverse = tape_clause_traverse,
    .tp_clear = tape_clause_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(KTapeClause, vectorcall),
    .tp_repr = tape_clause_repr,
    .tp_members = tape_clause_members,
};

int
kfx_add_tape_clauses(PyObject *module)
{
    if (PyType_Ready(&KTapeClause_Type) < 0)
        return -1;
    Py_INCREF(&KTapeClause_Type);
    if (PyModule_AddObject(module, "TapeClause", (PyObject *)&KTapeClause_Type) < 0) {
        Py_DECREF(&KTapeClause_Type);
        return -1;
    }
    return 0;
}
