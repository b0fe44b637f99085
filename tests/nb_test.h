// nb_test.h: the tiny assertion kit every host test uses. A failing CHECK
// prints file:line and the expression and makes the test exit non-zero; a
// test that cannot run (missing ../shared data) exits with NB_TEST_SKIP (77),
// which ctest reports as skipped.
#ifndef NB_TEST_H
#define NB_TEST_H

#include <stdio.h>
#include <stdlib.h>

#define NB_TEST_SKIP 77

// Iteration count for heavy tests: full in normal builds, reduced under the
// sanitizers (NB_TEST_SANITIZE), which run 5-20x slower.
#ifdef NB_TEST_SANITIZE
#define NB_TEST_SCALE(full, sanitized) (sanitized)
#else
#define NB_TEST_SCALE(full, sanitized) (full)
#endif

static int nb_test_failures = 0;
static long nb_test_checks = 0;

#define CHECK(x)                                                              \
    do {                                                                      \
        nb_test_checks++;                                                     \
        if (!(x)) {                                                           \
            nb_test_failures++;                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__,  \
                    #x);                                                      \
            if (nb_test_failures > 20) exit(1);                               \
        }                                                                     \
    } while (0)

#define CHECKF(x, ...)                                                        \
    do {                                                                      \
        nb_test_checks++;                                                     \
        if (!(x)) {                                                           \
            nb_test_failures++;                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__,  \
                    #x);                                                      \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            if (nb_test_failures > 20) exit(1);                               \
        }                                                                     \
    } while (0)

// Print the summary and return the process exit code.
static inline int nb_test_finish(const char *name) {
    printf("%s: %ld checks, %d failed\n", name, nb_test_checks, nb_test_failures);
    return nb_test_failures ? 1 : 0;
}

static inline const char *nb_test_shared_dir(void) {
    const char *d = getenv("NB_SHARED_DIR");
    return (d && *d) ? d : "../shared";
}

#endif // NB_TEST_H
