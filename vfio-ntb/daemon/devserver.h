/*
 * Device servers that die and come back (devserver.c), both halves: a lent device's,
 * as its worker says, and a borrowed device's, as its lender announces.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_DEVSERVER_H
#define VN_DEVSERVER_H

#include "daemon.h"
#include "devices.h"
#include "peers.h"

#include <stdbool.h>
#include <stdint.h>

/* Lender side, a port's VnPortDeviceServerFn (@opaque: the VnLocalDevice). */
void vn_devserver_changed(void *opaque, bool up, uint32_t gen);
/* Lender side: @ld's worker died while it was lent; its device went with it (the next
 * worker's is presented to the holder anew, as a lost server's return is). */
void vn_devserver_worker_gone(VnLocalDevice *ld);
/* Borrower side: what @lender's announcement @a says of the servers of devices we hold. */
void vn_devserver_announced(VnDaemon *d, const char *lender, const VnPeersAnnounce *a);

#endif /* VN_DEVSERVER_H */
