/* tape_calls.c: a tape's clause for a runtime op, compiled (speedups.TracerClause).
 *
 * A tape over memory (kina_fx/autograd/memory.py) answers each runtime op's
 * effect with a clause: BufferTracer.apply reads each input's recorded Tensor
 * (overwrite check included), computes the op with its autograd primitive --
 * which performs the primitive's effect, recorded by the autograd Tape
 * (kina_fx/autograd/tape.py, _binary_factory and _elementwise_factory) --
 * and writes the result into the output buffer.  That is some twenty Python
 * frames for a 2x2 matmul.  This clause does the same work in C for the
 * common case, and hands every other call to the Python clause it wraps
 * (the reference, and what runs under KINA_FX_PURE_PYTHON=1), before it has
 * changed anything.
 *
 * What it mirrors, and must change with: BufferTracer.apply, .read and
 * .record (memory.py), the binary and elementwise clauses of a Tape's
 * handler and their node tuples (tape.py), and the primitive's public
 * function (primitives.py: a box comes back).  It reads the fields those
 * modules define by name: a tracer's ``tracer`` slot, ``parent`` and
 * ``table``; an entry's ``tensor`` and ``value``; a Tensor's ``_value``,
 * ``_trace`` and ``_id``; a Tape's ``_live``, ``_handler``, ``_n`` and
 * ``_nodes``.
 *
 * The common case, checked before anything is written (else the Python
 * clause runs, and raises whatever it raises):
 *   - the op has no parameters, and either
 *     * a direct NumPy function (runtime_ops.RuntimeOp.direct), its
 *       primitive recording a binary or elementwise node
 *       (tape.compiled_recording), and RuntimeOp.calls_direct admitted the
 *       operands' shapes (a valid call, none of the kernels' special cases):
 *       the primitive's kernel then computes exactly ``direct(*values)``
 *       (tests/autodiff/test_tape_compiled_clause.py); or
 *     * none (the clause is "by kernel"): RuntimeOp.check_output accepts
 *       the call, as BufferTracer.apply checks it first, and the primitive's
 *       kernel itself computes the result; an Exception from either declines
 *       (the Python clause raises it again).  Its node is the binary or
 *       elementwise one, or else _general_factory's
 *       ``(rule, i, ids, inputs, (), out, prim)``, a non-differentiable
 *       input's id -1;
 *   - the tracer is a BufferTracer or MemoryTape, not nested in another;
 *   - every operand is exactly a NumPy array: out and each floating input
 *     of one floating type, each other input of its operand's type (int64
 *     labels and indices), a constant;
 *   - each input's buffer is known to the tracer and still holds the
 *     recorded bytes (memcmp), and holds a box of one live autograd Tape or a
 *     constant array, whose value is a NumPy array (the result must then
 *     have out's type: both paths compute on the values);
 *   - the primitive's effect still has its default, and the only handler in
 *     scope for it is that Tape's (kfx_sole_handler): performing it would
 *     run that Tape's clause, which would record one node and run the
 *     default.
 * Then ``direct(*values)`` is the primitive's result; the node and the box
 * are the Tape clause's, and the output buffer and the tracer's table are
 * written as BufferTracer.record writes them.
 */
#include "speedups.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fallback;       /* the Python clause: slot.tracer.apply(op, out, args) */
    PyObject *slot;           /* memory._Slot: its ``tracer`` uses the handler now */
    PyObject *spec;           /* the tuple memory._compiled_clause builds (SPEC_*) */
    /* borrowed from spec: */
    PyObject *direct, *admit, *admitted, *effect, *dflt, *prim, *rule, *rule_a, *rule_b;
    PyObject *diff;              /* the general node's differentiable inputs, or None */
    PyObject *types;             /* per input: None (out's type) or the dtype string it must have */
    PyObject *tracer_types, *entry_type, *tensor_type, *tape_type, *ndarray, *dtypes;
    PyObject *identities, *asarray, *primitives, *name, *op;
    PyObject *last_admitted[3];  /* the identities of the last admitted operands (held) */
    int nin;
    int by_kernel;               /* direct is the primitive's kernel, admit check_output */
} KTracerClause;

enum {
    SPEC_DIRECT, SPEC_ADMIT, SPEC_ADMITTED, SPEC_BY_KERNEL, SPEC_EFFECT, SPEC_DEFAULT, SPEC_PRIM,
    SPEC_NIN, SPEC_RULE, SPEC_RULE_A, SPEC_RULE_B, SPEC_DIFF, SPEC_TYPES, SPEC_TRACER_TYPES,
    SPEC_ENTRY, SPEC_TENSOR, SPEC_TAPE, SPEC_NDARRAY, SPEC_DTYPES, SPEC_IDENTITIES, SPEC_ASARRAY,
    SPEC_PRIMITIVES, SPEC_NAME, SPEC_OP, SPEC_SIZE
};

static PyObject *n_tracer, *n_parent, *n_table, *n_tensor, *n_value, *n_kind, *n_value_,
                *n_trace_, *n_id_, *n_live_, *n_handler_, *n_n_, *n_nodes_, *n_shape, *n_dtype,
                *n_produced, *n_primitive;

#define DECLINE 1          /* fast_call: not the common case, nothing done */

/* With an exception set by the check or the kernel of a clause "by kernel":
 * DECLINE for an Exception, cleared (the Python clause raises it again),
 * -1 for anything else (KeyboardInterrupt, SystemExit: it stays set). */
static int
decline_on_exception(void)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return DECLINE;
}

/* ``identities.get(id(view))``'s identity when it is ``view``'s (borrowed), else NULL. */
static PyObject *
identity_of(KTracerClause *c, PyObject *view)
{
    PyObject *id = PyLong_FromVoidPtr(view);
    if (id == NULL)
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(c->identities, id);
    Py_DECREF(id);
    if (hit == NULL || !PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 2
            || PyTuple_GET_ITEM(hit, 0) != view)
        return NULL;
    return PyTuple_GET_ITEM(hit, 1);
}

/* Whether ``dtype`` is one of the floating types the spec names (by identity:
 * NumPy's builtin types are singletons; another object only declines). */
static int
floating(KTracerClause *c, PyObject *dtype)
{
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(c->dtypes); k++)
        if (PyTuple_GET_ITEM(c->dtypes, k) == dtype)
            return 1;
    return 0;
}

/* Whether RuntimeOp.calls_direct admitted these operands (``views``, whose
 * identities are ``keys``: item 1 is the shape), asked once per shapes and
 * remembered in the spec's dict.  1 / 0 (errors cleared). */
static int
shapes_admitted(KTracerClause *c, PyObject *const *views, PyObject *const *keys, Py_ssize_t n)
{
    /* the same identity objects as the last admitted call: the same shapes */
    int again = 1;
    for (Py_ssize_t k = 0; k < n; k++)
        again &= c->last_admitted[k] == keys[k];
    if (again)
        return 1;
    PyObject *key = PyTuple_New(n);
    if (key == NULL) {
        PyErr_Clear();
        return 0;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!PyTuple_CheckExact(keys[k]) || PyTuple_GET_SIZE(keys[k]) != 4) {
            Py_DECREF(key);
            return 0;
        }
        PyTuple_SET_ITEM(key, k, Py_NewRef(PyTuple_GET_ITEM(keys[k], 1)));
    }
    PyObject *hit = PyDict_GetItemWithError(c->admitted, key);
    int admitted = hit == Py_True;
    if (hit == NULL && !PyErr_Occurred()) {
        PyObject *answer = PyObject_Vectorcall(c->admit, views, (size_t)n, NULL);
        admitted = answer == Py_True;
        if (answer != NULL) {
            if (PyDict_GET_SIZE(c->admitted) >= 1024)
                PyDict_Clear(c->admitted);
            PyDict_SetItem(c->admitted, key, admitted ? Py_True : Py_False);
        }
        Py_XDECREF(answer);
    }
    PyErr_Clear();
    Py_DECREF(key);
    if (admitted)
        for (Py_ssize_t k = 0; k < 3; k++)
            Py_XSETREF(c->last_admitted[k], Py_XNewRef(k < n ? keys[k] : NULL));
    return admitted;
}

/* One input as BufferTracer.read finds it, then as the Tape clause unwraps
 * it: its value (borrowed by the entry), and its id on ``*tape`` (a box of
 * that Tape; *tape is set by the first box) or -1 (a constant array).
 * 0, DECLINE, or -1 with an exception set. */
static int
read_input(KTracerClause *c, PyObject *table, PyObject *view, PyObject *key, PyObject **tape,
           PyObject **value, Py_ssize_t *id, PyObject **keep)
{
    PyObject *entry = PyDict_GetItemWithError(table, key);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : DECLINE;      /* unknown: strict raises, lenient copies */
    PyObject *recorded = PyObject_GetAttr(entry, n_value);
    if (recorded == NULL)
        return -1;
    int same = kfx_same_bytes(view, recorded);
    Py_DECREF(recorded);
    if (same != 1)
        return DECLINE;                              /* overwritten (raises), or strided */
    PyObject *tensor = PyObject_GetAttr(entry, n_tensor);
    if (tensor == NULL)
        return -1;
    *keep = tensor;
    if ((PyObject *)Py_TYPE(tensor) == c->ndarray) {
        *value = tensor;
        *id = -1;
    }
    else if ((PyObject *)Py_TYPE(tensor) == c->tensor_type) {
        PyObject *trace = PyObject_GetAttr(tensor, n_trace_);
        if (trace == NULL)
            return -1;
        Py_DECREF(trace);                            /* the box keeps it */
        if ((PyObject *)Py_TYPE(trace) != c->tape_type || (*tape != NULL && trace != *tape))
            return DECLINE;
        *tape = trace;
        PyObject *inner = PyObject_GetAttr(tensor, n_value_);
        if (inner == NULL)
            return -1;
        Py_DECREF(inner);                            /* the box keeps it */
        PyObject *ident = PyObject_GetAttr(tensor, n_id_);
        if (ident == NULL)
            return -1;
        *id = PyLong_AsSsize_t(ident);
        Py_DECREF(ident);
        if (*id < 0)
            return PyErr_Occurred() ? -1 : DECLINE;
        *value = inner;
    }
    else
        return DECLINE;
    /* a box of an outer trace, a CuPy array: the Python clause.  (The value's
     * type needs no check: both paths compute on the values, and the result
     * must have out's type.) */
    return (PyObject *)Py_TYPE(*value) == c->ndarray ? 0 : DECLINE;
}

/* Whether performing the primitive here would run ``tape``'s clause and then
 * the effect's default, as built.  1 / 0 / -1. */
static int
tape_records_alone(KTracerClause *c, PyObject *tape)
{
    PyObject *live = PyObject_GetAttr(tape, n_live_);
    if (live == NULL)
        return -1;
    Py_DECREF(live);
    if (live != Py_True)
        return 0;
    PyObject *dflt = PyObject_GetAttr(c->effect, s_default);
    if (dflt == NULL)
        return -1;
    Py_DECREF(dflt);
    if (dflt != c->dflt)
        return 0;
    PyObject *named = PyObject_GetAttr(c->op, n_primitive);
    if (named == NULL)
        return -1;
    int same_name = PyObject_RichCompareBool(named, c->name, Py_EQ);
    Py_DECREF(named);
    if (same_name <= 0)
        return same_name;
    PyObject *prim = PyDict_GetItemWithError(c->primitives, c->name);
    if (prim != c->prim)                             /* the op table changed since */
        return PyErr_Occurred() ? -1 : 0;
    PyObject *installed = PyObject_GetAttr(tape, n_handler_);
    if (installed == NULL)
        return -1;
    int sole = 0;
    if (PyTuple_CheckExact(installed) && PyTuple_GET_SIZE(installed) == 2)
        sole = kfx_sole_handler(c->effect, PyTuple_GET_ITEM(installed, 0));
    Py_DECREF(installed);
    return sole;
}

/* ``(rule, i, ids, u, v, out, prim)``, as the Tape's clause appends it. */
static PyObject *
node_of(KTracerClause *c, Py_ssize_t i, PyObject *const *values, const Py_ssize_t *ids, PyObject *out)
{
    PyObject *index = PyLong_FromSsize_t(i), *node = NULL;
    if (index == NULL)
        return NULL;
    if (c->diff == Py_None && (c->nin == 1 || ids[0] < 0 || ids[1] < 0)) {  /* one traced input */
        int k = c->nin == 1 || ids[0] >= 0 ? 0 : 1;
        PyObject *rule = c->nin == 1 ? c->rule : k == 0 ? c->rule_a : c->rule_b;
        PyObject *id = PyLong_FromSsize_t(ids[k]);
        if (id != NULL)
            node = PyTuple_Pack(7, rule, index, id, values[0], c->nin == 1 ? Py_None : values[1],
                                out, c->prim);
        Py_XDECREF(id);
    }
    else {      /* a binary node of two traced inputs, or _general_factory's: ids (-1: not differentiated) */
        PyObject *in_ids = PyTuple_New(c->nin), *inputs = PyTuple_New(c->nin);
        PyObject *params = in_ids == NULL || inputs == NULL ? NULL : PyTuple_New(0);
        for (int k = 0; params != NULL && k < c->nin; k++) {
            int traced = c->diff == Py_None || PyTuple_GET_ITEM(c->diff, k) == Py_True;
            PyObject *id = PyLong_FromSsize_t(traced ? ids[k] : -1);
            if (id == NULL)
                Py_CLEAR(params);
            else {
                PyTuple_SET_ITEM(in_ids, k, id);
                PyTuple_SET_ITEM(inputs, k, Py_NewRef(values[k]));
            }
        }
        if (params != NULL)
            node = PyTuple_Pack(7, c->rule, index, in_ids, inputs, params, out, c->prim);
        Py_XDECREF(in_ids);
        Py_XDECREF(inputs);
        Py_XDECREF(params);
    }
    Py_DECREF(index);
    return node;
}

/* ``object.__new__(type)`` with three fields set, as tensor._box and
 * memory._Entry make theirs (new reference, or NULL); tape_clauses.c makes
 * its boxes with it too. */
PyObject *
kfx_new_with_fields(PyObject *type, PyObject *const names[3], PyObject *const values[3])
{
    static PyObject *no_args;
    if (no_args == NULL && (no_args = PyTuple_New(0)) == NULL)
        return NULL;
    PyObject *made = PyBaseObject_Type.tp_new((PyTypeObject *)type, no_args, NULL);
    for (int k = 0; made != NULL && k < 3; k++)
        if (PyObject_SetAttr(made, names[k], values[k]) < 0)
            Py_CLEAR(made);
    return made;
}

/* A box of ``tape`` (id i) holding ``value``: tensor._box. */
static PyObject *
box_of(KTracerClause *c, PyObject *tape, Py_ssize_t i, PyObject *value)
{
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL)
        return NULL;
    PyObject *const names[3] = {n_value_, n_trace_, n_id_}, *const values[3] = {value, tape, index};
    PyObject *box = kfx_new_with_fields(c->tensor_type, names, values);
    Py_DECREF(index);
    return box;
}

/* memory._Entry(tensor, value, "produced") */
static PyObject *
entry_of(KTracerClause *c, PyObject *tensor, PyObject *value)
{
    PyObject *const names[3] = {n_tensor, n_value, n_kind}, *const values[3] = {tensor, value, n_produced};
    return kfx_new_with_fields(c->entry_type, names, values);
}

static int fast_record(KTracerClause *c, PyObject *const *views, PyObject *const *keys,
                       PyObject *dtype, PyObject **result);

/* The common case (top of the file): 0 (*result: ``out``), DECLINE, or -1. */
static int
fast_call(KTracerClause *c, PyObject *const *views, PyObject **result)
{
    int nin = c->nin;
    PyObject *out = views[0];
    for (int k = 0; k <= nin; k++)
        if ((PyObject *)Py_TYPE(views[k]) != c->ndarray)
            return DECLINE;
    PyObject *dtype = PyObject_GetAttr(out, n_dtype);
    if (dtype == NULL)
        return -1;
    Py_DECREF(dtype);                                /* out keeps it */
    if (!floating(c, dtype))
        return DECLINE;
    PyObject *keys[3] = {NULL, NULL, NULL};
    int status = DECLINE;
    for (int k = 0; k <= nin; k++) {
        keys[k] = Py_XNewRef(identity_of(c, views[k]));
        if (keys[k] == NULL) {
            status = PyErr_Occurred() ? -1 : DECLINE;
            goto release_keys;
        }
        /* an identity is (address, shape, strides, dtype.str): the inputs' type is out's */
        if (!PyTuple_CheckExact(keys[k]) || PyTuple_GET_SIZE(keys[k]) != 4)
            goto release_keys;
        if (k > 0) {
            PyObject *want = PyTuple_GET_ITEM(c->types, k - 1);
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(keys[k], 3),
                                                want == Py_None ? PyTuple_GET_ITEM(keys[0], 3) : want,
                                                Py_EQ);
            if (same <= 0) {
                status = same < 0 ? -1 : DECLINE;
                goto release_keys;
            }
        }
    }
    if (c->by_kernel) {                              /* BufferTracer.apply's check_output */
        PyObject *checked = PyObject_Vectorcall(c->admit, views, (size_t)(nin + 1), NULL);
        if (checked == NULL) {
            status = decline_on_exception();
            goto release_keys;
        }
        Py_DECREF(checked);
    }
    else if (!shapes_admitted(c, views, keys, nin + 1))
        goto release_keys;
    status = fast_record(c, views, keys, dtype, result);
release_keys:
    for (int k = 0; k <= nin; k++)
        Py_XDECREF(keys[k]);
    return status;
}

/* fast_call once the operands are checked: the tracer's part. */
static int
fast_record(KTracerClause *c, PyObject *const *views, PyObject *const *keys, PyObject *dtype,
            PyObject **result)
{
    int nin = c->nin;
    PyObject *out = views[0];
    PyObject *tracer = PyObject_GetAttr(c->slot, n_tracer);
    if (tracer == NULL)
        return -1;
    int status = DECLINE;
    PyObject *table = NULL, *keep[2] = {NULL, NULL}, *r = NULL, *value = NULL, *node = NULL, *box = NULL;
    PyObject *nodes = NULL, *count = NULL;
    int known = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(c->tracer_types); k++)
        known |= PyTuple_GET_ITEM(c->tracer_types, k) == (PyObject *)Py_TYPE(tracer);
    if (!known)
        goto done;
    PyObject *parent = PyObject_GetAttr(tracer, n_parent);
    if (parent == NULL) {
        status = -1;
        goto done;
    }
    Py_DECREF(parent);
    if (parent != Py_None)
        goto done;                                   /* nested tapes: the Python clause */
    table = PyObject_GetAttr(tracer, n_table);
    if (table == NULL) {
        status = -1;
        goto done;
    }
    if (!PyDict_CheckExact(table))
        goto done;
    PyObject *out_key = Py_NewRef(keys[0]);
    PyObject *tape = NULL, *values[2];
    Py_ssize_t ids[2];
    for (int k = 0; k < nin; k++) {
        status = read_input(c, table, views[k + 1], keys[k + 1], &tape, &values[k], &ids[k], &keep[k]);
        if (status != 0)
            goto done_key;
        if (c->diff != Py_None && PyTuple_GET_ITEM(c->diff, k) != Py_True && ids[k] >= 0) {
            status = DECLINE;                        /* a box as labels or indices */
            goto done_key;
        }
    }
    status = DECLINE;
    if (tape == NULL)
        goto done_key;                               /* constants only: no node */
    int alone = tape_records_alone(c, tape);
    if (alone <= 0) {
        status = alone < 0 ? -1 : DECLINE;
        goto done_key;
    }
    /* The primitive: its kernel, or ``direct`` on these values. */
    r = PyObject_Vectorcall(c->direct, values, (size_t)nin, NULL);
    if (r == NULL) {
        status = c->by_kernel ? decline_on_exception() : -1;
        goto done_key;
    }
    /* What out then holds: the result, or (a kernel's NumPy scalar) the array
     * of it that BufferTracer.record makes. */
    if ((PyObject *)Py_TYPE(r) == c->ndarray)
        value = Py_NewRef(r);
    else if (c->by_kernel && (value = PyObject_CallOneArg(c->asarray, r)) == NULL) {
        status = -1;
        goto done_key;
    }
    if (value == NULL || (PyObject *)Py_TYPE(value) != c->ndarray)
        goto done_key;                               /* not what the buffer can hold as is */
    /* Its type must be out's, and its shape (which admitted shapes imply). */
    PyObject *rdtype = PyObject_GetAttr(value, n_dtype);
    Py_XDECREF(rdtype);                              /* compared by identity only */
    if (rdtype != dtype) {
        PyErr_Clear();
        goto done_key;
    }
    if (c->by_kernel) {
        PyObject *shape = PyObject_GetAttr(value, n_shape);
        int same = shape == NULL ? -1 : PyObject_RichCompareBool(shape, PyTuple_GET_ITEM(keys[0], 1), Py_EQ);
        Py_XDECREF(shape);
        if (same <= 0) {
            status = same < 0 ? -1 : DECLINE;
            goto done_key;
        }
    }
    /* The Tape's node and box (tape.py's clause) ... */
    status = -1;
    count = PyObject_GetAttr(tape, n_n_);
    nodes = count == NULL ? NULL : PyObject_GetAttr(tape, n_nodes_);
    if (nodes == NULL || !PyList_CheckExact(nodes))
        goto done_key;
    Py_ssize_t i = PyLong_AsSsize_t(count);
    if (i == -1 && PyErr_Occurred())
        goto done_key;
    node = node_of(c, i, values, ids, r);
    if (node == NULL || PyList_Append(nodes, node) < 0)
        goto done_key;
    PyObject *next = PyLong_FromSsize_t(i + 1);
    if (next == NULL)
        goto done_key;
    int set = PyObject_SetAttr(tape, n_n_, next);
    Py_DECREF(next);
    if (set < 0 || (box = box_of(c, tape, i, r)) == NULL)
        goto done_key;
    /* ... then BufferTracer.record: the value into out, out's entry. */
    int copied = kfx_copy_bytes(out, value);
    if (copied != 1 && PyObject_SetItem(out, Py_Ellipsis, value) < 0)
        goto done_key;
    PyObject *entry = entry_of(c, box, value);
    if (entry == NULL)
        goto done_key;
    int stored = PyDict_SetItem(table, out_key, entry);
    Py_DECREF(entry);
    if (stored < 0)
        goto done_key;
    *result = Py_NewRef(out);
    status = 0;
done_key:
    Py_DECREF(out_key);
done:
    Py_XDECREF(count);
    Py_XDECREF(nodes);
    Py_XDECREF(box);
    Py_XDECREF(node);
    Py_XDECREF(r);
    Py_XDECREF(value);
    Py_XDECREF(keep[0]);
    Py_XDECREF(keep[1]);
    Py_XDECREF(table);
    Py_DECREF(tracer);
    return status;
}

static PyObject *
tracer_clause_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    KTracerClause *c = (KTracerClause *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n == c->nin + 1 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
        PyObject *result = NULL;
        int status = fast_call(c, args, &result);
        if (status == 0)
            return result;
        if (status < 0)
            return NULL;
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    return PyObject_Vectorcall(c->fallback, args, nargsf, kwnames);
}

static PyObject *
tracer_clause_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *fallback, *slot, *spec;
    static char *names[] = {"fallback", "slot", "spec", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!:TracerClause", names, &fallback, &slot,
                                     &PyTuple_Type, &spec))
        return NULL;
    if (PyTuple_GET_SIZE(spec) != SPEC_SIZE) {
        PyErr_SetString(PyExc_TypeError, "TracerClause: a spec as memory._compiled_clause builds it");
        return NULL;
    }
    long nin = PyLong_AsLong(PyTuple_GET_ITEM(spec, SPEC_NIN));
    if (nin != 1 && nin != 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "TracerClause: one or two inputs");
        return NULL;
    }
    PyObject *types = PyTuple_GET_ITEM(spec, SPEC_TYPES), *diff = PyTuple_GET_ITEM(spec, SPEC_DIFF);
    int by_kernel = PyObject_IsTrue(PyTuple_GET_ITEM(spec, SPEC_BY_KERNEL));
    if (by_kernel < 0)
        return NULL;
    if (!PyDict_CheckExact(PyTuple_GET_ITEM(spec, SPEC_ADMITTED))
            || !PyDict_CheckExact(PyTuple_GET_ITEM(spec, SPEC_IDENTITIES))
            || !PyDict_CheckExact(PyTuple_GET_ITEM(spec, SPEC_PRIMITIVES))
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(spec, SPEC_TRACER_TYPES))
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(spec, SPEC_DTYPES))
            || !PyTuple_CheckExact(types) || PyTuple_GET_SIZE(types) != nin
            || (diff != Py_None && (!PyTuple_CheckExact(diff) || PyTuple_GET_SIZE(diff) != nin
                                    || !by_kernel))
            || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "TracerClause: a spec as memory._compiled_clause builds it");
        return NULL;
    }
    if (n_tracer == NULL) {
#define NAME(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
        NAME(n_tracer, "tracer");
        NAME(n_parent, "parent");
        NAME(n_table, "table");
        NAME(n_tensor, "tensor");
        NAME(n_value, "value");
        NAME(n_kind, "kind");
        NAME(n_value_, "_value");
        NAME(n_trace_, "_trace");
        NAME(n_id_, "_id");
        NAME(n_live_, "_live");
        NAME(n_handler_, "_handler");
        NAME(n_n_, "_n");
        NAME(n_nodes_, "_nodes");
        NAME(n_shape, "shape");
        NAME(n_dtype, "dtype");
        NAME(n_produced, "produced");
        NAME(n_primitive, "primitive");
#undef NAME
    }
    KTracerClause *c = (KTracerClause *)type->tp_alloc(type, 0);
    if (c == NULL)
        return NULL;
    c->vectorcall = tracer_clause_call;
    c->fallback = Py_NewRef(fallback);
    c->slot = Py_NewRef(slot);
    c->spec = Py_NewRef(spec);
#define ITEM(k) PyTuple_GET_ITEM(spec, k)
    c->direct = ITEM(SPEC_DIRECT);
    c->admit = ITEM(SPEC_ADMIT);
    c->admitted = ITEM(SPEC_ADMITTED);
    c->effect = ITEM(SPEC_EFFECT);
    c->dflt = ITEM(SPEC_DEFAULT);
    c->prim = ITEM(SPEC_PRIM);
    c->rule = ITEM(SPEC_RULE);
    c->rule_a = ITEM(SPEC_RULE_A);
    c->rule_b = ITEM(SPEC_RULE_B);
    c->diff = ITEM(SPEC_DIFF);
    c->types = ITEM(SPEC_TYPES);
    c->asarray = ITEM(SPEC_ASARRAY);
    c->tracer_types = ITEM(SPEC_TRACER_TYPES);
    c->entry_type = ITEM(SPEC_ENTRY);
    c->tensor_type = ITEM(SPEC_TENSOR);
    c->tape_type = ITEM(SPEC_TAPE);
    c->ndarray = ITEM(SPEC_NDARRAY);
    c->dtypes = ITEM(SPEC_DTYPES);
    c->identities = ITEM(SPEC_IDENTITIES);
    c->primitives = ITEM(SPEC_PRIMITIVES);
    c->name = ITEM(SPEC_NAME);
    c->op = ITEM(SPEC_OP);
#undef ITEM
    c->nin = (int)nin;
    c->by_kernel = by_kernel;
    if (!PyType_Check(c->entry_type) || !PyType_Check(c->tensor_type) || !PyType_Check(c->tape_type)
            || !PyType_Check(c->ndarray)) {
        Py_DECREF(c);
        PyErr_SetString(PyExc_TypeError, "TracerClause: the spec's types are not types");
        return NULL;
    }
    return (PyObject *)c;
}

static int
tracer_clause_traverse(PyObject *self, visitproc visit, void *arg)
{
    KTracerClause *c = (KTracerClause *)self;
    Py_VISIT(c->fallback);
    Py_VISIT(c->slot);
    Py_VISIT(c->spec);
    for (int k = 0; k < 3; k++)
        Py_VISIT(c->last_admitted[k]);
    return 0;
}

static int
tracer_clause_clear(PyObject *self)
{
    KTracerClause *c = (KTracerClause *)self;
    Py_CLEAR(c->fallback);
    Py_CLEAR(c->slot);
    Py_CLEAR(c->spec);
    for (int k = 0; k < 3; k++)
        Py_CLEAR(c->last_admitted[k]);
    return 0;
}

static void
tracer_clause_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    tracer_clause_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *
tracer_clause_repr(PyObject *self)
{
    KTracerClause *c = (KTracerClause *)self;
    return PyUnicode_FromFormat("<TracerClause of %R>", c->fallback);
}

static PyMemberDef tracer_clause_members[] = {
    {"fallback", T_OBJECT, offsetof(KTracerClause, fallback), READONLY,
     "The Python clause every call outside the common case goes to."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(tracer_clause_doc,
"TracerClause(fallback, slot, spec)\n--\n\n"
"A tape's clause for one runtime op's effect: records the common case in C\n"
"and calls ``fallback`` (the Python clause) for every other call\n"
"(kina_fx/_speedups_c/tape_calls.c; kina_fx.autograd.memory builds it).");

static PyTypeObject KTracerClause_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kina_fx._speedups.TracerClause",
    .tp_basicsize = sizeof(KTracerClause),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = tracer_clause_doc,
    .tp_new = tracer_clause_new,
    .tp_dealloc = tracer_clause_dealloc,
    .tp_traverse = tracer_clause_traverse,
    .tp_clear = tracer_clause_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(KTracerClause, vectorcall),
    .tp_repr = tracer_clause_repr,
    .tp_members = tracer_clause_members,
};

int
kfx_add_tape_calls(PyObject *module)
{
    if (PyType_Ready(&KTracerClause_Type) < 0)
        return -1;
    Py_INCREF(&KTracerClause_Type);
    if (PyModule_AddObject(module, "TracerClause", (PyObject *)&KTracerClause_Type) < 0) {
        Py_DECREF(&KTracerClause_Type);
        return -1;
    }
    return 0;
}
