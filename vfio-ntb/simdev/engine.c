/*
 * Polling thread with adaptive back-off (see engine.h).
 *
 * Spinning uses the CPU's pause hint and sched_yield(): on the two-core
 * test machines the guest's TCG vCPU thread needs one core, and a yield lets
 * it run on ours too when the scheduler puts both there.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "engine.h"

#include "common/lock.h"

#include <gio/gio.h>
#include <sched.h>

/* Spinning passes between two sched_yield() calls. */
#define YIELD_EVERY 16

/*
 * Ownership: name, fn, opaque and thread are set before the thread starts.
 * @lock guards stop, kicked and stats; the thread only takes it to sleep
 * and to publish counters, so the poll function runs without it.
 */
struct VnEngine {
    char *name;
    VnEnginePollFn fn;
    void *opaque;
    GThread *thread;

    VnMutex lock;
    VnCond cond;
    gint stop; /* atomic too: read while spinning */
    bool kicked;
    VnEngineStats stats;
};

static const char *const poll_names[VN_ENGINE_POLL_LAST] = {
    [VN_ENGINE_IDLE] = "idle",
    [VN_ENGINE_BUSY] = "busy",
    [VN_ENGINE_DORMANT] = "dormant",
};

const char *vn_engine_poll_to_string(VnEnginePoll p)
{
    return (unsigned)p < VN_ENGINE_POLL_LAST ? poll_names[p] : "unknown";
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Sleep up to @us unless kicked or stopped; returns true when stopping. */
static bool engine_sleep(VnEngine *e, gint64 us, bool *kicked)
{
    gint64 until = g_get_monotonic_time() + us;
    bool stop;

    vn_mutex_lock(&e->lock);
    e->stats.sleeps++;
    while (!e->stop && !e->kicked) {
        if (!vn_cond_wait_until(&e->cond, &e->lock, until)) {
            break;
        }
    }
    *kicked = e->kicked;
    e->kicked = false;
    stop = e->stop;
    vn_mutex_unlock(&e->lock);
    return stop;
}

static gpointer engine_main(gpointer data)
{
    VnEngine *e = data;
    gint64 last_busy = g_get_monotonic_time();
    gint64 sleep_us = 0;
    uint64_t polls = 0, busy_polls = 0;
    unsigned spins = 0;
    bool kicked = false;

    g_info("engine %s: started", e->name);
    for (;;) {
        VnEnginePoll got = e->fn(e->opaque);
        gint64 now;

        polls++;
        if (got == VN_ENGINE_BUSY) {
            busy_polls++;
            last_busy = g_get_monotonic_time();
            sleep_us = 0;
            continue;
        }
        now = g_get_monotonic_time();
        if (now - last_busy < VN_ENGINE_SPIN_US) {
            cpu_relax();
            if (++spins % YIELD_EVERY == 0) {
                sched_yield();
                /* The stop flag is read under the lock; checking it while
                 * spinning keeps vn_engine_free() prompt. */
                if (g_atomic_int_get(&e->stop)) {
                    break;
                }
            }
            continue;
        }
        sleep_us = sleep_us == 0
                       ? VN_ENGINE_SLEEP_MIN_US
                       : MIN(sleep_us * 2, got == VN_ENGINE_DORMANT ? VN_ENGINE_DORMANT_SLEEP_US
                                                                    : VN_ENGINE_SLEEP_MAX_US);
        /* Publish counters once per sleep: cheap, and fresh enough. */
        vn_mutex_lock(&e->lock);
        e->stats.polls += polls;
        e->stats.busy_polls += busy_polls;
        vn_mutex_unlock(&e->lock);
        polls = busy_polls = 0;
        if (engine_sleep(e, sleep_us, &kicked)) {
            break;
        }
        if (kicked) {
            last_busy = g_get_monotonic_time();
            sleep_us = 0;
        }
    }
    vn_mutex_lock(&e->lock);
    e->stats.polls += polls;
    e->stats.busy_polls += busy_polls;
    vn_mutex_unlock(&e->lock);
    g_info("engine %s: stopped", e->name);
    return NULL;
}

VnEngine *vn_engine_new(const char *name, VnEnginePollFn fn, void *opaque, GError **error)
{
    VnEngine *e = g_new0(VnEngine, 1);

    e->name = g_strdup(name);
    e->fn = fn;
    e->opaque = opaque;
    vn_mutex_init(&e->lock);
    vn_cond_init(&e->cond);
    e->thread = g_thread_try_new(name, engine_main, e, error);
    if (e->thread == NULL) {
        g_prefix_error(error, "engine %s: ", name);
        vn_cond_clear(&e->cond);
        vn_mutex_clear(&e->lock);
        g_free(e->name);
        g_free(e);
        return NULL;
    }
    return e;
}

void vn_engine_free(VnEngine *e)
{
    if (e == NULL) {
        return;
    }
    vn_mutex_lock(&e->lock);
    g_atomic_int_set(&e->stop, TRUE);
    vn_cond_signal(&e->cond);
    vn_mutex_unlock(&e->lock);
    g_thread_join(e->thread);
    vn_cond_clear(&e->cond);
    vn_mutex_clear(&e->lock);
    g_free(e->name);
    g_free(e);
}

void vn_engine_kick(VnEngine *e)
{
    vn_mutex_lock(&e->lock);
    e->kicked = true;
    e->stats.kicks++;
    vn_cond_signal(&e->cond);
    vn_mutex_unlock(&e->lock);
}

void vn_engine_stats(VnEngine *e, VnEngineStats *out)
{
    vn_mutex_lock(&e->lock);
    *out = e->stats;
    vn_mutex_unlock(&e->lock);
}
