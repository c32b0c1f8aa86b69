/* module.c: the kina_fx._speedups module.
 *
 * What it mirrors: the binding code at the end of kina_fx/handlers.py, which
 * hands this module the classes and functions it works with (_bind,
 * _bind_forward here; _bind_tail, _bind_round_trip and _bind_c_abi in their
 * own files), the method table, and the _C_API capsule libkina_fx.so uses.
 * speedups.h lists the files and what each transcribes.
 */
#include "speedups.h"
#include "kina_fast_api.h"

PyObject *s_state, *s_current, *s_stack, *s_handler, *s_parent, *s_fiber, *s_index;
PyObject *s_fun, *s_on, *s_get, *s_default, *s_append, *s_outcome, *s_switch, *s_ret, *s_exc, *s_id;

/* ---- binding ------------------------------------------------------------------ */

/* ``type`` is ``core`` (one of types.c's types) or a subclass in
 * which no descriptor shadows one of core's fields: C code may then read and
 * write those fields of type's instances directly.  0, or -1 with TypeError. */
int
check_data_type(PyObject *type, PyTypeObject *core, const char *what)
{
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, core)) {
        PyErr_Format(PyExc_TypeError, "_bind: %s must derive from kina_fx._speedups.%s "
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
                    PyErr_Format(PyExc_TypeError, "_bind: %s.%s shadows the field of that name",
                                 what, field);
                    return -1;
                }
            }
        }
    }
    return 0;
}

int
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
    if (check_data_type(fiber_t, &KFiber_Type, "Fiber") ||
            check_data_type(tstate_t, &KThreadState_Type, "ThreadState") ||
            check_data_type(handler_t, &KHandler_Type, "Handler") ||
            check_data_type(skip_t, &KSkip_Type, "_Skip") ||
            check_data_type(tail_t, &KTailResume_Type, "_TailResume"))
        return NULL;
    /* Handler's own ``fun`` / ``on`` descriptors: an entry whose type resolves
     * the name to them has the field (get_handler_attr). */
    PyObject *d_fun = Py_XNewRef(_PyType_Lookup(&KHandler_Type, s_fun));
    PyObject *d_on = Py_XNewRef(_PyType_Lookup(&KHandler_Type, s_on));
    if (d_fun == NULL || d_on == NULL) {
        Py_XDECREF(d_fun);
        Py_XDECREF(d_on);
        PyErr_SetString(PyExc_TypeError, "_bind: Handler has no fun / on fields");
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
    Py_XSETREF(g_handler_t, (PyTypeObject *)Py_NewRef(handler_t));
    Py_XSETREF(g_tail_t, (PyTypeObject *)Py_NewRef(tail_t));
    Py_XSETREF(g_handler_fun, d_fun);
    Py_XSETREF(g_handler_on, d_on);
    Py_XSETREF(g_unhandled, Py_NewRef(unhandled_t));
    Py_XSETREF(g_effect_t, Py_NewRef(effect_t));
    Py_XSETREF(g_suspend, Py_NewRef(susp));
    Py_XSETREF(g_nested, Py_NewRef(nested));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_bind", bind, METH_VARARGS, bind_doc},
    {"_bind_forward", bind_forward, METH_O, bind_forward_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "kina_fx._speedups",
    "Compiled fast path of kina_fx.handlers.perform (see kina_fx/_speedups_c/speedups.h).",
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
    if (kfx_add_data_types(m) < 0 || PyModule_AddFunctions(m, kfx_perform_methods) < 0 || PyModule_AddFunctions(m, kfx_tail_methods) < 0
            || PyModule_AddFunctions(m, kfx_round_trip_methods) < 0
            || PyModule_AddFunctions(m, kfx_c_abi_methods) < 0
            || PyModule_AddFunctions(m, kfx_c_fibers_methods) < 0
            || PyModule_AddFunctions(m, kfx_buffers_methods) < 0
            || PyModule_AddFunctions(m, kfx_op_calls_methods) < 0) {
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
