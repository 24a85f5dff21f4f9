/*
 * PCI configuration space of a simulated device (see pcicfg.h).
 *
 * Layout (fixed; the capability list is walked by the guest and by QEMU's
 * vfio code, which reads the MSI-X capability to find table and PBA, or the
 * MSI capability's control word to build its own copy with msi_init()):
 *
 *   0x00  type 0 header (PCI 3.0 6.1), memory BARs as the params say
 *   0x40  Power Management, version 3 (PCI PM 1.2 3.2)
 *   0x50  MSI-X (PCIe r5.0 7.7.2), 12 bytes, or
 *         MSI (PCI 3.0 6.8.1), 64-bit with per-vector masking, 24 bytes
 *   0x70  PCI Express, version 2, endpoint (PCIe r5.0 7.5.3)
 *   0x100 extended space: all zeros, no extended capabilities
 *
 * The PCI Express capability sits after the longer of the two, so both
 * modes share one layout (QEMU refuses capabilities that overlap).
 *
 * Every register has a write mask: a byte written to the space becomes
 * (old & ~mask) | (new & mask), the same rule QEMU's hw/pci uses for its
 * emulated devices.  No register of ours has write-1-to-clear bits: we
 * never set status bits that would need them.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "pcicfg.h"

#include "common/util.h"
#include "trace-simdev.h"

#include <errno.h>
#include <gio/gio.h>
#include <linux/pci_regs.h>
#include <string.h>

/* Bits mirrored for other threads (see pcicfg.h). */
enum {
    STATE_BUS_MASTER = 1 << 0,
    STATE_MEM_ENABLE = 1 << 1,
    STATE_INTX_DISABLE = 1 << 2,
    STATE_MSIX_ENABLE = 1 << 3,
    STATE_MSIX_MASKALL = 1 << 4,
    STATE_MSI_ENABLE = 1 << 5,
    /* bits 8-10: log2 of the enabled MSI vectors (Multiple Message Enable) */
    STATE_MSI_LOG2_SHIFT = 8,
    STATE_MSI_LOG2_MASK = 7 << STATE_MSI_LOG2_SHIFT,
};

/* Length of the PCI Express capability structure, version 2 (PCIe r5.0
 * 7.5.3: up to and including Slot Status 2 at 3Ah). */
#define EXP_CAP_LEN 0x3cu
/* Length of the MSI-X, MSI (64-bit address, per-vector masking: PCI 3.0
 * 6.8.1, up to and including Pending Bits at 14h) and PM capabilities. */
#define MSIX_CAP_LEN 12u
#define MSI_CAP_LEN 24u
#define PM_CAP_LEN 8u

struct VnPciCfg {
    VnPciCfgParams params;
    uint8_t bytes[VN_PCICFG_STD_SIZE];    /* current values (socket thread) */
    uint8_t wmask[VN_PCICFG_STD_SIZE];    /* writable bits */
    uint8_t defaults[VN_PCICFG_STD_SIZE]; /* power-on image */
    gint state;                           /* STATE_*, atomic */
    uint32_t msi_mask;                    /* MSI Mask Bits mirror, atomic */
    uint32_t msi_pending;                 /* MSI Pending Bits, atomic: set and
                                            * cleared by the signalling thread,
                                            * cleared by reset; the bytes of
                                            * the register are filled in on
                                            * read */
    bool flr_pending;                     /* Initiate FLR was written */
    uint64_t bar_addr[VN_PCICFG_BARS];    /* programmed BAR addresses, atomic */
};

static const char *const irq_mode_names[VN_PCICFG_IRQ_LAST] = {
    [VN_PCICFG_IRQ_MSIX] = "msix",
    [VN_PCICFG_IRQ_MSI] = "msi",
};

const char *vn_pcicfg_irq_mode_to_string(VnPciCfgIrqMode mode)
{
    return (unsigned)mode < VN_PCICFG_IRQ_LAST ? irq_mode_names[mode] : "?";
}

bool vn_pcicfg_irq_mode_from_string(const char *s, VnPciCfgIrqMode *mode)
{
    for (unsigned m = 0; m < VN_PCICFG_IRQ_LAST; m++) {
        if (s != NULL && strcmp(s, irq_mode_names[m]) == 0) {
            *mode = (VnPciCfgIrqMode)m;
            return true;
        }
    }
    return false;
}

static void set8(VnPciCfg *cfg, unsigned off, uint8_t val, uint8_t mask)
{
    cfg->bytes[off] = val;
    cfg->wmask[off] = mask;
}

static void set16(VnPciCfg *cfg, unsigned off, uint16_t val, uint16_t mask)
{
    set8(cfg, off, val & 0xff, mask & 0xff);
    set8(cfg, off + 1, val >> 8, mask >> 8);
}

static void set32(VnPciCfg *cfg, unsigned off, uint32_t val, uint32_t mask)
{
    set16(cfg, off, val & 0xffff, mask & 0xffff);
    set16(cfg, off + 2, val >> 16, mask >> 16);
}

static uint16_t get16(const VnPciCfg *cfg, unsigned off)
{
    return (uint16_t)(cfg->bytes[off] | cfg->bytes[off + 1] << 8);
}

static uint32_t get32(const VnPciCfg *cfg, unsigned off)
{
    return get16(cfg, off) | (uint32_t)get16(cfg, off + 2) << 16;
}

static bool is_msi(const VnPciCfg *cfg)
{
    return cfg->params.irq_mode == VN_PCICFG_IRQ_MSI;
}

static bool is_pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

static bool bars_valid(const VnPciCfgParams *p, GError **error)
{
    for (unsigned i = 0; i < VN_PCICFG_BARS; i++) {
        const VnPciCfgBar *b = &p->bars[i];

        if (b->size == 0) {
            continue;
        }
        if (!is_pow2(b->size) || b->size < 4096 || (!b->is64 && b->size > (1ull << 31))) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "config space: BAR%u: %" G_GUINT64_FORMAT " bytes (a power of two "
                        "of at least 4 KiB, at most 2 GiB for a 32-bit BAR)",
                        i, b->size);
            return false;
        }
        if (b->is64 && (i + 1 >= VN_PCICFG_BARS || p->bars[i + 1].size != 0)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "config space: BAR%u is 64-bit but BAR%u is not free for its upper "
                        "half",
                        i, i + 1);
            return false;
        }
        if (b->is64) {
            i++;
        }
    }
    return true;
}

static bool params_valid(const VnPciCfgParams *p, GError **error)
{
    uint64_t table_len, pba_len, msix_bar;

    if (!bars_valid(p, error)) {
        return false;
    }
    if ((unsigned)p->irq_mode >= VN_PCICFG_IRQ_LAST) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "config space: unknown interrupt mode %u", (unsigned)p->irq_mode);
        return false;
    }
    if (p->irq_mode == VN_PCICFG_IRQ_MSI) {
        if (!is_pow2(p->msi_vectors) || p->msi_vectors > VN_PCICFG_MAX_MSI_VECTORS) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "config space: %u MSI vectors (a power of two up to %u)", p->msi_vectors,
                        VN_PCICFG_MAX_MSI_VECTORS);
            return false;
        }
        return true;
    }
    if (p->msix_vectors == 0 || p->msix_vectors > VN_PCICFG_MAX_VECTORS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "config space: %u MSI-X vectors (1..%u)", p->msix_vectors,
                    VN_PCICFG_MAX_VECTORS);
        return false;
    }
    /* PCIe r5.0 7.7.2.3/7.7.2.4: the offsets are QWORD aligned, the BIR
     * names a BAR that exists. */
    table_len = (uint64_t)p->msix_vectors * VN_PCICFG_MSIX_ENTRY_SIZE;
    pba_len = ((uint64_t)p->msix_vectors + 63) / 64 * 8;
    msix_bar = p->msix_bir < VN_PCICFG_BARS ? p->bars[p->msix_bir].size : 0;
    if (msix_bar == 0 || (p->msix_table_offset & 7) || (p->msix_pba_offset & 7) ||
        !vn_util_range_ok(p->msix_table_offset, table_len, msix_bar) ||
        !vn_util_range_ok(p->msix_pba_offset, pba_len, msix_bar) ||
        (p->msix_table_offset < p->msix_pba_offset + pba_len &&
         p->msix_pba_offset < p->msix_table_offset + table_len)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "config space: MSI-X table (%u vectors at 0x%x) and PBA (0x%x) "
                    "do not fit BAR%u",
                    p->msix_vectors, p->msix_table_offset, p->msix_pba_offset, p->msix_bir);
        return false;
    }
    return true;
}

/* PCI 3.0 6.2.5.1: the low bits say what the BAR is; the size follows
 * from which address bits are writable.  A BAR whose bits are all read-only
 * zero is not implemented (nor is the expansion ROM BAR). */
static void build_bars(VnPciCfg *cfg)
{
    const VnPciCfgParams *p = &cfg->params;

    for (unsigned i = 0; i < VN_PCICFG_BARS; i++) {
        const VnPciCfgBar *b = &p->bars[i];
        unsigned reg = PCI_BASE_ADDRESS_0 + 4 * i;
        uint32_t type = b->is64 ? PCI_BASE_ADDRESS_MEM_TYPE_64 : PCI_BASE_ADDRESS_MEM_TYPE_32;

        if (b->size == 0) {
            continue;
        }
        if (b->prefetch) {
            type |= PCI_BASE_ADDRESS_MEM_PREFETCH;
        }
        set32(cfg, reg, type, (uint32_t) ~(b->size - 1) & PCI_BASE_ADDRESS_MEM_MASK);
        if (b->is64) {
            set32(cfg, reg + 4, 0, (uint32_t)(~(b->size - 1) >> 32));
            i++;
        }
    }
}

static void build_header(VnPciCfg *cfg)
{
    const VnPciCfgParams *p = &cfg->params;

    /* PCI 3.0 6.2.1: identification, all read-only */
    set16(cfg, PCI_VENDOR_ID, p->vendor_id, 0);
    set16(cfg, PCI_DEVICE_ID, p->device_id, 0);
    /* PCI 3.0 6.2.2 / PCIe r5.0 7.5.1.1.3: we have no I/O BAR, so I/O
     * Space stays 0; Memory Space, Bus Master, Parity Error Response, SERR#
     * Enable and Interrupt Disable are the writable bits of a PCIe function. */
    set16(cfg, PCI_COMMAND, 0,
          PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_PARITY | PCI_COMMAND_SERR |
              PCI_COMMAND_INTX_DISABLE);
    /* Capabilities List: we have a list at 0x40 (PCIe requires one). */
    set16(cfg, PCI_STATUS, PCI_STATUS_CAP_LIST, 0);
    set8(cfg, PCI_REVISION_ID, p->revision, 0);
    set8(cfg, PCI_CLASS_PROG, p->class_code & 0xff, 0);
    set16(cfg, PCI_CLASS_DEVICE, (uint16_t)(p->class_code >> 8), 0);
    /* Cache Line Size is RW for software's use (PCIe r5.0 7.5.1.1.7);
     * Latency Timer is hardwired 0 on PCIe. */
    set8(cfg, PCI_CACHE_LINE_SIZE, 0, 0xff);
    set8(cfg, PCI_HEADER_TYPE, PCI_HEADER_TYPE_NORMAL, 0);

    build_bars(cfg);
    set16(cfg, PCI_SUBSYSTEM_VENDOR_ID, p->subsys_vendor_id, 0);
    set16(cfg, PCI_SUBSYSTEM_ID, p->subsys_id, 0);
    set8(cfg, PCI_CAPABILITY_LIST, VN_PCICFG_CAP_PM, 0);
    /* Interrupt Line is for software; Interrupt Pin 1 = INTA#. */
    set8(cfg, PCI_INTERRUPT_LINE, 0, 0xff);
    set8(cfg, PCI_INTERRUPT_PIN, 1, 0);
}

/* PCIe r5.0 7.7.2.2: Table Size is N - 1 (RO); MSI-X Enable and Function
 * Mask are RW.  7.7.2.3/4: offset | BIR, read-only. */
static void build_msix(VnPciCfg *cfg, unsigned msix, unsigned next)
{
    const VnPciCfgParams *p = &cfg->params;

    set8(cfg, msix + PCI_CAP_LIST_ID, PCI_CAP_ID_MSIX, 0);
    set8(cfg, msix + PCI_CAP_LIST_NEXT, (uint8_t)next, 0);
    set16(cfg, msix + PCI_MSIX_FLAGS, (uint16_t)(p->msix_vectors - 1),
          PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL);
    set32(cfg, msix + PCI_MSIX_TABLE, p->msix_table_offset | p->msix_bir, 0);
    set32(cfg, msix + PCI_MSIX_PBA, p->msix_pba_offset | p->msix_bir, 0);
}

/* PCI 3.0 6.8.1: MSI with a 64-bit Message Address (PCIe r5.0 7.7.1
 * requires it of PCI Express functions) and per-vector masking. */
static void build_msi(VnPciCfg *cfg, unsigned msi, unsigned next)
{
    uint32_t n = cfg->params.msi_vectors;
    uint16_t mmc = (uint16_t)g_bit_nth_lsf(n, -1); /* log2, n is a power of two */
    uint32_t mask_bits = n == 32 ? 0xffffffffu : (1u << n) - 1;

    set8(cfg, msi + PCI_CAP_LIST_ID, PCI_CAP_ID_MSI, 0);
    set8(cfg, msi + PCI_CAP_LIST_NEXT, (uint8_t)next, 0);
    /* 6.8.1.3: MSI Enable and Multiple Message Enable are RW; Multiple
     * Message Capable, 64 bit address capable and Per-vector masking
     * capable are RO.  (PCIe's Extended Message Data bits 9/10 stay 0.) */
    set16(cfg, msi + PCI_MSI_FLAGS,
          (uint16_t)(mmc << 1) | PCI_MSI_FLAGS_64BIT | PCI_MSI_FLAGS_MASKBIT,
          PCI_MSI_FLAGS_ENABLE | PCI_MSI_FLAGS_QSIZE);
    /* 6.8.1.4-6.8.1.6: the address is DWORD aligned (bits 1:0 RO 0); the
     * data is 16 bits (the upper word, Extended Message Data, RO 0). */
    set32(cfg, msi + PCI_MSI_ADDRESS_LO, 0, 0xfffffffcu);
    set32(cfg, msi + PCI_MSI_ADDRESS_HI, 0, 0xffffffffu);
    set16(cfg, msi + PCI_MSI_DATA_64, 0, 0xffff);
    set16(cfg, msi + PCI_MSI_DATA_64 + 2, 0, 0);
    /* 6.8.1.7/6.8.1.8: one mask and one pending bit per capable vector,
     * the rest reserved; Pending is read-only (we fill it in on read). */
    set32(cfg, msi + PCI_MSI_MASK_64, 0, mask_bits);
    set32(cfg, msi + PCI_MSI_PENDING_64, 0, 0);
}

static void build_caps(VnPciCfg *cfg)
{
    unsigned pm = VN_PCICFG_CAP_PM, irq = VN_PCICFG_CAP_MSIX, exp = VN_PCICFG_CAP_EXP;

    G_STATIC_ASSERT(VN_PCICFG_CAP_MSI == VN_PCICFG_CAP_MSIX);
    G_STATIC_ASSERT(VN_PCICFG_CAP_PM + PM_CAP_LEN <= VN_PCICFG_CAP_MSIX);
    G_STATIC_ASSERT(VN_PCICFG_CAP_MSIX + MSIX_CAP_LEN <= VN_PCICFG_CAP_EXP);
    G_STATIC_ASSERT(VN_PCICFG_CAP_MSI + MSI_CAP_LEN <= VN_PCICFG_CAP_EXP);
    G_STATIC_ASSERT(VN_PCICFG_CAP_EXP + EXP_CAP_LEN <= VN_PCICFG_STD_SIZE);

    /* PCI PM 1.2 3.2.3: version 3, no PME, no D1/D2.  PMCSR (3.2.4):
     * PowerState is RW; No_Soft_Reset = 1 because leaving D3hot does not
     * reset our state (PCIe requires functions to say so). */
    set8(cfg, pm + PCI_CAP_LIST_ID, PCI_CAP_ID_PM, 0);
    set8(cfg, pm + PCI_CAP_LIST_NEXT, (uint8_t)irq, 0);
    set16(cfg, pm + PCI_PM_PMC, 3, 0);
    set16(cfg, pm + PCI_PM_CTRL, PCI_PM_CTRL_NO_SOFT_RESET, PCI_PM_CTRL_STATE_MASK);

    if (is_msi(cfg)) {
        build_msi(cfg, irq, exp);
    } else {
        build_msix(cfg, irq, exp);
    }

    /* PCIe r5.0 7.5.3.2: capability version 2, Device/Port Type 0000b
     * (PCI Express Endpoint); last in the list. */
    set8(cfg, exp + PCI_CAP_LIST_ID, PCI_CAP_ID_EXP, 0);
    set8(cfg, exp + PCI_CAP_LIST_NEXT, 0, 0);
    set16(cfg, exp + PCI_EXP_FLAGS, 2 | (PCI_EXP_TYPE_ENDPOINT << 4), 0);
    /* 7.5.3.3: Max_Payload_Size Supported 128 bytes, Role-Based Error
     * Reporting (must be 1), Function Level Reset capable: without FLR (and
     * with No_Soft_Reset set, and on QEMU's root bus where there is no
     * secondary bus to reset) a guest has no way to reset the function, and
     * Linux offers no /sys/.../reset.  QEMU still resets us with
     * DEVICE_RESET when it has FLR (hw/vfio/pci.c vfio_pci_reset). */
    set32(cfg, exp + PCI_EXP_DEVCAP, PCI_EXP_DEVCAP_RBER | PCI_EXP_DEVCAP_FLR, 0);
    /* 7.5.3.4: error reporting enables, Relaxed Ordering, MPS, Extended
     * Tag, No Snoop and Max_Read_Request_Size are RW; Phantom Functions and
     * Aux Power are unsupported, hardwired 0.  Initiate FLR (bit 15) is
     * not stored: it always reads 0 and a write of 1 starts an FLR, see
     * vn_pcicfg_write().  Defaults: RO and NS set, MRRS 512 bytes. */
    set16(cfg, exp + PCI_EXP_DEVCTL,
          PCI_EXP_DEVCTL_RELAX_EN | PCI_EXP_DEVCTL_NOSNOOP_EN | PCI_EXP_DEVCTL_READRQ_512B,
          PCI_EXP_DEVCTL_CERE | PCI_EXP_DEVCTL_NFERE | PCI_EXP_DEVCTL_FERE | PCI_EXP_DEVCTL_URRE |
              PCI_EXP_DEVCTL_RELAX_EN | PCI_EXP_DEVCTL_PAYLOAD | PCI_EXP_DEVCTL_EXT_TAG |
              PCI_EXP_DEVCTL_NOSNOOP_EN | PCI_EXP_DEVCTL_READRQ);
    /* 7.5.3.6-7.5.3.8: a x1 link at 2.5 GT/s, trained.  Link Control's
     * ASPM, RCB, Common Clock and Extended Synch are RW for endpoints. */
    set32(cfg, exp + PCI_EXP_LNKCAP, PCI_EXP_LNKCAP_SLS_2_5GB | (1u << 4), 0);
    set16(cfg, exp + PCI_EXP_LNKCTL, 0,
          PCI_EXP_LNKCTL_ASPMC | PCI_EXP_LNKCTL_RCB | PCI_EXP_LNKCTL_CCC | PCI_EXP_LNKCTL_ES);
    set16(cfg, exp + PCI_EXP_LNKSTA, PCI_EXP_LNKSTA_CLS_2_5GB | (1u << 4), 0);
    /* 7.5.3.15-7.5.3.19: no optional v2 features; 2.5 GT/s supported. */
    set32(cfg, exp + PCI_EXP_LNKCAP2, PCI_EXP_LNKCAP2_SLS_2_5GB, 0);
    set16(cfg, exp + PCI_EXP_LNKCTL2, 1, 0);
}

/* PCI 3.0 6.8.1.3: software must not enable more vectors than the function
 * is capable of; if it does, hold it to the capable count (QEMU's
 * msi_write_config() does the same to its copy), so what the register
 * says and what we signal agree. */
static void msi_clamp(VnPciCfg *cfg)
{
    unsigned off = VN_PCICFG_CAP_MSI + PCI_MSI_FLAGS;
    uint16_t ctl = get16(cfg, off);
    uint16_t mmc = (ctl & PCI_MSI_FLAGS_QMASK) >> 1;
    uint16_t mme = (ctl & PCI_MSI_FLAGS_QSIZE) >> 4;

    if (mme > mmc) {
        ctl = (uint16_t)((ctl & ~PCI_MSI_FLAGS_QSIZE) | mmc << 4);
        cfg->bytes[off] = (uint8_t)ctl;
    }
}

/* The address each memory BAR holds (PCI 3.0 6.2.5.1: the bits above the
 * type bits; a 64-bit BAR's upper half in the next register), for the
 * engine thread to recognise bus addresses of its own memory. */
static void bars_update(VnPciCfg *cfg)
{
    const VnPciCfgParams *p = &cfg->params;

    for (unsigned i = 0; i < VN_PCICFG_BARS; i++) {
        unsigned reg = PCI_BASE_ADDRESS_0 + 4 * i;
        uint64_t addr = 0;

        if (p->bars[i].size != 0) {
            addr = get32(cfg, reg) & (uint32_t)PCI_BASE_ADDRESS_MEM_MASK;
            if (p->bars[i].is64) {
                addr |= (uint64_t)get32(cfg, reg + 4) << 32;
            }
        }
        __atomic_store_n(&cfg->bar_addr[i], addr, __ATOMIC_SEQ_CST);
        if (p->bars[i].is64) {
            i++; /* the upper half is no BAR of its own */
        }
    }
}

static void state_update(VnPciCfg *cfg)
{
    uint16_t cmd = get16(cfg, PCI_COMMAND);
    uint16_t irq = get16(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS);
    gint st = 0;

    if (cmd & PCI_COMMAND_MASTER) {
        st |= STATE_BUS_MASTER;
    }
    if (cmd & PCI_COMMAND_MEMORY) {
        st |= STATE_MEM_ENABLE;
    }
    if (cmd & PCI_COMMAND_INTX_DISABLE) {
        st |= STATE_INTX_DISABLE;
    }
    if (is_msi(cfg)) {
        if (irq & PCI_MSI_FLAGS_ENABLE) {
            st |= STATE_MSI_ENABLE;
        }
        st |= ((irq & PCI_MSI_FLAGS_QSIZE) >> 4) << STATE_MSI_LOG2_SHIFT;
        __atomic_store_n(&cfg->msi_mask, get32(cfg, VN_PCICFG_CAP_MSI + PCI_MSI_MASK_64),
                         __ATOMIC_SEQ_CST);
    } else {
        if (irq & PCI_MSIX_FLAGS_ENABLE) {
            st |= STATE_MSIX_ENABLE;
        }
        if (irq & PCI_MSIX_FLAGS_MASKALL) {
            st |= STATE_MSIX_MASKALL;
        }
    }
    g_atomic_int_set(&cfg->state, st);
    bars_update(cfg);
}

VnPciCfg *vn_pcicfg_new(const VnPciCfgParams *params, GError **error)
{
    VnPciCfg *cfg;

    if (!params_valid(params, error)) {
        return NULL;
    }
    cfg = g_new0(VnPciCfg, 1);
    cfg->params = *params;
    build_header(cfg);
    build_caps(cfg);
    memcpy(cfg->defaults, cfg->bytes, sizeof(cfg->defaults));
    state_update(cfg);
    return cfg;
}

void vn_pcicfg_free(VnPciCfg *cfg)
{
    g_free(cfg);
}

int vn_pcicfg_read(VnPciCfg *cfg, uint64_t offset, void *buf, uint32_t count)
{
    uint8_t *out = buf;

    if (!vn_util_range_ok(offset, count, VN_PCICFG_SIZE)) {
        return -EINVAL;
    }
    if (is_msi(cfg)) {
        /* Read-only to the host, so the write path leaves it alone. */
        set32(cfg, VN_PCICFG_CAP_MSI + PCI_MSI_PENDING_64,
              __atomic_load_n(&cfg->msi_pending, __ATOMIC_SEQ_CST), 0);
    }
    for (uint32_t i = 0; i < count; i++) {
        uint64_t a = offset + i;

        out[i] = a < VN_PCICFG_STD_SIZE ? cfg->bytes[a] : 0;
    }
    return 0;
}

int vn_pcicfg_write(VnPciCfg *cfg, uint64_t offset, const void *buf, uint32_t count)
{
    const uint8_t *in = buf;
    unsigned pmcsr = VN_PCICFG_CAP_PM + PCI_PM_CTRL;
    uint8_t old_state = cfg->bytes[pmcsr] & PCI_PM_CTRL_STATE_MASK;

    if (!vn_util_range_ok(offset, count, VN_PCICFG_SIZE)) {
        return -EINVAL;
    }
    for (uint32_t i = 0; i < count; i++) {
        uint64_t a = offset + i;

        if (a >= VN_PCICFG_STD_SIZE) {
            break; /* extended space: no registers, writes are dropped */
        }
        cfg->bytes[a] = (uint8_t)((cfg->bytes[a] & ~cfg->wmask[a]) | (in[i] & cfg->wmask[a]));
        /* PCIe r5.0 7.5.3.4: Initiate Function Level Reset, high byte bit 7
         * of Device Control. */
        if (a == VN_PCICFG_CAP_EXP + PCI_EXP_DEVCTL + 1 &&
            (in[i] & (PCI_EXP_DEVCTL_BCR_FLR >> 8))) {
            cfg->flr_pending = true;
        }
    }
    /* PCI PM 1.2 3.2.4: a write of an unsupported state (D1, D2: our PMC
     * says neither is supported) must leave PowerState unchanged. */
    if ((cfg->bytes[pmcsr] & PCI_PM_CTRL_STATE_MASK) == 1 ||
        (cfg->bytes[pmcsr] & PCI_PM_CTRL_STATE_MASK) == 2) {
        cfg->bytes[pmcsr] = (uint8_t)((cfg->bytes[pmcsr] & ~PCI_PM_CTRL_STATE_MASK) | old_state);
    }
    if (is_msi(cfg)) {
        msi_clamp(cfg);
    }
    state_update(cfg);
    trace_pcicfg_write(offset, count, get16(cfg, PCI_COMMAND),
                       vn_pcicfg_irq_mode_to_string(cfg->params.irq_mode),
                       get16(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS));
    return 0;
}

void vn_pcicfg_reset(VnPciCfg *cfg)
{
    memcpy(cfg->bytes, cfg->defaults, sizeof(cfg->bytes));
    cfg->flr_pending = false;
    __atomic_store_n(&cfg->msi_pending, 0, __ATOMIC_SEQ_CST);
    state_update(cfg);
}

bool vn_pcicfg_take_flr(VnPciCfg *cfg)
{
    bool flr = cfg->flr_pending;

    cfg->flr_pending = false;
    return flr;
}

bool vn_pcicfg_bus_master(VnPciCfg *cfg)
{
    return g_atomic_int_get(&cfg->state) & STATE_BUS_MASTER;
}

bool vn_pcicfg_mem_enabled(VnPciCfg *cfg)
{
    return g_atomic_int_get(&cfg->state) & STATE_MEM_ENABLE;
}

uint64_t vn_pcicfg_bar_addr(VnPciCfg *cfg, unsigned bar)
{
    return bar < VN_PCICFG_BARS ? __atomic_load_n(&cfg->bar_addr[bar], __ATOMIC_SEQ_CST) : 0;
}

bool vn_pcicfg_intx_disabled(VnPciCfg *cfg)
{
    return g_atomic_int_get(&cfg->state) & STATE_INTX_DISABLE;
}

bool vn_pcicfg_msix_enabled(VnPciCfg *cfg)
{
    return g_atomic_int_get(&cfg->state) & STATE_MSIX_ENABLE;
}

bool vn_pcicfg_msix_masked(VnPciCfg *cfg)
{
    return g_atomic_int_get(&cfg->state) & STATE_MSIX_MASKALL;
}

bool vn_pcicfg_msi_enabled(VnPciCfg *cfg)
{
    return g_atomic_int_get(&cfg->state) & STATE_MSI_ENABLE;
}

uint32_t vn_pcicfg_msi_vectors(VnPciCfg *cfg)
{
    return 1u << ((g_atomic_int_get(&cfg->state) & STATE_MSI_LOG2_MASK) >> STATE_MSI_LOG2_SHIFT);
}

/* PCI 3.0 6.8.3.5: "While a vector is masked, the function is prohibited
 * from sending the associated message, and the function must set the
 * associated Pending bit whenever the function would otherwise send the
 * message."  QEMU emulates the mask too (hw/pci/msi.c msi_notify()), but
 * it writes the mask bits through to us as well, and a client without
 * that emulation (or KVM's irqfd, which bypasses it) relies on ours. */
bool vn_pcicfg_msi_hold(VnPciCfg *cfg, uint32_t vector)
{
    uint32_t bit;

    if (vector >= VN_PCICFG_MAX_MSI_VECTORS) {
        return false;
    }
    bit = 1u << vector;
    if (!(__atomic_load_n(&cfg->msi_mask, __ATOMIC_SEQ_CST) & bit)) {
        return false;
    }
    __atomic_fetch_or(&cfg->msi_pending, bit, __ATOMIC_SEQ_CST);
    return true;
}

/* "When software unmasks a vector whose associated Pending bit is set, the
 * function must schedule sending the associated message, and clear the
 * Pending bit as soon as the message has been sent." */
uint32_t vn_pcicfg_msi_take_released(VnPciCfg *cfg)
{
    uint32_t pending = __atomic_load_n(&cfg->msi_pending, __ATOMIC_SEQ_CST);
    uint32_t released;

    if (pending == 0) {
        return 0;
    }
    released = pending & ~__atomic_load_n(&cfg->msi_mask, __ATOMIC_SEQ_CST);
    if (released == 0) {
        return 0;
    }
    /* Only our caller's thread sets bits and only it clears them (but for
     * reset, which may take them first): what was set and is still set. */
    return __atomic_fetch_and(&cfg->msi_pending, ~released, __ATOMIC_SEQ_CST) & released;
}
