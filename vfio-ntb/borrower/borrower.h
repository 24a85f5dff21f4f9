/*
 * The borrower side of one lent device: a vfio-user server that presents a
 * device living on another node to one QEMU.
 *
 * - BARs the lender exports as fabric segments are mapped through fabric
 *   windows and offered to QEMU as region fds with sparse-mmap areas that
 *   leave out the MSI-X table and PBA (QEMU emulates those): the guest's
 *   loads and stores reach the device with no software in the path.
 * - Config space is mediated: the ROM BAR, BAR registers, the interrupt
 *   line, FLR and the extended capabilities (which cannot be honoured across
 *   the fabric) are virtualized; the rest is forwarded to the lender.
 * - DMA_MAP exports the guest-memory fd as a fabric segment (one per memory
 *   backend, shared by its sections) and asks the lender to map it at the
 *   guest-physical IOVA; DMA_UNMAP is forwarded and completes only when the
 *   device can no longer reach the memory.
 * - Interrupts: in fd mode QEMU's eventfds travel to the lender's device,
 *   which then signals the VM directly; in relay mode the borrower keeps them
 *   and signals them on the lender's doorbells.
 * - On lender loss, reads return all-ones and writes are dropped (no stale
 *   data), the loss is logged and counted, and a QEMU that takes device
 *   requests is asked to unplug the device.
 *
 * Threads: one GMainContext, shared with the fabric; no lending request is waited
 * for: each is answered from the loop, in the order they were sent.
 */
#ifndef VN_BORROWER_H
#define VN_BORROWER_H

#include "fabric/fabric.h"
#include "lending/proto.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnBorrower VnBorrower;

typedef struct VnBorrowerStats {
    uint64_t region_forwarded;   /* trapped BAR accesses forwarded to the lender */
    uint64_t config_forwarded;   /* config accesses forwarded */
    uint64_t config_virtualized; /* config accesses answered here */
    uint64_t relayed_irqs;       /* doorbells turned into VM interrupts */
    uint64_t fabric_requests;    /* lending requests sent */
    uint64_t dma_maps;           /* forwarded to the lender */
    uint64_t dma_unmaps;
    uint64_t dma_maps_here;         /* answered here: the mapping lingered (borrower-int.h) */
    uint64_t dma_unmaps_here;       /* answered here: the mapping lingers */
    uint64_t dma_lingering;         /* mappings lingering now */
    uint64_t unplug_requests;       /* device requests signalled to QEMU */
    uint64_t unmaps_missed;         /* DMA unmaps that did not reach a lost lender */
    uint64_t dma_maps_refused;      /* DMA maps the lender refused (each logged with its range) */
    uint64_t lender_returns;        /* a lost lender came back and serves again */
    uint64_t posted_writes;         /* forwarded BAR writes posted (borrower-int.h) */
    uint64_t posted_write_failures; /* ... that the lender answered with an error */
    uint64_t p2p_targets;           /* another device's BAR mapped for ours (docs/p2p.md) */
    uint64_t p2p_refused;           /* ... that our lender did not map */
    bool lender_lost;
} VnBorrowerStats;

/*
 * Borrow @device from node @lender (ATTACH), map its BARs and serve it on @socket_path (which
 * must not exist) in @ctx.  With @handoff_fd >= 0, serve the QEMU of a worker that died
 * instead (borrower/takeover.c): @handoff_fd (a file, taken) holds the daemon's handoff,
 * {"state": what that worker kept, "fds": {"KEY": FD}} with each FD open in this process
 * (its listening socket, QEMU's connection, the eventfds it held), and the lender is asked
 * to resume the attachment as it is.
 *
 * Nothing here waits on the lender: @done is told once, from @ctx's loop (or before this
 * returns, for what is wrong at once), with the borrower that serves, or NULL and why.
 */
typedef void (*VnBorrowerStartedFn)(void *opaque, VnBorrower *b, const GError *error);
void vn_borrower_start(VnFabric *fab, const char *lender, const char *device, VnIrqMode mode,
                       const char *socket_path, int handoff_fd, GMainContext *ctx,
                       VnBorrowerStartedFn done, void *opaque);
/*
 * A guest behind its own IOMMU maps and unmaps each I/O's buffers, mostly the same pages at
 * the same addresses again and again (Linux reuses a freed IOVA first).  QEMU's unmap is
 * answered at once and the mapping lingers at the lender for at most @ms and at most @max
 * mappings; a map equal to a lingering one takes it back without asking the lender, and
 * any other map over it unmaps it there first.  That is what Linux's own default (lazy)
 * IOMMU mode gives a device on bare metal: its flush queue lets a freed IOVA reach its page
 * for up to 10 ms and 256 entries per CPU.  An unmap of everything never lingers; @ms 0:
 * none does (each unmap waits for the lender).  The defaults are below; @max is at most
 * VN_BORROWER_MAX_LINGERING.
 */
#define VN_BORROWER_LINGER_MS 10
#define VN_BORROWER_MAX_LINGER_MS 1000u /* what a daemon may set ([node] dma-unmap-linger-ms) */
#define VN_BORROWER_MAX_LINGERING 512
/* Unmaps of lingering mappings on their way at once, nobody waiting for them (the lender
 * takes at most 256 requests from a peer at a time; the rest wait here). */
#define VN_BORROWER_MAX_UNMAPS_POSTED 32
void vn_borrower_set_dma_linger(VnBorrower *b, unsigned ms, unsigned max);

/* The exit status of a worker (borrower/worker.c) that could not take over. */
#define VN_BORROWER_EXIT_NO_TAKEOVER 3
/* Stops serving, DETACHes (if the lender is there), unmaps the windows. */
void vn_borrower_free(VnBorrower *b);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnBorrower, vn_borrower_free)

const char *vn_borrower_lender(VnBorrower *b);
const char *vn_borrower_device(VnBorrower *b);

/* Fabric events for this borrower's lender. */
void vn_borrower_doorbell(VnBorrower *b, uint32_t bit);
void vn_borrower_lender_down(VnBorrower *b);
/* The lender is back (its daemon kept the lease): forward again, true; or
 * false, said, when a DMA unmap missed it meanwhile (its device may still
 * reach memory QEMU took back: the device stays dead until detached). */
bool vn_borrower_lender_up(VnBorrower *b);

/*
 * Ask QEMU to take the device out of the VM through the device-request
 * interrupt (the guest's driver releases it, then QEMU disconnects).  Only
 * a QEMU that registered an eventfd for it can be asked (vfio-user-pci with
 * x-req, qemu-patches/0003); returns false otherwise, and the caller falls
 * back to QMP device_del.
 */
bool vn_borrower_can_request_unplug(VnBorrower *b);
bool vn_borrower_request_unplug(VnBorrower *b);

void vn_borrower_stats(VnBorrower *b, VnBorrowerStats *out);
/* Counters (ours and the vfio-user server's) as a JSON object. */
char *vn_borrower_stats_json(VnBorrower *b);

#endif /* VN_BORROWER_H */
