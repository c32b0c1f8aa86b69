/* The C part of _libkina_fx_cpython.so: the exported wrappers, the Python
 * start-up guard and kina_last_error.  cffi compiles this file (kina_fx/ffi/c/
 * build.py passes it to set_source) after its own prelude, so Python.h is
 * included.  Hosts link libkina_fx.so (kina_loader.c), which loads libpython
 * and this library and forwards every export here.
 *
 * Why hand-written wrappers: a bare cffi export returns 0 (Success in our ABI)
 * when Python failed to start or no Python code is attached.  Each export here
 * first runs kina__ensure_python(), which starts the right interpreter itself
 * and returns KINA_STATUS_INTERNAL with a message on failure; only then does it
 * call the static `extern "Python"` function that kina_fx.ffi.attach binds
 * with @ffi.def_extern(error=5, onerror=...).
 *
 * The exports come from KINA_EXPORTS (kina_exports.h), generated from the
 * table of every export, kina_fx/ffi/exports.py: adding an export is a row
 * there (docs/abi.md, "Adding an export"), not an edit here.
 *
 * Nothing here keeps a pointer into a caller's stack beyond one call: hosts may
 * run on greenlet fibers whose stacks are copied away while suspended.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kina_fx.h"
#include "kina_exports.h"
#include "kina_fast_api.h"

#define KINA_API __attribute__((visibility("default")))

/* ---- kina_last_error: thread-local, shared by every export --------------- */

#define KINA_ERROR_CAP 1024
static __thread char kina__error[KINA_ERROR_CAP];

static void kina__set_last_error(const char *message)
{
    snprintf(kina__error, sizeof kina__error, "%s", message ? message : "");
}

static void kina__errorf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kina__error, sizeof kina__error, fmt, ap);
    va_end(ap);
}

KINA_API const char *kina_last_error(void) { return kina__error; }

KINA_API int32_t kina_abi_version(void) { return KINA_ABI_VERSION; }

/* ---- starting Python ----------------------------------------------------- */

static pthread_once_t kina__once = PTHREAD_ONCE_INIT;
static int32_t kina__init_status = KINA_STATUS_INTERNAL;
static char kina__init_message[KINA_ERROR_CAP] = "kina_fx: Python was never started";

/* Called by the embedded init code (build.py) when importing kina_fx failed. */
static void kina__set_init_error(const char *message)
{
    snprintf(kina__init_message, sizeof kina__init_message, "%s", message ? message : "");
    kina__init_status = KINA_STATUS_INTERNAL;
}

/* The interpreter of the environment libkina_fx.so is installed in.  The
 * loader (kina_loader.c, the libkina_fx.so hosts link) finds it, loads its
 * libpython and calls this before any export; "" when Python already ran. */
static char kina__python[PATH_MAX];

KINA_API void kina__set_interpreter(const char *path)
{
    snprintf(kina__python, sizeof kina__python, "%s", path ? path : "");
}

static int kina__find_python(char *out, size_t cap)
{
    if (kina__python[0] == '\0')
        return -1;
    snprintf(out, cap, "%s", kina__python);
    return 0;
}

/* A host that dlopen()ed us with RTLD_LOCAL left libpython's symbols private;
 * extension modules (numpy, _cffi_backend) need them global. */
static void kina__promote_libpython(void)
{
    Dl_info info;
    if (dladdr((void *)&Py_IsInitialized, &info) && info.dli_fname)
        (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
}

static int kina__start_interpreter(void)
{
    char python[PATH_MAX];
    if (kina__find_python(python, sizeof python) != 0) {
        kina__set_init_error("kina_fx: cannot find the Python interpreter of the "
                             "environment libkina_fx.so was installed into "
                             "(set KINA_FX_PYTHON to its path)");
        return -1;
    }
    kina__promote_libpython();

    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the host owns SIGINT */
    config.parse_argv = 0;
    config.use_environment = 0;         /* PYTHONHOME/PYTHONPATH of another Python must not leak in */
    config.user_site_directory = 0;
    PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, python);
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
        snprintf(kina__init_message, sizeof kina__init_message,
                 "kina_fx: starting Python (%.300s) failed: %.100s%s%.400s", python,
                 st.func ? st.func : "", st.func ? ": " : "",
                 st.err_msg ? st.err_msg : "unknown error");
        return -1;
    }
    (void)PyEval_SaveThread(); /* cffi and later callers take the GIL themselves */
    return 0;
}

/* Import _cffi_backend ourselves first: if it is missing, cffi's own start-up
 * would print a traceback and make every export return 0. */
static int kina__preflight(void)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = 0;
    PyObject *m = PyImport_ImportModule("_cffi_backend");
    if (m == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *text = value ? PyObject_Str(value) : NULL;
        const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
        snprintf(kina__init_message, sizeof kina__init_message,
                 "kina_fx: cannot import _cffi_backend: %s", s ? s : "unknown error");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        rc = -1;
    }
    Py_XDECREF(m);
    PyGILState_Release(gil);
    return rc;
}

/* Set up the embedded cffi module in the interpreter that now runs, without
 * cffi_start_python().  That function first takes a process-wide spin lock
 * kept in a field of PyCapsule_Type (_cffi_carefully_make_gil): before Python
 * 3.12 the field is tp_version_tag, which CPython sets as soon as anything
 * looks up an attribute on a capsule (`import torch` does), and the lock then
 * spins forever.  The lock only serialises Py_InitializeEx between cffi
 * modules; Python already runs here (we started it under our pthread_once, or
 * the host process did), so what is left of cffi's start-up is done here as
 * _cffi_start_python does it after the lock: under cffi's own reentrant
 * mutex, _cffi_initialize_python() (GIL, PyInit of the module, the init code
 * of build.py), then extern "Python" calls are switched to _cffi_backend's
 * dispatcher.  These are names of cffi's _embedding.h (stable since cffi 1.5;
 * a cffi that renamed them fails the build, it cannot hang). */
static int kina__attach_embedded_module(void)
{
    _cffi_acquire_reentrant_mutex();
    int rc = _cffi_initialize_python();
    if (rc == 0 && _cffi_call_python_org != NULL) {
        __sync_synchronize(); /* the module's state is visible before the switch */
        _cffi_call_python = (_cffi_call_python_fnptr)_cffi_call_python_org;
    } else {
        _cffi_call_python_org = NULL;
        rc = -1;
    }
    _cffi_release_reentrant_mutex();
    return rc;
}

static void kina__init_once(void)
{
    if (!Py_IsInitialized() && kina__start_interpreter() != 0)
        return;
    if (kina__preflight() != 0)
        return;
    /* The embedded init code (build.py) imports kina_fx.ffi and attaches the
     * callbacks; it reports its own failure through kina__set_init_error. */
    kina__init_status = KINA_STATUS_SUCCESS;
    if (kina__attach_embedded_module() != 0)
        kina__set_init_error("kina_fx: cffi could not start the embedded module");
}

/* 0 when Python runs and kina_fx.ffi is attached, else KINA_STATUS_INTERNAL
 * with kina_last_error set.  Shared by every export. */
static int32_t kina__ensure_python(void)
{
    pthread_once(&kina__once, kina__init_once);
    if (kina__init_status != KINA_STATUS_SUCCESS) {
        kina__errorf("%s", kina__init_message);
        return kina__init_status;
    }
    return KINA_STATUS_SUCCESS;
}

/* ---- Python's recursion limit at the C/Python boundary ----------------------- */

/* A callback that cffi enters with Python's recursion limit reached fails at
 * its entry, and the onerror hook that should turn the RecursionError into a
 * status is entered at the same depth and fails too: cffi then prints both
 * tracebacks (C handlers that re-enter kina_perform hit it on Python 3.12+).
 * So each export first checks that the calling thread has this many frames
 * (and, from 3.12, C recursion units) left, and otherwise returns 5 itself.
 * Only the calling thread writes these counters, and it is here, not running
 * Python: reading them without the GIL is safe. */
#define KINA__CALLBACK_HEADROOM 10

static int32_t kina__check_recursion_headroom(void)
{
    PyThreadState *ts = PyGILState_GetThisThreadState();
    if (ts == NULL)
        return KINA_STATUS_SUCCESS; /* no Python frames on this thread */
#if PY_VERSION_HEX >= 0x030E0000
    int ok = ts->py_recursion_remaining > KINA__CALLBACK_HEADROOM;
#elif PY_VERSION_HEX >= 0x030C0000
    int ok = ts->py_recursion_remaining > KINA__CALLBACK_HEADROOM
        && ts->c_recursion_remaining > KINA__CALLBACK_HEADROOM;
#elif PY_VERSION_HEX >= 0x030B0000
    int ok = ts->recursion_remaining > KINA__CALLBACK_HEADROOM;
#else
    /* Python 3.10 keeps the limit in the interpreter state, readable only
     * with the GIL: taken only when the stack is deep enough to matter. */
    int ok = 1;
    if (ts->recursion_depth > 100) {
        PyGILState_STATE gil = PyGILState_Ensure();
        ok = ts->recursion_depth + KINA__CALLBACK_HEADROOM < Py_GetRecursionLimit();
        PyGILState_Release(gil);
    }
#endif
    if (ok)
        return KINA_STATUS_SUCCESS;
    kina__errorf("RecursionError: maximum recursion depth exceeded (kina_fx: fewer than %d "
                 "levels of Python's recursion limit left to call into Python)",
                 KINA__CALLBACK_HEADROOM);
    return KINA_STATUS_INTERNAL;
}

/* ---- the exports and their C fast paths ------------------------------------ */

/* The FAST rows of KINA_EXPORTS (kina_perform, kina_resume_fiber and the
 * fiber queries) first try a C fast path of kina_fx._speedups
 * (kina_fast_api.h): kina_perform answered
 * by C handlers, a host fiber resumed, its pending perform read, without
 * entering Python through cffi.  A fast path answers (KINA_FAST_DONE, with
 * *status set as the Python path would) or declines having done nothing (a
 * Python clause first, an invalid argument, a fiber or handle it does not
 * know...): the extern "Python" path then does everything, validation and
 * error texts included.  The fast paths take the GIL themselves when they
 * need it, and decline on a thread that has no Python thread state yet (its
 * first call through cffi gives it one).
 *
 * The table comes from the capsule kina_fx._speedups._C_API, imported once
 * (under the GIL, so once); without kina_fx._speedups, or with one built for
 * another version of the table, the fast paths are off. */
static const kina_fast_api *kina__fast_table;
static int kina__fast_state;   /* 0: not looked up; 1: found; -1: unavailable */

static const kina_fast_api *kina__fast_lookup(void)
{
    if (PyGILState_GetThisThreadState() == NULL)
        return NULL;               /* no thread state: not even to look it up */
    PyGILState_STATE gil = PyGILState_Ensure();
    if (__atomic_load_n(&kina__fast_state, __ATOMIC_ACQUIRE) == 0) {
        const kina_fast_api *api = PyCapsule_Import("kina_fx._speedups._C_API", 0);
        if (api == NULL)
            PyErr_Clear();
        int found = api != NULL && api->version == KINA_FAST_API_VERSION;
        kina__fast_table = found ? api : NULL;
        __atomic_store_n(&kina__fast_state, found ? 1 : -1, __ATOMIC_RELEASE);
    }
    PyGILState_Release(gil);
    return kina__fast_table;
}

static inline const kina_fast_api *kina__fast(void)
{
    int state = __atomic_load_n(&kina__fast_state, __ATOMIC_ACQUIRE);
    return state > 0 ? kina__fast_table : state < 0 ? NULL : kina__fast_lookup();
}

/* kina__fast_<export>(arguments..., &status): 1 when the fast path answered. */
#define KINA__FAST_PATH(name, call)                                   \
    const kina_fast_api *api_ = kina__fast();                         \
    return api_ != NULL && api_->call == KINA_FAST_DONE;

static int kina__fast_kina_perform(int32_t effect, const int64_t *args, int32_t nargs,
                                   int64_t *out_value, int32_t *status)
{
    KINA__FAST_PATH(kina_perform, perform(effect, args, nargs, out_value, status))
}

static int kina__fast_kina_resume_fiber(kina_fiber_t fiber, int64_t value, int32_t *out_state,
                                        int32_t *status)
{
    KINA__FAST_PATH(kina_resume_fiber, resume_fiber(fiber, value, out_state, status))
}

static int kina__fast_kina_get_perform_id(kina_fiber_t fiber, int32_t *out_effect, int32_t *status)
{
    KINA__FAST_PATH(kina_get_perform_id, get_perform_id(fiber, out_effect, status))
}

static int kina__fast_kina_get_perform_args(kina_fiber_t fiber, int64_t *out_args, int32_t cap,
                                            int32_t *out_nargs, int32_t *status)
{
    KINA__FAST_PATH(kina_get_perform_args, get_perform_args(fiber, out_args, cap, out_nargs, status))
}

static int kina__fast_kina_fiber_state(kina_fiber_t fiber, int32_t *out_state, int32_t *status)
{
    KINA__FAST_PATH(kina_fiber_state, fiber_state(fiber, out_state, status))
}

static int kina__fast_kina_fiber_result(kina_fiber_t fiber, int64_t *out_value, int32_t *status)
{
    KINA__FAST_PATH(kina_fiber_result, fiber_result(fiber, out_value, status))
}

/* A runtime op row's fast path: kina_fx._speedups (op_calls.c) performs the
 * op's effect from C when it has the operands' views cached (CPU backend). */
static int kina__fast_runtime_op(int32_t row, void *const *memrefs, int32_t nmem,
                                 const int32_t *params, int32_t nparams, int32_t *status)
{
    KINA__FAST_PATH(runtime_op, runtime_op(row, memrefs, nmem, params, nparams, status))
}

#define KINA__LIST(...) __VA_ARGS__
#define KINA_DEFINE_OP_FAST(name, row, params, memrefs, ints)                              \
    static int kina__fast_##name(KINA__LIST params, int32_t *status)                       \
    {                                                                                      \
        void *const memrefs_[] = {KINA__LIST memrefs};                                     \
        const int32_t ints_[] = {KINA__LIST ints};                                         \
        return kina__fast_runtime_op(row, memrefs_, (int32_t)(sizeof memrefs_ / sizeof *memrefs_), \
                                     ints_ + 1, (int32_t)(sizeof ints_ / sizeof *ints_) - 1, status); \
    }
KINA_OP_FAST_PATHS(KINA_DEFINE_OP_FAST)

/* Before an extern "Python" callback: a C handler that the fast paths called
 * without the GIL may be calling back; its skip marker must be in place
 * before Python code looks at the handler stack (_speedups_c/nogil.c). */
static inline void kina__before_python(void)
{
    const kina_fast_api *api = kina__fast();
    if (api != NULL)
        api->prepare();
}

/* An export's wrapper: the guard (Python started, stack headroom), then
 * `fast_path` (a FAST row's C fast path; empty for a PYTHON row), then the
 * callback. */
#define KINA__WRAPPER(name, pyname, params, args, fast_path) \
    static int32_t pyname params;                           \
    KINA_API int32_t name params                            \
    {                                                       \
        int32_t status_ = kina__ensure_python();            \
        if (status_ == KINA_STATUS_SUCCESS)                 \
            status_ = kina__check_recursion_headroom();     \
        if (status_ != KINA_STATUS_SUCCESS)                 \
            return status_;                                 \
        fast_path                                           \
        kina__before_python();                              \
        return pyname args;                                 \
    }

#define KINA_DEFINE_PYTHON(name, pyname, params, args) \
    KINA__WRAPPER(name, pyname, params, args, )
#define KINA_DEFINE_FAST(name, pyname, params, args)                          \
    KINA__WRAPPER(name, pyname, params, args,                                 \
                  if (kina__fast_##name(KINA__ARGS_AND_STATUS args, &status_)) \
                      return status_;)
#define KINA__ARGS_AND_STATUS(...) __VA_ARGS__

#define KINA_DEFINE(path, name, pyname, params, args) KINA_DEFINE_##path(name, pyname, params, args)
KINA_EXPORTS(KINA_DEFINE)

/* The Python names of the callbacks, for kina_fx.ffi.attach() to check that
 * every one is attached. */
#define KINA_NAME_OF(path, name, pyname, params, args) #pyname,
static const char *const kina__callback_names[] = {KINA_EXPORTS(KINA_NAME_OF) NULL};

static const char *kina__callback_name(int i)
{
    int n = (int)(sizeof kina__callback_names / sizeof kina__callback_names[0]) - 1;
    return (i >= 0 && i < n) ? kina__callback_names[i] : NULL;
}
