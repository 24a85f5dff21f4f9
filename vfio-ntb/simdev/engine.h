/*
 * A polling thread with adaptive back-off, for a device whose guest writes
 * registers in shared memory that nothing announces (the NVMe doorbells in
 * a mapped BAR).
 *
 * The thread calls a poll function in a loop.  After a pass that found
 * work it keeps spinning (yielding the CPU) for VN_ENGINE_SPIN_US, because
 * the next doorbell usually follows soon (TESTBED: sleeping between polls
 * cost two thirds of 4 KiB QD1 throughput, spinning ~2 ms matched the
 * trapped path); then it sleeps with intervals that double from
 * VN_ENGINE_SLEEP_MIN_US up to VN_ENGINE_SLEEP_MAX_US (or
 * VN_ENGINE_DORMANT_SLEEP_US when the poll says the device is dormant), so
 * an idle device costs no busy core.  vn_engine_kick() ends a sleep at once (for events
 * that do arrive as messages: a trapped doorbell, a config write).
 *
 * Threads: vn_engine_new/free from the owner's thread; vn_engine_kick and
 * vn_engine_stats from any thread.  The poll function runs only in the
 * engine thread and must do its own locking against other threads.
 */
#ifndef VN_ENGINE_H
#define VN_ENGINE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#define VN_ENGINE_SPIN_US 2000
#define VN_ENGINE_SLEEP_MIN_US 50
#define VN_ENGINE_SLEEP_MAX_US 2000
/* Longest sleep while the device is dormant (e.g. an NVMe controller that
 * is disabled: the host waits up to CAP.TO for it, 20 ms is nothing). */
#define VN_ENGINE_DORMANT_SLEEP_US 20000

/* What a poll pass found. */
typedef enum VnEnginePoll {
    VN_ENGINE_IDLE,    /* nothing, but work may come any moment */
    VN_ENGINE_BUSY,    /* did work: keep spinning */
    VN_ENGINE_DORMANT, /* nothing, and latency does not matter now */
    VN_ENGINE_POLL_LAST
} VnEnginePoll;

const char *vn_engine_poll_to_string(VnEnginePoll p);

/* One pass. */
typedef VnEnginePoll (*VnEnginePollFn)(void *opaque);

typedef struct VnEngine VnEngine;

typedef struct VnEngineStats {
    uint64_t polls;      /* passes */
    uint64_t busy_polls; /* passes that found work */
    uint64_t sleeps;     /* timed waits */
    uint64_t kicks;
} VnEngineStats;

/* Start the thread, named @name, polling @fn(@opaque).  Returns NULL with
 * @error set if the thread cannot be created. */
VnEngine *vn_engine_new(const char *name, VnEnginePollFn fn, void *opaque, GError **error);
/* Stop the thread and wait for it: when this returns @fn runs no more. */
void vn_engine_free(VnEngine *e);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnEngine, vn_engine_free)

/* Poll now and spin again for a while. */
void vn_engine_kick(VnEngine *e);
void vn_engine_stats(VnEngine *e, VnEngineStats *out);

#endif /* VN_ENGINE_H */
