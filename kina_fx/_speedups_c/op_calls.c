/* op_calls.c: a runtime op export called from C, on the CPU backend.
 *
 * Transcribes the CPU path of the callbacks of kina_fx/ffi/ops.py
 * (_make_callback): each memref operand becomes the NumPy view that
 * kina_fx.memref.ViewCache holds for its exact descriptor bytes, and the op's
 * effect is performed with the views and the int32 parameters; an exception
 * becomes a status and kina_last_error through ffi.effects._report_error, as
 * cffi's onerror hook makes it on the Python path.  The views are read from
 * the ViewCaches' own dicts (ffi.ops.FAST_ROWS names them), so a view is
 * made, checked and cached in one place, by Python.
 *
 * What it saves: the cffi callback's entry and argument boxing, and reading
 * each descriptor through cffi cdata (about a microsecond per operand).
 *
 * Anything out of the ordinary declines before anything is done, and the
 * export's cffi path (the reference) then does everything, error texts
 * included: the C ABI's fast paths off (KINA_FX_PURE_PYTHON=1, or turned
 * off), ffi.ops not imported yet (its first call takes the cffi path, which
 * imports it; the next one reads its FAST_ROWS), a null memref or descriptor, a rank out of range, a
 * descriptor whose view is not cached yet (the cffi path makes it), another
 * backend selected (KINA_FX_DEVICE), an op whose row is not bound (those
 * checking a device ordinal), or a thread without a Python thread state.
 */
#include "speedups.h"

typedef struct {
    int64_t rank;
    void *descriptor;
} kfx_unranked_memref;

#define KFX_OP_MAX_OPERANDS 8
#define KFX_OP_MAX_PARAMS 8
#define KFX_OP_MAX_RANK 32        /* kina_fx.h: KINA_MAX_RANK */

/* ffi.ops.FAST_ROWS (1) when it has the expected shape: per op, None or
 * (effect, (the ViewCache dict of each memref operand, ...)); else 0. */
int
kfx_check_op_rows(PyObject *rows)
{
    if (!PyTuple_Check(rows))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rows); i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (row == Py_None)
            continue;
        PyObject *dicts = PyTuple_Check(row) && PyTuple_GET_SIZE(row) == 3 ? PyTuple_GET_ITEM(row, 1) : NULL;
        int ok = dicts != NULL && PyTuple_Check(dicts) && PyTuple_GET_SIZE(dicts) >= 1
            && PyTuple_GET_SIZE(dicts) <= KFX_OP_MAX_OPERANDS;
        for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(dicts); k++)
            ok = PyDict_CheckExact(PyTuple_GET_ITEM(dicts, k));
        PyObject *direct = ok ? PyTuple_GET_ITEM(row, 2) : NULL;
        if (ok && direct != Py_None)     /* (default, function, ndarray, {shapes}, admit) */
            ok = PyTuple_Check(direct) && PyTuple_GET_SIZE(direct) == 5
                && PyCallable_Check(PyTuple_GET_ITEM(direct, 1))
                && PyType_Check(PyTuple_GET_ITEM(direct, 2))
                && PyDict_CheckExact(PyTuple_GET_ITEM(direct, 3))
                && PyCallable_Check(PyTuple_GET_ITEM(direct, 4));
        if (!ok)
            return 0;
    }
    return 1;
}

/* ---- the direct call ------------------------------------------------------------ *
 *
 * For the ops whose default comes down to one NumPy function on small
 * operands (runtime_ops.RuntimeOp.direct: matmul, the binary ufuncs, exp, log,
 * tanh, relu), the fast path calls that function itself, ``direct(*inputs,
 * out=out)`` under quiet floating-point conditions, instead of performing the
 * effect, when all of this holds (else the effect is performed, as before):
 *   - the effect still has the default the row was built with, and no
 *     handler in scope handles the effect (kfx_effect_unhandled: the search
 *     perform would make), so perform would run that default
 *     (direct_allowed, asked once per call);
 *   - every view is exactly a NumPy array;
 *   - these operand shapes were admitted before: after a successful call
 *     through the default, RuntimeOp.calls_direct said that the default
 *     computes exactly the direct call for them (a valid call, none of the
 *     kernels' special cases).  The admitted shapes are remembered in the
 *     row's dict, keyed by each operand's rank and sizes.
 * What it saves: perform's Python default, the kernel's frames and checks,
 * and the floating-point wrapper's frame (8,000 of a 2x2 matmul's 25,600
 * instructions: docs/benchmarks.md).
 *
 * A training loop calls each op on the same buffers again and again, so the
 * operands of each op's last direct call are remembered too (ffi.ops.
 * FAST_LAST_DIRECT: their ranks and descriptors' bytes, and their views): a
 * call with the very same descriptors needs no view lookup and no shapes
 * lookup, the views being the ones the view caches gave then (the same bytes
 * make the same view) and their shapes admitted.  The entries are dropped
 * with the view caches (memref.register_cache). */

enum { DIRECT_NO, DIRECT_DONE, DIRECT_ADMIT };

#define DIRECT_MEMO_MAX 1024
/* The longest operands_key: each operand's rank and whole descriptor. */
#define KEY_BYTES_MAX (KFX_OP_MAX_OPERANDS * 8 * (1 + 3 + 2 * KFX_OP_MAX_RANK))

/* Each operand's rank, then its sizes (``whole``: its descriptor's bytes,
 * ``bytes[k]`` of them), into ``buf``; returns the length.  The key of the
 * admitted shapes, and (whole) of the last direct call. */
static Py_ssize_t
operands_key(void *const *memrefs, int32_t nmem, const Py_ssize_t *bytes, int whole, char *buf)
{
    Py_ssize_t n = 0;
    for (int32_t k = 0; k < nmem; k++) {
        const kfx_unranked_memref *m = memrefs[k];
        memcpy(buf + n, &m->rank, sizeof(int64_t));
        n += sizeof(int64_t);
        /* the descriptor: allocated, aligned, offset, sizes[rank], strides[rank] */
        const char *from = (const char *)m->descriptor + (whole ? 0 : 3 * sizeof(int64_t));
        size_t len = whole ? (size_t)bytes[k] : (size_t)m->rank * sizeof(int64_t);
        memcpy(buf + n, from, len);
        n += (Py_ssize_t)len;
    }
    return n;
}

/* Whether the quiet context can be set from C (NumPy 2: a context
 * variable; NumPy 1.x keeps its error state elsewhere). */
static int
quiet_context_known(void)
{
    PyObject *ctx = g_op_fp_context;
    return ctx != NULL && PyTuple_Check(ctx) && PyTuple_GET_SIZE(ctx) == 2
           && PyContextVar_CheckExact(PyTuple_GET_ITEM(ctx, 0));
}

/* Whether performing ``effect`` here would run the default the row ``direct``
 * was built with, and so a direct call may stand in for it (1 / 0; errors are
 * cleared: perform meets them again, and reports them). */
static int
direct_allowed(PyObject *direct, PyObject *effect)
{
    PyObject *dflt = PyObject_GetAttr(effect, s_default);
    Py_XDECREF(dflt);               /* compared by identity only; the effect keeps it */
    int allowed = dflt == PyTuple_GET_ITEM(direct, 0) && kfx_effect_unhandled(effect) > 0;
    PyErr_Clear();
    return allowed;
}

/* ``callable(*args)`` with NumPy's floating-point conditions ignored, as
 * gpu_ops.quiet_fp makes it: its context variable set to
 * gpu_ops.QUIET_FP_CONTEXT's value around the call (quiet_context_known). */
static PyObject *
quiet_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *var = PyTuple_GET_ITEM(g_op_fp_context, 0), *quiet = PyTuple_GET_ITEM(g_op_fp_context, 1);
    PyObject *token = PyContextVar_Set(var, quiet);
    if (token == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(callable, args, nargsf, kwnames);
    PyObject *pending = r == NULL ? exc_save() : NULL;
    if (PyContextVar_Reset(var, token) < 0) {
        Py_XDECREF(pending);
        Py_CLEAR(r);
    }
    else if (pending != NULL)
        exc_restore(pending);
    Py_DECREF(token);
    return r;
}

/* ``direct(*views[1:], out=views[0])`` with NumPy's floating-point
 * conditions ignored; sets *status (0, or the exception's).  Returns
 * DIRECT_DONE. */
static int
call_direct(PyObject *direct, PyObject *const *views, int32_t nmem, int32_t *status)
{
    static PyObject *out_kw;
    PyObject *r = NULL;
    if (out_kw == NULL)
        out_kw = Py_BuildValue("(s)", "out");
    if (out_kw != NULL) {
        PyObject *args[KFX_OP_MAX_OPERANDS];
        for (int32_t k = 1; k < nmem; k++)
            args[k - 1] = views[k];
        args[nmem - 1] = views[0];
        r = quiet_vectorcall(PyTuple_GET_ITEM(direct, 1), args, (size_t)(nmem - 1), out_kw);
    }
    if (r == NULL)
        *status = kfx_report_exception();
    else {
        Py_DECREF(r);
        *status = 0;
    }
    return DIRECT_DONE;
}

/* With the direct call allowed: DIRECT_DONE (made; *status set) when the
 * shapes were admitted, DIRECT_ADMIT (not made: *key, a new reference, is
 * their key, to admit after the call), DIRECT_NO. */
static int
try_direct(PyObject *direct, PyObject *const *views, int32_t nmem, void *const *memrefs,
           PyObject **key, int32_t *status)
{
    PyObject *ndarray = PyTuple_GET_ITEM(direct, 2);
    for (int32_t k = 0; k < nmem; k++)
        if ((PyObject *)Py_TYPE(views[k]) != ndarray)
            return DIRECT_NO;
    char buf[KEY_BYTES_MAX];
    PyObject *k = PyBytes_FromStringAndSize(buf, operands_key(memrefs, nmem, NULL, 0, buf));
    PyObject *admitted = k == NULL ? NULL : PyDict_GetItemWithError(PyTuple_GET_ITEM(direct, 3), k);
    if (admitted != NULL) {
        Py_DECREF(k);
        return call_direct(direct, views, nmem, status);
    }
    if (k == NULL || PyErr_Occurred()) {
        PyErr_Clear();
        Py_XDECREF(k);
        return DIRECT_NO;
    }
    *key = k;
    return DIRECT_ADMIT;
}

/* The entry of ``memo`` (FAST_LAST_DIRECT or FAST_LAST_VIEWS: op index ->
 * (ranks and descriptors' bytes, views...)) for op ``op`` when its operands
 * have these very descriptors (borrowed), else NULL (errors cleared). */
static PyObject *
recall_views(PyObject *memo, int32_t op, void *const *memrefs, int32_t nmem, const Py_ssize_t *bytes)
{
    PyObject *key = PyLong_FromLong(op);
    PyObject *entry = memo == NULL || key == NULL || !PyDict_CheckExact(memo) ? NULL
                      : PyDict_GetItemWithError(memo, key);
    Py_XDECREF(key);
    PyErr_Clear();
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != nmem + 1
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 0)))
        return NULL;
    char buf[KEY_BYTES_MAX];
    Py_ssize_t n = operands_key(memrefs, nmem, bytes, 1, buf);
    PyObject *raw = PyTuple_GET_ITEM(entry, 0);
    if (n != PyBytes_GET_SIZE(raw) || memcmp(buf, PyBytes_AS_STRING(raw), (size_t)n) != 0)
        return NULL;
    return entry;
}

/* Remember in ``memo`` the views of a call whose operands had these
 * descriptors (see recall_views). */
static void
remember_views(PyObject *memo, int32_t op, void *const *memrefs, int32_t nmem, const Py_ssize_t *bytes,
               PyObject *const *views)
{
    if (memo == NULL || !PyDict_CheckExact(memo))
        return;
    char buf[KEY_BYTES_MAX];
    PyObject *entry = PyTuple_New(nmem + 1);
    PyObject *raw = entry == NULL ? NULL
                    : PyBytes_FromStringAndSize(buf, operands_key(memrefs, nmem, bytes, 1, buf));
    PyObject *key = raw == NULL ? NULL : PyLong_FromLong(op);
    if (key != NULL) {
        PyTuple_SET_ITEM(entry, 0, raw);
        for (int32_t k = 0; k < nmem; k++)
            PyTuple_SET_ITEM(entry, k + 1, Py_NewRef(views[k]));
        PyDict_SetItem(memo, key, entry);
        Py_DECREF(key);
    }
    else
        Py_XDECREF(raw);
    Py_XDECREF(entry);
    PyErr_Clear();
}

/* With the direct call allowed: DIRECT_DONE (*status set) when this call's
 * operands are the last direct call's, else DIRECT_NO. */
static int
repeat_direct(int32_t op, PyObject *direct, void *const *memrefs, int32_t nmem,
              const Py_ssize_t *bytes, int32_t *status)
{
    PyObject *entry = recall_views(g_op_last_direct, op, memrefs, nmem, bytes);
    if (entry == NULL)
        return DIRECT_NO;
    Py_INCREF(entry);                /* the call may drop it from the dict */
    call_direct(direct, PySequence_Fast_ITEMS(entry) + 1, nmem, status);
    Py_DECREF(entry);
    return DIRECT_DONE;
}

/* After a successful call through the default: remember ``key`` when
 * RuntimeOp.calls_direct admits these operands.  Changes no status. */
static void
admit_direct(PyObject *direct, PyObject *key, PyObject *const *views, int32_t nmem)
{
    PyObject *admits = PyObject_Vectorcall(PyTuple_GET_ITEM(direct, 4), views, (size_t)nmem, NULL);
    if (admits != NULL && PyObject_IsTrue(admits) > 0) {
        PyObject *memo = PyTuple_GET_ITEM(direct, 3);
        if (PyDict_GET_SIZE(memo) >= DIRECT_MEMO_MAX)
            PyDict_Clear(memo);
        PyDict_SetItem(memo, key, Py_True);
    }
    Py_XDECREF(admits);
    PyErr_Clear();
}

/* ffi.ops._cpu_selected(), asked again only when what decides it may have
 * changed (gpu_ops.DEVICE_INPUTS: KINA_FX_DEVICE's value object and the
 * device memo, compared by identity; both kept alive here, so neither's
 * address can be reused meanwhile).  1 (the CPU), or 0 with an exception
 * possibly set. */
static PyObject *seen_value, *seen_memo;
static int seen_cpu;

static int
device_inputs(PyObject **value, PyObject **memo)
{
    PyObject *in = g_device_inputs;
    if (in == NULL || !PyTuple_Check(in) || PyTuple_GET_SIZE(in) != 3
            || !PyDict_CheckExact(PyTuple_GET_ITEM(in, 0)) || !PyDict_Check(PyTuple_GET_ITEM(in, 2)))
        return 0;
    static PyObject *memo_name;
    if (memo_name == NULL && (memo_name = PyUnicode_InternFromString("_device_memo")) == NULL)
        return 0;
    *value = PyDict_GetItemWithError(PyTuple_GET_ITEM(in, 0), PyTuple_GET_ITEM(in, 1));
    if (*value == NULL && PyErr_Occurred())
        return 0;
    *memo = PyDict_GetItemWithError(PyTuple_GET_ITEM(in, 2), memo_name);
    return *memo != NULL;
}

static int
cpu_selected(void)
{
    PyObject *value = NULL, *memo = NULL;
    int known = device_inputs(&value, &memo);
    if (known && seen_memo != NULL && memo == seen_memo && value == seen_value)
        return seen_cpu;
    PyErr_Clear();
    PyObject *selected = Py_NewRef(g_cpu_selected);
    PyObject *cpu = PyObject_CallNoArgs(selected);
    Py_DECREF(selected);
    int on_cpu = cpu == Py_True;
    Py_XDECREF(cpu);
    if (cpu == NULL)
        return 0;
    if (device_inputs(&value, &memo)) {      /* as they are after that answer */
        Py_XSETREF(seen_value, Py_XNewRef(value));
        Py_XSETREF(seen_memo, Py_NewRef(memo));
        seen_cpu = on_cpu;
    }
    else {
        PyErr_Clear();
        Py_CLEAR(seen_memo);
    }
    return on_cpu;
}

int
kfx_fast_runtime_op(int32_t op, void *const *memrefs, int32_t nmem, const int32_t *params,
                    int32_t nparams, int32_t *status)
{
    if (!kfx_c_abi_on || op < 0 || nmem < 1
            || nmem > KFX_OP_MAX_OPERANDS || nparams < 0 || nparams > KFX_OP_MAX_PARAMS)
        return KINA_FAST_DECLINED;
    Py_ssize_t bytes[KFX_OP_MAX_OPERANDS];
    for (int32_t k = 0; k < nmem; k++) {
        const kfx_unranked_memref *m = memrefs[k];
        if (m == NULL || m->rank < 0 || m->rank > KFX_OP_MAX_RANK || m->descriptor == NULL)
            return KINA_FAST_DECLINED;
        bytes[k] = (Py_ssize_t)(8 * (3 + 2 * m->rank));
    }
    kfx_gil_call g;
    if (!kfx_gil_enter(&g))
        return KINA_FAST_DECLINED;
    if (kfx_import_op_collaborators() <= 0) {        /* ffi.ops not imported yet */
        PyErr_Clear();
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *rows = Py_XNewRef(g_op_rows);
    PyObject *row = rows != NULL && op < PyTuple_GET_SIZE(rows) ? PyTuple_GET_ITEM(rows, op) : Py_None;
    if (row == Py_None || PyTuple_GET_SIZE(PyTuple_GET_ITEM(row, 1)) != nmem) {
        Py_XDECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    if (!cpu_selected()) {
        PyErr_Clear();               /* the cffi path raises it again, properly */
        Py_DECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *direct = nparams == 0 ? PyTuple_GET_ITEM(row, 2) : Py_None;
    int quiet = quiet_context_known();
    int allowed = quiet && direct != Py_None && direct_allowed(direct, PyTuple_GET_ITEM(row, 0));
    if (allowed && repeat_direct(op, direct, memrefs, nmem, bytes, status) == DIRECT_DONE) {
        Py_DECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DONE;
    }
    PyObject *dicts = PyTuple_GET_ITEM(row, 1);
    PyObject *args[1 + KFX_OP_MAX_OPERANDS + KFX_OP_MAX_PARAMS];
    Py_ssize_t n = 0;
    args[n++] = Py_NewRef(PyTuple_GET_ITEM(row, 0));
    int declined = 0;
    /* the views of this op's last call through the effect, for the same descriptors */
    PyObject *recalled = recall_views(g_op_last_views, op, memrefs, nmem, bytes);
    for (int32_t k = 0; recalled != NULL && k < nmem; k++)
        args[n++] = Py_NewRef(PyTuple_GET_ITEM(recalled, k + 1));
    for (int32_t k = recalled != NULL ? nmem : 0; k < nmem && !declined; k++) {
        const kfx_unranked_memref *m = memrefs[k];
        PyObject *key = PyBytes_FromStringAndSize((const char *)m->descriptor, bytes[k]);
        PyObject *view = key == NULL ? NULL : PyDict_GetItemWithError(PyTuple_GET_ITEM(dicts, k), key);
        Py_XDECREF(key);
        if (view == NULL)
            declined = 1;            /* not cached (or out of memory): the cffi path */
        else
            args[n++] = Py_NewRef(view);
    }
    for (int32_t j = 0; j < nparams && !declined; j++) {
        PyObject *p = PyLong_FromLong(params[j]);
        if (p == NULL)
            declined = 1;
        else
            args[n++] = p;
    }
    if (declined) {
        PyErr_Clear();
        while (n > 0)
            Py_DECREF(args[--n]);
        Py_DECREF(rows);
        kfx_gil_leave(&g);
        return KINA_FAST_DECLINED;
    }
    PyObject *key = NULL;
    int how = allowed ? try_direct(direct, args + 1, nmem, memrefs, &key, status) : DIRECT_NO;
    if (how == DIRECT_DONE && *status == 0)
        remember_views(g_op_last_direct, op, memrefs, nmem, bytes, args + 1);
    if (how != DIRECT_DONE) {
        /* perform under quiet floating-point conditions: set from here (no
         * wrapper frame), or by ffi.ops._fast_perform where C cannot (NumPy 1.x) */
        PyObject *result = quiet ? quiet_vectorcall(kfx_perform_fn, args, (size_t)n, NULL)
                                 : PyObject_Vectorcall(g_op_perform, args, (size_t)n, NULL);
        if (result == NULL)
            *status = kfx_report_exception();
        else {
            Py_DECREF(result);
            *status = 0;
            if (how == DIRECT_ADMIT)
                admit_direct(direct, key, args + 1, nmem);
            if (recalled == NULL && nparams == 0)
                remember_views(g_op_last_views, op, memrefs, nmem, bytes, args + 1);
        }
    }
    Py_XDECREF(key);
    while (n > 0)
        Py_DECREF(args[--n]);
    Py_DECREF(rows);
    kfx_gil_leave(&g);
    return KINA_FAST_DONE;
}
