/*
 * The mutex and condition variable of the few structs that threads share
 * (the simulated device's engine, the irq table, the NVMe model, the fabric
 * registry): POSIX threads', behind GLib-like names.
 *
 * Why not GMutex/GCond: on Linux GLib implements them with raw futex calls,
 * which ThreadSanitizer cannot see, so every access they guard reads as a
 * race and `make check-tsan` would say nothing true.  pthread's are what
 * GThread runs on anyway, and TSan understands them.
 *
 * Errors: pthread's mutex and condition calls fail only on misuse (an
 * uninitialised or foreign lock), which is a bug here, never peer input.
 */
#ifndef VN_LOCK_H
#define VN_LOCK_H

#include <glib.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef struct VnMutex {
    pthread_mutex_t m;
} VnMutex;

/* For a static VnMutex; others use vn_mutex_init(). */
#define VN_MUTEX_INIT             \
    {                             \
        PTHREAD_MUTEX_INITIALIZER \
    }

typedef struct VnCond {
    pthread_cond_t c;
} VnCond;

static inline void vn_mutex_init(VnMutex *m)
{
    pthread_mutex_init(&m->m, NULL);
}

static inline void vn_mutex_clear(VnMutex *m)
{
    pthread_mutex_destroy(&m->m);
}

static inline void vn_mutex_lock(VnMutex *m)
{
    pthread_mutex_lock(&m->m);
}

static inline void vn_mutex_unlock(VnMutex *m)
{
    pthread_mutex_unlock(&m->m);
}

/* Waits are measured on CLOCK_MONOTONIC, as g_get_monotonic_time() is. */
static inline void vn_cond_init(VnCond *c)
{
    pthread_condattr_t a;

    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&c->c, &a);
    pthread_condattr_destroy(&a);
}

static inline void vn_cond_clear(VnCond *c)
{
    pthread_cond_destroy(&c->c);
}

static inline void vn_cond_signal(VnCond *c)
{
    pthread_cond_signal(&c->c);
}

/* Wait (holding @m) until signalled or @until_us (g_get_monotonic_time()
 * microseconds) passes; false when the time passed.  Wakes may be spurious,
 * as with g_cond_wait_until(): callers loop on their condition. */
static inline bool vn_cond_wait_until(VnCond *c, VnMutex *m, gint64 until_us)
{
    struct timespec ts = {
        .tv_sec = (time_t)(until_us / G_USEC_PER_SEC),
        .tv_nsec = (long)(until_us % G_USEC_PER_SEC) * 1000,
    };

    return pthread_cond_timedwait(&c->c, &m->m, &ts) == 0;
}

#endif /* VN_LOCK_H */
