/*
 * Helpers shared by the bench programs: percentiles of nanosecond samples
 * and the ABBA order of A/B rounds.
 *
 * ABBA: round r runs A then B when r is even, B then A when r is odd, so
 * rounds go A B | B A | A B | ... and a drift in time (a warming cache, a
 * neighbour's load) weighs on both sides alike instead of on whichever
 * always runs second.
 *
 * Header-only (static inline): each bench is one .c file (Makefile).
 */
#ifndef VN_BENCH_STATS_H
#define VN_BENCH_STATS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Samples one bench takes at most per side: 16 MiB of uint64_t. */
#define VN_BENCH_MAX_SAMPLES 2000000
/* Rounds of an A/B bench at most (per-round results are kept in arrays). */
#define VN_BENCH_MAX_ROUNDS 64

/*
 * The optional [ROUNDS] [SAMPLES] that follow an A/B bench's two sockets
 * (argv[3], argv[4]), with its defaults; false after saying what is allowed.
 */
static inline bool vn_bench_args(int argc, char **argv, const char *name, int def_rounds,
                                 int def_samples, int *rounds, int *samples)
{
    *rounds = argc > 3 ? atoi(argv[3]) : def_rounds;
    *samples = argc > 4 ? atoi(argv[4]) : def_samples;
    if (*rounds < 1 || *rounds > VN_BENCH_MAX_ROUNDS || *samples < 10 ||
        (uint64_t)*samples * (uint64_t)*rounds > VN_BENCH_MAX_SAMPLES) {
        fprintf(stderr, "%s: ROUNDS 1..%d, SAMPLES >= 10, at most %d in all\n", name,
                VN_BENCH_MAX_ROUNDS, VN_BENCH_MAX_SAMPLES);
        return false;
    }
    return true;
}

static inline int vn_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* The @pct-th percentile (0..100) of @n samples; sorts them in place. */
static inline uint64_t vn_bench_pct(uint64_t *v, size_t n, unsigned pct)
{
    size_t i;

    if (n == 0) {
        return 0;
    }
    qsort(v, n, sizeof(v[0]), vn_bench_cmp_u64);
    i = n * pct / 100;
    return v[i < n ? i : n - 1];
}

/* The same on a copy: @v keeps its order. */
static inline uint64_t vn_bench_pct_copy(const uint64_t *v, size_t n, unsigned pct)
{
    uint64_t *c = malloc(n * sizeof(v[0]) + 1);
    uint64_t r;

    if (c == NULL) {
        return 0;
    }
    memcpy(c, v, n * sizeof(v[0]));
    r = vn_bench_pct(c, n, pct);
    free(c);
    return r;
}

/* Does round @r run side A first?  (ABBA, see above.) */
static inline bool vn_bench_a_first(unsigned r)
{
    return r % 2 == 0;
}

#endif /* VN_BENCH_STATS_H */
