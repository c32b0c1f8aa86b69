/* libFuzzer target: every memref export of libkina_fx.so against docs/abi.md.
 *
 * The exports come from a table generated from the library's own export
 * tables (fuzz/gen_exports.py -> memref_exports.h), so new exports are fuzzed
 * as soon as they exist.  Each input builds one call: operands placed in an
 * arena between two PROT_NONE guard pages (any access outside it crashes),
 * with layouts of every kind (row/column-major, reversed, stepped, broadcast,
 * random strides, offsets, operands overlapping each other, empty memrefs with
 * huge sizes) and, now and then, one deliberately malformed argument.  After
 * the call it checks:
 *
 *  - the status is one a memref export may return (0, 1, 2, 4, 6; never 5, a
 *    bug), with a message when non-zero; a malformed argument is never 0;
 *  - a failed call changed nothing: not one byte of the arena, no descriptor;
 *  - a successful call wrote only the elements of its outputs, and no output
 *    it accepted has two indices sharing an element;
 *  - for every op of the runtime op table (copies, matmul, gather, softmax,
 *    log_softmax, repeat_interleave, the elementwise ops, the broadcasting
 *    binary ops, the reductions, transpose, cross_entropy, the collectives of
 *    one process), the outputs equal
 *    a double-precision reference computed from the operands as they were
 *    before the call (memmove semantics for overlaps);
 *  - check order (docs/abi.md): now and then a call that is valid but for its
 *    output's shape gets its floating operands on a PROT_NONE region, all at
 *    one address (so that the memmove copy of an overlapping input is due),
 *    sometimes with 2^40 elements each: it must be status 1 exactly, having
 *    read nothing (a read crashes) and allocated nothing (a copy of 2^40
 *    elements would be status 2);
 *  - alloc: the documented statuses, the descriptor untouched on failure, a
 *    distinct 64-byte aligned buffer with row-major strides on success.
 */
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"

enum { KF_MEMREF = 1, KF_INT32 = 2 };
enum { KF_IN = 0, KF_OUT = 1, KF_ALLOC = 2 };

typedef struct {
    int kind, role, esize;
    const char *name;
} kf_param_t;

typedef struct {
    const char *name;
    int nparams;
    kf_param_t params[8];
    int32_t (*call)(void *const *m, const int64_t *s);
} kf_export_t;

#include "memref_exports.h"

#define ARENA_BYTES (64 * 1024)
#define MAX_DIMS 4
#define MAX_WORDS (3 + 2 * (KINA_MAX_RANK + 2))

static uint8_t *arena;
static uint8_t *untouchable;              /* POISON_BYTES that no access may reach */
#define POISON_BYTES (1 << 20)
static long check_order_calls[2];         /* [small, 2^40 elements] */
static uint8_t before[ARENA_BYTES];
static uint8_t written[ARENA_BYTES];

typedef struct {
    kina_unranked_memref_t um;
    int64_t words[MAX_WORDS];     /* allocated, aligned, offset, sizes, strides */
    int64_t saved[MAX_WORDS];
    int rank, esize, role;
    int64_t sizes[MAX_DIMS], strides[MAX_DIMS], offset;
    uintptr_t aligned;
    int in_arena;                 /* well-formed, every element inside the arena */
    int null_ptr;                 /* passed as NULL */
} kf_mem_t;

static kf_mem_t mems[8];

/* Outcome counts per export, printed at exit with KINA_FUZZ_STATS=1: a run
 * that never reaches status 0 for an export checks little of it. */
static long outcomes[KF_NEXPORTS][9];

static void print_outcomes(void)
{
    fprintf(stderr, "check-order small %ld\ncheck-order huge %ld\n", check_order_calls[0],
            check_order_calls[1]);
    for (int e = 0; e < KF_NEXPORTS; e++) {
        fprintf(stderr, "%-48s", KF_EXPORTS[e].name);
        for (int s = 0; s < 9; s++)
            fprintf(stderr, " %d:%ld", s, outcomes[e][s]);
        fprintf(stderr, "\n");
    }
}

static void count_outcome(const kf_export_t *ex, int32_t status)
{
    outcomes[ex - KF_EXPORTS][status >= 0 && status < 9 ? status : 5]++;
}

/* ---- layouts -------------------------------------------------------------------------- */

static int64_t count_of(const int64_t *sizes, int rank)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= sizes[i];
    return n;
}

/* Byte position in the arena of element k (row-major linear index) of m. */
static int64_t element_pos(const kf_mem_t *m, int64_t k)
{
    int64_t e = m->offset;
    for (int i = m->rank - 1; i >= 0; i--) {
        int64_t idx = k % m->sizes[i];
        k /= m->sizes[i];
        e += idx * m->strides[i];
    }
    return (int64_t)(m->aligned - (uintptr_t)arena) + e * m->esize;
}

static void write_words(kf_mem_t *m)
{
    m->words[0] = (int64_t)m->aligned;
    m->words[1] = (int64_t)m->aligned;
    m->words[2] = m->offset;
    for (int i = 0; i < m->rank; i++) {
        m->words[3 + i] = m->sizes[i];
        m->words[3 + m->rank + i] = m->strides[i];
    }
    m->um.rank = m->rank;
    m->um.descriptor = m->words;
}

/* Place a well-formed memref of this shape in the arena (near `near` when >= 0). */
static void place(kf_bytes_t *b, kf_mem_t *m, const int64_t *sizes, int rank, int esize, int role,
                  int64_t near)
{
    memset(m, 0, sizeof *m);
    m->rank = rank;
    m->esize = esize;
    m->role = role;
    m->in_arena = 1;
    for (int i = 0; i < rank; i++)
        m->sizes[i] = sizes[i];
    int64_t stride = 1;
    int kind = (int)kf_pick(b, 8);
    for (int i = rank - 1; i >= 0; i--) {            /* row-major first */
        m->strides[i] = stride;
        stride *= sizes[i] > 0 ? sizes[i] : 1;
    }
    if (kind == 1) {                                  /* column-major */
        stride = 1;
        for (int i = 0; i < rank; i++) {
            m->strides[i] = stride;
            stride *= sizes[i] > 0 ? sizes[i] : 1;
        }
    } else if (kind == 2) {                           /* reversed */
        for (int i = 0; i < rank; i++)
            m->strides[i] = -m->strides[i];
    } else if (kind == 3) {                           /* stepped */
        for (int i = 0; i < rank; i++)
            m->strides[i] *= 2 + (int64_t)kf_pick(b, 2);
    } else if (kind == 4 && rank > 0) {              /* broadcast along one dimension */
        m->strides[kf_pick(b, (uint32_t)rank)] = 0;
    } else if (kind == 5) {                           /* anything small */
        for (int i = 0; i < rank; i++)
            m->strides[i] = (int64_t)kf_pick(b, 11) - 5;
    }
    m->offset = (int64_t)kf_pick(b, 17) - 8;
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < rank; i++) {
        int64_t d = (sizes[i] > 0 ? sizes[i] - 1 : 0) * m->strides[i];
        if (d < 0)
            lo += d;
        else
            hi += d;
    }
    int64_t elems = ARENA_BYTES / esize;
    int64_t span = hi - lo + 1;
    int64_t first;                                    /* element position of the lowest element */
    if (near >= 0 && !kf_one_in(b, 3))
        first = near / esize + (int64_t)kf_pick(b, 9) - 4;
    else
        first = (int64_t)kf_pick(b, (uint32_t)(elems - span));
    if (first < 0)
        first = 0;
    if (first + span > elems)
        first = elems - span;
    m->aligned = (uintptr_t)arena + (uintptr_t)((first - lo - m->offset) * esize);
    write_words(m);
}

/* Break one thing about m that the export must refuse. */
static void break_memref(kf_bytes_t *b, kf_mem_t *m)
{
    int64_t n = count_of(m->sizes, m->rank);
    m->in_arena = 0;
    switch (kf_pick(b, 8)) {
    case 0: m->null_ptr = 1; return;
    case 1: m->um.descriptor = NULL; return;
    case 2: {
        static const int64_t ranks[] = {33, -1, 1LL << 40, INT64_MIN};
        m->um.rank = ranks[kf_pick(b, 4)];
        return;
    }
    case 3:
        if (m->rank > 0) {
            m->words[3 + kf_pick(b, (uint32_t)m->rank)] = -1 - (int64_t)kf_pick(b, 3);
            return;
        }
        break;
    case 4:
        if (n > 0) {
            m->words[0] = m->words[1] = 0;            /* null data, elements to read */
            return;
        }
        break;
    case 5:
        if (n > 0) {
            static const int64_t offsets[] = {INT64_MAX, INT64_MIN, -(1LL << 62)};
            m->words[2] = offsets[kf_pick(b, 3)];
            return;
        }
        break;
    case 6:
        if (m->rank > 0) {                            /* a broadcast operand of 2^64+ bytes */
            int i = (int)kf_pick(b, (uint32_t)m->rank);
            for (int j = 0; j < m->rank; j++)
                if (m->sizes[j] == 0)
                    return (void)(m->null_ptr = 1);
            m->words[3 + i] = 1LL << 62;
            m->words[3 + m->rank + i] = 0;
            return;
        }
        break;
    case 7:
        if (m->rank > 0 && n > 1) {
            for (int i = 0; i < m->rank; i++)
                if (m->sizes[i] > 1) {
                    m->words[3 + m->rank + i] = INT64_MAX / (1 + (int64_t)kf_pick(b, 2));
                    return;
                }
        }
        break;
    }
    m->null_ptr = 1;
}

/* An empty memref with huge other sizes, garbage pointers and strides: nothing may be read. */
static void place_huge_empty(kf_bytes_t *b, kf_mem_t *m, const int64_t *sizes, int rank, int esize, int role)
{
    memset(m, 0, sizeof *m);
    m->rank = rank;
    m->esize = esize;
    m->role = role;
    m->in_arena = 1;
    for (int i = 0; i < rank; i++) {
        m->sizes[i] = sizes[i];
        m->strides[i] = kf_i64(b);
    }
    m->offset = kf_i64(b);
    m->aligned = kf_one_in(b, 2) ? 0 : (uintptr_t)0xdeadbeef000ULL;
    write_words(m);
}

/* A row-major memref of this shape at `address` (not in the arena). */
static void place_at(kf_mem_t *m, const int64_t *sizes, int rank, int esize, int role, uintptr_t address)
{
    memset(m, 0, sizeof *m);
    m->rank = rank;
    m->esize = esize;
    m->role = role;
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        m->sizes[i] = sizes[i];
        m->strides[i] = stride;
        stride *= sizes[i] > 0 ? sizes[i] : 1;
    }
    m->aligned = address;
    write_words(m);
}

/* ---- shapes for the exports with known rules -------------------------------------------- */

static int has(const char *name, const char *part) { return strstr(name, part) != NULL; }

static int random_shape(kf_bytes_t *b, int64_t *sizes, int min_rank)
{
    int rank = min_rank + (int)kf_pick(b, (uint32_t)(MAX_DIMS - min_rank));
    if (rank > 3)
        rank = 3;
    for (int i = 0; i < rank; i++)
        sizes[i] = kf_one_in(b, 8) ? 0 : 1 + (int64_t)kf_pick(b, 4);
    return rank;
}

typedef struct {
    int rank[8];
    int64_t sizes[8][MAX_DIMS];
    int64_t scalar[8];
    int64_t perm[MAX_DIMS];       /* transpose's permutation */
    int huge_empty;
} kf_call_t;

static const char *const UNARY[] = {"_neg_f32", "_exp_f32", "_log_f32", "_tanh_f32", "_sigmoid_f32",
                                    "_relu_f32"};
static const char *const BINARY[] = {"_add_f32", "_sub_f32", "_mul_f32", "_div_f32", "_pow_f32"};
static const char *const REDUCTIONS[] = {"_sum_f32", "_mean_f32", "_max_f32"};

static int has_any(const char *name, const char *const *parts, int n)
{
    for (int i = 0; i < n; i++)
        if (strstr(name, parts[i]))
            return 1;
    return 0;
}

#define IS_UNARY(name) has_any(name, UNARY, 6)
#define IS_BINARY(name) has_any(name, BINARY, 5)
#define IS_REDUCTION(name) has_any(name, REDUCTIONS, 3)
#define ALL_AXES INT32_MIN

/* An axis for rank `r`: mostly in [-r, r), sometimes anything. */
static int64_t draw_axis(kf_bytes_t *b, int r)
{
    if (kf_one_in(b, 10) || r == 0)
        return kf_scalar(b);
    return (int64_t)kf_pick(b, (uint32_t)(2 * r)) - r;
}

static void shapes_for(kf_bytes_t *b, const kf_export_t *ex, kf_call_t *c, int may_disagree)
{
    int64_t s[MAX_DIMS];
    int r = random_shape(b, s, 0);
    for (int p = 0; p < ex->nparams; p++) {       /* default: one shape for every memref */
        c->rank[p] = r;
        memcpy(c->sizes[p], s, sizeof s);
        c->scalar[p] = kf_scalar(b);
        if (strcmp(ex->params[p].name, "device") == 0)
            c->scalar[p] = kf_one_in(b, 6) ? kf_scalar(b) : 0;
        /* a reduction code or a root rank: mostly near the valid few (one
         * process: root 0; codes 0-3), sometimes anything */
        if (strcmp(ex->params[p].name, "op") == 0 || strcmp(ex->params[p].name, "root") == 0)
            c->scalar[p] = kf_one_in(b, 6) ? kf_scalar(b) : (int64_t)kf_pick(b, 5) - 1;
    }
    if (has(ex->name, "matmul")) {
        int64_t m = kf_pick(b, 4), k = kf_pick(b, 4), n = kf_pick(b, 4);
        int va = kf_one_in(b, 5), vb = kf_one_in(b, 5);
        int batch = kf_one_in(b, 4) ? 1 + (int)kf_pick(b, 3) : 0;
        int64_t bs = batch ? (int64_t)kf_pick(b, 3) : 1;
        int ra = 0, rb = 0, ro = 0;
        if (batch) {
            c->sizes[1][ra++] = bs; c->sizes[2][rb++] = kf_one_in(b, 2) ? 1 : bs; c->sizes[0][ro++] = bs;
        }
        if (!va) { c->sizes[1][ra++] = m; c->sizes[0][ro++] = m; }
        c->sizes[1][ra++] = k;
        c->sizes[2][rb++] = k;
        if (!vb) { c->sizes[2][rb++] = n; c->sizes[0][ro++] = n; }
        c->rank[0] = ro; c->rank[1] = ra; c->rank[2] = rb;
    } else if (has(ex->name, "gather")) {
        int rv = 1 + (int)kf_pick(b, 2), ri = (int)kf_pick(b, 3);
        c->rank[1] = rv;
        c->sizes[1][0] = kf_pick(b, 5);
        for (int i = 1; i < rv; i++)
            c->sizes[1][i] = kf_pick(b, 4);
        c->rank[2] = ri;
        for (int i = 0; i < ri; i++)
            c->sizes[2][i] = kf_pick(b, 4);
        c->rank[0] = ri + rv - 1;
        for (int i = 0; i < ri; i++)
            c->sizes[0][i] = c->sizes[2][i];
        for (int i = 1; i < rv; i++)
            c->sizes[0][ri + i - 1] = c->sizes[1][i];
    } else if (has(ex->name, "gpu_softmax") || has(ex->name, "repeat_interleave")) {
        int rx = random_shape(b, s, 1);
        c->rank[0] = c->rank[1] = rx;
        memcpy(c->sizes[0], s, sizeof s);
        memcpy(c->sizes[1], s, sizeof s);
        int64_t axis = kf_one_in(b, 10) ? kf_scalar(b) : (int64_t)kf_pick(b, (uint32_t)(2 * rx)) - rx;
        c->scalar[2] = axis;
        if (has(ex->name, "repeat")) {
            int64_t reps = kf_one_in(b, 10) ? kf_scalar(b) : (int64_t)kf_pick(b, 4);
            c->scalar[3] = reps;
            if (axis >= -rx && axis < rx && reps >= 0)
                c->sizes[0][(axis + rx) % rx] *= reps;
        }
    } else if (has(ex->name, "log_softmax")) {
        int rx = random_shape(b, s, 1);
        c->rank[0] = c->rank[1] = rx;
        memcpy(c->sizes[0], s, sizeof s);
        memcpy(c->sizes[1], s, sizeof s);
        c->scalar[2] = draw_axis(b, rx);
    } else if (IS_BINARY(ex->name)) {                 /* broadcasting: suffixes, 1s */
        int ro = random_shape(b, s, 0);
        int64_t out[MAX_DIMS] = {0};
        for (int p = 1; p <= 2; p++) {
            int drop = kf_one_in(b, 3) ? (int)kf_pick(b, (uint32_t)ro + 1) : 0;
            c->rank[p] = ro - drop;
            for (int i = 0; i < c->rank[p]; i++)
                c->sizes[p][i] = kf_one_in(b, 3) ? 1 : s[drop + i];
        }
        for (int i = 0; i < ro; i++) {                 /* NumPy's broadcast, right-aligned */
            int64_t n = 1;
            for (int p = 1; p <= 2; p++) {
                int j = i - (ro - c->rank[p]);
                if (j >= 0 && c->sizes[p][j] != 1)
                    n = c->sizes[p][j];
            }
            out[i] = n;
        }
        c->rank[0] = ro;
        memcpy(c->sizes[0], out, sizeof out);
    } else if (IS_REDUCTION(ex->name)) {
        int rx = random_shape(b, s, 0);
        c->rank[1] = rx;
        memcpy(c->sizes[1], s, sizeof s);
        int64_t axis = kf_one_in(b, 4) ? ALL_AXES : draw_axis(b, rx);
        int64_t keep = kf_one_in(b, 12) ? kf_scalar(b) : (int64_t)kf_pick(b, 2);
        c->scalar[2] = axis;
        c->scalar[3] = keep;
        int ro = 0;
        for (int i = 0; i < rx; i++) {
            int reduced = axis == ALL_AXES || (axis >= -rx && axis < rx && (axis + rx) % rx == i);
            if (!reduced)
                c->sizes[0][ro++] = s[i];
            else if (keep == 1)
                c->sizes[0][ro++] = 1;
        }
        c->rank[0] = ro;
    } else if (has(ex->name, "transpose")) {
        int rx = random_shape(b, s, 1);
        c->rank[1] = rx;
        memcpy(c->sizes[1], s, sizeof s);
        for (int i = 0; i < rx; i++)                   /* a random permutation */
            c->perm[i] = i;
        for (int i = rx - 1; i > 0; i--) {
            int j = (int)kf_pick(b, (uint32_t)i + 1);
            int64_t t = c->perm[i];
            c->perm[i] = c->perm[j];
            c->perm[j] = t;
        }
        c->rank[2] = 1;
        c->sizes[2][0] = rx;
        c->rank[0] = rx;
        for (int i = 0; i < rx; i++)
            c->sizes[0][i] = s[c->perm[i]];
    } else if (has(ex->name, "cross_entropy")) {
        int rx = random_shape(b, s, 1);
        c->rank[1] = rx;
        memcpy(c->sizes[1], s, sizeof s);
        c->rank[2] = rx - 1;
        memcpy(c->sizes[2], s, sizeof s);
        c->rank[0] = 0;
    }
    /* Sometimes an empty shape with huge other sizes, the same for every memref. */
    if ((has(ex->name, "copy") || has(ex->name, "gpu_softmax")) && kf_one_in(b, 12)) {
        int rx = 2 + (int)kf_pick(b, 2);
        int zero = (int)kf_pick(b, (uint32_t)rx);
        for (int p = 0; p < 2; p++) {
            c->rank[p] = rx;
            for (int i = 0; i < rx; i++)
                c->sizes[p][i] = i == zero ? 0 : (1LL << 40) + (int64_t)kf_pick(b, 3);
        }
        c->huge_empty = 1;
    }
    if (may_disagree && kf_one_in(b, 10)) {       /* a shape that disagrees */
        int p = (int)kf_pick(b, (uint32_t)ex->nparams);
        if (ex->params[p].kind == KF_MEMREF && c->rank[p] > 0)
            c->sizes[p][kf_pick(b, (uint32_t)c->rank[p])] += 1;
    }
}

/* ---- values ------------------------------------------------------------------------------ */

static double read_f32(const uint8_t *base, int64_t pos)
{
    float f;
    memcpy(&f, base + pos, 4);
    return f;
}

static int64_t read_i64(const uint8_t *base, int64_t pos)
{
    int64_t v;
    memcpy(&v, base + pos, 8);
    return v;
}

/* Index of k-th element (row-major) of a shape, digit by digit. */
static void unravel(int64_t k, const int64_t *sizes, int rank, int64_t *idx)
{
    for (int i = rank - 1; i >= 0; i--) {
        idx[i] = sizes[i] ? k % sizes[i] : 0;
        k = sizes[i] ? k / sizes[i] : 0;
    }
}

static int64_t ravel(const int64_t *idx, const int64_t *sizes, int rank)
{
    int64_t k = 0;
    for (int i = 0; i < rank; i++)
        k = k * sizes[i] + idx[i];
    return k;
}

static void check_close(double got, double want, double tol, const char *what, int64_t k)
{
    if ((isnan(want) && isnan(got)) || (isinf(want) && got == want))
        return;
    KF_CHECK(fabs(got - want) <= tol * (1.0 + fabs(want)), "%s: element %lld is %.9g, reference %.9g",
             what, (long long)k, got, want);
}

/* Outputs against a reference computed from `before` (the operands before the call). */
static void check_reference(const kf_export_t *ex, kf_call_t *c)
{
    kf_mem_t *o = &mems[0];
    int64_t n = count_of(o->sizes, o->rank), idx[2 * MAX_DIMS], j[2 * MAX_DIMS];
    if (has(ex->name, "copy") || has(ex->name, "all_reduce") || has(ex->name, "_broadcast_f32")) {
        /* the collectives of one process (no group in scope) are copies */
        kf_mem_t *s = &mems[1];
        for (int64_t k = 0; k < n; k++)
            KF_CHECK(memcmp(arena + element_pos(o, k), before + element_pos(s, k), (size_t)o->esize) == 0,
                     "%s: element %lld is not the source's", ex->name, (long long)k);
    } else if (has(ex->name, "matmul")) {
        kf_mem_t *a = &mems[1], *bm = &mems[2];
        int ra = a->rank, rb = bm->rank, ro = o->rank;
        int64_t kdim = a->sizes[ra - 1];
        for (int64_t k = 0; k < n; k++) {
            unravel(k, o->sizes, ro, idx);
            /* the output index: [batch] [m if a is a matrix] [n if b is a matrix] */
            int64_t bi = 0, mi = 0, ni = 0;
            int p = 0;
            if (ra > 2 || rb > 2)
                bi = idx[p++];
            if (ra >= 2)
                mi = idx[p++];
            if (rb >= 2)
                ni = idx[p++];
            double sum = 0;
            for (int64_t q = 0; q < kdim; q++) {
                int64_t ia[MAX_DIMS], ib[MAX_DIMS];
                int x = 0;
                if (ra > 2) ia[x++] = a->sizes[0] == 1 ? 0 : bi;
                if (ra >= 2) ia[x++] = mi;
                ia[x++] = q;
                x = 0;
                if (rb > 2) ib[x++] = bm->sizes[0] == 1 ? 0 : bi;
                ib[x++] = q;
                if (rb >= 2) ib[x++] = ni;
                sum += read_f32(before, element_pos(a, ravel(ia, a->sizes, ra)))
                     * read_f32(before, element_pos(bm, ravel(ib, bm->sizes, rb)));
            }
            check_close(read_f32(arena, element_pos(o, k)), sum, 1e-5, ex->name, k);
        }
    } else if (has(ex->name, "gather")) {
        kf_mem_t *v = &mems[1], *ind = &mems[2];
        int ri = ind->rank;
        for (int64_t k = 0; k < n; k++) {
            unravel(k, o->sizes, o->rank, idx);
            int64_t row = read_i64(before, element_pos(ind, ravel(idx, ind->sizes, ri)));
            j[0] = row;
            for (int i = 1; i < v->rank; i++)
                j[i] = idx[ri + i - 1];
            KF_CHECK(memcmp(arena + element_pos(o, k), before + element_pos(v, ravel(j, v->sizes, v->rank)), 4) == 0,
                     "%s: element %lld is not row %lld's", ex->name, (long long)k, (long long)row);
        }
    } else if (has(ex->name, "gpu_softmax")) {
        kf_mem_t *x = &mems[1];
        int r = x->rank, axis = (int)((c->scalar[2] + r) % r);
        for (int64_t k = 0; k < n; k++) {
            unravel(k, o->sizes, r, idx);
            memcpy(j, idx, sizeof idx);
            double mx = -INFINITY, sum = 0;
            for (j[axis] = 0; j[axis] < x->sizes[axis]; j[axis]++)
                mx = fmax(mx, read_f32(before, element_pos(x, ravel(j, x->sizes, r))));
            for (j[axis] = 0; j[axis] < x->sizes[axis]; j[axis]++)
                sum += exp(read_f32(before, element_pos(x, ravel(j, x->sizes, r))) - mx);
            double want = exp(read_f32(before, element_pos(x, k)) - mx) / sum;
            check_close(read_f32(arena, element_pos(o, k)), want, 1e-5, ex->name, k);
        }
    } else if (has(ex->name, "repeat_interleave")) {
        kf_mem_t *x = &mems[1];
        int r = x->rank, axis = (int)((c->scalar[2] + r) % r);
        int64_t reps = c->scalar[3];
        for (int64_t k = 0; k < n; k++) {
            unravel(k, o->sizes, r, idx);
            idx[axis] /= reps;
            KF_CHECK(memcmp(arena + element_pos(o, k), before + element_pos(x, ravel(idx, x->sizes, r)), 4) == 0,
                     "%s: element %lld is not the repeated one", ex->name, (long long)k);
        }
    } else if (IS_UNARY(ex->name)) {
        kf_mem_t *x = &mems[1];
        for (int64_t k = 0; k < n; k++) {
            double v = read_f32(before, element_pos(x, k));
            double want = has(ex->name, "_neg_") ? -v : has(ex->name, "_exp_") ? exp(v)
                        : has(ex->name, "_log_") ? log(v) : has(ex->name, "_tanh_") ? tanh(v)
                        : has(ex->name, "_sigmoid_") ? 1 / (1 + exp(-v)) : (v > 0 ? v : 0);
            check_close(read_f32(arena, element_pos(o, k)), (float)want, 1e-6, ex->name, k);
        }
    } else if (IS_BINARY(ex->name)) {
        kf_mem_t *a = &mems[1], *bm = &mems[2];
        int ro = o->rank;
        for (int64_t k = 0; k < n; k++) {
            int64_t ia[MAX_DIMS], ib[MAX_DIMS];
            unravel(k, o->sizes, ro, idx);
            for (int i = 0; i < a->rank; i++)             /* right-aligned; size 1 broadcasts */
                ia[i] = a->sizes[i] == 1 ? 0 : idx[ro - a->rank + i];
            for (int i = 0; i < bm->rank; i++)
                ib[i] = bm->sizes[i] == 1 ? 0 : idx[ro - bm->rank + i];
            float x = (float)read_f32(before, element_pos(a, ravel(ia, a->sizes, a->rank)));
            float y = (float)read_f32(before, element_pos(bm, ravel(ib, bm->sizes, bm->rank)));
            double want = has(ex->name, "_add_") ? x + y : has(ex->name, "_sub_") ? x - y
                        : has(ex->name, "_mul_") ? (double)x * y : has(ex->name, "_div_") ? (double)x / y
                        : pow(x, y);
            check_close(read_f32(arena, element_pos(o, k)), (float)want, 1e-6, ex->name, k);
        }
    } else if (IS_REDUCTION(ex->name)) {
        kf_mem_t *x = &mems[1];
        int r = x->rank;
        int64_t axis = c->scalar[2];
        for (int64_t k = 0; k < n; k++) {                 /* every x element that maps to out[k] */
            double acc = has(ex->name, "_max_") ? -INFINITY : 0;
            int64_t count = 0, total = count_of(x->sizes, r);
            unravel(k, o->sizes, o->rank, idx);
            for (int64_t q = 0; q < total; q++) {
                int64_t xi[MAX_DIMS];
                unravel(q, x->sizes, r, xi);
                int match = 1;
                for (int i = 0, oi = 0; i < r; i++) {
                    int reduced = axis == ALL_AXES || (axis + r) % r == i;
                    if (!reduced)
                        match &= xi[i] == idx[oi++];
                    else if (c->scalar[3] == 1)
                        oi++;
                }
                if (!match)
                    continue;
                double v = read_f32(before, element_pos(x, q));
                acc = has(ex->name, "_max_") ? fmax(acc, v) : acc + v;
                count++;
            }
            double want = has(ex->name, "_mean_") ? acc / (double)count : acc;
            check_close(read_f32(arena, element_pos(o, k)), want, 1e-4, ex->name, k);
        }
    } else if (has(ex->name, "transpose")) {
        kf_mem_t *x = &mems[1];
        for (int64_t k = 0; k < n; k++) {
            int64_t xi[MAX_DIMS];
            unravel(k, o->sizes, o->rank, idx);
            for (int i = 0; i < o->rank; i++)
                xi[c->perm[i]] = idx[i];
            KF_CHECK(memcmp(arena + element_pos(o, k), before + element_pos(x, ravel(xi, x->sizes, x->rank)), 4) == 0,
                     "%s: element %lld is not the transposed one", ex->name, (long long)k);
        }
    } else if (has(ex->name, "log_softmax")) {
        kf_mem_t *x = &mems[1];
        int r = x->rank, axis = (int)((c->scalar[2] + r) % r);
        for (int64_t k = 0; k < n; k++) {
            unravel(k, o->sizes, r, idx);
            memcpy(j, idx, sizeof idx);
            double mx = -INFINITY, sum = 0;
            for (j[axis] = 0; j[axis] < x->sizes[axis]; j[axis]++)
                mx = fmax(mx, read_f32(before, element_pos(x, ravel(j, x->sizes, r))));
            for (j[axis] = 0; j[axis] < x->sizes[axis]; j[axis]++)
                sum += exp(read_f32(before, element_pos(x, ravel(j, x->sizes, r))) - mx);
            double want = read_f32(before, element_pos(x, k)) - mx - log(sum);
            check_close(read_f32(arena, element_pos(o, k)), want, 1e-5, ex->name, k);
        }
    } else if (has(ex->name, "cross_entropy")) {
        kf_mem_t *z = &mems[1], *lab = &mems[2];
        int r = z->rank;
        int64_t classes = z->sizes[r - 1], samples = count_of(lab->sizes, lab->rank), zi[MAX_DIMS];
        double total = 0;
        for (int64_t q = 0; q < samples; q++) {
            unravel(q, lab->sizes, lab->rank, zi);
            int64_t label = read_i64(before, element_pos(lab, q));
            double mx = -INFINITY, sum = 0;
            for (zi[r - 1] = 0; zi[r - 1] < classes; zi[r - 1]++)
                mx = fmax(mx, read_f32(before, element_pos(z, ravel(zi, z->sizes, r))));
            for (zi[r - 1] = 0; zi[r - 1] < classes; zi[r - 1]++)
                sum += exp(read_f32(before, element_pos(z, ravel(zi, z->sizes, r))) - mx);
            zi[r - 1] = label;
            total -= read_f32(before, element_pos(z, ravel(zi, z->sizes, r))) - mx - log(sum);
        }
        check_close(read_f32(arena, element_pos(o, 0)), total / (double)samples, 1e-5, ex->name, 0);
    }
}

/* ---- alloc ------------------------------------------------------------------------------- */

static int64_t allocs_since_free;

static void fuzz_alloc(kf_bytes_t *b, const kf_export_t *ex)
{
    kf_mem_t *m = &mems[0];
    memset(m, 0, sizeof *m);
    int rank = (int)kf_pick(b, 4);
    m->rank = rank;
    int64_t elems = 1;
    for (int i = 0; i < rank; i++) {
        switch (kf_pick(b, 10)) {
        case 0: m->sizes[i] = 0; break;
        case 1: m->sizes[i] = 1LL << (40 + kf_pick(b, 23)); break;   /* more than any host has */
        case 2: m->sizes[i] = -1; break;
        default: m->sizes[i] = 1 + (int64_t)kf_pick(b, 16); break;
        }
        elems *= m->sizes[i] > 0 ? m->sizes[i] : 0;
    }
    static const int32_t sizes[] = {2, 4, 8, 4, 8, 0, 3, -4};
    int32_t esize = kf_one_in(b, 8) ? kf_scalar(b) : sizes[kf_pick(b, 8)];
    write_words(m);
    m->words[0] = m->words[1] = 0;
    for (int i = 0; i < rank; i++)
        m->words[3 + rank + i] = 0;
    memcpy(m->saved, m->words, sizeof m->words);
    kina_unranked_memref_t um_before = m->um;
    void *args[8] = {&m->um};
    int64_t scalars[8] = {0, esize};
    int32_t status = ex->call(args, scalars);
    count_outcome(ex, status);
    kf_check_failure_message(status, ex->name);
    KF_CHECK(status == 0 || status == 1 || status == 2 || status == 6, "alloc: status %d", status);
    KF_CHECK(memcmp(&um_before, &m->um, sizeof um_before) == 0, "alloc changed the {rank, descriptor} struct");
    int bad_size = 0;
    for (int i = 0; i < rank; i++)
        bad_size |= m->sizes[i] < 0;
    if (bad_size)
        KF_CHECK(status == 1, "alloc of a negative size: status %d", status);
    else if (esize != 2 && esize != 4 && esize != 8)
        KF_CHECK(status == 6, "alloc with element_size %d: status %d", esize, status);
    if (status != 0) {
        KF_CHECK(memcmp(m->saved, m->words, sizeof m->words) == 0, "a failed alloc wrote the descriptor");
        return;
    }
    allocs_since_free++;
    int64_t aligned = m->words[1];
    KF_CHECK(m->words[0] == aligned && aligned != 0 && aligned % 64 == 0 && m->words[2] == 0,
             "alloc: allocated %llx aligned %llx offset %lld", (long long)m->words[0], (long long)aligned,
             (long long)m->words[2]);
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        KF_CHECK(m->words[3 + i] == m->sizes[i], "alloc changed size %d", i);
        KF_CHECK(m->words[3 + rank + i] == stride, "alloc: stride %d is %lld, row-major is %lld", i,
                 (long long)m->words[3 + rank + i], (long long)stride);
        stride *= m->sizes[i] > 0 ? m->sizes[i] : 1;
    }
    if (elems * esize <= (1 << 20))
        memset((void *)(intptr_t)aligned, 0xAB, (size_t)(elems * esize));   /* the buffer is there */
    static int64_t last;
    KF_CHECK(aligned != last || allocs_since_free == 1, "alloc returned the same buffer twice");
    last = aligned;
}

/* Whether every floating memref of the call has one shape, of rank >= 1 (so
 * that making dimension 0 2^40 larger in all of them keeps the call valid). */
static int same_floating_shapes(const kf_export_t *ex, const kf_call_t *c)
{
    int first = -1;
    for (int p = 0; p < ex->nparams; p++) {
        if (ex->params[p].kind != KF_MEMREF || ex->params[p].esize == 8)
            continue;
        if (c->rank[p] == 0)
            return 0;
        if (first < 0)
            first = p;
        else if (c->rank[p] != c->rank[first]
                 || memcmp(c->sizes[p], c->sizes[first], sizeof(int64_t) * (size_t)c->rank[p]) != 0)
            return 0;
    }
    return first >= 0;
}

/* ---- the target -------------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    setenv("KINA_FX_DEVICE", "cpu", 1);
    long page = sysconf(_SC_PAGESIZE);
    uint8_t *region = mmap(NULL, ARENA_BYTES + 2 * (size_t)page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        abort();
    mprotect(region, (size_t)page, PROT_NONE);
    mprotect(region + page + ARENA_BYTES, (size_t)page, PROT_NONE);
    arena = region + page;
    if (getenv("KINA_FUZZ_STATS"))
        atexit(print_outcomes);
    untouchable = mmap(NULL, POISON_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (untouchable == MAP_FAILED)
        abort();
    if (runtime_gpu_free_all() != 0) {    /* starts Python once, before the first input */
        fprintf(stderr, "fuzz_memref: the library does not start: %s\n", kina_last_error());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kf_bytes_t b = {data, size};
    const kf_export_t *ex = &KF_EXPORTS[kf_pick(&b, KF_NEXPORTS)];
    if (ex->nparams == 0) {
        int32_t status = ex->call(NULL, NULL);
        count_outcome(ex, status);
        KF_CHECK(status == 0, "%s: status %d", ex->name, status);
        allocs_since_free = 0;
        return 0;
    }
    if (ex->params[0].role == KF_ALLOC) {
        fuzz_alloc(&b, ex);
        if (allocs_since_free > 64) {
            KF_CHECK(runtime_gpu_free_all() == 0, "free_all failed");
            allocs_since_free = 0;
        }
        return 0;
    }

    /* Values: small multiples of 1/4 (exact in float arithmetic), indices mostly in range. */
    for (int64_t i = 0; i < ARENA_BYTES / 4; i++) {
        float f = (float)((int)((i * 2654435761u + size * 40503u) >> 7) % 17 - 8) / 4.0f;
        memcpy(arena + 4 * i, &f, 4);
    }
    kf_call_t c;
    memset(&c, 0, sizeof c);
    /* see the file's comment; never the default of an input that ran out of bytes */
    int check_order = kf_pick(&b, 8) == 7;
    shapes_for(&b, ex, &c, !check_order);
    int huge = 0;
    if (check_order) {
        if (c.huge_empty)
            return 0;
        huge = kf_pick(&b, 2) == 1 && same_floating_shapes(ex, &c);
        for (int p = 0; huge && p < ex->nparams; p++)
            if (ex->params[p].kind == KF_MEMREF && ex->params[p].esize != 8)
                c.sizes[p][0] += 1LL << 40;
        if (c.rank[0] > 0) {                          /* the output's shape disagrees */
            c.sizes[0][0] += 1;
        } else {
            c.rank[0] = 1;
            c.sizes[0][0] = 1;
        }
    }
    void *args[8] = {0};
    int64_t near = -1;
    int shape_ok = 1;
    for (int p = 0; p < ex->nparams; p++) {
        const kf_param_t *pp = &ex->params[p];
        if (pp->kind != KF_MEMREF)
            continue;
        kf_mem_t *m = &mems[p];
        int64_t n = count_of(c.sizes[p], c.rank[p]);
        if (check_order && pp->esize != 8) {         /* floating: where nothing may be read */
            place_at(m, c.sizes[p], c.rank[p], pp->esize, pp->role, (uintptr_t)untouchable);
            continue;
        }
        if (c.huge_empty && p < 2)
            place_huge_empty(&b, m, c.sizes[p], c.rank[p], pp->esize, pp->role);
        else if (n * pp->esize > ARENA_BYTES / 4)
            return 0;                               /* too big for the arena: not interesting */
        else
            place(&b, m, c.sizes[p], c.rank[p], pp->esize, pp->role, near);
        if (m->in_arena && !c.huge_empty && n > 0)
            near = element_pos(m, 0);
        if (pp->esize == 8 && !c.huge_empty && n > 0) {   /* int64 indices, labels, permutations */
            int64_t rows = 4;
            if (p >= 2 && has(ex->name, "gather"))
                rows = c.sizes[1][0];
            else if (p >= 2 && has(ex->name, "cross_entropy"))
                rows = c.sizes[1][c.rank[1] - 1];          /* the classes */
            int perm = has(ex->name, "transpose");
            for (int64_t k = 0; k < n; k++) {
                int64_t v = kf_one_in(&b, 16) ? kf_i64(&b)
                          : perm && k < MAX_DIMS ? c.perm[k]
                          : (rows ? (int64_t)kf_pick(&b, (uint32_t)rows) : 0);
                memcpy(arena + element_pos(m, k), &v, 8);
            }
        }
    }
    (void)shape_ok;
    int broken = -1;
    if (!check_order && kf_one_in(&b, 10)) {
        int p = (int)kf_pick(&b, (uint32_t)ex->nparams);
        if (ex->params[p].kind == KF_MEMREF && !c.huge_empty) {
            break_memref(&b, &mems[p]);
            broken = p;
        }
    }
    int64_t scalars[8] = {0};
    for (int p = 0; p < ex->nparams; p++) {
        if (ex->params[p].kind == KF_MEMREF) {
            memcpy(mems[p].saved, mems[p].words, sizeof mems[p].words);
            args[p] = mems[p].null_ptr ? NULL : &mems[p].um;
        } else {
            scalars[p] = c.scalar[p];
        }
    }
    memcpy(before, arena, ARENA_BYTES);

    int32_t status = ex->call(args, scalars);
    count_outcome(ex, status);

    kf_check_failure_message(status, ex->name);
    KF_CHECK(status == 0 || status == 1 || status == 2 || status == 4 || status == 6,
             "%s: status %d is not one a memref export returns on the CPU", ex->name, status);
    for (int p = 0; p < ex->nparams; p++)
        if (ex->params[p].kind == KF_MEMREF)
            KF_CHECK(memcmp(mems[p].saved, mems[p].words, sizeof mems[p].words) == 0,
                     "%s: the descriptor of %s changed", ex->name, ex->params[p].name);
    if (broken >= 0)
        KF_CHECK(status != 0, "%s: malformed %s accepted", ex->name, ex->params[broken].name);
    if (check_order) {
        check_order_calls[huge]++;
        KF_CHECK(status == 1, "%s: a call whose output shape disagrees, its floating operands %s where "
                 "nothing may be read: status %d (validation comes before any copy or allocation: 1)",
                 ex->name, huge ? "of 2^40 elements" : "", status);
    }
    if (status != 0) {
        KF_CHECK(memcmp(before, arena, ARENA_BYTES) == 0, "%s: a failed call (status %d) wrote memory",
                 ex->name, status);
        return 0;
    }
    /* Success: only output elements written, and no accepted output aliases itself. */
    memset(written, 0, sizeof written);
    for (int p = 0; p < ex->nparams; p++) {
        kf_mem_t *m = &mems[p];
        if (ex->params[p].kind != KF_MEMREF || m->role != KF_OUT || c.huge_empty)
            continue;
        int64_t n = count_of(m->sizes, m->rank);
        for (int64_t k = 0; k < n; k++) {
            int64_t pos = element_pos(m, k);
            for (int i = 0; i < m->esize; i++) {
                KF_CHECK(written[pos + i] != 2 + p, "%s: output %s has two indices on one element, accepted",
                         ex->name, ex->params[p].name);
                written[pos + i] = (uint8_t)(2 + p);
            }
        }
    }
    for (int64_t i = 0; i < ARENA_BYTES; i++)
        KF_CHECK(written[i] || arena[i] == before[i], "%s: byte %lld outside every output was written",
                 ex->name, (long long)i);
    if (!c.huge_empty)
        check_reference(ex, &c);
    return 0;
}
