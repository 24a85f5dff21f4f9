/*
 * Borrower workers (spawn.c): each attached device's vfio-user server runs in a
 * vfio-ntb-borrower process, which outlives the daemon; with the lender workers
 * (lenders.h) they are vn_spawn_ops, the daemon's VnWorkerOps (workers.h).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_SPAWN_H
#define VN_SPAWN_H

#include "workers.h"

/* Worker processes, which outlive the daemon: the VnWorkerOps of vn_daemon_new() when it is
 * given none. */
extern const VnWorkerOps vn_spawn_ops;

#endif /* VN_SPAWN_H */
