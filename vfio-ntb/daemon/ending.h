/*
 * Workers on their way out (ending.c), watched from the loop: QEMU's moment to let go,
 * SIGTERM, SIGKILL; a new worker for the same device waits for the old one to be gone.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_ENDING_H
#define VN_ENDING_H

#include "daemon.h"
#include "port.h"

#include <glib.h>
#include <stdbool.h>

/*
 * The ending takes @pid (@child: ours to reap; its child watch removed by
 * the caller), @port, @channel_path and @socket_path (QEMU's; each may be NULL;
 * the files are removed when it is gone), and returns at once.  It waits at most
 * @client_wait_ms for the worker's QEMU to let go (0: not at all), then
 * sends SIGTERM, and SIGKILL after @term_wait_ms.  @what names the device
 * ("host/name" borrowed, a name lent): a new worker for it waits while
 * vn_ending_busy() says one is still going.
 */
typedef struct VnEnding VnEnding;
VnEnding *vn_ending_start(VnDaemon *d, const char *what, GPid pid, bool child, VnPort *port,
                          char *channel_path, char *socket_path, unsigned client_wait_ms,
                          unsigned term_wait_ms);
/* A managed function's lender worker (@pid 0: none runs): once it is gone, @bdf goes back to
 * the driver @kept_path names (lending/pcibind.h), if the file is still there (the worker,
 * serving as root, gives it back itself); the ending lasts until then. */
void vn_ending_give_back(VnEnding *e, const char *bdf, const char *kept_path);
/* Is a worker of @what still on its way out? */
bool vn_ending_busy(VnDaemon *d, const char *what);
/* d->endings, empty (vn_endings_free frees it). */
GPtrArray *vn_endings_new(void);
/* At the daemon's end: each gets SIGTERM if it has not yet, none is waited for. */
void vn_endings_free(GPtrArray *endings);

#endif /* VN_ENDING_H */
