/* module.c: the kina_fx._speedups module.
 *
 * What it holds: the Python objects the C core works with, which it imports
 * itself from the modules it accelerates (the table ``collaborators`` below,
 * read once, at the first call that needs them: kfx_import_collaborators),
 * the method table and the _C_API capsule libkina_fx.so uses.  speedups.h
 * lists the files and what each transcribes.
 *
 * Why at first use and not at import: kina_fx.fibers imports this module at
 * its top (its classes derive from the data types of types.c), so when this
 * module is initialised fibers, handlers and ffi.effects are not imported
 * yet.  By the first call of perform, switch_into, drive or resume they are,
 * since those are reached through them; kfx_import_collaborators still
 * refuses a module that is being imported (an import cycle would otherwise
 * hand it a half-made module).
 */
#include "speedups.h"
#include "kina_fast_api.h"

PyObject *s_state, *s_current, *s_stack, *s_handler, *s_parent, *s_fiber, *s_index;
PyObject *s_fun, *s_on, *s_get, *s_default, *s_append, *s_outcome, *s_switch, *s_ret, *s_exc, *s_id;

int kfx_ready;
int kfx_c_abi_on;

/* The variables the table below fills (speedups.h says what each is). */
PyObject *g_local, *g_handler_fun, *g_handler_on, *g_unhandled, *g_cancelled, *g_effect_t,
         *g_effects_by_id, *g_suspend, *g_remove_marker, *g_forward, *g_gexit, *g_unwind,
         *g_begin_unwind, *g_switch_into_py, *g_unwind_fn, *g_resume_py, *g_abort_unless_kept,
         *g_drive_fresh, *g_performed, *g_returned, *g_raised, *g_suspend_to_host,
         *g_answer_fn, *g_report_fn, *g_keyword_arguments_error, *g_states[N_STATES];
PyTypeObject *g_fiber_t, *g_tstate_t, *g_skip_t, *g_handler_t, *g_tail_t, *g_chain_t, *g_cont_t,
             *g_stepper_t, *g_catch_t, *g_cclause_t, *g_chandler_t;
PyObject *t_resume_names, *t_cache, *t_tail_calls, *t_names_function;
PyObject *kfx_perform_fn;
PyObject *g_op_rows, *g_cpu_selected, *g_op_perform, *g_op_fp_context, *g_device_inputs,
         *g_op_last_direct, *g_op_last_views;
Py_ssize_t t_max_frames;
int g_hop_depth;

/* ---- the collaborators ----------------------------------------------------------- *
 *
 * Every Python object the C core uses, by module and name (a dotted name is
 * an attribute of an attribute).  A class the C core makes or reads as one of
 * its data types (``data``) must derive from that type without shadowing one
 * of its fields (check_data_type): its instances' fields are then the C
 * struct's, never a Python class's layout. */

enum { ANY, CALLABLE, CLASS, EXCEPTION, INT };

typedef struct {
    const char *module, *name;
    PyObject **into;
    int kind;
    PyTypeObject *data;              /* a class deriving from this data type     */
} collaborator;

static PyObject *o_max_frames, *o_hop_depth;       /* ints, read into C below */

#define DATA(module, name, into, type) {module, name, (PyObject **)(into), CLASS, type}

/* A table: its rows repeat one shape on purpose (one a collaborator). */
static const collaborator collaborators[] = {
    {"greenlet", "GreenletExit", &g_gexit, EXCEPTION, NULL},
    {"kina_fx.errors", "Unhandled", &g_unhandled, EXCEPTION, NULL},
    {"kina_fx.errors", "Cancelled", &g_cancelled, EXCEPTION, NULL},
    {"kina_fx.tailcalls", "MAX_TAIL_FRAMES", &o_max_frames, INT, NULL},
    {"kina_fx.tailcalls", "RESUME_NAMES", &t_resume_names, ANY, NULL},
    {"kina_fx.tailcalls", "tail_calls_by_code", &t_cache, ANY, NULL},
    {"kina_fx.tailcalls", "tail_calls", &t_tail_calls, CALLABLE, NULL},
    {"kina_fx.tailcalls", "names_function", &t_names_function, CALLABLE, NULL},
    {"kina_fx.fibers", "local", &g_local, ANY, NULL},
    DATA("kina_fx.fibers", "Fiber", &g_fiber_t, &KFiber_Type),
    DATA("kina_fx.fibers", "ThreadState", &g_tstate_t, &KThreadState_Type),
    DATA("kina_fx.fibers", "Chain", &g_chain_t, &KChain_Type),
    {"kina_fx.fibers", "Unwind", &g_unwind, EXCEPTION, NULL},
    {"kina_fx.fibers", "RETURNED", &g_returned, ANY, NULL},
    {"kina_fx.fibers", "RAISED", &g_raised, ANY, NULL},
    {"kina_fx.fibers", "switch_into", &g_switch_into_py, CALLABLE, NULL},
    {"kina_fx.fibers", "unwind", &g_unwind_fn, CALLABLE, NULL},
    {"kina_fx.fibers", "_begin_unwind_here", &g_begin_unwind, CALLABLE, NULL},
    {"kina_fx.handlers", "Effect", &g_effect_t, CLASS, NULL},
    {"kina_fx.handlers", "Effect._by_id", &g_effects_by_id, ANY, NULL},
    DATA("kina_fx.handlers", "Handler", &g_handler_t, &KHandler_Type),
    DATA("kina_fx.handlers", "_Skip", &g_skip_t, &KSkip_Type),
    DATA("kina_fx.handlers", "_TailResume", &g_tail_t, &KTailResume_Type),
    DATA("kina_fx.handlers", "Continuation", &g_cont_t, &KContinuation_Type),
    DATA("kina_fx.handlers", "Stepper", &g_stepper_t, &KStepper_Type),
    DATA("kina_fx.handlers", "_Catch", &g_catch_t, &KCatch_Type),
    {"kina_fx.handlers", "FORWARD", &g_forward, ANY, NULL},
    {"kina_fx.handlers", "PERFORMED", &g_performed, ANY, NULL},
    {"kina_fx.handlers", "_SUSPEND_TO_HOST", &g_suspend_to_host, ANY, NULL},
    {"kina_fx.handlers", "Stepper.NEW", &g_states[ST_NEW], ANY, NULL},
    {"kina_fx.handlers", "Stepper.RUNNING", &g_states[ST_RUNNING], ANY, NULL},
    {"kina_fx.handlers", "Stepper.SUSPENDED", &g_states[ST_SUSPENDED], ANY, NULL},
    {"kina_fx.handlers", "Stepper.DONE", &g_states[ST_DONE], ANY, NULL},
    {"kina_fx.handlers", "Stepper.FAILED", &g_states[ST_FAILED], ANY, NULL},
    {"kina_fx.handlers", "Stepper.CANCELLED", &g_states[ST_CANCELLED], ANY, NULL},
    {"kina_fx.handlers", "_HOP_DEPTH", &o_hop_depth, INT, NULL},
    {"kina_fx.handlers", "_suspend_perform", &g_suspend, CALLABLE, NULL},
    {"kina_fx.handlers", "keyword_arguments_error", &g_keyword_arguments_error, CALLABLE, NULL},
    {"kina_fx.handlers", "_remove_marker", &g_remove_marker, CALLABLE, NULL},
    {"kina_fx.handlers", "_ContinuationReference.resume", &g_resume_py, CALLABLE, NULL},
    {"kina_fx.handlers", "_abort_unless_kept", &g_abort_unless_kept, CALLABLE, NULL},
    {"kina_fx.handlers", "_drive_on_fresh_stack", &g_drive_fresh, CALLABLE, NULL},
};

/* What the C ABI's fast paths add (kfx_set_c_abi_fast_paths). */
static const collaborator c_abi_collaborators[] = {
    DATA("kina_fx.ffi.effects", "CClause", &g_cclause_t, &KCClause_Type),
    DATA("kina_fx.ffi.effects", "CHandler", &g_chandler_t, &KCHandler_Type),
    {"kina_fx.ffi.effects", "_answer_to_int64", &g_answer_fn, CALLABLE, NULL},
    {"kina_fx.ffi.effects", "_report_error", &g_report_fn, CALLABLE, NULL},
};

/* What the runtime op exports' fast path adds (op_calls.c), read at its
 * first call after kina_fx.ffi.ops was imported (a host that uses only the
 * effects exports never imports it, nor NumPy). */
static const collaborator op_collaborators[] = {
    {"kina_fx.ffi.ops", "FAST_ROWS", &g_op_rows, ANY, NULL},
    {"kina_fx.ffi.ops", "_cpu_selected", &g_cpu_selected, CALLABLE, NULL},
    {"kina_fx.ffi.ops", "_fast_perform", &g_op_perform, CALLABLE, NULL},
    {"kina_fx.ffi.ops", "FAST_LAST_DIRECT", &g_op_last_direct, ANY, NULL},
    {"kina_fx.ffi.ops", "FAST_LAST_VIEWS", &g_op_last_views, ANY, NULL},
    {"kina_fx.gpu_ops", "QUIET_FP_CONTEXT", &g_op_fp_context, ANY, NULL},
    {"kina_fx.gpu_ops", "DEVICE_INPUTS", &g_device_inputs, ANY, NULL},
};

#define N_COLLABORATORS (sizeof(collaborators) / sizeof(collaborators[0]))
#define N_C_ABI (sizeof(c_abi_collaborators) / sizeof(c_abi_collaborators[0]))
#define N_OPS (sizeof(op_collaborators) / sizeof(op_collaborators[0]))

/* ``type`` is ``core`` (one of types.c's types) or a subclass in
 * which no descriptor shadows one of core's fields: C code may then read and
 * write those fields of type's instances directly.  0, or -1 with TypeError. */
static int
check_data_type(PyObject *type, PyTypeObject *core, const char *what)
{
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, core)) {
        PyErr_Format(PyExc_TypeError, "%s must derive from kina_fx._speedups.%s "
                     "(fibers.data_type)", what, strrchr(core->tp_name, '.') + 1);
        return -1;
    }
    for (PyTypeObject *t = core; t != NULL && t != &PyBaseObject_Type; t = t->tp_base) {
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0;; k++) {
                const char *field = pass == 0 ? (t->tp_members ? t->tp_members[k].name : NULL)
                                              : (t->tp_getset ? t->tp_getset[k].name : NULL);
                if (field == NULL)
                    break;
                PyObject *name = PyUnicode_InternFromString(field);
                if (name == NULL)
                    return -1;
                PyObject *mine = _PyType_Lookup(t, name), *theirs = _PyType_Lookup((PyTypeObject *)type, name);
                Py_DECREF(name);
                if (mine != theirs) {
                    PyErr_Format(PyExc_TypeError, "%s.%s shadows the field of that name", what, field);
                    return -1;
                }
            }
        }
    }
    return 0;
}

/* The module ``name``, fully imported (new reference); NULL with an
 * exception.  A module whose import is still running (its spec says
 * _initializing) is refused: its names may not exist yet. */
static int
being_imported(PyObject *module)
{
    PyObject *spec = PyObject_GetAttrString(module, "__spec__");
    PyObject *busy = spec == NULL || spec == Py_None ? NULL : PyObject_GetAttrString(spec, "_initializing");
    int initializing = busy != NULL && PyObject_IsTrue(busy) > 0;
    Py_XDECREF(busy);
    Py_XDECREF(spec);
    PyErr_Clear();                   /* no spec or no flag: an ordinary, complete module */
    return initializing;
}

static PyObject *
import_complete(const char *name)
{
    PyObject *module = PyImport_ImportModule(name);
    if (module == NULL)
        return NULL;
    if (being_imported(module)) {
        PyErr_Format(PyExc_ImportError, "kina_fx._speedups was called while %s was still being "
                     "imported (an import cycle)", name);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* Read ``table`` into the variables it names: all of them, or none (-1 with
 * an exception).  ``got`` holds the new references until then. */
static int
read_collaborators(const collaborator *table, size_t n, PyObject **got)
{
    PyObject *module = NULL;
    const char *module_name = NULL;
    size_t k;
    for (k = 0; k < n; k++) {
        const collaborator *c = &table[k];
        if (module_name == NULL || strcmp(module_name, c->module) != 0) {
            Py_XSETREF(module, import_complete(c->module));
            module_name = c->module;
            if (module == NULL)
                goto fail;
        }
        PyObject *obj = Py_NewRef(module);
        char path[128], *rest;
        snprintf(path, sizeof path, "%s", c->name);
        for (char *part = strtok_r(path, ".", &rest); part != NULL && obj != NULL;
                part = strtok_r(NULL, ".", &rest))
            Py_SETREF(obj, PyObject_GetAttrString(obj, part));
        got[k] = obj;
        if (obj == NULL)
            goto fail;
        const char *bad = NULL;
        if (c->kind == CALLABLE && !PyCallable_Check(obj))
            bad = "callable";
        else if (c->kind == CLASS && !PyType_Check(obj))
            bad = "a class";
        else if (c->kind == EXCEPTION && !PyExceptionClass_Check(obj))
            bad = "an exception class";
        else if (c->kind == INT && !PyLong_Check(obj))
            bad = "an int";
        if (bad != NULL) {
            PyErr_Format(PyExc_TypeError, "%s is not %s", c->name, bad);
            k++;
            goto fail;
        }
        if (c->data != NULL && check_data_type(obj, c->data, c->name) < 0) {
            k++;
            goto fail;
        }
    }
    Py_XDECREF(module);
    for (k = 0; k < n; k++)
        Py_XSETREF(*table[k].into, got[k]);
    return 0;

fail:
    Py_XDECREF(module);
    while (k-- > 0)
        Py_XDECREF(got[k]);
    if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_AttributeError)) {
        /* a build older or newer than the Python code: say so */
        PyObject *exc = exc_save();
        PyErr_Format(PyExc_ImportError, "kina_fx._speedups does not fit this kina_fx (%S); "
                     "rebuild it (pip install -e .) or set KINA_FX_PURE_PYTHON=1", exc);
        Py_XDECREF(exc);
    }
    return -1;
}

/* Import the collaborators (once).  0, or -1 with an exception. */
int
kfx_import_collaborators(void)
{
    if (kfx_ready)
        return 0;
    PyObject *got[N_COLLABORATORS] = {NULL};
    if (read_collaborators(collaborators, N_COLLABORATORS, got) < 0)
        return -1;
    if (kfx_ready)                   /* another thread imported them meanwhile */
        return 0;
    t_max_frames = PyLong_AsSsize_t(o_max_frames);
    g_hop_depth = (int)PyLong_AsLong(o_hop_depth);
    if (PyErr_Occurred())
        return -1;
    kfx_ready = 1;
    return 0;
}

/* The runtime op collaborators: 1 once read, 0 while kina_fx.ffi.ops is not
 * (completely) imported, -1 with an exception. */
int
kfx_import_op_collaborators(void)
{
    static int ready;
    if (ready)
        return 1;
    PyObject *name = PyUnicode_FromString("kina_fx.ffi.ops");
    PyObject *ops = name == NULL ? NULL : PyImport_GetModule(name);
    Py_XDECREF(name);
    if (ops == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int initializing = being_imported(ops);
    Py_DECREF(ops);
    if (initializing)
        return 0;
    PyObject *got[N_OPS] = {NULL};
    if (read_collaborators(op_collaborators, N_OPS, got) < 0)
        return -1;
    if (!kfx_check_op_rows(g_op_rows)) {
        PyErr_SetString(PyExc_TypeError, "kina_fx.ffi.ops.FAST_ROWS is not a tuple of None or "
                        "(effect, (dict, ...), direct call) per row");
        return -1;
    }
    ready = 1;
    return 1;
}

PyDoc_STRVAR(set_c_abi_fast_paths_doc,
"set_c_abi_fast_paths($module, on, /)\n--\n\n"
"Turn the C ABI's fast paths (kina_fast_api.h: kina_perform answered by C\n"
"handlers, host fibers stepped in C) on or off; returns whether they were on.\n"
"kina_fx.ffi.effects turns them on when it attaches the library (they read\n"
"its CClause and CHandler); off, every call takes the cffi path.");

static PyObject *
set_c_abi_fast_paths(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    PyObject *was = Py_NewRef(kfx_c_abi_on ? Py_True : Py_False);
    if (on && !kfx_c_abi_on) {
        PyObject *got[N_C_ABI] = {NULL};
        if (kfx_import_collaborators() < 0 || read_collaborators(c_abi_collaborators, N_C_ABI, got) < 0) {
            Py_DECREF(was);
            return NULL;
        }
    }
    kfx_c_abi_on = on;
    return was;
}

static PyMethodDef module_methods[] = {
    {"set_c_abi_fast_paths", set_c_abi_fast_paths, METH_O, set_c_abi_fast_paths_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "kina_fx._speedups",
    "The compiled implementation of kina_fx's effects runtime (see kina_fx/_speedups_c/speedups.h).",
    -1,
    module_methods,
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
    INTERN(s_id, "id");
#undef INTERN
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (kfx_add_data_types(m) < 0 || PyModule_AddFunctions(m, kfx_perform_methods) < 0
            || PyModule_AddFunctions(m, kfx_tail_methods) < 0
            || PyModule_AddFunctions(m, kfx_round_trip_methods) < 0
            || PyModule_AddFunctions(m, kfx_buffers_methods) < 0
            || PyModule_AddFunctions(m, kfx_kernels_methods) < 0 || kfx_add_tape_calls(m) < 0
            || kfx_add_tape_clauses(m) < 0
            || kfx_add_c_fibers(m) < 0 || kfx_init_round_trip() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if ((kfx_perform_fn = PyObject_GetAttrString(m, "perform")) == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    /* HandlerData's own ``fun`` / ``on`` descriptors: an entry whose type
     * resolves the name to them has the field (get_handler_attr). */
    g_handler_fun = Py_XNewRef(_PyType_Lookup(&KHandler_Type, s_fun));
    g_handler_on = Py_XNewRef(_PyType_Lookup(&KHandler_Type, s_on));
    if (g_handler_fun == NULL || g_handler_on == NULL) {
        PyErr_SetString(PyExc_SystemError, "kina_fx._speedups: HandlerData has no fun / on fields");
        Py_DECREF(m);
        return NULL;
    }
    if ((state_key = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    /* For libkina_fx.so (kina_runtime.c): its C fast paths (kina_fast_api.h). */
    PyObject *capi = PyCapsule_New((void *)&kfx_fast_api, "kina_fx._speedups._C_API", NULL);
    if (capi == NULL || PyModule_AddObject(m, "_C_API", capi) < 0) {
        Py_XDECREF(capi);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
