/* libkina_fx.so, the library C hosts link: it finds Python, then forwards.
 *
 * The ABI itself lives in _libkina_fx_cpython.so beside this file
 * (kina_runtime.c built with cffi's embedding mode for one CPython minor
 * version).  That module leaves its Python symbols undefined, like any
 * extension module, so this loader, which links no libpython and carries no
 * RPATH, decides at run time which libpython they resolve to.  On the first
 * call of any export (once per process):
 *
 * 1. Python already in the process (a Python program opened us, or the host
 *    embeds Python): use it, if it is the minor version we were built for.
 * 2. Otherwise find the interpreter of the environment this file is installed
 *    in: $KINA_FX_PYTHON; else bin/python3 of the first directory above us
 *    holding pyvenv.cfg (a venv); else <prefix>/bin/python3.X when we sit in
 *    <prefix>/lib/python3.X/site-packages (a system, conda or pyenv install);
 *    else the interpreter of an editable install (baked in by build.py; "" in
 *    wheels).  Its version (pyvenv.cfg, or the name python3.X) must be ours.
 * 3. Load that interpreter's libpython with RTLD_GLOBAL (extension modules
 *    need its symbols): <base prefix>/lib[/<multiarch>]/libpython3.X.so.1.0,
 *    else the same name from the system library path.
 * 4. Load the embedded module, look up every export in it and hand it the
 *    interpreter's path (kina__set_interpreter): kina_runtime.c starts Python
 *    with that program name.
 *
 * A failure makes every export return KINA_STATUS_INTERNAL with the reason in
 * kina_last_error(); nothing is printed.  See docs/install.md.
 */
#define _GNU_SOURCE /* dladdr, RTLD_DEFAULT */
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
#include "kina_exports.h" /* KINA_EXPORTS(X): every export answered by Python */

#define KINA_API __attribute__((visibility("default")))

#if !defined(KINA_PYTHON_MAJOR) || !defined(KINA_PYTHON_MINOR) || !defined(KINA_LIBPYTHON) \
    || !defined(KINA_MULTIARCH) || !defined(KINA_EMBEDDED_LIBRARY) || !defined(KINA_EDITABLE_PYTHON)
#error "kina_loader.c is compiled by kina_fx/ffi/c/build.py, which defines these"
#endif

#define KINA_ERROR_CAP 1024

static __thread char kina__error[KINA_ERROR_CAP];
static char kina__load_message[KINA_ERROR_CAP];
static pthread_once_t kina__once = PTHREAD_ONCE_INIT;
static int kina__loaded; /* set (release) once every pointer below is */
static const char *(*kina__real_last_error)(void);

#define KINA_REAL_POINTER(path, name, pyname, params, args) static int32_t(*kina__real_##name) params;
KINA_EXPORTS(KINA_REAL_POINTER)

static int kina__fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kina__load_message, sizeof kina__load_message, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- where things are ------------------------------------------------------ */

static int kina__is_file(const char *path) { return path[0] != '\0' && access(path, R_OK) == 0; }

static int kina__is_executable(const char *path) { return path[0] != '\0' && access(path, X_OK) == 0; }

static void kina__strip_last(char *path) /* "/a/b/c" -> "/a/b"; "/a" -> "" */
{
    char *slash = strrchr(path, '/');
    if (slash != NULL)
        *slash = '\0';
}

static const char *kina__basename(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* pyvenv.cfg in `dir`: its `home` (the base interpreter's bin directory) and
 * its version (`version`, or `version_info` as virtualenv and uv write it). */
static int kina__read_pyvenv(const char *dir, char *home, size_t home_cap, int *major, int *minor)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/pyvenv.cfg", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[PATH_MAX + 64];
    while (fgets(line, sizeof line, f) != NULL) {
        char *eq = strchr(line, '=');
        if (eq == NULL)
            continue;
        char *key = line, *value = eq + 1, *end = eq;
        while (end > key && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        *end = '\0';
        while (*value == ' ' || *value == '\t')
            value++;
        value[strcspn(value, "\r\n")] = '\0';
        if (strcmp(key, "home") == 0)
            snprintf(home, home_cap, "%s", value);
        else if (strcmp(key, "version") == 0 || strcmp(key, "version_info") == 0)
            (void)sscanf(value, "%d.%d", major, minor);
    }
    fclose(f);
    return 0;
}

typedef struct {
    char python[PATH_MAX];      /* the interpreter: Python's program name */
    const char *found_by;       /* how, for messages */
    char base_prefix[PATH_MAX]; /* the installation holding its libpython */
    int major, minor;           /* its version; 0.0 when nothing tells */
} kina__interpreter;

/* Fill base_prefix and the version for in->python. */
static void kina__describe(kina__interpreter *in)
{
    char venv[PATH_MAX], home[PATH_MAX] = "";
    snprintf(venv, sizeof venv, "%s", in->python);
    kina__strip_last(venv); /* .../bin */
    kina__strip_last(venv); /* the venv, if it is one */
    if (kina__read_pyvenv(venv, home, sizeof home, &in->major, &in->minor) == 0 && home[0]) {
        snprintf(in->base_prefix, sizeof in->base_prefix, "%s", home);
        kina__strip_last(in->base_prefix); /* home is <base prefix>/bin */
    }
    char real[PATH_MAX];
    if (realpath(in->python, real) == NULL)
        return;
    if (in->base_prefix[0] == '\0') {
        snprintf(in->base_prefix, sizeof in->base_prefix, "%s", real);
        kina__strip_last(in->base_prefix);
        kina__strip_last(in->base_prefix);
    }
    if (in->major == 0) /* a venv's python3 resolves to the base's python3.X */
        (void)sscanf(kina__basename(real), "python%d.%d", &in->major, &in->minor);
}

/* <prefix> when `dir` is <prefix>/lib/python3.X/site-packages/kina_fx. */
static int kina__site_packages_prefix(const char *dir, char *prefix, size_t cap)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    kina__strip_last(path);
    const char *site = kina__basename(path);
    if (strcmp(site, "site-packages") != 0 && strcmp(site, "dist-packages") != 0)
        return -1;
    kina__strip_last(path);
    if (strncmp(kina__basename(path), "python", 6) != 0)
        return -1;
    kina__strip_last(path);
    kina__strip_last(path); /* lib or lib64 */
    snprintf(prefix, cap, "%s", path);
    return 0;
}

static int kina__find_interpreter(const char *self_dir, kina__interpreter *in)
{
    memset(in, 0, sizeof *in);
    const char *env = getenv("KINA_FX_PYTHON");
    if (env && env[0]) {
        if (!kina__is_executable(env))
            return kina__fail("kina_fx: KINA_FX_PYTHON=%.400s is not an executable file", env);
        snprintf(in->python, sizeof in->python, "%s", env);
        in->found_by = "KINA_FX_PYTHON";
        return 0;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", self_dir);
    while (dir[0] != '\0') {
        char probe[PATH_MAX + 32];
        snprintf(probe, sizeof probe, "%s/pyvenv.cfg", dir);
        if (kina__is_file(probe)) {
            static const char *const names[] = {"/bin/python3", "/bin/python"};
            for (size_t i = 0; i < 2; i++) {
                snprintf(probe, sizeof probe, "%s%s", dir, names[i]);
                if (kina__is_executable(probe)) {
                    snprintf(in->python, sizeof in->python, "%s", probe);
                    in->found_by = "the venv libkina_fx.so is installed in";
                    return 0;
                }
            }
        }
        kina__strip_last(dir);
    }
    char prefix[PATH_MAX];
    if (kina__site_packages_prefix(self_dir, prefix, sizeof prefix) == 0) {
        char probe[PATH_MAX + 32];
        snprintf(probe, sizeof probe, "%s/bin/python%d.%d", prefix, KINA_PYTHON_MAJOR, KINA_PYTHON_MINOR);
        if (!kina__is_executable(probe))
            snprintf(probe, sizeof probe, "%s/bin/python3", prefix);
        if (kina__is_executable(probe)) {
            snprintf(in->python, sizeof in->python, "%s", probe);
            in->found_by = "the installation libkina_fx.so is installed in";
            return 0;
        }
    }
    if (kina__is_executable(KINA_EDITABLE_PYTHON)) {
        snprintf(in->python, sizeof in->python, "%s", KINA_EDITABLE_PYTHON);
        in->found_by = "the editable install that built libkina_fx.so";
        return 0;
    }
    return kina__fail("kina_fx: cannot find the Python interpreter of the environment "
                      "libkina_fx.so (in %.300s) was installed into; set KINA_FX_PYTHON "
                      "to its path (a CPython %d.%d)",
                      self_dir, KINA_PYTHON_MAJOR, KINA_PYTHON_MINOR);
}

/* ---- libpython ------------------------------------------------------------- */

/* The libpython file of CPython major.minor under `prefix`, or "" if none. */
static void kina__libpython_under(const char *prefix, int major, int minor, char *out, size_t cap)
{
    static const char *const dirs[] = {"/lib/" KINA_MULTIARCH "/", "/lib/", "/lib64/"};
    char name[64];
    if (major == KINA_PYTHON_MAJOR && minor == KINA_PYTHON_MINOR)
        snprintf(name, sizeof name, "%s", KINA_LIBPYTHON);
    else
        snprintf(name, sizeof name, "libpython%d.%d.so.1.0", major, minor);
    out[0] = '\0';
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && prefix[0]; i++) {
        if (i == 0 && KINA_MULTIARCH[0] == '\0')
            continue;
        snprintf(out, cap, "%s%s%s", prefix, dirs[i], name);
        if (kina__is_file(out))
            return;
    }
    out[0] = '\0';
}

static int kina__load_libpython(const kina__interpreter *in)
{
    char path[PATH_MAX + 64];
    kina__libpython_under(in->base_prefix, KINA_PYTHON_MAJOR, KINA_PYTHON_MINOR, path, sizeof path);
    const char *what = path[0] ? path : KINA_LIBPYTHON; /* else: the system library path */
    if (dlopen(what, RTLD_NOW | RTLD_GLOBAL) == NULL)
        return kina__fail("kina_fx: cannot load %s for %.300s (looked in %.300s/lib and the "
                          "system library path): %.300s; kina_fx needs a CPython built with "
                          "a shared libpython (--enable-shared)",
                          KINA_LIBPYTHON, in->python, in->base_prefix, dlerror());
    return 0;
}

static int kina__wrong_version(const kina__interpreter *in)
{
    char theirs[PATH_MAX + 64];
    kina__libpython_under(in->base_prefix, in->major, in->minor, theirs, sizeof theirs);
    if (theirs[0] == '\0')
        snprintf(theirs, sizeof theirs, "libpython%d.%d.so.1.0", in->major, in->minor);
    return kina__fail("kina_fx: libkina_fx.so was built for CPython %d.%d (%s), but the "
                      "interpreter found by %s, %.300s, is CPython %d.%d (%.300s): install "
                      "kina_fx with that interpreter (pip install --force-reinstall kina_fx), "
                      "or set KINA_FX_PYTHON to a CPython %d.%d that has kina_fx",
                      KINA_PYTHON_MAJOR, KINA_PYTHON_MINOR, KINA_LIBPYTHON, in->found_by,
                      in->python, in->major, in->minor, theirs, KINA_PYTHON_MAJOR,
                      KINA_PYTHON_MINOR);
}

/* ---- loading --------------------------------------------------------------- */

static int kina__load(void)
{
    Dl_info info;
    char self_dir[PATH_MAX];
    if (!dladdr((void *)&kina_abi_version, &info) || info.dli_fname == NULL
        || realpath(info.dli_fname, self_dir) == NULL)
        return kina__fail("kina_fx: libkina_fx.so cannot find its own file (dladdr failed)");
    kina__strip_last(self_dir);

    kina__interpreter in;
    memset(&in, 0, sizeof in);
    const char *(*running_version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "Py_GetVersion");
    int (*is_initialized)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    if (running_version != NULL) {
        int major = 0, minor = 0;
        (void)sscanf(running_version(), "%d.%d", &major, &minor);
        if (major != KINA_PYTHON_MAJOR || minor != KINA_PYTHON_MINOR)
            return kina__fail("kina_fx: libkina_fx.so was built for CPython %d.%d (%s), but "
                              "this process already runs CPython %d.%d (libpython%d.%d): use "
                              "the kina_fx installed for that interpreter",
                              KINA_PYTHON_MAJOR, KINA_PYTHON_MINOR, KINA_LIBPYTHON, major,
                              minor, major, minor);
        /* libpython loaded but not started: kina_runtime.c still needs a program name */
        if (is_initialized != NULL && !is_initialized() && kina__find_interpreter(self_dir, &in) != 0)
            return -1;
    } else {
        if (kina__find_interpreter(self_dir, &in) != 0)
            return -1;
        kina__describe(&in);
        if (in.major != 0 && (in.major != KINA_PYTHON_MAJOR || in.minor != KINA_PYTHON_MINOR))
            return kina__wrong_version(&in);
        if (kina__load_libpython(&in) != 0)
            return -1;
    }

    char embedded[PATH_MAX + 64];
    snprintf(embedded, sizeof embedded, "%s/%s", self_dir, KINA_EMBEDDED_LIBRARY);
    void *lib = dlopen(embedded, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return kina__fail("kina_fx: cannot load %.400s: %.400s", embedded, dlerror());
    void (*set_interpreter)(const char *) = (void (*)(const char *))dlsym(lib, "kina__set_interpreter");
    kina__real_last_error = (const char *(*)(void))dlsym(lib, "kina_last_error");
    if (set_interpreter == NULL || kina__real_last_error == NULL)
        return kina__fail("kina_fx: %.400s is not kina_fx's embedded module", embedded);
#define KINA_BIND(path, name, pyname, params, args)                                          \
    if ((*(void **)&kina__real_##name = dlsym(lib, #name)) == NULL)                          \
        return kina__fail("kina_fx: %.400s lacks %s (a different kina_fx build?)", embedded, \
                          #name);
    KINA_EXPORTS(KINA_BIND)
#undef KINA_BIND
    set_interpreter(in.python);
    return 0;
}

static void kina__load_once(void)
{
    if (kina__load() == 0)
        __atomic_store_n(&kina__loaded, 1, __ATOMIC_RELEASE);
}

/* The first call, and every call after a failed load (kept out of line so
 * that the forwarders below are a load, a test and a jump). */
__attribute__((noinline, cold)) static int kina__load_or_fail(void)
{
    pthread_once(&kina__once, kina__load_once);
    if (__atomic_load_n(&kina__loaded, __ATOMIC_ACQUIRE))
        return 0;
    snprintf(kina__error, sizeof kina__error, "%s", kina__load_message);
    return -1;
}

static inline int kina__ensure_loaded(void)
{
    if (__builtin_expect(__atomic_load_n(&kina__loaded, __ATOMIC_ACQUIRE), 1))
        return 0;
    return kina__load_or_fail();
}

/* ---- the exports ----------------------------------------------------------- */

KINA_API int32_t kina_abi_version(void) { return KINA_ABI_VERSION; }

KINA_API const char *kina_last_error(void)
{
    if (__atomic_load_n(&kina__loaded, __ATOMIC_ACQUIRE))
        return kina__real_last_error();
    return kina__error;
}

#define KINA_FORWARDER(path, name, pyname, params, args) \
    KINA_API int32_t name params                           \
    {                                                      \
        if (kina__ensure_loaded() != 0)                    \
            return KINA_STATUS_INTERNAL;                   \
        return kina__real_##name args;                     \
    }
KINA_EXPORTS(KINA_FORWARDER)
