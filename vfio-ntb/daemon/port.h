/*
 * A worker's port: the daemon's end of the `host` fabric backend
 * (fabric/host.h has the wire and the worker's end).
 *
 * A borrower worker is not a fabric node: its frames go out as this
 * host's, and what it maps, exports and rings is this host's.  The port
 * relays for it without waiting on anyone (a request becomes an
 * asynchronous request of the daemon's, its reply is sent back when it
 * comes), and checks what the worker asks like any peer's input: only its
 * lender, only requests and events that name its device, only its own
 * segments, routes, windows and doorbell bits, a bounded number in flight.
 * Freeing the port takes back everything the worker had through it.
 *
 * One port per worker, a socket (0600) that only the worker connects to;
 * a worker that reconnects (its daemon restarted, or it lost the
 * connection) replaces its old connection.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_PORT_H
#define VN_PORT_H

#include "fabric/fabric.h"

#include <glib.h>
#include <stdbool.h>

/* Requests one worker may have relayed and unanswered. */
#define VN_PORT_MAX_INFLIGHT 64u
/* Windows, segments and routes one worker may hold through its port. */
#define VN_PORT_MAX_WINDOWS 16u
#define VN_PORT_MAX_EXPORTS 256u

typedef struct VnPort VnPort;

/*
 * Listen on @path for the worker serving @lender's device @device (its
 * name on the lender).  A file at @path is replaced when no one answers on
 * it.  Its sources go to @ctx (NULL: the default, the daemon's).  NULL with @error.
 */
VnPort *vn_port_new(VnFabric *fab, const char *path, const char *lender, const char *device,
                    GMainContext *ctx, GError **error);
/* Unmaps, unexports, frees its bits, fails what it had in flight; unlinks
 * the socket when @unlink (not when a worker outlives this daemon). */
void vn_port_free(VnPort *p, bool unlink);
/* vn_port_free(@p, true): the worker is gone for good. */
void vn_port_free_unlinked(VnPort *p);
/* Handle what the worker sent and we have not read yet (it has exited:
 * its last words, its DETACH, are relayed). */
void vn_port_drain(VnPort *p);
const char *vn_port_path(VnPort *p);

/* From the daemon's fabric handlers: the worker learns of its lender's
 * link; a doorbell that is the worker's (true) is passed on to it. */
void vn_port_link(VnPort *p, const char *peer, bool up);
bool vn_port_doorbell(VnPort *p, const char *peer, uint32_t bit);

/* What the port refused from its worker (counted, logged). */
uint64_t vn_port_refused(VnPort *p);

#endif /* VN_PORT_H */
