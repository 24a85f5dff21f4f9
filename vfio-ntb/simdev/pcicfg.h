/*
 * PCI configuration space of a simulated device: a type 0 header with
 * memory BARs, PM, MSI-X or MSI, and PCI Express capabilities, and write
 * masks so that a write changes only the bits the PCI specifications make
 * writable.
 *
 * The model is the vfio region VFIO_PCI_CONFIG_REGION_INDEX: 4096 bytes,
 * the first 256 the conventional header and capabilities, the rest the
 * PCIe extended space, which is all zeros (no extended capabilities; PCIe
 * r5.0 7.6.3 allows a zero header at 100h).
 *
 * Threads: vn_pcicfg_read/write/reset/take_flr run in the socket thread only.  The
 * bits other code acts on (bus master, memory space, INTx disable, MSI-X
 * enable and function mask, MSI enable, enabled MSI vectors and mask bits,
 * the BAR addresses) are
 * mirrored into atomic words after every write, so the query functions may
 * be called from any thread without a lock.  MSI pending bits are the
 * exception that goes the other way: one signalling thread sets and clears
 * them (vn_pcicfg_msi_hold/take_released), config reads show them.
 */
#ifndef VN_PCICFG_H
#define VN_PCICFG_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Size of the vfio config region (PCIe: 4 KiB of configuration space). */
#define VN_PCICFG_SIZE 4096u
/* Conventional configuration space: header and capability list. */
#define VN_PCICFG_STD_SIZE 256u
/* MSI-X allows 2048 vectors (PCIe r5.0 7.7.2.2: Table Size is 11 bits). */
#define VN_PCICFG_MAX_VECTORS 2048u
/* One MSI-X table entry (PCIe r5.0 7.7.2.5) and one 64-bit PBA word. */
#define VN_PCICFG_MSIX_ENTRY_SIZE 16u
/* MSI allows 32 vectors (PCI 3.0 6.8.1.3: Multiple Message Capable is at
 * most 101b); the mask and pending registers are 32 bits. */
#define VN_PCICFG_MAX_MSI_VECTORS 32u

/* Offsets of our capabilities (fixed layout, see pcicfg.c).  MSI-X and MSI
 * take the same place: a function has one or the other. */
#define VN_PCICFG_CAP_PM 0x40u
#define VN_PCICFG_CAP_MSIX 0x50u
#define VN_PCICFG_CAP_MSI 0x50u
#define VN_PCICFG_CAP_EXP 0x70u

/* Which message-signalled interrupt capability the function has. */
typedef enum VnPciCfgIrqMode {
    VN_PCICFG_IRQ_MSIX, /* MSI-X, table and PBA in a BAR (the default) */
    VN_PCICFG_IRQ_MSI,  /* MSI: 64-bit, per-vector masking, no table */
    VN_PCICFG_IRQ_LAST
} VnPciCfgIrqMode;

/* "msix", "msi" (the CLI's spelling); "?" for a value out of range. */
const char *vn_pcicfg_irq_mode_to_string(VnPciCfgIrqMode mode);
/* The inverse; false (and @mode untouched) for anything else. */
bool vn_pcicfg_irq_mode_from_string(const char *s, VnPciCfgIrqMode *mode);

/* Base Address Registers of a type 0 header (PCI 3.0 6.2.5.1). */
#define VN_PCICFG_BARS 6u

/* One memory BAR (we have no I/O BARs). */
typedef struct VnPciCfgBar {
    uint64_t size; /* 0: not implemented; else a power of two >= 4 KiB
                                 * (32-bit BARs: at most 2 GiB) */
    bool is64;     /* 64-bit: takes the next BAR's slot too */
    bool prefetch; /* Prefetchable */
} VnPciCfgBar;

typedef struct VnPciCfgParams {
    uint16_t vendor_id;
    uint16_t device_id;
    uint16_t subsys_vendor_id;
    uint16_t subsys_id;
    uint8_t revision;
    uint32_t class_code; /* 24 bits: base class, sub class, prog-if */
    /* A 64-bit BAR's next slot must have size 0 (BAR5 cannot be 64-bit). */
    VnPciCfgBar bars[VN_PCICFG_BARS];
    VnPciCfgIrqMode irq_mode; /* 0 = MSI-X */
    /* VN_PCICFG_IRQ_MSIX only: */
    uint32_t msix_vectors;      /* 1..VN_PCICFG_MAX_VECTORS */
    uint8_t msix_bir;           /* BAR holding table and PBA (one that exists) */
    uint32_t msix_table_offset; /* 8-byte aligned, inside the BAR */
    uint32_t msix_pba_offset;   /* 8-byte aligned, inside the BAR */
    /* VN_PCICFG_IRQ_MSI only: */
    uint32_t msi_vectors; /* power of two, 1..VN_PCICFG_MAX_MSI_VECTORS */
} VnPciCfgParams;

typedef struct VnPciCfg VnPciCfg;

/*
 * Build the power-on configuration space for @params (copied).  Returns
 * NULL with @error set when a size is not a power of two, the MSI-X table
 * or PBA does not fit its BAR or overlaps the other, a count is out of
 * range, or the mode is unknown.
 */
VnPciCfg *vn_pcicfg_new(const VnPciCfgParams *params, GError **error);
void vn_pcicfg_free(VnPciCfg *cfg);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnPciCfg, vn_pcicfg_free)

/*
 * Config space accesses of any size and alignment inside
 * [0, VN_PCICFG_SIZE).  Writes go through the write masks; bits that are
 * not writable keep their value, writes above 0xff are ignored.  Returns 0
 * or -EINVAL for a range outside the space.
 */
int vn_pcicfg_read(VnPciCfg *cfg, uint64_t offset, void *buf, uint32_t count);
int vn_pcicfg_write(VnPciCfg *cfg, uint64_t offset, const void *buf, uint32_t count);

/* Back to the power-on state (a conventional reset: PCIe r5.0 7.5.1.1.1
 * and 7.5.1.2.1 give every register's value after reset).  We have no
 * sticky or HwInit bits, so a Function Level Reset (PCIe r5.0 6.6.2) is
 * the same. */
void vn_pcicfg_reset(VnPciCfg *cfg);

/* True once after a write set Initiate Function Level Reset in the PCI
 * Express Device Control register: the owner must then reset the function
 * (device state and, with vn_pcicfg_reset(), the config space). */
bool vn_pcicfg_take_flr(VnPciCfg *cfg);

/* Any thread: the command register's Bus Master Enable (PCI 3.0 6.2.2). */
bool vn_pcicfg_bus_master(VnPciCfg *cfg);
/* Any thread: Memory Space Enable. */
bool vn_pcicfg_mem_enabled(VnPciCfg *cfg);
/* Any thread: the address software programmed into memory BAR @bar (both
 * halves of a 64-bit BAR, type bits masked off); 0 for a BAR that is not
 * implemented, the upper half of a 64-bit one, or one not yet assigned.
 * While software sizes a BAR (all ones written) it reads as the size mask:
 * look at it only with Memory Space Enable set, as the device decodes it. */
uint64_t vn_pcicfg_bar_addr(VnPciCfg *cfg, unsigned bar);
/* Any thread: Interrupt Disable (INTx may not be asserted). */
bool vn_pcicfg_intx_disabled(VnPciCfg *cfg);
/* Any thread: MSI-X Enable and Function Mask (PCIe r5.0 7.7.2.2). */
bool vn_pcicfg_msix_enabled(VnPciCfg *cfg);
bool vn_pcicfg_msix_masked(VnPciCfg *cfg);
/* Any thread: MSI Enable (PCI 3.0 6.8.1.3); always false in MSI-X mode. */
bool vn_pcicfg_msi_enabled(VnPciCfg *cfg);
/* Any thread: the vectors software allocated, 2^Multiple Message Enable
 * (1..the capable count: a larger value written is taken as the capable
 * count, as QEMU's hw/pci/msi.c does); 1 in MSI-X mode.  Only meaningful
 * while MSI is enabled. */
uint32_t vn_pcicfg_msi_vectors(VnPciCfg *cfg);

/*
 * Per-vector masking (PCI 3.0 6.8.3.5), for the one thread that sends MSI
 * messages.  vn_pcicfg_msi_hold(): if @vector (< the enabled count) is
 * masked, set its Pending bit and return true: the caller must not send it
 * now.  vn_pcicfg_msi_take_released(): the vectors whose Pending bit is set
 * and that are no longer masked, with their Pending bits cleared: the
 * caller must send each now.  Call it after a config write (the owner is
 * told by its region_write); a vector unmasked between hold's check and its
 * setting Pending is caught by the next call.  A reset clears Pending.
 */
bool vn_pcicfg_msi_hold(VnPciCfg *cfg, uint32_t vector);
uint32_t vn_pcicfg_msi_take_released(VnPciCfg *cfg);

#endif /* VN_PCICFG_H */
