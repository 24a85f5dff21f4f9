/*
 * vfio-user server engine: listens on a UNIX socket, serves one client at a
 * time, decodes each command and dispatches it to a device through a const
 * VnDeviceOps table.
 *
 * The engine owns the protocol: VERSION negotiation, GET_INFO,
 * GET_REGION_INFO (with the argsz retry and the sparse-mmap capability),
 * GET_IRQ_INFO, the DMA table (VnDma) and the interrupt table (VnIrqs),
 * range checks of every region access.  The device only sees accesses that
 * are in range and events it asked for.
 *
 * A malformed message gets an error reply (or, when the stream can no longer
 * be trusted, a logged disconnect); the server then accepts the next client.
 * When a client goes, its DMA mappings and eventfds are dropped before the
 * device's client_gone is called.
 *
 * Threads: everything here runs in the GMainContext given to
 * vn_server_new() (the default one when NULL).  vn_server_dma() and
 * vn_server_irqs() may be used from other threads (they lock).
 */
#ifndef VN_SERVER_H
#define VN_SERVER_H

#include "dma.h"
#include "irqs.h"
#include "wire.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnSparseArea {
    uint64_t offset;
    uint64_t size;
} VnSparseArea;

typedef struct VnRegion {
    uint64_t size;        /* 0: the region does not exist */
    uint32_t flags;       /* VFIO_REGION_INFO_FLAG_READ|WRITE|MMAP */
    int mmap_fd;          /* borrowed from the device; -1 if none */
    uint64_t mmap_offset; /* offset of the region in mmap_fd */
    uint32_t nr_sparse;   /* <= VN_MAX_SPARSE_AREAS; 0 = whole region */
    VnSparseArea sparse[VN_MAX_SPARSE_AREAS];
} VnRegion;

typedef struct VnDeviceInfo {
    uint32_t flags;       /* VFIO_DEVICE_FLAGS_PCI | _RESET */
    uint32_t num_regions; /* <= VN_MAX_REGIONS */
    VnRegion regions[VN_MAX_REGIONS];
    uint32_t num_irqs; /* <= VN_MAX_IRQ_INDEXES */
    uint32_t irq_count[VN_MAX_IRQ_INDEXES];
    uint32_t irq_flags[VN_MAX_IRQ_INDEXES]; /* VFIO_IRQ_INFO_* */
} VnDeviceInfo;

/*
 * A device served by the engine.  Return values are 0 or -errno; an error
 * is sent back to the client as the reply's errno.
 */
typedef struct VnDeviceOps {
    /* Required.  [offset, offset + count) is inside the region. */
    int (*region_read)(void *opaque, uint32_t index, uint64_t offset, void *buf, uint32_t count);
    int (*region_write)(void *opaque, uint32_t index, uint64_t offset, const void *buf,
                        uint32_t count);
    /* Optional: after a mapping was added to the DMA table.  m->fd is the
     * table's (borrowed: dup it to keep it).  An error undoes the mapping
     * and is the client's reply. */
    int (*dma_mapped)(void *opaque, const VnDmaMapping *m);
    /* Optional: before [iova, iova + size) is removed (all: everything);
     * when it returns (or answers, after vn_server_later()) the device
     * must not touch that memory again. */
    void (*dma_unmapping)(void *opaque, uint64_t iova, uint64_t size, bool all);
    /* Optional: after SET_IRQS changed index @index. */
    void (*irqs_changed)(void *opaque, uint32_t index);
    /* Optional: handle SET_IRQS instead of the server's VnIrqs table (a
     * device that forwards the eventfds elsewhere).  Arguments as for
     * vn_irqs_set(), already checked by the decoder; fds consumed are set
     * to -1, the rest are closed by the server. */
    int (*set_irqs)(void *opaque, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                    const uint8_t *bools, int *fds, unsigned nfds);
    /* Optional: DEVICE_RESET (also called when a client goes). */
    int (*reset)(void *opaque);
    /* Optional: a client connected / went away (after DMA and irqs were
     * dropped and reset called).  client_leaving comes first, before that
     * dropping: nobody waits for what follows until client_gone. */
    void (*client_new)(void *opaque);
    void (*client_leaving)(void *opaque);
    void (*client_gone)(void *opaque);
} VnDeviceOps;

/* Replies a device may owe at once (vn_server_later()). */
#define VN_SERVER_MAX_DEFERRED 64u

/* Names the missing required member in @error. */
bool vn_device_ops_valid(const VnDeviceOps *ops, GError **error);

typedef struct VnServer VnServer;

/* Counters, read with vn_server_stats(). */
typedef struct VnServerStats {
    uint64_t clients;  /* accepted connections */
    uint64_t messages; /* commands received */
    uint64_t errors;   /* error replies sent */
    uint64_t region_reads;
    uint64_t region_writes;
    uint64_t dma_maps;
    uint64_t dma_unmaps;
    uint64_t resets;           /* DEVICE_RESETs the device carried out */
    uint64_t client_dma_reads; /* vn_server_client_dma() that succeeded */
    uint64_t client_dma_writes;
    uint64_t client_dma_failures;
    uint64_t region_maps;         /* X_REGION_MAP asks sent (maps and traps) */
    uint64_t region_map_failures; /* ... that the client refused */
    uint64_t per_region_rw[VN_MAX_REGIONS];
} VnServerStats;

/*
 * Create a server for a device described by @info (copied; the mmap fds in
 * it stay the device's) and listen on @socket_path, which must not exist.
 * @ops is validated here.  @ctx may be NULL for the default context.
 */
VnServer *vn_server_new(const char *socket_path, const VnDeviceInfo *info, const VnDeviceOps *ops,
                        void *opaque, GMainContext *ctx, GError **error);
/*
 * A server that takes over a dead one's sockets (the borrower's takeover): @listen_fd
 * listens on @socket_path already; @client_fd (-1: none) is a client that negotiated
 * VERSION with @caps.  Both are taken (closed on failure too) and must be UNIX stream
 * sockets, listening and connected.  What the client set up before (DMA table, interrupts)
 * is the caller's to put back through vn_server_dma() and vn_server_irqs().
 */
VnServer *vn_server_adopt(const char *socket_path, int listen_fd, int client_fd,
                          const VnWireCaps *caps, const VnDeviceInfo *info, const VnDeviceOps *ops,
                          void *opaque, GMainContext *ctx, GError **error);
/* The client's capabilities (VERSION), for the server that may take over. */
const VnWireCaps *vn_server_caps(VnServer *server);
/* The listening socket and the client's (-1: none), still the server's. */
int vn_server_listen_fd(VnServer *server);
int vn_server_client_fd(VnServer *server);
/* Disconnects the client, removes the socket file. */
void vn_server_free(VnServer *server);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnServer, vn_server_free)

/* The client's DMA table and interrupt table (valid for the server's life). */
VnDma *vn_server_dma(VnServer *server);
VnIrqs *vn_server_irqs(VnServer *server);

bool vn_server_has_client(VnServer *server);

/*
 * Answering later.  An op that cannot answer at once (it asks a peer first:
 * the borrower's lender) calls vn_server_later() from inside the op, keeps
 * the id, and returns 0 (what it returns then does not matter).  The ops that
 * may: dma_mapped, dma_unmapping, region_read, region_write, reset,
 * set_irqs (fds it consumed stay consumed, whatever the answer).  The
 * client's later commands are served meanwhile; their replies follow this
 * one's, in order, as vfio-user.rst's clients expect (QEMU takes a memory
 * transaction's last DMA_MAP reply as "all mapped").  At most
 * VN_SERVER_MAX_DEFERRED may be owed: past that the client's socket is not
 * read until one is answered.
 *
 * vn_server_complete() answers with @err (0 or -errno); a REGION_READ's
 * answer is vn_server_complete_read() with exactly the bytes it asked for.
 * An id the server no longer waits for (its client went, or another
 * server's) is ignored.  The reply, and those queued behind it, go out now; a
 * send error drops the client from the loop, not from inside the call.
 */
uint64_t vn_server_later(VnServer *server);
/*
 * An op that answers later and must finish something of its own before the client's next
 * command may be looked at (a DMA_MAP whose memory is first exported: the commands after
 * it, an UNMAP of it, must find it done) pauses the server's reading until it resumes;
 * pauses nest.  Its reply still comes with vn_server_complete().  pause returns what resume
 * takes (0: no client, nothing paused); a client that goes ends every pause of its.  resume:
 * whether the client paused is still here (false: it went, nothing of its is to be done).
 */
uint64_t vn_server_pause(VnServer *server);
bool vn_server_resume(VnServer *server, uint64_t pause);
void vn_server_complete(VnServer *server, uint64_t reply_id, int err);
void vn_server_complete_read(VnServer *server, uint64_t reply_id, const void *data, uint32_t count);
/* Drop the current client as if it had disconnected. */
void vn_server_disconnect(VnServer *server);
void vn_server_stats(VnServer *server, VnServerStats *out);
/* How long vn_server_client_dma() waits for the client's answer to a read.  No longer:
 * the client may be waiting for us meanwhile (a QEMU whose vCPU holds its big lock until
 * our answer to its MMIO, which is held here, and whose main loop would carry out the
 * read), and only this timeout ends that wait (the read then fails, all ones).  A longer
 * one made test_ntb's BAR guard stall past QEMU's own timeouts. */
#define VN_SERVER_CLIENT_DMA_TIMEOUT_MS 1000
/* The client's commands held while it waits (more stay in the socket). */
#define VN_SERVER_MAX_HELD 32
/* The most bytes one client DMA moves (QEMU takes up to 1 MiB). */
#define VN_SERVER_CLIENT_DMA_MAX 4096u

/*
 * DMA that the client carries out for the device, for an address the DMA
 * table does not hold that the client may still reach: peer to peer, a BAR
 * of another of its devices, through its IOMMU as its own device's DMA
 * would go (QEMU maps only RAM into the table).  A write (@to_client) is
 * posted: 0 once sent.  A read waits for the answer at most
 * VN_SERVER_CLIENT_DMA_TIMEOUT_MS, as a PCIe read waits for its completion;
 * meanwhile the client's own commands are held and served after, in order.
 * Returns 0, -ENOTCONN (no client, before VERSION, or it went), -E2BIG
 * (@len 0 or above VN_SERVER_CLIENT_DMA_MAX), -ETIMEDOUT, -EBUSY (it sent
 * VN_SERVER_MAX_HELD commands meanwhile), or the client's error.  From the
 * server's thread only (in a device op, of this server's or another's in
 * the same context).
 */
int vn_server_client_dma(VnServer *s, uint64_t addr, void *buf, uint32_t len, bool to_client);

/*
 * Asking the client to map an area of a BAR region itself (VN_CMD_X_REGION_MAP, wire.h):
 * with @fd >= 0, [@offset, @offset + @size) of region @index becomes the client's mapping
 * of @fd's @n extents @ext (each a range of @fd at an offset of the area, in order, apart;
 * what none covers reads all ones; @fd is sent, still the caller's), so its guest's loads
 * and stores there reach that memory with no message; with @fd < 0 (and @n 0) the client
 * drops that mapping and sends the area's accesses as messages again (a trap).  An area
 * keeps its offset and size while the client stays.  Offsets and sizes are multiples of
 * VN_SERVER_REGION_MAP_ALIGN.  Sent at once; @done(@opaque, err) is called exactly once
 * from the server's loop: 0 once the client has done it, its -errno if it refused (the
 * area is trapped then), or -ENOTCONN when the client goes first; a client that refuses a
 * trap is dropped (it may still reach the memory; a QEMU traps every area when its server
 * goes) and the ask ends with -ENOTCONN.  Returns 0 (sent),
 * -EOPNOTSUPP (the client did not offer VN_WIRE_CAP_REGION_MAP in VERSION: keep trapping),
 * -ENOTCONN, -EINVAL (not a BAR, not aligned, outside the region, extents out of order or
 * outside the area), -E2BIG (more than VN_WIRE_REGION_MAP_MAX_EXTENTS), -EBUSY
 * (VN_SERVER_MAX_ASKED unanswered), or a send's -errno; @done is not called then.
 */
#define VN_SERVER_REGION_MAP_ALIGN 4096u /* vn_wire_page_aligned() */
#define VN_SERVER_MAX_ASKED 16u
typedef void (*VnServerAnsweredFn)(void *opaque, int err);
int vn_server_region_map(VnServer *s, uint32_t index, uint64_t offset, uint64_t size, int fd,
                         const VnWireRegionExtent *ext, unsigned n, VnServerAnsweredFn done,
                         void *opaque);
/* Whether the client offered VN_WIRE_CAP_REGION_MAP (false before VERSION). */
bool vn_server_client_maps_regions(VnServer *s);

/* The counters as a JSON object (region_rw keyed by region index, plus the
 * interrupts signalled and the DMA mappings now in place); g_free it. */
char *vn_server_stats_json(VnServer *server);

#endif /* VN_SERVER_H */
