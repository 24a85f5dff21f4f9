/*
 * Daemon to daemon, the borrower's side of a lease (cluster-borrow.c; the lender's is
 * cluster.h's): borrow a device, return it, and release it when its lender revokes it
 * (the VM is asked to let go, within the grace the lender gave).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_CLUSTER_BORROW_H
#define VN_CLUSTER_BORROW_H

#include "daemon.h"
#include "devices.h"

/*
 * Borrow / return, asynchronous: @done runs once, later or at once, with
 * the borrowed device (borrow) or NULL, and on failure an error class of
 * docs/control.md and a message (@done may be NULL: nobody waits).  Return
 * detaches and forgets the device before it asks the lender.  Until the
 * lender answers, the device's job is a borrow for @owner (jobs.h): a second
 * borrow of it is refused naming that job (DeviceBusy).
 */
typedef void (*VnClusterDone)(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                              void *opaque);
void vn_cluster_borrow(VnDaemon *d, const char *lender, const char *name, const char *owner,
                       VnClusterDone done, void *opaque);
/* The job of @device ("node/name") while this node's borrow of it is under way, or NULL. */
const VnJob *vn_cluster_borrowing(VnDaemon *d, const char *device);
void vn_cluster_return(VnDaemon *d, VnBorrowed *b, VnClusterDone done, void *opaque);
/* Take @b out of its VM, then return it: the guest gets up to @wait_ms to
 * let go, waited for by a timer (the daemon keeps serving meanwhile). */
void vn_cluster_release(VnDaemon *d, VnBorrowed *b, unsigned wait_ms);

#endif /* VN_CLUSTER_BORROW_H */
