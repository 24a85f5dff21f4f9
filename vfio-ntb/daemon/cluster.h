/*
 * Daemon to daemon (cluster.c): who is there and what they lend (announcements
 * received, the node table, the heartbeat), and leases, the lender's side: borrows
 * granted, returns, revokes, and the lease listener that fences, answers revokes,
 * announces and emits events.  The borrower's side is cluster-borrow.h's.  Peers are
 * untrusted: every field of their messages is checked.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_CLUSTER_H
#define VN_CLUSTER_H

#include "control.h"
#include "daemon.h"
#include "devices.h"
#include "leases.h"
#include "fabric/fabric.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* The heartbeat, now and every VN_DAEMON_HEARTBEAT_MS: peers looked for, leases' clocks,
 * a failed save tried again, hosts long down forgotten, the periodic announcements. */
void vn_cluster_start(VnDaemon *d);
/* A peer's request (BORROW, RETURN; untrusted, checked whole): answered on the fabric with
 * @token, at once or once a fence under way is over. */
void vn_cluster_request(VnDaemon *d, VnFabricMsg *msg, uint64_t token);
/* A peer's event (ANNOUNCE, REVOKE; untrusted, checked whole); another is logged, ignored. */
void vn_cluster_event(VnDaemon *d, VnFabricMsg *msg);
/* The fabric's link to @peer went @up or down. */
void vn_cluster_link(VnDaemon *d, const char *peer, bool up);
/* The windows and routes with @peer are gone for good (fabric.h, on_paths_lost): what was
 * borrowed from it through them is lost, what was lent to it through them ends. */
void vn_cluster_paths_lost(VnDaemon *d, const char *peer);
/* Revoke, asked by @owner (jobs.h: VN_JOB_OWNER_*, or a node), answers @r when the device
 * is free; refused naming the job when the device's job does not allow it. */
void vn_cluster_revoke(VnDaemon *d, VnLocalDevice *ld, uint32_t grace_ms, const char *owner,
                       VnControlReply *r);
/* A revoke the state file says was waiting out its grace (until @deadline, real time, µs)
 * when the daemon stopped: @ld's restored lease is being revoked again, ending at that
 * deadline (at once when it passed); its holder is told again when it next announces. */
void vn_cluster_revoke_resume(VnDaemon *d, VnLocalDevice *ld, gint64 deadline);
/* The host wants @ld back (its worker heard VFIO's device request: an
 * unbind or a removal waits on it): a revoke with the usual grace, once. */
void vn_cluster_device_request(void *ld);
/* The lease listener that fences, answers revokes, announces and emits
 * events (registered by vn_cluster_start's caller before leases change). */
void vn_cluster_on_lease(void *opaque, const VnLeaseChange *change);

#endif /* VN_CLUSTER_H */
