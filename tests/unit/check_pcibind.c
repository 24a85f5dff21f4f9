/*
 * Unit tests of vfio-ntb/lending/pcibind.[ch] on a fake sysfs and procfs:
 * who uses a function (mounts, swap, holders, up interfaces, open DRM
 * nodes), what its IOMMU group holds, and what a bind writes.  Binds that
 * the kernel carries out are tested in the lender host (e2e vfio-managed).
 */
#include "check-main.h"
#include "fake-sysfs.h"

#include "lending/pcibind.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define BDF "0000:00:05.0"
#define OTHER "0000:00:05.1"

static char *sys, *proc;

static char *got(const char *rel)
{
    g_autofree char *path = g_build_filename(root, rel, NULL);
    char *text = NULL;

    return g_file_get_contents(path, &text, NULL, NULL) ? text : g_strdup("(none)");
}

/* Two functions in one group under a root port; the first has an NVMe
 * with a partition, a network interface and a DRM card; a function on
 * another bus has a disk of its own. */
static void setup(void)
{
    root = fake_root("pcibind");
    sys = g_build_filename(root, "sys", NULL);
    proc = g_build_filename(root, "proc", NULL);
    fake_put("sys/devices/pci0000:00/" BDF "/nvme/nvme0/nvme0n1/dev", "259:0\n");
    fake_put("sys/devices/pci0000:00/" BDF "/nvme/nvme0/nvme0n1/nvme0n1p1/dev", "259:1\n");
    fake_put("sys/devices/pci0000:00/" BDF "/net/eth7/flags", "0x1002\n"); /* down */
    fake_put("sys/devices/pci0000:00/" BDF "/drm/card3/dev", "226:3\n");
    fake_put("sys/devices/pci0000:00/" OTHER "/vendor", "0x8086\n");
    fake_put("sys/devices/pci0000:00/0000:00:06.0/block/vda/dev", "254:0\n");
    fake_put("sys/bus/pci/drivers/nvme/unbind", "");
    fake_put("sys/bus/pci/drivers/vfio-pci/unbind", "");
    fake_put("sys/bus/pci/drivers/igb/unbind", "");
    fake_put("sys/bus/pci/drivers_probe", "");
    fake_put("sys/devices/pci0000:00/" BDF "/driver_override", "(null)\n");
    fake_link("sys/bus/pci/devices/" BDF, "../../../devices/pci0000:00/" BDF);
    fake_link("sys/bus/pci/devices/" OTHER, "../../../devices/pci0000:00/" OTHER);
    fake_link("sys/class/block/nvme0n1", "../../devices/pci0000:00/" BDF "/nvme/nvme0/nvme0n1");
    fake_link("sys/class/block/nvme0n1p1",
              "../../devices/pci0000:00/" BDF "/nvme/nvme0/nvme0n1/nvme0n1p1");
    fake_link("sys/class/block/vda", "../../devices/pci0000:00/0000:00:06.0/block/vda");
    fake_link("sys/class/net/eth7", "../../devices/pci0000:00/" BDF "/net/eth7");
    fake_link("sys/class/drm/card3", "../../devices/pci0000:00/" BDF "/drm/card3");
    fake_link("sys/devices/pci0000:00/" BDF "/driver", "../../../bus/pci/drivers/nvme");
    fake_link("sys/devices/pci0000:00/" BDF "/iommu_group", "../../../kernel/iommu_groups/7");
    fake_link("sys/kernel/iommu_groups/7/devices/" BDF, "../../../../devices/pci0000:00/" BDF);
    fake_link("sys/kernel/iommu_groups/7/devices/" OTHER, "../../../../devices/pci0000:00/" OTHER);
    fake_put("proc/self/mountinfo", "22 1 254:0 / / rw - ext4 /dev/vda rw\n");
    fake_put("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n");
}

static void teardown(void)
{
    fake_remove();
    g_clear_pointer(&sys, g_free);
    g_clear_pointer(&proc, g_free);
}

START_TEST(test_driver)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *drv = vn_pcibind_driver(sys, BDF, NULL);
    g_autofree char *none = vn_pcibind_driver(sys, OTHER, NULL);

    ck_assert_str_eq(drv, "nvme");
    ck_assert_str_eq(none, "");
    ck_assert_ptr_null(vn_pcibind_driver(sys, "0000:00:1f.7", &error));
    ck_assert_ptr_nonnull(strstr(error->message, "no PCI function 0000:00:1f.7"));
}
END_TEST

/* Nobody uses it: the other function's root disk is not its. */
START_TEST(test_unused)
{
    ck_assert_ptr_null(vn_pcibind_users(sys, proc, BDF));
}
END_TEST

START_TEST(test_users_named)
{
    g_autofree char *users = NULL;

    fake_put("proc/self/mountinfo", "22 1 254:0 / / rw - ext4 /dev/vda rw\n"
                                    "40 22 259:1 / /data rw,relatime - ext4 /dev/nvme0n1p1 rw\n");
    fake_put("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n"
                           "/dev/nvme0n1\tpartition\t1024\t0\t-2\n");
    fake_put("sys/devices/pci0000:00/" BDF "/net/eth7/flags", "0x1003\n");
    fake_put("sys/devices/pci0000:00/" BDF "/nvme/nvme0/nvme0n1/holders/dm-0/dev", "253:0\n");
    users = vn_pcibind_users(sys, proc, BDF);
    ck_assert_ptr_nonnull(users);
    ck_assert_ptr_nonnull(strstr(users, "nvme0n1p1 is mounted on /data"));
    ck_assert_ptr_nonnull(strstr(users, "nvme0n1 is a swap area in use"));
    ck_assert_ptr_nonnull(strstr(users, "nvme0n1 is held by dm-0"));
    ck_assert_ptr_nonnull(strstr(users, "network interface eth7 is up"));
    ck_assert_ptr_null(strstr(users, "vda"));
}
END_TEST

/* An open DRM node: a process whose fd is the card's character device
 * (needs mknod, so root; skipped without). */
START_TEST(test_drm_open)
{
    g_autofree char *node = g_build_filename(root, "card3-node", NULL);
    g_autofree char *users = NULL;

    if (mknod(node, S_IFCHR | 0600, makedev(226, 3)) < 0) {
        return;
    }
    fake_put("proc/4242/comm", "Xorg\n");
    fake_link("proc/4242/fd/9", node);
    fake_put("proc/4243/comm", "bash\n");
    fake_link("proc/4243/fd/0", "/dev/null");
    users = vn_pcibind_users(sys, proc, BDF);
    ck_assert_ptr_nonnull(users);
    ck_assert_str_eq(users, "/dev/dri/card3 is open in process 4242 (Xorg)");
}
END_TEST

START_TEST(test_group)
{
    g_autofree char *bad = NULL;

    ck_assert_ptr_null(vn_pcibind_group_conflicts(sys, BDF)); /* no driver */
    fake_link("sys/devices/pci0000:00/" OTHER "/driver", "../../../bus/pci/drivers/igb");
    bad = vn_pcibind_group_conflicts(sys, BDF);
    ck_assert_ptr_nonnull(bad);
    ck_assert_str_eq(bad, OTHER " (igb)");
    {
        g_autofree char *drv =
            g_build_filename(root, "sys/devices/pci0000:00/" OTHER "/driver", NULL);

        ck_assert_int_eq(unlink(drv), 0);
    }
    fake_link("sys/devices/pci0000:00/" OTHER "/driver", "../../../bus/pci/drivers/vfio-pci");
    ck_assert_ptr_null(vn_pcibind_group_conflicts(sys, BDF));
}
END_TEST

/* What a bind asks of the kernel: vfio-pci as the override, an unbind from
 * its driver, a probe; a fake kernel does not carry it out, so the bind
 * says the function did not go to vfio-pci. */
START_TEST(test_bind_writes)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *was = NULL;
    g_autofree char *override = NULL, *unbind = NULL, *probed = NULL;

    ck_assert(!vn_pcibind_to_vfio(sys, BDF, &was, &error));
    ck_assert_str_eq(was, "nvme");
    ck_assert_ptr_nonnull(strstr(error->message, "did not bind to vfio-pci"));
    override = got("sys/devices/pci0000:00/" BDF "/driver_override");
    unbind = got("sys/bus/pci/drivers/nvme/unbind");
    probed = got("sys/bus/pci/drivers_probe");
    ck_assert_str_eq(override, "vfio-pci");
    ck_assert_str_eq(unbind, BDF);
    ck_assert_str_eq(probed, BDF);
}
END_TEST

/* Given back: override cleared, unbound from vfio-pci, probed; a function
 * that was vfio-pci's to begin with is left alone. */
START_TEST(test_restore_writes)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *override = NULL, *unbind = NULL;
    g_autofree char *drv = g_build_filename(root, "sys/devices/pci0000:00/" BDF "/driver", NULL);

    ck_assert(vn_pcibind_restore(sys, BDF, "vfio-pci", NULL));
    override = got("sys/devices/pci0000:00/" BDF "/driver_override");
    ck_assert_str_eq(override, "(null)\n");
    ck_assert_int_eq(unlink(drv), 0);
    fake_link("sys/devices/pci0000:00/" BDF "/driver", "../../../bus/pci/drivers/vfio-pci");
    ck_assert(!vn_pcibind_restore(sys, BDF, "nvme", &error));
    ck_assert_ptr_nonnull(strstr(error->message, "not back to nvme"));
    g_free(override);
    override = got("sys/devices/pci0000:00/" BDF "/driver_override");
    unbind = got("sys/bus/pci/drivers/vfio-pci/unbind");
    ck_assert_str_eq(override, "\n");
    ck_assert_str_eq(unbind, BDF);
}
END_TEST

/* What a managed function's worker keeps: the driver and the function, read back checked;
 * given back only for the function it names, and removed once the function is back. */
START_TEST(test_kept_give_back)
{
    g_autofree char *path = g_build_filename(root, "lend-nvme0-driver", NULL);
    g_autofree char *driver = NULL, *bdf = NULL;
    g_autoptr(GError) error = NULL;
    const char *bad[] = { "nv/me\n" BDF "\n", "nvme\n0000:00:05\n", "nvme\n../../x\n" };

    ck_assert(vn_pcibind_keep(path, BDF, "nvme", NULL));
    ck_assert(vn_pcibind_kept(path, &driver, &bdf));
    ck_assert_str_eq(driver, "nvme");
    ck_assert_str_eq(bdf, BDF);
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_free(driver);
        g_free(bdf);
        ck_assert(g_file_set_contents(path, bad[i], -1, NULL));
        ck_assert_msg(!vn_pcibind_kept(path, &driver, &bdf), "%s", bad[i]);
        ck_assert(!vn_pcibind_give_back(sys, path, NULL, NULL));
        ck_assert(g_file_test(path, G_FILE_TEST_EXISTS));
    }
    /* not the function the caller knows: refused, nothing written */
    ck_assert(vn_pcibind_keep(path, OTHER, "", NULL));
    ck_assert(!vn_pcibind_give_back(sys, path, BDF, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "names " OTHER ", not " BDF));
    g_clear_error(&error);
    /* a driver that does not take it back (this tree's probe binds nothing): the file stays */
    ck_assert(vn_pcibind_keep(path, BDF, "igb", NULL));
    ck_assert(!vn_pcibind_give_back(sys, path, NULL, &error));
    ck_assert(g_file_test(path, G_FILE_TEST_EXISTS));
    g_clear_error(&error);
    /* back (it had no driver: any will do), and the file gone; an older worker's file (the
     * driver alone) with the function the caller knows */
    ck_assert(vn_pcibind_keep(path, BDF, "", NULL));
    ck_assert_msg(vn_pcibind_give_back(sys, path, NULL, &error), "%s", error->message);
    ck_assert(!g_file_test(path, G_FILE_TEST_EXISTS));
    ck_assert(g_file_set_contents(path, "\n", -1, NULL));
    ck_assert(!vn_pcibind_give_back(sys, path, NULL, NULL));
    ck_assert(vn_pcibind_give_back(sys, path, BDF, NULL));
    ck_assert(!g_file_test(path, G_FILE_TEST_EXISTS));
}
END_TEST

/* A physical function with SR-IOV: the count written (from 0), its VFs'
 * addresses read from virtfnN; more than it has, or none, refused. */
START_TEST(test_sriov)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) vfs = NULL;
    g_autofree char *numvfs = NULL;

    fake_put("sys/devices/pci0000:00/" BDF "/sriov_totalvfs", "7\n");
    fake_put("sys/devices/pci0000:00/" BDF "/sriov_numvfs", "0\n");
    fake_link("sys/devices/pci0000:00/" BDF "/virtfn0", "../0000:00:10.0");
    fake_link("sys/devices/pci0000:00/" BDF "/virtfn1", "../0000:00:10.2");
    vfs = vn_pcibind_sriov_enable(sys, BDF, 2, &error);
    ck_assert_msg(vfs != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(vfs->len, 2);
    ck_assert_str_eq(vfs->pdata[0], "0000:00:10.0");
    ck_assert_str_eq(vfs->pdata[1], "0000:00:10.2");
    numvfs = got("sys/devices/pci0000:00/" BDF "/sriov_numvfs");
    ck_assert_str_eq(numvfs, "2");
    g_clear_pointer(&vfs, g_ptr_array_unref);
    /* Asked again (a restart): the same VFs, the count left alone. */
    vfs = vn_pcibind_sriov_enable(sys, BDF, 2, &error);
    ck_assert_ptr_nonnull(vfs);
    ck_assert_ptr_null(vn_pcibind_sriov_enable(sys, BDF, 8, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "at most 7 virtual functions, not 8"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_pcibind_sriov_enable(sys, BDF, 3, &error)); /* no virtfn2 */
    ck_assert_ptr_nonnull(strstr(error->message, "no virtual function 2"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_pcibind_sriov_enable(sys, OTHER, 1, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "no SR-IOV"));
}
END_TEST

static Suite *pcibind_suite(void)
{
    Suite *s = suite_create("pcibind");
    TCase *tc = tcase_create("pcibind");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_driver);
    tcase_add_test(tc, test_unused);
    tcase_add_test(tc, test_users_named);
    tcase_add_test(tc, test_drm_open);
    tcase_add_test(tc, test_group);
    tcase_add_test(tc, test_bind_writes);
    tcase_add_test(tc, test_restore_writes);
    tcase_add_test(tc, test_kept_give_back);
    tcase_add_test(tc, test_sriov);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(pcibind_suite());
}
