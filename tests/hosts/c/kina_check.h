/* The check macro the C test hosts share: counts checks, prints each failure
 * with kina_last_error(), and lets main() report "N checks passed". */
#ifndef KINA_CHECK_H
#define KINA_CHECK_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kina_fx.h"

static int checks = 0, failures = 0;
static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER; /* hosts with threads */

#define CHECK(cond)                                                                   \
    do {                                                                              \
        int ok__ = (cond);                                                            \
        pthread_mutex_lock(&check_lock);                                              \
        checks++;                                                                     \
        if (!ok__) {                                                                  \
            failures++;                                                               \
            printf("FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,     \
                   kina_last_error());                                                \
        }                                                                             \
        pthread_mutex_unlock(&check_lock);                                            \
    } while (0)

/* Does kina_last_error() contain `word` (case-insensitive)? */
static inline int err_has(const char *word)
{
    const char *e = kina_last_error();
    if (e == NULL || word == NULL)
        return e != NULL;
    size_t n = strlen(word);
    for (const char *p = e; *p; p++)
        if (strncasecmp(p, word, n) == 0)
            return 1;
    return 0;
}

#endif /* KINA_CHECK_H */
