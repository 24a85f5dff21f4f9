/*
 * Unit tests of the simulated device as the vfio-user server sees it
 * (vfio-ntb/simdev/pcidev.c): the regions and irqs it reports and the
 * config space behind its ops, in both interrupt modes, and the parameters
 * it refuses.  The NVMe controller itself is tested in check_nvme*.c.
 */
#include "simdev/pcidev.h"

#include "check-main.h"

#include <check.h>
#include <errno.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
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

static VnPciDev *mk(VnPciCfgIrqMode mode, uint32_t vectors, GError **error)
{
    g_autofree char *backing = g_build_filename(dir, ns_file, NULL);
    VnPciDevParams p = {
        .backing = backing,
        .size = 1 << 20,
        .serial = "PCIDEV-1",
        .vectors = vectors,
        .irq_mode = mode,
    };

    return vn_pcidev_new(&p, error);
}

static uint32_t cfg_rd(VnPciDev *d, unsigned off, unsigned len)
{
    uint32_t v = 0;

    ck_assert_int_eq(vn_pcidev_ops.region_read(d, VFIO_PCI_CONFIG_REGION_INDEX, off, &v, len), 0);
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

static const struct {
    const char *why;
    uint32_t mode, vectors;
} bad[] = {
    { "one vector", VN_PCICFG_IRQ_MSIX, 1 },
    { "one vector (MSI)", VN_PCICFG_IRQ_MSI, 1 },
    { "too many vectors", VN_PCICFG_IRQ_MSIX, VN_PCIDEV_MAX_VECTORS + 1 },
    { "too many vectors (MSI)", VN_PCICFG_IRQ_MSI, VN_PCIDEV_MAX_VECTORS + 1 },
    { "unknown mode", VN_PCICFG_IRQ_LAST, 9 },
};

START_TEST(test_bad_params)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnPciDev) d = mk((VnPciCfgIrqMode)bad[_i].mode, bad[_i].vectors, &error);

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
