/*
 * A simulated NVMe 1.4 controller with one namespace backed by a raw file:
 * the subset of the NVMe Base Specification 1.4 that Linux's nvme driver
 * uses (admin queue, Identify, features, I/O queues, Read/Write/Flush/Write
 * Zeroes with PRPs and PRP lists), and optionally a Controller Memory Buffer
 * for data (Linux publishes it as p2pmem).
 *
 * The controller registers and doorbells live in BAR0 memory that the guest
 * writes directly (a shared mapping), so nothing announces a doorbell write:
 * the owner calls vn_nvme_poll_once() in a loop (an engine thread; a test
 * calls it by hand).  Guest memory is reached only through a VnDma and
 * interrupts go out through a VnIrqs; every value the guest controls is
 * checked and answered with an NVMe status, never trusted.
 *
 * Threads: the controller's state is guarded by an internal mutex.
 * vn_nvme_poll_once() (engine thread), vn_nvme_reset() and vn_nvme_flush()
 * (socket thread) each take it, so a reset never runs in the middle of a
 * command.  vn_nvme_new/attach/free run before and after the engine.
 */
#ifndef VN_NVME_H
#define VN_NVME_H

#include "pcicfg.h"
#include "vfio-user/dma.h"
#include "vfio-user/irqs.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* BAR0: registers at 0, doorbells from 0x1000 (NVMe 1.4 3.1); 16 KiB holds
 * the doorbells of far more queues than we grant. */
#define VN_NVME_BAR0_SIZE 16384u
/* Logical block size of the namespace (LBA Format 0, LBADS 9). */
#define VN_NVME_LBA_SIZE 512u
/* Largest namespace: 16 TiB, so that block counts and byte offsets stay far
 * from overflow and a mistyped size is caught. */
#define VN_NVME_MAX_SIZE (16ull << 40)
/* I/O queue pairs we grant at most (Set Features Number of Queues); each
 * gets its own MSI-X vector besides the admin queue's. */
#define VN_NVME_MAX_IO_QUEUES 64u
/* Serial Number field of Identify Controller: 20 ASCII bytes. */
#define VN_NVME_SERIAL_LEN 20u
/* Controller Memory Buffer (NVMe 1.4 4.7), in MiB (CMBSZ.SZU = 1 MiB).  At
 * least 2: Linux publishes a CMB as p2pmem through ZONE_DEVICE pages, which
 * it maps in 2 MiB subsections, so a smaller BAR backs no page.  At most
 * 256: the memfd is the device's memory and a lender exports it whole as a
 * window; more is a mistyped size, not a buffer anyone needs. */
#define VN_NVME_MIN_CMB_MIB 2u
#define VN_NVME_MAX_CMB_MIB 256u
/* The BAR of the CMB (CMBLOC.BIR), where QEMU's nvme puts it: BAR0/1 hold
 * the registers, BAR4 the MSI-X table. */
#define VN_NVME_CMB_BAR 2u

/* Whether @mib is a CMB size we offer: 0 (none), or a power of two (a BAR
 * is one, PCI 3.0 6.2.5.1, and the CMB is all of it) from
 * VN_NVME_MIN_CMB_MIB to VN_NVME_MAX_CMB_MIB. */
bool vn_nvme_cmb_mib_valid(int64_t mib);

typedef struct VnNvmeParams {
    const char *backing;    /* namespace file: created or extended */
    uint64_t size;          /* namespace bytes, multiple of the LBA size */
    const char *serial;     /* printable ASCII, <= VN_NVME_SERIAL_LEN */
    uint32_t vectors;       /* MSI-X or MSI vectors (CQ interrupt vectors < this) */
    uint32_t io_queues;     /* 1..VN_NVME_MAX_IO_QUEUES */
    uint16_t pci_vendor_id; /* reported in Identify Controller VID/SSVID */
    uint16_t pci_subsys_vendor_id;
    /* 0: no CMB.  Else a power of two in VN_NVME_MIN_CMB_MIB..
     * VN_NVME_MAX_CMB_MIB, with @cmb that many MiB (borrowed, shared with the
     * guest and peers like BAR0): the memory of BAR VN_NVME_CMB_BAR. */
    uint32_t cmb_mib;
    uint8_t *cmb;
} VnNvmeParams;

typedef struct VnNvme VnNvme;

/* Counters, read with vn_nvme_stats(). */
typedef struct VnNvmeStats {
    uint64_t admin_cmds;
    uint64_t io_cmds;
    uint64_t errors; /* completions with a non-zero status */
    uint64_t read_cmds;
    uint64_t write_cmds;
    uint64_t blocks_read;
    uint64_t blocks_written;
    uint64_t irqs;    /* interrupts requested */
    uint64_t enables; /* CC.EN 0->1 transitions that succeeded */
} VnNvmeStats;

/*
 * Open (create or extend, keeping the data) the backing file and build a
 * disabled controller whose registers live in @bar0 (VN_NVME_BAR0_SIZE
 * bytes, borrowed, shared with the guest) and which asks @cfg (borrowed)
 * whether bus mastering, MSI-X, MSI and INTx are enabled (and, for MSI, its
 * per-vector masks).  Returns NULL with @error set on a bad parameter or a
 * file error.
 */
VnNvme *vn_nvme_new(const VnNvmeParams *params, uint8_t *bar0, VnPciCfg *cfg, GError **error);
void vn_nvme_free(VnNvme *n);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnNvme, vn_nvme_free)

/* Give the controller the client's DMA and interrupt tables (borrowed; the
 * server's live as long as the server).  Until then polling does nothing. */
void vn_nvme_attach(VnNvme *n, VnDma *dma, VnIrqs *irqs);

/*
 * One pass over the registers, completion-queue heads and submission-queue
 * tails: handles CC changes, executes a bounded number of commands per
 * queue and raises the interrupts they earned.  Returns true if anything
 * changed (a command ran, CC or a head moved), which the caller uses to
 * decide whether to keep spinning.  Never blocks on the guest.
 */
bool vn_nvme_poll_once(VnNvme *n);

/* True while CC.EN has been accepted (CSTS.RDY): commands may arrive. */
bool vn_nvme_ready(VnNvme *n);

/* Reset the controller as a function reset does: queues deleted, pending
 * commands dropped, every BAR0 register back to its default and every
 * doorbell zeroed.  The namespace's data and the CMB's contents are kept. */
void vn_nvme_reset(VnNvme *n);

/* Write the namespace's data to stable storage (fdatasync).  0 or -errno. */
int vn_nvme_flush(VnNvme *n);

void vn_nvme_stats(VnNvme *n, VnNvmeStats *out);

#endif /* VN_NVME_H */
