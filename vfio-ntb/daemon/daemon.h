/*
 * vfio-ntbd's core (daemon.c): a VnDaemon owns the host's fabric node, the lent and
 * borrowed devices (devices.h) and their leases, the node table, the control socket and
 * the timers, and routes fabric events to its parts.  Each part has a header named after
 * its file (docs/architecture.md maps them); vfio-ntbd.c is main() around it, and the
 * unit tests run daemons in-process.
 *
 * Threads: one GMainContext (the default); every field is the main
 * thread's.
 */
#ifndef VN_DAEMON_H
#define VN_DAEMON_H

#include "conf.h"
#include "leases.h"
#include "peers.h"
#include "spare.h"
#include "fabric/fabric.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnControl VnControl;

/* A host that announced itself (workers never do, so they are never here).
 * Kept while its link is down, so its devices show as unreachable, until
 * VN_DAEMON_FORGET_NODE_MS have passed or the table needs the room. */
typedef struct VnRemoteNode {
    char *name;
    bool link_up;
    gint64 down_since_us; /* monotonic, while !link_up */
    gint64 seen_us;       /* monotonic: its last announcement */
    VnPeersAnnounce *ann; /* its last announcement (decoded, so valid) */
    bool owed;            /* our last announcement to it was not sent: the next beat sends */
    guint phase;          /* the beat of each VN_DAEMON_REFRESH_EVERY that refreshes it */
    guint answered_beat;  /* 1 + the beat we last answered its "answer" on (0: never) */
} VnRemoteNode;

typedef struct VnDaemonStatic VnDaemonStatic;
typedef struct VnMetrics VnMetrics;
typedef struct VnWorkerOps VnWorkerOps;

/*
 * The `reload` command's way to the config (its main() knows the file and
 * tells systemd around it): false with @error when the file is refused.
 * Without one (a daemon a test made) the command is refused.
 */
typedef bool (*VnReloadFn)(void *data, char **summary, GError **error);

typedef struct VnDaemon {
    VnConfig *conf;
    VnFabric *fab;
    GPtrArray *local;     /* VnLocalDevice */
    GPtrArray *borrowed;  /* VnBorrowed */
    GPtrArray *borrowing; /* borrows asked of a lender, not answered yet (cluster-borrow.c) */
    GHashTable *nodes;    /* name -> VnRemoteNode */
    VnLeases *leases;     /* of the devices in @local */
    uint64_t save_errors; /* state saves that failed (reported in query-stats) */
    uint64_t leases_lost; /* lender: leases ended other than by a return (expired,
                           * dropped, revoked): a guest lost its device */
    bool unsaved;         /* the last save failed: the state file is behind; every
                           * control answer says "saved": false until one works */
    VnControl *control;
    GMainLoop *loop;
    guint heartbeat;
    guint announce_timer; /* a coalesced announcement is due */
    guint adopt_timer;    /* the workers' time to claim their exports back (daemon.c) */
    char *announced;      /* the last announcement broadcast, or NULL */
    unsigned beats;
    gint64 started_us;       /* monotonic; restored leases wait from here */
    VnDaemonStatic *statics; /* the borrows the config file names (daemon.c) */
    const VnWorkerOps *workers;
    GPtrArray *endings; /* VnEnding: workers on their way out (ending.c) */
    VnSpare *spare;     /* a borrower worker started ahead of need, once one was (spare.h) */
    GPtrArray *gathers; /* counters being asked of workers (stats.c) */
    GPtrArray *unplugs; /* VnUnplug: VMs being asked to let go (unplug.c) */
    VnMetrics *metrics; /* [node] metrics-file's timer, or NULL (metrics.c) */
    GHashTable *losses; /* borrowed device -> its last loss, a line (devices.c) */
    VnReloadFn reload;  /* the `reload` command's (vn_daemon_set_reload), or NULL */
    void *reload_data;
} VnDaemon;

/* ---- daemon.c ---- */
/*
 * A daemon for @conf (which it takes, even on failure): probes the control
 * socket, joins the fabric, lends, restores its state, opens the control
 * socket and starts announcing.  @workers serve attached devices (NULL:
 * vn_spawn_ops, worker processes).  NULL with @error when any of that fails.
 * It runs in the thread-default main context (the default one).
 */
VnDaemon *vn_daemon_new(VnConfig *conf, const VnWorkerOps *workers, GError **error);
/* Serve until vn_daemon_quit(). */
void vn_daemon_run(VnDaemon *d);
/* vn_daemon_run() returns (from the loop: a signal's handler, a test). */
void vn_daemon_quit(VnDaemon *d);
/* Borrower workers keep serving their VMs (a new daemon adopts them). */
void vn_daemon_free(VnDaemon *d);
/* The counters to [node] stats-file, if set. */
void vn_daemon_write_stats(VnDaemon *d);

/* Peers are looked for this often.  Announcements go out on every change and to a new
 * link; messages on a link arrive in order, so the periodic ones only heal what a send
 * that failed left behind: to a host we share a lease with every VN_DAEMON_ANNOUNCE_EVERY
 * beats, to any other every VN_DAEMON_REFRESH_EVERY (each host at its own beat, so an idle
 * cluster's messages are spread out, not a burst), and at the next beat to one whose last
 * send failed. */
#define VN_DAEMON_HEARTBEAT_MS 1000
#define VN_DAEMON_ANNOUNCE_EVERY 5
#define VN_DAEMON_REFRESH_EVERY 60
/* A grant is announced this long after it, with every change made
 * meanwhile: each announcement goes to every peer (n - 1 messages, each
 * parsed by its receiver), so a burst of grants on one lender -- a VM taking
 * several devices -- costs one broadcast, and a grant returned within the
 * delay costs none (the lease's end finds nothing to announce).  A lease's
 * end is announced at once (a reassign's target must see the device free).
 * Third parties learn of a grant this much later; the borrower learns from
 * the reply at once, and a lender refuses a lent device whatever a third
 * party believes. */
#define VN_DAEMON_ANNOUNCE_DELAY_MS 50
/* A revoke's default grace period. */
#define VN_DAEMON_REVOKE_GRACE_MS 5000
/* A revoked borrower gives its VM half the grace period, at most this, to let
 * go of the device, and looks whether it has this often. */
#define VN_DAEMON_MAX_RELEASE_MS 10000
#define VN_DAEMON_RELEASE_POLL_MS 50
/* The most a revoke may give: what a REVOKE message may carry. */
#define VN_DAEMON_MAX_GRACE_MS VN_PEERS_MAX_GRACE_MS
/* A host whose link went down is listed (its devices unreachable) this long;
 * then, or when the table is full, it is forgotten until it announces again. */
#define VN_DAEMON_FORGET_NODE_MS (10 * 60 * 1000)

#endif /* VN_DAEMON_H */
