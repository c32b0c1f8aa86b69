/* Shared by the fuzz targets: reading structured choices out of libFuzzer's
 * bytes, and reporting a broken promise of docs/abi.md as a crash (abort),
 * which libFuzzer saves as a reproducer. */
#ifndef KINA_FUZZ_COMMON_H
#define KINA_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kina_fx.h"

typedef struct {
    const uint8_t *p;
    size_t n;
} kf_bytes_t;

static inline uint8_t kf_u8(kf_bytes_t *b)
{
    if (b->n == 0)
        return 0;
    b->n--;
    return *b->p++;
}

/* A choice in [0, n). */
static inline uint32_t kf_pick(kf_bytes_t *b, uint32_t n)
{
    uint32_t v = kf_u8(b);
    v = (v << 8) | kf_u8(b);
    return n ? v % n : 0;
}

/* True with probability about 1/n. */
static inline int kf_one_in(kf_bytes_t *b, uint32_t n)
{
    return kf_pick(b, n) == 0;
}

static inline int64_t kf_i64(kf_bytes_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | kf_u8(b);
    return (int64_t)v;
}

/* An int32 scalar: mostly small, sometimes an extreme. */
static inline int32_t kf_scalar(kf_bytes_t *b)
{
    switch (kf_pick(b, 8)) {
    case 0: return INT32_MIN;
    case 1: return INT32_MAX;
    case 2: return (int32_t)kf_i64(b);
    default: return (int32_t)kf_pick(b, 9) - 4;
    }
}

#define KF_FAIL(...)                                                                  \
    do {                                                                              \
        fprintf(stderr, "CONTRACT BROKEN (%s:%d): ", __FILE__, __LINE__);             \
        fprintf(stderr, __VA_ARGS__);                                                 \
        fprintf(stderr, "\n  kina_last_error: %s\n", kina_last_error());              \
        abort();                                                                      \
    } while (0)

#define KF_CHECK(cond, ...)                                                           \
    do {                                                                              \
        if (!(cond))                                                                  \
            KF_FAIL(__VA_ARGS__);                                                     \
    } while (0)

/* A failed call has a message; the message is text of bounded length. */
static inline void kf_check_failure_message(int32_t status, const char *what)
{
    const char *msg = kina_last_error();
    KF_CHECK(msg != NULL, "%s: kina_last_error() is NULL", what);
    size_t len = strnlen(msg, 2048);
    KF_CHECK(len < 1024, "%s: kina_last_error() longer than 1023 bytes", what);
    if (status != 0)
        KF_CHECK(len > 0, "%s: status %d with an empty kina_last_error()", what, status);
}

#endif
