/*
 * The node's counters as Prometheus metrics, for node_exporter's textfile
 * collector ([node] metrics-file; docs/operations.md "Metrics").
 *
 * Why a file and not an HTTP endpoint: vfio-ntbd's unit allows it AF_UNIX
 * sockets only and it runs no HTTP server (one more listener on every host
 * of the fabric, to harden and authenticate); the fleets it runs on run
 * node_exporter already, whose textfile collector serves *.prom files from
 * a directory.  The file is replaced atomically (a temporary file in the
 * same directory, renamed over it), so the collector never reads half of
 * one.
 *
 * Two parts: the exposition text, pure (a snapshot of the daemon's state
 * plus the query-stats JSON in, text out: what the unit tests check), and
 * the writer.  The daemon's timer that feeds them is in metrics.c too
 * (vn_metrics_start / vn_metrics_stop, below).
 *
 * Threads: none; the daemon's main thread.
 */
#ifndef VN_METRICS_H
#define VN_METRICS_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdint.h>

/* [node] metrics-interval-ms: the default, and its bounds (faster asks
 * every worker more often than anyone scrapes; slower than an hour is not
 * monitoring). */
#define VN_METRICS_DEFAULT_INTERVAL_MS 15000
#define VN_METRICS_MIN_INTERVAL_MS 100
#define VN_METRICS_MAX_INTERVAL_MS 3600000

/* One device of the node, as the daemon sees it when the counters are asked. */
typedef struct VnMetricsDevice {
    char *device; /* "host/name" */
    bool lent;    /* role "lender"; else "borrower" */
    /* The lease's state: a lender's VnLeaseState name ("free", "held", ...),
     * a borrower's "held", "unconfirmed" or "lost" (static strings). */
    const char *state;
    bool attached; /* borrower: its worker serves a VM */
    /* lender: who holds it, and the VM it serves it to (as its holder
     * announces), or NULL: labels of vfio_ntb_lease_state. */
    char *holder;
    char *domain;
} VnMetricsDevice;

/* A peer the node knows, and whether its link is up. */
typedef struct VnMetricsPeer {
    char *name;
    bool up;
} VnMetricsPeer;

typedef struct VnMetricsSnapshot {
    char *node;
    bool running; /* false in the file written at exit */
    gint64 unix_ms;
    /* Lent devices first, in the order of query-stats' "lent" array, then
     * the borrowed ones. */
    GPtrArray *devices; /* VnMetricsDevice */
    GPtrArray *peers;   /* VnMetricsPeer */
} VnMetricsSnapshot;

VnMetricsSnapshot *vn_metrics_snapshot_new(const char *node);
/* Adds a copy of @device; @state must be a static string. */
void vn_metrics_snapshot_add_device(VnMetricsSnapshot *s, const char *device, bool lent,
                                    const char *state, bool attached);
/* The device added last is held by @holder, which serves it to @domain
 * (either may be NULL). */
void vn_metrics_snapshot_device_holder(VnMetricsSnapshot *s, const char *holder,
                                       const char *domain);
void vn_metrics_snapshot_add_peer(VnMetricsSnapshot *s, const char *name, bool up);
void vn_metrics_snapshot_free(VnMetricsSnapshot *s);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnMetricsSnapshot, vn_metrics_snapshot_free)

/* The lease states a role's vfio_ntb_lease_state reports, NULL-terminated. */
const char *const *vn_metrics_lease_states(bool lent);

/*
 * The exposition text (Prometheus text format 0.0.4) of @s and @stats, the
 * query-stats answer for the whole node (may be NULL: no counters).
 * @stats came from workers too, so it is untrusted: a counter that is not a
 * non-negative integer is left out, a "lent" entry is the device at the
 * same position in @s, a "borrowed" one the device its "device" names (a
 * second entry for the same device is ignored).  Every family has its HELP
 * and TYPE lines and all its samples together; label values are escaped.
 */
char *vn_metrics_text(const VnMetricsSnapshot *s, JsonNode *stats);

/* @v as a label value: \ " and newline escaped (text format 0.0.4). */
void vn_metrics_escape(GString *out, const char *v);

/*
 * Replace @path with @text atomically: written to "@path.tmp" (created
 * anew, never through a link), made mode 0644 whatever the umask (the
 * collector runs as another user), then renamed over @path.  False with
 * @error, @path untouched and no temporary file left.
 */
bool vn_metrics_write(const char *path, const char *text, GError **error);

/* ---- the daemon's timer ---- */
typedef struct VnDaemon VnDaemon;

/* [node] metrics-file, if set: written now and every metrics-interval-ms
 * (the workers asked as query-stats asks them; one gather at a time). */
void vn_metrics_start(VnDaemon *d);
/* Before the daemon's devices go: the timer ends and the file is written
 * once more, saying the daemon stopped (metrics.h). */
void vn_metrics_stop(VnDaemon *d);

#endif /* VN_METRICS_H */
