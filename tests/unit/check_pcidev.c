/*
 * Unit tests of the simulated device as the vfio-user server sees it
 * (vfio-ntb/simdev/pcidev.c): the regions and irqs it reports and the
 * config space behind its ops, in both interrupt modes, the CMB's BAR, and
 * the parameters it refuses.  The NVMe controller itself is tested in
 * check_nvme*.c.
 */
#include "simdev/pcidev.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * The temp dir belongs to the test runner (an unchecked fixture runs in the
 * parent, once per TCase), as in nvme-rig.h: a failing forked test skips
 * its own cleanup.  Tests create only this name in it.
 */
static char *dir;
static const char *const ns_file = "ns.img";

static void dir_create(void)
{
    g_autoptr(GError) error = NULL;

    dir = g_dir_make_tmp("check_pcidev-XXXXXX", &error);
    g_assert_no_error(error);
}

static void dir_remove(void)
{
    g_autofree char *f = g_build_filename(dir, ns_file, NULL);

    unlink(f);
    rmdir(dir);
    g_clear_pointer(&dir, g_free);
}

static VnPciDev *mk_cmb(VnPciCfgIrqMode mode, uint32_t vectors, uint32_t cmb_mib, bool trap,
                        GError **error)
{
    g_autofree char *backing = g_build_filename(dir, ns_file, NULL);
    VnPciDevParams p = {
        .backing = backing,
        .size = 1 << 20,
        .serial = "PCIDEV-1",
        .vectors = vectors,
        .irq_mode = mode,
        .trap_bars = trap,
        .cmb_mib = cmb_mib,
    };

    return vn_pcidev_new(&p, error);
}

static VnPciDev *mk(VnPciCfgIrqMode mode, uint32_t vectors, GError **error)
{
    return mk_cmb(mode, vectors, 0, false, error);
}

static uint32_t cfg_rd(VnPciDev *d, unsigned off, unsigned len)
{
    uint32_t v = 0;

    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_CONFIG_REGION_INDEX, off, &v, len), 0);
    return v;
}

static void cfg_wr32(VnPciDev *d, unsigned off, uint32_t v)
{
    ck_assert_int_eq(vn_pcidev_ops.region_write(d, VFIO_PCI_CONFIG_REGION_INDEX, off, &v, 4), 0);
}

/* An NVMe register through BAR0's trapped path. */
static uint32_t nvme_rd(VnPciDev *d, unsigned off)
{
    uint32_t v = 0;

    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_BAR0_REGION_INDEX, off, &v, 4), 0);
    return v;
}

/* --vectors as asked and what each mode offers: MSI a power of two <= 32. */
static const struct {
    VnPciCfgIrqMode mode;
    uint32_t asked, offered;
} modes[] = {
    { VN_PCICFG_IRQ_MSIX, 9, 9 },  { VN_PCICFG_IRQ_MSIX, 2, 2 },  { VN_PCICFG_IRQ_MSIX, 128, 128 },
    { VN_PCICFG_IRQ_MSI, 9, 8 },   { VN_PCICFG_IRQ_MSI, 2, 2 },   { VN_PCICFG_IRQ_MSI, 3, 2 },
    { VN_PCICFG_IRQ_MSI, 32, 32 }, { VN_PCICFG_IRQ_MSI, 33, 32 }, { VN_PCICFG_IRQ_MSI, 128, 32 },
};

START_TEST(test_info)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnPciDev) d = mk(modes[_i].mode, modes[_i].asked, &error);
    bool msi = modes[_i].mode == VN_PCICFG_IRQ_MSI;
    uint32_t n = modes[_i].offered;
    const VnDeviceInfo *info;
    uint8_t buf[4];

    ck_assert_msg(d != NULL, "%s", error ? error->message : "");
    info = vn_pcidev_info(d);
    ck_assert_uint_eq(vn_pcidev_vectors(d), n);

    /* Regions: BAR0 mapped, config 4 KiB; BAR4 only with MSI-X */
    ck_assert_uint_eq(info->num_regions, VFIO_PCI_NUM_REGIONS);
    ck_assert_uint_eq(info->regions[VFIO_PCI_BAR0_REGION_INDEX].size, VN_NVME_BAR0_SIZE);
    ck_assert_uint_eq(info->regions[VFIO_PCI_CONFIG_REGION_INDEX].size, 4096);
    ck_assert_uint_eq(info->regions[VFIO_PCI_BAR4_REGION_INDEX].size,
                      msi ? 0 : VN_PCIDEV_BAR4_SIZE);
    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_BAR4_REGION_INDEX, 0, buf, 4),
                     msi ? -EINVAL : 0);
    ck_assert_int_eq(vn_pcidev_ops.region_write(d, VFIO_PCI_BAR4_REGION_INDEX, 0, buf, 4),
                     msi ? -EINVAL : 0);
    /* No CMB: BAR2 is no region and no BAR, CMBLOC/CMBSZ (NVMe 1.4 3.1.11,
     * 3.1.12) read 0 */
    ck_assert_uint_eq(info->regions[VFIO_PCI_BAR2_REGION_INDEX].size, 0);
    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_BAR2_REGION_INDEX, 0, buf, 4), -EINVAL);
    ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_2, 4), 0);
    ck_assert_uint_eq(nvme_rd(d, 0x38), 0);
    ck_assert_uint_eq(nvme_rd(d, 0x3c), 0);

    /* Irqs: INTx 1; the mode's index has the vectors, the other none */
    ck_assert_uint_eq(info->num_irqs, VFIO_PCI_NUM_IRQS);
    ck_assert_uint_eq(info->irq_count[VFIO_PCI_INTX_IRQ_INDEX], 1);
    ck_assert_uint_eq(info->irq_count[VFIO_PCI_MSI_IRQ_INDEX], msi ? n : 0);
    ck_assert_uint_eq(info->irq_count[VFIO_PCI_MSIX_IRQ_INDEX], msi ? 0 : n);
    ck_assert_uint_eq(info->irq_flags[msi ? VFIO_PCI_MSI_IRQ_INDEX : VFIO_PCI_MSIX_IRQ_INDEX] &
                          VFIO_IRQ_INFO_EVENTFD,
                      VFIO_IRQ_INFO_EVENTFD);
    ck_assert_uint_eq(info->irq_count[VFIO_PCI_ERR_IRQ_INDEX], 1);

    /* Config space through the ops: the mode's capability, its count */
    ck_assert_uint_eq(cfg_rd(d, VN_PCICFG_CAP_MSIX, 1), msi ? PCI_CAP_ID_MSI : PCI_CAP_ID_MSIX);
    if (msi) {
        ck_assert_uint_eq((cfg_rd(d, VN_PCICFG_CAP_MSI + PCI_MSI_FLAGS, 2) & PCI_MSI_FLAGS_QMASK) >>
                              1,
                          (uint32_t)g_bit_nth_lsf(n, -1));
        ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_4, 4), 0);
    } else {
        ck_assert_uint_eq(cfg_rd(d, VN_PCICFG_CAP_MSIX + PCI_MSIX_FLAGS, 2), n - 1);
    }
}
END_TEST

/* The CMB in each interrupt mode, mapped or trapped: BAR2 (with BAR3) a
 * 64-bit prefetchable memory BAR of the CMB's size, the region a sealed
 * memfd of that size (zeros) whose bytes trapped accesses read and write,
 * BAR4 still the MSI-X table's, and the NVMe registers saying where. */
static const struct {
    VnPciCfgIrqMode mode;
    uint32_t mib;
    bool trap;
} cmbs[] = {
    { VN_PCICFG_IRQ_MSIX, 2, false },
    { VN_PCICFG_IRQ_MSI, 2, false },
    { VN_PCICFG_IRQ_MSIX, 16, false },
    { VN_PCICFG_IRQ_MSIX, 2, true },
};

START_TEST(test_cmb)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnPciDev) d = mk_cmb(cmbs[_i].mode, 9, cmbs[_i].mib, cmbs[_i].trap, &error);
    uint64_t size = (uint64_t)cmbs[_i].mib << 20;
    bool msi = cmbs[_i].mode == VN_PCICFG_IRQ_MSI;
    const VnRegion *r;
    struct stat st;
    uint8_t *map, buf[16];

    ck_assert_msg(d != NULL, "%s", error ? error->message : "");
    r = &vn_pcidev_info(d)->regions[VFIO_PCI_BAR2_REGION_INDEX];
    ck_assert_uint_eq(r->size, size);
    ck_assert_uint_eq(r->flags & (VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE),
                      VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE);
    ck_assert_uint_eq(vn_pcidev_info(d)->regions[VFIO_PCI_BAR4_REGION_INDEX].size,
                      msi ? 0 : VN_PCIDEV_BAR4_SIZE);

    /* Config space: 64-bit (10b) prefetchable memory; sizing gives the size */
    ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_2, 4),
                      PCI_BASE_ADDRESS_MEM_TYPE_64 | PCI_BASE_ADDRESS_MEM_PREFETCH);
    ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_3, 4), 0);
    cfg_wr32(d, PCI_BASE_ADDRESS_2, 0xffffffff);
    cfg_wr32(d, PCI_BASE_ADDRESS_3, 0xffffffff);
    ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_2, 4),
                      ((uint32_t) ~(size - 1) & PCI_BASE_ADDRESS_MEM_MASK) |
                          PCI_BASE_ADDRESS_MEM_TYPE_64 | PCI_BASE_ADDRESS_MEM_PREFETCH);
    ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_3, 4), 0xffffffff);
    ck_assert_uint_eq(cfg_rd(d, PCI_BASE_ADDRESS_4, 4), 0); /* 32-bit, untouched */

    /* CMBLOC BIR 2; CMBSZ SZ = MiB, SZU 1 MiB (2), WDS, RDS */
    ck_assert_uint_eq(nvme_rd(d, 0x38), 2);
    ck_assert_uint_eq(nvme_rd(d, 0x3c), (cmbs[_i].mib << 12) | (2u << 8) | (1u << 4) | (1u << 3));

    if (cmbs[_i].trap) {
        ck_assert_uint_eq(r->flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
        ck_assert_int_eq(r->mmap_fd, -1);
        ck_assert_int_eq(
            vn_pcidev_ops.region_write(d, VFIO_PCI_BAR2_REGION_INDEX, size - 5, "trap", 5), 0);
        ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_BAR2_REGION_INDEX, size - 5, buf, 5),
                         0);
        ck_assert_str_eq((char *)buf, "trap");
        return;
    }
    /* Mappable: one sparse area over all of it, a sealed memfd of its size */
    ck_assert_uint_eq(r->flags & VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_MMAP);
    ck_assert_int_ge(r->mmap_fd, 0);
    ck_assert_uint_eq(r->mmap_offset, 0);
    ck_assert_uint_eq(r->nr_sparse, 1);
    ck_assert_uint_eq(r->sparse[0].offset, 0);
    ck_assert_uint_eq(r->sparse[0].size, size);
    ck_assert_int_eq(fstat(r->mmap_fd, &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, size);
    ck_assert_int_eq(fcntl(r->mmap_fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW),
                     F_SEAL_SHRINK | F_SEAL_GROW);

    /* What the client stores through its mapping, a trapped read returns,
     * and the other way round; the CMB starts as zeros */
    map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->mmap_fd, 0);
    ck_assert(map != MAP_FAILED);
    for (uint64_t i = 0; i < size; i += 4096) {
        ck_assert_msg(map[i] == 0 && map[i + 4095] == 0,
                      "CMB not zero at 0x%" G_GINT64_MODIFIER "x", i);
    }
    memcpy(map + 0x1000, "through the fd", 15);
    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_BAR2_REGION_INDEX, 0x1000, buf, 15), 0);
    ck_assert_str_eq((char *)buf, "through the fd");
    ck_assert_int_eq(
        vn_pcidev_ops.region_write(d, VFIO_PCI_BAR2_REGION_INDEX, size - 8, "trapped", 8), 0);
    ck_assert_str_eq((char *)map + size - 8, "trapped");
    /* Past the end: refused */
    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_BAR2_REGION_INDEX, size - 4, buf, 8),
                     -EINVAL);
    munmap(map, size);
}
END_TEST

static const struct {
    const char *why;
    uint32_t mode, vectors, cmb_mib;
} bad[] = {
    { "one vector", VN_PCICFG_IRQ_MSIX, 1, 0 },
    { "one vector (MSI)", VN_PCICFG_IRQ_MSI, 1, 0 },
    { "too many vectors", VN_PCICFG_IRQ_MSIX, VN_PCIDEV_MAX_VECTORS + 1, 0 },
    { "too many vectors (MSI)", VN_PCICFG_IRQ_MSI, VN_PCIDEV_MAX_VECTORS + 1, 0 },
    { "unknown mode", VN_PCICFG_IRQ_LAST, 9, 0 },
    { "CMB below 2 MiB", VN_PCICFG_IRQ_MSIX, 9, 1 },
    { "CMB not a power of two", VN_PCICFG_IRQ_MSIX, 9, 3 },
    { "CMB above 256 MiB", VN_PCICFG_IRQ_MSIX, 9, VN_NVME_MAX_CMB_MIB * 2 },
};

START_TEST(test_bad_params)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnPciDev) d =
        mk_cmb((VnPciCfgIrqMode)bad[_i].mode, bad[_i].vectors, bad[_i].cmb_mib, false, &error);

    ck_assert_msg(d == NULL, "accepted: %s", bad[_i].why);
    ck_assert_ptr_nonnull(error);
}
END_TEST

static Suite *pcidev_suite(void)
{
    Suite *s = suite_create("pcidev");
    TCase *tc;

    tc = tcase_create("info");
    tcase_add_unchecked_fixture(tc, dir_create, dir_remove);
    tcase_add_loop_test(tc, test_info, 0, G_N_ELEMENTS(modes));
    suite_add_tcase(s, tc);

    tc = tcase_create("cmb");
    tcase_add_unchecked_fixture(tc, dir_create, dir_remove);
    tcase_add_loop_test(tc, test_cmb, 0, G_N_ELEMENTS(cmbs));
    suite_add_tcase(s, tc);

    tc = tcase_create("params");
    tcase_add_unchecked_fixture(tc, dir_create, dir_remove);
    tcase_add_loop_test(tc, test_bad_params, 0, G_N_ELEMENTS(bad));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(pcidev_suite());
}
