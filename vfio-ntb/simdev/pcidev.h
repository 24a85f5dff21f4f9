/*
 * The simulated PCIe NVMe device as the vfio-user server engine sees it:
 * its VnDeviceInfo (regions, irqs) and its VnDeviceOps, tying together the
 * config space (pcicfg.c), the NVMe controller (nvme*.c), BAR0 in a memfd
 * the client maps, optionally the Controller Memory Buffer in BAR2 (another
 * memfd), BAR4 with the MSI-X table, and the engine thread that polls BAR0
 * (engine.c).
 *
 * Two interrupt modes (VnPciDevParams.irq_mode):
 *   MSI-X (default, what NVMe controllers have): an MSI-X capability with
 *     @vectors vectors, table and PBA in BAR4.
 *   MSI: an MSI capability with the largest power of two <= @vectors
 *     (at most 32) and no BAR4.  Stock QEMU 11.1's vfio-user-pci aborts
 *     when a device with MSI-X is hot-unplugged (vfio_user_msix_teardown()
 *     deletes a subregion QOM already unparented); without MSI-X it can.
 *
 * Regions (linux/vfio.h indexes): BAR0 16 KiB, READ|WRITE|MMAP from a memfd
 * with one sparse area over all of it; BAR2 (BAR3 its upper half) the CMB,
 * @cmb_mib MiB, 64-bit prefetchable, READ|WRITE|MMAP from its own memfd the
 * same way, size 0 without a CMB; BAR4 4 KiB READ|WRITE, trapped (QEMU
 * emulates the MSI-X table itself and keeps the BAR unmapped), size 0 in
 * MSI mode; CONFIG 4 KiB.  With trap_bars, BAR0 and BAR2 come without their
 * memfds (READ|WRITE: every access a message, to the same memory).
 * Irqs: INTx 1, MSI 0 or the MSI vectors, MSI-X @vectors (NORESIZE) or 0,
 * ERR 1 (never signalled, as the kernel's vfio-pci reports it), REQ 0.
 *
 * Threads: the ops run in the server's GMainContext (the socket thread).
 * The engine thread runs vn_nvme_poll_once() only.  Who owns what:
 *   config space   socket thread (the engine reads its atomic state bits)
 *   BAR4 storage   socket thread only (MSI-X mode)
 *   BAR0 memory    shared with the guest; registers by the NVMe controller
 *   CMB memory     shared with the guest and peers; data by the controller
 *   NVMe state     the controller's own lock (engine polls, socket resets)
 * reset, client_gone and a guest's FLR (Initiate FLR written to config
 * space) take the controller lock, so when they return the controller is
 * disabled and issues no DMA until the guest enables it again.
 */
#ifndef VN_PCIDEV_H
#define VN_PCIDEV_H

#include "nvme.h"
#include "vfio-user/server.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Our own ids (Linux's nvme driver binds by class 01:08:02, any id works;
 * QEMU's 1b36:0010 would make us indistinguishable from its nvme). */
#define VN_PCIDEV_VENDOR_ID 0x1de1u
#define VN_PCIDEV_DEVICE_ID 0x5601u
/* Class 01h mass storage, 08h non-volatile memory, 02h NVM Express. */
#define VN_PCIDEV_CLASS 0x010802u
#define VN_PCIDEV_BAR4_SIZE 4096u
#define VN_PCIDEV_MSIX_TABLE 0x000u
#define VN_PCIDEV_MSIX_PBA 0x800u
/* MSI-X vectors: the table (16 bytes each) must end before the PBA at
 * 0x800, so at most 128; at least 2 (admin queue + one I/O queue). */
#define VN_PCIDEV_MIN_VECTORS 2u
#define VN_PCIDEV_MAX_VECTORS (VN_PCIDEV_MSIX_PBA / VN_PCICFG_MSIX_ENTRY_SIZE)

typedef struct VnPciDevParams {
    const char *backing; /* namespace file */
    uint64_t size;       /* namespace bytes */
    const char *serial;
    /* VN_PCIDEV_MIN_VECTORS..VN_PCIDEV_MAX_VECTORS, whatever the mode; I/O
     * queues = vectors - 1 (<= 64), vectors shared when MSI has fewer. */
    uint32_t vectors;
    VnPciCfgIrqMode irq_mode; /* 0 = MSI-X */
    /* BAR0 (and the CMB) offered without its memfd: every register access is a
     * REGION_READ/WRITE, as a device's BAR a lender cannot map is (the software path; its
     * benches and tests). */
    bool trap_bars;
    /* 0: no CMB, BAR2 not implemented.  Else its size in MiB, which
     * vn_nvme_cmb_mib_valid() must accept. */
    uint32_t cmb_mib;
} VnPciDevParams;

typedef struct VnPciDev VnPciDev;

/* Build the device (config space, BAR0 and CMB memfds, controller,
 * namespace file).  The CMB starts zeroed (a new memfd).  NULL with @error
 * set on a bad parameter or a system error. */
VnPciDev *vn_pcidev_new(const VnPciDevParams *params, GError **error);
/* Stops the engine if it still runs. */
void vn_pcidev_free(VnPciDev *d);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnPciDev, vn_pcidev_free)

/* Vectors the device offers in its mode (MSI-X: params.vectors; MSI: the
 * largest power of two not above it, at most VN_PCICFG_MAX_MSI_VECTORS). */
uint32_t vn_pcidev_vectors(VnPciDev *d);

/* What to give vn_server_new() (valid for the device's life; the BAR0 and
 * CMB memfds stay the device's). */
const VnDeviceInfo *vn_pcidev_info(VnPciDev *d);
extern const VnDeviceOps vn_pcidev_ops;

/* Attach the server's DMA and irq tables (borrowed: the server must outlive
 * vn_pcidev_stop) and start the engine thread. */
bool vn_pcidev_start(VnPciDev *d, VnDma *dma, VnIrqs *irqs, GError **error);
/* Stop the engine thread; call before freeing the server. */
void vn_pcidev_stop(VnPciDev *d);

VnNvme *vn_pcidev_nvme(VnPciDev *d);

#endif /* VN_PCIDEV_H */
