/*
 * The lender side of one lent device.
 *
 * A lender drives a local device through a backend (backend.h: its I/O
 * through VnBackendOps, its DMA through the IOMMU's VnBackendIommuOps) --
 * a vfio-user client (vfio-user/client.h) connected to any vfio-user device
 * server (vfio-ntb-simdev, QEMU's x-remote, a libvfio-user server), or a
 * PCI function of this host through Linux VFIO -- and exports it to one
 * borrower at a time over the fabric with the lending protocol (proto.h):
 *
 * - ATTACH: connects to the device server, describes the device, and
 *   exports every mappable BAR as a fabric segment that only the borrower
 *   may map (its own sparse areas kept).  A second borrower gets EBUSY.
 * - REGION_RW: forwarded to the device in order (trapped regions, config).
 * - DMA_MAP: maps the borrower's segment through a fabric window (one
 *   window per segment, shared by every mapping into it) and maps it at the
 *   IOVA in the device's DMA space.  DMA_UNMAP unmaps from the device before
 *   the reply, so when the borrower's unmap completes the device can no
 *   longer reach that memory; a window no mapping uses is unmapped.
 * - SET_IRQS: in fd mode the borrower's interrupt routes (fabric.h; on shm
 *   the VM's own eventfds) go to the device itself, so it signals the VM
 *   with no hop; in relay mode the lender gives the device its own
 *   eventfds, watches them and rings the doorbell bits the borrower named.
 * - RESET, DETACH; and when the borrower is gone (vn_lender_peer_down(): its
 *   lease ended): fence -- unmap all DMA, disable every interrupt, reset the
 *   device, withdraw the segments, disconnect from the device server -- so
 *   a new borrower can attach.
 *
 * It runs in a lender worker (worker.c), on the `host` fabric backend: the
 * borrower is its host's lease holder.
 *
 * Threads: the lender lives in its fabric's GMainContext.
 */
#ifndef VN_LENDER_H
#define VN_LENDER_H

#include "fabric/fabric.h"
#include "lending/backend.h"
#include "proto.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct VnLender VnLender;

typedef struct VnLenderStats {
    uint64_t requests;     /* lending-protocol requests handled */
    uint64_t queued;       /* of those, how many waited for one before them */
    uint64_t refused_busy; /* ... and how many found no room to wait (EBUSY) */
    uint64_t region_rw;    /* forwarded region accesses, config included */
    uint64_t config_rw;    /* forwarded config-space accesses */
    uint64_t relayed_irqs; /* device interrupts relayed (one doorbell may carry
                               * several that coalesced in the eventfd) */
    uint64_t dma_maps;
    uint64_t p2p_maps; /* of those, onto another device's BAR (docs/p2p.md) */
    uint64_t dma_unmaps;
    uint64_t resets;
    uint64_t fences;          /* borrower losses and detaches cleaned up */
    uint64_t bar_withholds;   /* paths onto the BARs withheld before memory went off */
    uint64_t device_timeouts; /* commands the device server did not answer in time */
    uint64_t device_late;     /* answers to those that came later (dropped) */
    bool device_stalled;      /* the last command timed out, none answered since */
    uint32_t windows;         /* fabric windows mapped now */
    uint64_t device_requests; /* the host asked for the device back (VFIO's REQ) */
    uint64_t server_losses;   /* the device server died or wedged */
    uint64_t server_returns;  /* ... and answered again */
    uint64_t server_dials;    /* dials of a lost or not yet found server (lender-server.c) */
} VnLenderStats;

/*
 * Lend device @name (proto.h name rules), reached through backend @ops
 * (backend.h, checked here) at @where (a vfio-user socket, ...).  Nothing
 * opens it until a borrower attaches.
 */
VnLender *vn_lender_new(VnFabric *fab, const char *name, const VnBackendOps *ops, const char *where,
                        GError **error);
/* Fences first if a borrower holds the device. */
void vn_lender_free(VnLender *l);

/*
 * While lent, the lender hears the host's device request (a backend with
 * VFIO_PCI_REQ_IRQ_INDEX: the kernel wants the function back, for an unbind
 * or a removal, and waits until every fd of it is closed).  @fn is told
 * each time the kernel asks (it asks again every few seconds), so that the
 * lease is revoked gracefully; when the kernel has asked
 * VN_LENDER_REQUESTS_BEFORE_FENCE times and the device is still lent, or
 * when no @fn is set, the lender fences on its own.  The device request is
 * the lender host's: a borrower's SET_IRQS of that index is refused.
 */
#define VN_LENDER_REQUESTS_BEFORE_FENCE 3
typedef void (*VnLenderRequestFn)(void *opaque);
void vn_lender_on_device_request(VnLender *l, VnLenderRequestFn fn, void *opaque);
/*
 * The device server came or went (a backend that can lose it: vfio-user): @up, and how
 * many times a lost server came back (@gen; a holder presents the device anew to its VM
 * when it grows, since the device it had is gone).  @why says what happened.  Told at
 * each change, from the lender's context.
 */
typedef void (*VnLenderServerFn)(void *opaque, bool up, uint32_t gen, const char *why);
void vn_lender_on_server(VnLender *l, VnLenderServerFn fn, void *opaque);
/*
 * Connections to the device server come from @fn (a worker without the rights to reach the
 * server's socket: its daemon dials for it), for a backend that takes one (open_fd), asked
 * without waiting: @fn tells @done (with @done_opaque) a connected fd, or -1 with @error,
 * once, at once or later.  Without it the lender dials itself.
 */
typedef void (*VnLenderDialedFn)(void *done_opaque, int fd, const GError *error);
typedef void (*VnLenderDialFn)(void *opaque, VnLenderDialedFn done, void *done_opaque);
void vn_lender_set_dialer(VnLender *l, VnLenderDialFn fn, void *opaque);
/* Whether a device server answers now (always true for a backend that cannot lose it),
 * how many times it came back, and its last loss ("HH:MM:SS: why") or NULL. */
bool vn_lender_server_up(VnLender *l);
uint32_t vn_lender_server_gen(VnLender *l);
const char *vn_lender_server_loss(VnLender *l);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnLender, vn_lender_free)

const char *vn_lender_name(VnLender *l);
/* The node holding the device, or NULL. */
const char *vn_lender_borrower(VnLender *l);

/*
 * Handle a lending-protocol request (msg->type a VnProtoType) whose
 * "device" is ours; answers it exactly once through vn_fabric_reply*().
 * A request from a node other than the borrower (except ATTACH) gets EPERM.
 */
void vn_lender_request(VnLender *l, VnFabricMsg *msg, uint64_t token);
/* A doorbell or link event for the lender's borrower. */
void vn_lender_peer_down(VnLender *l, const char *peer);
/* @peer's link is up: the port says so of the lease holder only. */
void vn_lender_peer_up(VnLender *l, const char *peer);

void vn_lender_stats(VnLender *l, VnLenderStats *out);
/* "answering", "stalled (its last command got no answer)" or "not connected"
 * (not lent). */
const char *vn_lender_device_state(VnLender *l);
/* The device server's last stall and how it ended, or NULL: never stalled. */
const char *vn_lender_last_stall(VnLender *l);
char *vn_lender_stats_json(VnLender *l);

#endif /* VN_LENDER_H */
