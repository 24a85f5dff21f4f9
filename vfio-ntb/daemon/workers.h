/*
 * What serves an attached device's VM, and a lent device's backend: the daemon's
 * VnWorkerOps seam (worker processes: spawn.h's vn_spawn_ops; a unit test's fake), checked
 * once by vn_worker_ops_valid() (workers.c).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_WORKERS_H
#define VN_WORKERS_H

#include "daemon.h"
#include "devices.h"
#include "common/wctl.h"

#include <glib.h>
#include <stdbool.h>

/*
 * Behind this table so the daemon runs in unit tests with a fake one.  Every
 * member is required (vn_worker_ops_valid()).
 *
 * start: serve @b on b->socket (b->domain set); sets b->worker_pid (> 0
 *   while it runs), b->worker_name, b->channel_path, b->port.  Asynchronous: @done
 *   runs once, at once or later from the loop, with @error NULL when the
 *   worker serves, else why not; b->starting is set meanwhile.  When @b is
 *   freed first (returned), @done runs with b NULL and an error.
 * stop: b->worker_pid is 0 and b->port NULL after, at once: the worker
 *   ends in the background (it first waits for QEMU to let go of its
 *   socket, bounded), and a start for the same device waits for that.
 * adopt: after a restart, is the recorded worker still there (b->worker_pid
 *   cleared if not)?  Only it may reconnect to its port, with @secret (the
 *   state file's: port.h, vn_port_adopt).
 * stats, lend_stats: ask for its counters without waiting: @done runs
 *   once, later from the loop or before this returns, with the JSON text
 *   (untrusted: the worker wrote it; at most VN_SPAWN_MAX_STATS bytes; @done
 *   frees it) or NULL.  Returns the call in flight, to cancel with
 *   vn_wctl_call_cancel() (@done never runs then), or NULL once @done ran.
 * request_unplug: ask the VM to release @b through the device-request
 *   interrupt, as stats asks (@done's text: {"requested": false} when its
 *   QEMU takes no device requests).
 * client_state: is a QEMU connected (the device still in a VM)?  Never
 *   waits: the worker's answer to a question asked at or after @since_us
 *   (monotonic), else VN_CLIENT_UNKNOWN, asking it when no question is in
 *   flight.  A caller polls.
 */
typedef void (*VnWorkerStarted)(VnDaemon *d, VnBorrowed *b, const GError *error, void *opaque);

/*
 * lend_start: start @ld's lender worker (ld->worker_pid set), false with
 *   @error; lend_stop: end it (bounded), fencing the device; lend_adopt:
 *   after a restart, is the recorded one still there (pid cleared if not)?
 *   As adopt, with its port's @secret.
 *   lend_kill: kill it now (it did not fence in time): true when its exit
 *   will be reported (vn_fence_worker_died), false when it is as good as gone
 *   already (pid cleared).
 * stop_strays (optional): at start, once the recorded workers were adopted
 *   and before new ones start, stop every other worker of this node that
 *   runs (strays.c); returns how many.
 */
struct VnWorkerOps {
    const char *name;
    bool (*lend_start)(VnDaemon *d, VnLocalDevice *ld, GError **error);
    void (*lend_stop)(VnDaemon *d, VnLocalDevice *ld);
    bool (*lend_adopt)(VnDaemon *d, VnLocalDevice *ld, const char *secret);
    bool (*lend_kill)(VnDaemon *d, VnLocalDevice *ld);
    VnWctlCall *(*lend_stats)(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done, void *opaque);
    void (*start)(VnDaemon *d, VnBorrowed *b, VnWorkerStarted done, void *opaque);
    void (*stop)(VnDaemon *d, VnBorrowed *b);
    bool (*adopt)(VnDaemon *d, VnBorrowed *b, const char *secret);
    VnWctlCall *(*stats)(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque);
    VnWctlCall *(*request_unplug)(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque);
    VnClientState (*client_state)(VnDaemon *d, VnBorrowed *b, gint64 since_us);
    guint (*stop_strays)(VnDaemon *d);
};

/* Does @ops have every member it must (stop_strays may be NULL)?  False with @error
 * (G_IO_ERROR_INVALID_ARGUMENT) naming the first missing. */
bool vn_worker_ops_valid(const VnWorkerOps *ops, GError **error);

#endif /* VN_WORKERS_H */
