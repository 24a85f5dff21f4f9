/*
 * Unit tests of the simulated device's PCI configuration space
 * (vfio-ntb/simdev/pcicfg.c): identity, capability chain, write masks, BAR
 * sizing, MSI-X/command state bits, reset, parameter checks, and the MSI
 * mode (its capability, masks, pending bits, no BAR4).
 */
#include "simdev/pcicfg.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <linux/pci_regs.h>
#include <string.h>

static const VnPciCfgParams good = {
    .vendor_id = 0x1de1,
    .device_id = 0x5601,
    .subsys_vendor_id = 0x1de1,
    .subsys_id = 0x5601,
    .revision = 1,
    .class_code = 0x010802,
    .bars = { [0] = { .size = 16384, .is64 = true }, [4] = { .size = 4096 } },
    .msix_vectors = 9,
    .msix_bir = 4,
    .msix_table_offset = 0,
    .msix_pba_offset = 0x800,
};

/* MSI mode as pcidev builds it: no BAR4, 8 vectors. */
static const VnPciCfgParams good_msi = {
    .vendor_id = 0x1de1,
    .device_id = 0x5601,
    .subsys_vendor_id = 0x1de1,
    .subsys_id = 0x5601,
    .revision = 1,
    .class_code = 0x010802,
    .bars = { [0] = { .size = 16384, .is64 = true } },
    .irq_mode = VN_PCICFG_IRQ_MSI,
    .msi_vectors = 8,
};

static VnPciCfg *mk_with(const VnPciCfgParams *p)
{
    g_autoptr(GError) error = NULL;
    VnPciCfg *cfg = vn_pcicfg_new(p, &error);

    ck_assert_msg(cfg != NULL, "%s", error ? error->message : "");
    return cfg;
}

static VnPciCfg *mk(void)
{
    return mk_with(&good);
}

static uint32_t rd(VnPciCfg *cfg, unsigned off, unsigned len)
{
    uint32_t v = 0;

    ck_assert_int_eq(vn_pcicfg_read(cfg, off, &v, len), 0);
    return v;
}

static void wr(VnPciCfg *cfg, unsigned off, uint32_t v, unsigned len)
{
    ck_assert_int_eq(vn_pcicfg_write(cfg, off, &v, len), 0);
}

START_TEST(test_identity)
{
    g_autoptr(VnPciCfg) cfg = mk();

    ck_assert_uint_eq(rd(cfg, PCI_VENDOR_ID, 2), 0x1de1);
    ck_assert_uint_eq(rd(cfg, PCI_DEVICE_ID, 2), 0x5601);
    ck_assert_uint_eq(rd(cfg, PCI_CLASS_REVISION, 4), 0x01080201);
    ck_assert_uint_eq(rd(cfg, PCI_HEADER_TYPE, 1), 0);
    ck_assert_uint_eq(rd(cfg, PCI_INTERRUPT_PIN, 1), 1);
    ck_assert_uint_eq(rd(cfg, PCI_STATUS, 2) & PCI_STATUS_CAP_LIST, PCI_STATUS_CAP_LIST);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_0, 4), PCI_BASE_ADDRESS_MEM_TYPE_64);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_4, 4), 0);
    /* read-only: a write changes nothing */
    wr(cfg, PCI_VENDOR_ID, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_VENDOR_ID, 4), 0x56011de1);
}
END_TEST

START_TEST(test_capabilities)
{
    g_autoptr(VnPciCfg) cfg = mk();
    unsigned ids[8], n = 0;
    unsigned pos = rd(cfg, PCI_CAPABILITY_LIST, 1);

    /* Walk the list like a driver: PM, MSI-X, PCI Express, end. */
    while (pos != 0 && n < G_N_ELEMENTS(ids)) {
        ids[n++] = rd(cfg, pos, 1);
        pos = rd(cfg, pos + 1, 1);
    }
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ids[0], PCI_CAP_ID_PM);
    ck_assert_uint_eq(ids[1], PCI_CAP_ID_MSIX);
    ck_assert_uint_eq(ids[2], PCI_CAP_ID_EXP);
    /* MSI-X: table size N-1, table and PBA in BAR4 */
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, 2), 8);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_TABLE, 4), 0x000 | 4);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_PBA, 4), 0x800 | 4);
    /* PCIe: version 2 endpoint, FLR capable */
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_EXP + PCI_EXP_FLAGS, 2), 0x0002);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_EXP + PCI_EXP_DEVCAP, 4) & PCI_EXP_DEVCAP_FLR,
                      PCI_EXP_DEVCAP_FLR);
    /* Extended space: zeros, writes dropped */
    ck_assert_uint_eq(rd(cfg, 0x100, 4), 0);
    wr(cfg, 0x100, 0x12345678, 4);
    ck_assert_uint_eq(rd(cfg, 0x100, 4), 0);
    ck_assert_uint_eq(rd(cfg, 0xffc, 4), 0);
}
END_TEST

START_TEST(test_write_masks)
{
    g_autoptr(VnPciCfg) cfg = mk();

    wr(cfg, PCI_COMMAND, 0xffff, 2);
    ck_assert_uint_eq(rd(cfg, PCI_COMMAND, 2), PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER |
                                                   PCI_COMMAND_PARITY | PCI_COMMAND_SERR |
                                                   PCI_COMMAND_INTX_DISABLE);
    ck_assert(vn_pcicfg_bus_master(cfg));
    ck_assert(vn_pcicfg_mem_enabled(cfg));
    ck_assert(vn_pcicfg_intx_disabled(cfg));
    wr(cfg, PCI_COMMAND, PCI_COMMAND_MEMORY, 2);
    ck_assert(!vn_pcicfg_bus_master(cfg));
    ck_assert(!vn_pcicfg_intx_disabled(cfg));

    /* BAR sizing (PCI 3.0 6.2.5.1): all ones reads back the size mask. */
    wr(cfg, PCI_BASE_ADDRESS_0, 0xffffffff, 4);
    wr(cfg, PCI_BASE_ADDRESS_1, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_0, 4), 0xffffc000 | PCI_BASE_ADDRESS_MEM_TYPE_64);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_1, 4), 0xffffffff);
    wr(cfg, PCI_BASE_ADDRESS_4, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_4, 4), 0xfffff000);
    wr(cfg, PCI_BASE_ADDRESS_2, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_2, 4), 0);
    wr(cfg, PCI_ROM_ADDRESS, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_ROM_ADDRESS, 4), 0);
    wr(cfg, PCI_BASE_ADDRESS_0, 0xfebf0000, 4);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_0, 4), 0xfebf0004);

    /* MSI-X control: only Enable and Function Mask */
    wr(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, 0xffff, 2);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, 2), 0xc008);
    ck_assert(vn_pcicfg_msix_enabled(cfg));
    ck_assert(vn_pcicfg_msix_masked(cfg));
    /* a byte write to the upper half alone */
    wr(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS + 1, 0x80, 1);
    ck_assert(vn_pcicfg_msix_enabled(cfg));
    ck_assert(!vn_pcicfg_msix_masked(cfg));
    wr(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_TABLE, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_TABLE, 4), 4);

    /* PM: D3hot accepted, D1 (unsupported) ignored */
    wr(cfg, VN_PCICFG_CAP_PM + PCI_PM_CTRL, 3, 2);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_PM + PCI_PM_CTRL, 2) & 3, 3);
    wr(cfg, VN_PCICFG_CAP_PM + PCI_PM_CTRL, 1, 2);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_PM + PCI_PM_CTRL, 2) & 3, 3);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_PM + PCI_PM_CTRL, 2) & PCI_PM_CTRL_NO_SOFT_RESET,
                      PCI_PM_CTRL_NO_SOFT_RESET);

    /* Initiate FLR: reads 0, reported once; other Device Control bits stay */
    ck_assert(!vn_pcicfg_take_flr(cfg));
    wr(cfg, VN_PCICFG_CAP_EXP + PCI_EXP_DEVCTL, PCI_EXP_DEVCTL_BCR_FLR | 0x2810, 2);
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_EXP + PCI_EXP_DEVCTL, 2), 0x2810);
    ck_assert(vn_pcicfg_take_flr(cfg));
    ck_assert(!vn_pcicfg_take_flr(cfg));
    wr(cfg, VN_PCICFG_CAP_EXP + PCI_EXP_DEVCTL, 0xffff & ~PCI_EXP_DEVCTL_BCR_FLR, 2);
    ck_assert(!vn_pcicfg_take_flr(cfg));
    ck_assert_uint_eq(rd(cfg, VN_PCICFG_CAP_EXP + PCI_EXP_DEVCTL, 2), 0x79ff);

    /* Interrupt Line is for software, Interrupt Pin is not */
    wr(cfg, PCI_INTERRUPT_LINE, 0x020b, 2);
    ck_assert_uint_eq(rd(cfg, PCI_INTERRUPT_LINE, 2), 0x010b);
}
END_TEST

START_TEST(test_reset_and_bounds)
{
    g_autoptr(VnPciCfg) cfg = mk();
    uint8_t buf[8];

    wr(cfg, PCI_COMMAND, PCI_COMMAND_MASTER, 2);
    wr(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE, 2);
    wr(cfg, PCI_BASE_ADDRESS_4, 0xfe000000, 4);
    vn_pcicfg_reset(cfg);
    ck_assert_uint_eq(rd(cfg, PCI_COMMAND, 2), 0);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_4, 4), 0);
    ck_assert(!vn_pcicfg_bus_master(cfg));
    ck_assert(!vn_pcicfg_msix_enabled(cfg));

    ck_assert_int_eq(vn_pcicfg_read(cfg, VN_PCICFG_SIZE - 4, buf, 8), -EINVAL);
    ck_assert_int_eq(vn_pcicfg_write(cfg, VN_PCICFG_SIZE, buf, 1), -EINVAL);
    ck_assert_int_eq(vn_pcicfg_read(cfg, UINT64_MAX - 2, buf, 4), -EINVAL);
}
END_TEST

/* --- MSI mode ------------------------------------------------------------ */

#define MSI VN_PCICFG_CAP_MSI

START_TEST(test_msi_layout)
{
    g_autoptr(VnPciCfg) cfg = mk_with(&good_msi);
    unsigned ids[8], offs[8], n = 0;
    unsigned pos = rd(cfg, PCI_CAPABILITY_LIST, 1);

    while (pos != 0 && n < G_N_ELEMENTS(ids)) {
        offs[n] = pos;
        ids[n++] = rd(cfg, pos, 1);
        pos = rd(cfg, pos + 1, 1);
    }
    /* PM, MSI where MSI-X sits in the other mode, PCI Express; no MSI-X */
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ids[0], PCI_CAP_ID_PM);
    ck_assert_uint_eq(ids[1], PCI_CAP_ID_MSI);
    ck_assert_uint_eq(offs[1], 0x50);
    ck_assert_uint_eq(ids[2], PCI_CAP_ID_EXP);
    /* the 24-byte MSI capability ends before the next one starts */
    ck_assert_uint_ge(offs[2], offs[1] + 24);
    /* PCI 3.0 6.8.1.3: 64-bit, per-vector masking, 8 vectors capable
     * (MMC 011b), disabled, 1 vector enabled */
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_FLAGS, 2),
                      PCI_MSI_FLAGS_64BIT | PCI_MSI_FLAGS_MASKBIT | (3 << 1));
    for (unsigned off = MSI + PCI_MSI_ADDRESS_LO; off < MSI + 24; off += 4) {
        ck_assert_uint_eq(rd(cfg, off, 4), 0);
    }
    ck_assert(!vn_pcicfg_msi_enabled(cfg));
    ck_assert(!vn_pcicfg_msix_enabled(cfg));
    ck_assert_uint_eq(vn_pcicfg_msi_vectors(cfg), 1);

    /* BAR4 absent: reads 0, sizing finds no writable bit */
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_4, 4), 0);
    wr(cfg, PCI_BASE_ADDRESS_4, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_4, 4), 0);
    /* BAR0 is still there */
    wr(cfg, PCI_BASE_ADDRESS_0, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, PCI_BASE_ADDRESS_0, 4), 0xffffc000 | PCI_BASE_ADDRESS_MEM_TYPE_64);
}
END_TEST

START_TEST(test_msi_write_masks)
{
    g_autoptr(VnPciCfg) cfg = mk_with(&good_msi);
    uint32_t ro = PCI_MSI_FLAGS_64BIT | PCI_MSI_FLAGS_MASKBIT | (3 << 1);

    /* Control: only MSI Enable and Multiple Message Enable; MME 111b (more
     * than the 8 capable) is held to 011b */
    wr(cfg, MSI + PCI_MSI_FLAGS, 0xffff, 2);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_FLAGS, 2), ro | PCI_MSI_FLAGS_ENABLE | (3 << 4));
    ck_assert(vn_pcicfg_msi_enabled(cfg));
    ck_assert(!vn_pcicfg_msix_enabled(cfg));
    ck_assert_uint_eq(vn_pcicfg_msi_vectors(cfg), 8);
    /* MME 001b: 2 vectors; a write of the capable field changes nothing */
    wr(cfg, MSI + PCI_MSI_FLAGS, PCI_MSI_FLAGS_ENABLE | (1 << 4) | PCI_MSI_FLAGS_QMASK, 2);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_FLAGS, 2), ro | PCI_MSI_FLAGS_ENABLE | (1 << 4));
    ck_assert_uint_eq(vn_pcicfg_msi_vectors(cfg), 2);
    /* MME 010b with a byte write: 4 vectors; then disable */
    wr(cfg, MSI + PCI_MSI_FLAGS, PCI_MSI_FLAGS_ENABLE | (2 << 4), 1);
    ck_assert_uint_eq(vn_pcicfg_msi_vectors(cfg), 4);
    wr(cfg, MSI + PCI_MSI_FLAGS, 2 << 4, 2);
    ck_assert(!vn_pcicfg_msi_enabled(cfg));

    /* Address: DWORD aligned, 64 bits; data: 16 bits, extended data RO */
    wr(cfg, MSI + PCI_MSI_ADDRESS_LO, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_ADDRESS_LO, 4), 0xfffffffc);
    wr(cfg, MSI + PCI_MSI_ADDRESS_HI, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_ADDRESS_HI, 4), 0xffffffff);
    wr(cfg, MSI + PCI_MSI_DATA_64, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_DATA_64, 4), 0xffff);
    /* Mask bits: one per capable vector; pending: read-only */
    wr(cfg, MSI + PCI_MSI_MASK_64, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_MASK_64, 4), 0xff);
    wr(cfg, MSI + PCI_MSI_PENDING_64, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_PENDING_64, 4), 0);
    /* the capability header and the capable bits are read-only */
    wr(cfg, MSI, 0xffff, 2);
    ck_assert_uint_eq(rd(cfg, MSI, 1), PCI_CAP_ID_MSI);
    ck_assert_uint_eq(rd(cfg, MSI + 1, 1), VN_PCICFG_CAP_EXP);

    /* Reset: all back, pending included */
    wr(cfg, MSI + PCI_MSI_FLAGS, PCI_MSI_FLAGS_ENABLE | (3 << 4), 2);
    ck_assert(vn_pcicfg_msi_hold(cfg, 2));
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_PENDING_64, 4), 0x04);
    vn_pcicfg_reset(cfg);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_FLAGS, 2), ro);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_MASK_64, 4), 0);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_PENDING_64, 4), 0);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_ADDRESS_HI, 4), 0);
    ck_assert(!vn_pcicfg_msi_enabled(cfg));
    ck_assert_uint_eq(vn_pcicfg_msi_vectors(cfg), 1);
    ck_assert_uint_eq(vn_pcicfg_msi_take_released(cfg), 0);
}
END_TEST

/* PCI 3.0 6.8.3.5: a masked vector's message is held as a Pending bit and
 * sent when the vector is unmasked. */
START_TEST(test_msi_pending)
{
    g_autoptr(VnPciCfg) cfg = mk_with(&good_msi);

    wr(cfg, MSI + PCI_MSI_FLAGS, PCI_MSI_FLAGS_ENABLE | (3 << 4), 2);
    ck_assert(!vn_pcicfg_msi_hold(cfg, 1));  /* not masked: send */
    wr(cfg, MSI + PCI_MSI_MASK_64, 0x0a, 4); /* mask 1 and 3 */
    ck_assert(vn_pcicfg_msi_hold(cfg, 1));
    ck_assert(vn_pcicfg_msi_hold(cfg, 3));
    ck_assert(!vn_pcicfg_msi_hold(cfg, 2));
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_PENDING_64, 4), 0x0a);
    ck_assert_uint_eq(vn_pcicfg_msi_take_released(cfg), 0); /* still masked */
    wr(cfg, MSI + PCI_MSI_MASK_64, 0x08, 4);                /* unmask 1 */
    ck_assert_uint_eq(vn_pcicfg_msi_take_released(cfg), 0x02);
    ck_assert_uint_eq(vn_pcicfg_msi_take_released(cfg), 0); /* once */
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_PENDING_64, 4), 0x08);
    wr(cfg, MSI + PCI_MSI_MASK_64 + 1, 0, 1); /* no-op byte write */
    ck_assert_uint_eq(vn_pcicfg_msi_take_released(cfg), 0);
    wr(cfg, MSI + PCI_MSI_MASK_64, 0, 1); /* unmask 3 */
    ck_assert_uint_eq(vn_pcicfg_msi_take_released(cfg), 0x08);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_PENDING_64, 4), 0);
    /* out-of-range vectors are never held */
    ck_assert(!vn_pcicfg_msi_hold(cfg, 32));
}
END_TEST

/* Every capable count: Multiple Message Capable is log2 of it, and exactly
 * its mask bits are writable (32 vectors: all of them). */
static const uint32_t msi_counts[] = { 1, 2, 4, 8, 16, 32 };

START_TEST(test_msi_counts)
{
    VnPciCfgParams p = good_msi;
    uint32_t n = msi_counts[_i];
    g_autoptr(VnPciCfg) cfg = NULL;

    p.msi_vectors = n;
    cfg = mk_with(&p);
    ck_assert_uint_eq((rd(cfg, MSI + PCI_MSI_FLAGS, 2) & PCI_MSI_FLAGS_QMASK) >> 1,
                      (uint32_t)g_bit_nth_lsf(n, -1));
    wr(cfg, MSI + PCI_MSI_MASK_64, 0xffffffff, 4);
    ck_assert_uint_eq(rd(cfg, MSI + PCI_MSI_MASK_64, 4), n == 32 ? 0xffffffffu : (1u << n) - 1);
    /* asking for all 32 gets the capable count */
    wr(cfg, MSI + PCI_MSI_FLAGS, PCI_MSI_FLAGS_ENABLE | (5 << 4), 2);
    ck_assert_uint_eq(vn_pcicfg_msi_vectors(cfg), n);
    ck_assert(vn_pcicfg_msi_hold(cfg, n - 1));
}
END_TEST

START_TEST(test_irq_mode_names)
{
    VnPciCfgIrqMode m = VN_PCICFG_IRQ_LAST;

    ck_assert(vn_pcicfg_irq_mode_from_string("msi", &m));
    ck_assert_int_eq(m, VN_PCICFG_IRQ_MSI);
    ck_assert(vn_pcicfg_irq_mode_from_string("msix", &m));
    ck_assert_int_eq(m, VN_PCICFG_IRQ_MSIX);
    ck_assert(!vn_pcicfg_irq_mode_from_string("MSI", &m));
    ck_assert(!vn_pcicfg_irq_mode_from_string("", &m));
    ck_assert(!vn_pcicfg_irq_mode_from_string(NULL, &m));
    ck_assert_int_eq(m, VN_PCICFG_IRQ_MSIX); /* untouched */
    ck_assert_str_eq(vn_pcicfg_irq_mode_to_string(VN_PCICFG_IRQ_MSI), "msi");
    ck_assert_str_eq(vn_pcicfg_irq_mode_to_string(VN_PCICFG_IRQ_LAST), "?");
}
END_TEST

/* Parameters that must be refused. */
static const struct {
    const char *why;
    uint64_t bar0;
    uint32_t bar4, vectors, table, pba;
    uint8_t bir;
} bad[] = {
    { "bar0 not a power of two", 12288, 4096, 9, 0, 0x800, 4 },
    { "bar4 too small", 16384, 2048, 9, 0, 0x800, 4 },
    { "no vectors", 16384, 4096, 0, 0, 0x800, 4 },
    { "too many vectors", 16384, 4096, 4096, 0, 0x800, 4 },
    { "table overlaps PBA", 16384, 4096, 200, 0, 0x800, 4 },
    { "PBA outside the BAR", 16384, 4096, 9, 0, 0x1000, 4 },
    { "table misaligned", 16384, 4096, 9, 4, 0x800, 4 },
    { "table beyond BAR0", 16384, 4096, 2048, 0, 0x8000, 0 },
    { "MSI-X without BAR4", 16384, 0, 9, 0, 0x800, 4 },
    { "MSI-X in a BAR that does not exist", 16384, 4096, 9, 0, 0x800, 2 },
    { "BIR beyond BAR5", 16384, 4096, 9, 0, 0x800, 7 },
};

START_TEST(test_bad_params)
{
    g_autoptr(GError) error = NULL;
    VnPciCfgParams p = good;

    p.bars[0].size = bad[_i].bar0;
    p.bars[4].size = bad[_i].bar4;
    p.msix_vectors = bad[_i].vectors;
    p.msix_table_offset = bad[_i].table;
    p.msix_pba_offset = bad[_i].pba;
    p.msix_bir = bad[_i].bir;
    ck_assert_msg(vn_pcicfg_new(&p, &error) == NULL, "accepted: %s", bad[_i].why);
    ck_assert_ptr_nonnull(error);
}
END_TEST

static const struct {
    const char *why;
    uint32_t mode, vectors, bar4;
} bad_msi[] = {
    { "no MSI vectors", VN_PCICFG_IRQ_MSI, 0, 0 },
    { "MSI vectors not a power of two", VN_PCICFG_IRQ_MSI, 6, 0 },
    { "more than 32 MSI vectors", VN_PCICFG_IRQ_MSI, 64, 0 },
    { "BAR4 not a power of two", VN_PCICFG_IRQ_MSI, 8, 3000 },
    { "unknown mode", VN_PCICFG_IRQ_LAST, 8, 0 },
};

START_TEST(test_bad_msi_params)
{
    g_autoptr(GError) error = NULL;
    VnPciCfgParams p = good_msi;

    p.irq_mode = (VnPciCfgIrqMode)bad_msi[_i].mode;
    p.msi_vectors = bad_msi[_i].vectors;
    p.bars[4].size = bad_msi[_i].bar4;
    ck_assert_msg(vn_pcicfg_new(&p, &error) == NULL, "accepted: %s", bad_msi[_i].why);
    ck_assert_ptr_nonnull(error);
}
END_TEST

/* The NTB model's layout: 32-bit BARs 0-2 (MSI-X in BAR1), BAR4 64-bit prefetchable. */
static const VnPciCfgParams ntb_like = {
    .vendor_id = 0x1957,
    .device_id = 0x0809,
    .class_code = 0x058000,
    .bars = { [0] = { .size = 4096 },
              [1] = { .size = 4096 },
              [2] = { .size = 8192 },
              [4] = { .size = 1ull << 32, .is64 = true, .prefetch = true } },
    .msix_vectors = 32,
    .msix_bir = 1,
    .msix_table_offset = 0,
    .msix_pba_offset = 0x800,
};

/* Sizing (PCI 3.0 6.2.5.1): all ones written, the size read back from the low bits. */
START_TEST(test_bar_layouts)
{
    g_autoptr(VnPciCfg) cfg = mk_with(&ntb_like);
    static const struct {
        unsigned bar;
        uint32_t want;
    } sized[] = {
        { 0, 0xfffff000 },
        { 1, 0xfffff000 },
        { 2, 0xffffe000 },
        { 3, 0 },
        { 4, PCI_BASE_ADDRESS_MEM_TYPE_64 | PCI_BASE_ADDRESS_MEM_PREFETCH },
        { 5, 0xffffffff },
    };
    uint32_t ones = 0xffffffff, v, msix_table;

    for (unsigned i = 0; i < G_N_ELEMENTS(sized); i++) {
        unsigned reg = PCI_BASE_ADDRESS_0 + 4 * sized[i].bar;

        ck_assert_int_eq(vn_pcicfg_write(cfg, reg, &ones, 4), 0);
        ck_assert_int_eq(vn_pcicfg_read(cfg, reg, &v, 4), 0);
        ck_assert_msg(v == sized[i].want, "BAR%u reads 0x%08x, want 0x%08x", sized[i].bar, v,
                      sized[i].want);
    }
    /* The MSI-X capability names BAR1. */
    ck_assert_int_eq(vn_pcicfg_read(cfg, VN_PCICFG_CAP_MSIX + PCI_MSIX_TABLE, &msix_table, 4), 0);
    ck_assert_uint_eq(msix_table & PCI_MSIX_TABLE_BIR, 1);
}
END_TEST

/* The addresses software programs into the BARs, as the engine thread reads
 * them: a 64-bit BAR's two halves together, the type bits left out, an
 * unimplemented BAR and a 64-bit BAR's upper half 0, back to 0 on reset. */
START_TEST(test_bar_addresses)
{
    g_autoptr(VnPciCfg) cfg = mk();

    for (unsigned b = 0; b < VN_PCICFG_BARS + 1; b++) {
        ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, b), 0);
    }
    wr(cfg, PCI_BASE_ADDRESS_0, 0xfebf0000, 4);
    wr(cfg, PCI_BASE_ADDRESS_1, 0x8, 4);
    wr(cfg, PCI_BASE_ADDRESS_4, 0xfebe1000, 4);
    wr(cfg, PCI_BASE_ADDRESS_2, 0xfe000000, 4); /* not implemented: ignored */
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 0), 0x8febf0000ull);
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 1), 0);
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 2), 0);
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 4), 0xfebe1000);
    /* Bits below the size do not stick (BAR0 is 16 KiB) */
    wr(cfg, PCI_BASE_ADDRESS_0, 0xfebf3000, 4);
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 0), 0x8febf0000ull);
    vn_pcicfg_reset(cfg);
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 0), 0);
    ck_assert_uint_eq(vn_pcicfg_bar_addr(cfg, 4), 0);
}
END_TEST

static const struct {
    const char *why;
    unsigned bar;
    uint64_t size;
    bool is64;
} bad_bars[] = {
    { "64-bit BAR5", 5, 4096, true },
    { "64-bit BAR whose upper half is BAR2", 1, 4096, true },
    { "32-bit BAR of 4 GiB", 3, 1ull << 32, false },
    { "BAR smaller than a page", 3, 2048, false },
    { "BAR not a power of two", 3, 12288, false },
};

START_TEST(test_bad_bars)
{
    g_autoptr(GError) error = NULL;
    VnPciCfgParams p = ntb_like;

    p.bars[bad_bars[_i].bar].size = bad_bars[_i].size;
    p.bars[bad_bars[_i].bar].is64 = bad_bars[_i].is64;
    ck_assert_msg(vn_pcicfg_new(&p, &error) == NULL, "accepted: %s", bad_bars[_i].why);
    ck_assert_ptr_nonnull(error);
}
END_TEST

static Suite *pcicfg_suite(void)
{
    Suite *s = suite_create("pcicfg");
    TCase *tc;

    tc = tcase_create("layout");
    tcase_add_test(tc, test_identity);
    tcase_add_test(tc, test_capabilities);
    tcase_add_test(tc, test_bar_layouts);
    suite_add_tcase(s, tc);

    tc = tcase_create("writes");
    tcase_add_test(tc, test_write_masks);
    tcase_add_test(tc, test_reset_and_bounds);
    tcase_add_test(tc, test_bar_addresses);
    suite_add_tcase(s, tc);

    tc = tcase_create("msi");
    tcase_add_test(tc, test_msi_layout);
    tcase_add_test(tc, test_msi_write_masks);
    tcase_add_test(tc, test_msi_pending);
    tcase_add_loop_test(tc, test_msi_counts, 0, G_N_ELEMENTS(msi_counts));
    tcase_add_test(tc, test_irq_mode_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("params");
    tcase_add_loop_test(tc, test_bad_params, 0, G_N_ELEMENTS(bad));
    tcase_add_loop_test(tc, test_bad_msi_params, 0, G_N_ELEMENTS(bad_msi));
    tcase_add_loop_test(tc, test_bad_bars, 0, G_N_ELEMENTS(bad_bars));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(pcicfg_suite());
}
