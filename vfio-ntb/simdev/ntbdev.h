/*
 * The simulated NTB (epf.h) as two vfio-user devices, one per port: each port's config space
 * (pcicfg.h: vendor:device and class that ntb_hw_epf binds to, MSI-X in BAR1), its regions
 * and the VnDeviceOps that the server engine calls.  Window accesses become DMA in the peer
 * port's client's memory: the DMA table its QEMU filled, which follows that guest's IOMMU
 * (QEMU maps what the guest's IOMMU maps for the device), so the peer's translation is the
 * peer host's own, as an NTB's inbound translation is.  An address that table does not hold
 * (QEMU maps only RAM into it: a BAR of another device of the peer host's, reached peer to
 * peer) is asked of the peer's QEMU (vn_server_client_dma()), which resolves it through the
 * same IOMMU into that device.
 *
 * Regions of each port, as the window count's map has them (vn_epf_layout()): BAR0 (control,
 * VN_EPF_CTRL_SIZE), BAR1 (MSI-X table and PBA: QEMU emulates the table; we keep the storage;
 * with three windows the peer's scratchpads first), BAR2 (doorbells; with three windows,
 * window 1 after them), the windows' BARs, CONFIG.
 * All trapped: a window's target changes whenever the peer reprograms its translation.
 * Irqs: INTx 1 (never raised), MSI-X VN_EPF_MAX_VECTORS, ERR 1 (as vfio-pci reports).
 *
 * Threads: everything runs in the servers' GMainContext (one for both ports).
 */
#ifndef VN_NTBDEV_H
#define VN_NTBDEV_H

#include "epf.h"
#include "vfio-user/server.h"

#include <glib.h>

typedef struct VnNtbDev VnNtbDev;

/* Both ports, @windows windows of @sizes bytes (vn_epf_new's bounds). */
VnNtbDev *vn_ntbdev_new(const uint64_t *sizes, unsigned windows, GError **error);
void vn_ntbdev_free(VnNtbDev *d);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnNtbDev, vn_ntbdev_free)

/* What to give vn_server_new() for either port (the same for both), with
 * vn_ntbdev_port(d, port) as the opaque of vn_ntbdev_ops. */
const VnDeviceInfo *vn_ntbdev_info(VnNtbDev *d);
void *vn_ntbdev_port(VnNtbDev *d, unsigned port);
extern const VnDeviceOps vn_ntbdev_ops;

/* Give @port its server's DMA and irq tables (borrowed: the server outlives the device's
 * use of them; detach with NULL before freeing the server). */
void vn_ntbdev_attach(VnNtbDev *d, unsigned port, VnServer *server);

/* Whether windows may be mapped by their clients (ntbdev-int.h; on at first): off, every
 * mapped window is trapped again, as under a QEMU without the extension (what a bench
 * compares in one run). */
void vn_ntbdev_set_mapping(VnNtbDev *d, bool on);
bool vn_ntbdev_mapping(VnNtbDev *d);

/* Where each port's parts are (the same for both). */
void vn_ntbdev_layout(VnNtbDev *d, VnEpfLayout *out);

/* Both ports' counters and the link as JSON; g_free it. */
char *vn_ntbdev_stats_json(VnNtbDev *d);

#endif /* VN_NTBDEV_H */
