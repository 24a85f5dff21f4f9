/*
 * vfio-user client engine: connects to a device server and issues commands
 * synchronously (one outstanding request at a time, plus posted writes).
 *
 * Used by the lender to drive vfio-user devices, by tests and by benches.
 * The server is a peer like any other: every reply is checked against the
 * request (id, command, sizes, fd count) before it is used.
 *
 * Errors: -errno (the server's errno for an error reply, -ETIMEDOUT when no
 * reply came within the timeout, -EPROTO for a malformed reply).
 *
 * A server that stalls (stopped, swapping, blocked) past the timeout answers
 * later, in order.  Replies are matched by id: the ones that come for a
 * request that already timed out are dropped (counted, and told to the
 * observer), so the next request gets its own reply and the connection
 * stays usable.  What a timed-out request did on the device is unknown.
 * Threads: one thread at a time.
 */
#ifndef VN_CLIENT_H
#define VN_CLIENT_H

#include "wire.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnClient VnClient;

/* Every timed-out request's late reply is recognised (and dropped), however
 * many time out in one stall; for the last this many, the observer hears
 * how late it came (older ones: at least the timeout). */
#define VN_CLIENT_LATE_TIMES 16

typedef struct VnClientStats {
    uint64_t timeouts;     /* requests that got no reply in time */
    uint64_t late_replies; /* replies that came after that, dropped */
    uint32_t awaiting;     /* timed-out requests not answered yet */
    bool stalled;          /* the last request timed out: nothing answered since */
} VnClientStats;

typedef enum VnClientEvent {
    VN_CLIENT_TIMED_OUT,  /* @ms: the timeout */
    VN_CLIENT_LATE_REPLY, /* @ms: how long after it was sent the reply came */
    VN_CLIENT_EVENT_LAST
} VnClientEvent;

/* Told of each timeout and late reply, from inside the call that saw it. */
typedef void (*VnClientObserver)(void *opaque, VnClientEvent ev, uint16_t cmd, uint64_t ms);

/* Connect and negotiate VERSION.  @timeout_ms bounds every later reply. */
VnClient *vn_client_connect(const char *socket_path, unsigned timeout_ms, GError **error);
/* The same over @fd, a connection someone else made (taken; closed on failure): @name says
 * which server in messages. */
VnClient *vn_client_new_fd(int fd, const char *name, unsigned timeout_ms, GError **error);
void vn_client_free(VnClient *c);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnClient, vn_client_free)

/* The connection's socket, for a watch on its hang-up only (the client reads and writes
 * it; nothing else may). */
int vn_client_fd(VnClient *c);

/* The server's capabilities from VERSION. */
const VnWireCaps *vn_client_caps(VnClient *c);

void vn_client_stats(VnClient *c, VnClientStats *out);
/* @fn (NULL: none) hears of stalls; @opaque is passed back. */
void vn_client_set_observer(VnClient *c, VnClientObserver fn, void *opaque);

int vn_client_get_info(VnClient *c, VnWireDeviceInfo *info);

/*
 * GET_REGION_INFO with the argsz retry.  On success *info is filled, *fd is
 * the region's mmap fd or -1 (caller owns it), and when @sparse is not NULL
 * up to @max_sparse sparse areas are stored and their number in *nr_sparse.
 */
int vn_client_get_region_info(VnClient *c, uint32_t index, struct vfio_region_info *info, int *fd,
                              struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                              uint32_t *nr_sparse);

int vn_client_get_irq_info(VnClient *c, uint32_t index, struct vfio_irq_info *info);

/* SET_IRQS; @fds (borrowed) has count eventfds for DATA_EVENTFD, or NULL. */
int vn_client_set_irqs(VnClient *c, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                       const uint8_t *bools, const int *fds);

/* Returns bytes read, or -errno. */
int vn_client_region_read(VnClient *c, uint32_t region, uint64_t offset, void *buf, uint32_t count);
/* With @posted the write goes NO_REPLY and the call returns at once. */
int vn_client_region_write(VnClient *c, uint32_t region, uint64_t offset, const void *buf,
                           uint32_t count, bool posted);

/* @fd is borrowed (-1 for none). */
int vn_client_dma_map(VnClient *c, uint64_t iova, uint64_t size, uint64_t offset, uint32_t prot,
                      int fd);
/*
 * Several DMA_MAPs as QEMU sends a memory transaction's: all sent before
 * any reply is read, then the replies taken in order.  Returns 0 or the
 * first error's -errno (the other maps stand).  @n small enough for the
 * socket's buffers (a transaction's maps: tens).
 */
typedef struct VnClientDmaMap {
    uint64_t iova, size, offset;
    uint32_t prot;
    int fd; /* borrowed; -1 for none */
} VnClientDmaMap;
int vn_client_dma_map_many(VnClient *c, const VnClientDmaMap *maps, unsigned n);
int vn_client_dma_unmap(VnClient *c, uint64_t iova, uint64_t size, bool all);
int vn_client_reset(VnClient *c);

/*
 * Send raw bytes (a whole message, or garbage) with fds and wait for one
 * message back; for tests of malformed input and of what a server sends
 * unasked.  The message (owned) goes to *reply.  With @msg NULL nothing is
 * sent; with @reply NULL nothing is waited for.
 */
int vn_client_raw(VnClient *c, const void *msg, size_t len, const int *fds, unsigned nfds,
                  GByteArray **reply);

#endif /* VN_CLIENT_H */
