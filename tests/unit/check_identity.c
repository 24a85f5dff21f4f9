/*
 * Unit tests of vfio-ntb/daemon/identity.[ch]: a function's identity read
 * from a fake sysfs and named from the PCI ID database (Debian's pci.ids),
 * its storage size, and names from peers made printable.
 */
#include "check-main.h"
#include "fake-sysfs.h"

#include "daemon/identity.h"

#include <glib/gstdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *sys;

static void setup(void)
{
    root = fake_root("identity");
    sys = g_build_filename(root, "sys", NULL);
    fake_put("sys/devices/pci0000:00/0000:00:05.0/vendor", "0x1b36\n");
    fake_put("sys/devices/pci0000:00/0000:00:05.0/device", "0x0010\n");
    fake_put("sys/devices/pci0000:00/0000:00:05.0/class", "0x010802\n");
    fake_link("sys/bus/pci/devices/0000:00:05.0", "../../../devices/pci0000:00/0000:00:05.0");
}

static void teardown(void)
{
    fake_remove();
    g_clear_pointer(&sys, g_free);
}

/* What lspci says of it: vendor:device, class, the database's names. */
START_TEST(test_named)
{
    VnIdentity id;

    ck_assert(vn_identity_of_pci(sys, "0000:00:05.0", &id));
    ck_assert(id.known);
    ck_assert_str_eq(id.pci, "0000:00:05.0");
    ck_assert_uint_eq(id.vendor, 0x1b36);
    ck_assert_uint_eq(id.device, 0x0010);
    ck_assert_uint_eq(id.class_code, 0x010802);
    ck_assert_str_eq(id.name, "Non-Volatile memory controller: Red Hat, Inc. QEMU NVM "
                              "Express Controller");
    ck_assert_uint_eq(id.size, 0);
    ck_assert(!vn_identity_of_pci(sys, "0000:00:1f.7", &id));
}
END_TEST

/* Its whole disks count, their partitions do not (they are in them); a
 * disk of another function does not either. */
START_TEST(test_storage_size)
{
    VnIdentity id;

    fake_put("sys/devices/pci0000:00/0000:00:05.0/nvme/nvme0/nvme0n1/size", "131072\n");
    fake_put("sys/devices/pci0000:00/0000:00:05.0/nvme/nvme0/nvme0n1/nvme0n1p1/size", "2048\n");
    fake_put("sys/devices/pci0000:00/0000:00:05.0/nvme/nvme0/nvme0n1/nvme0n1p1/partition", "1\n");
    fake_put("sys/devices/pci0000:00/0000:00:06.0/block/vda/size", "999\n");
    fake_link("sys/class/block/nvme0n1",
              "../../devices/pci0000:00/0000:00:05.0/nvme/nvme0/nvme0n1");
    fake_link("sys/class/block/nvme0n1p1",
              "../../devices/pci0000:00/0000:00:05.0/nvme/nvme0/nvme0n1/nvme0n1p1");
    fake_link("sys/class/block/vda", "../../devices/pci0000:00/0000:00:06.0/block/vda");
    ck_assert(vn_identity_of_pci(sys, "0000:00:05.0", &id));
    ck_assert_uint_eq(id.size, 131072ull * 512);
}
END_TEST

/* A device the database does not know still has a name. */
START_TEST(test_unknown_ids)
{
    VnIdentity id;

    fake_put("sys/devices/pci0000:00/0000:00:05.0/device", "0xfff0\n");
    fake_put("sys/devices/pci0000:00/0000:00:05.0/class", "0xff0000\n");
    ck_assert(vn_identity_of_pci(sys, "0000:00:05.0", &id));
    ck_assert_msg(strstr(id.name, "Red Hat, Inc. Device fff0") != NULL, "%s", id.name);
}
END_TEST

START_TEST(test_clean_name)
{
    char name[VN_IDENTITY_MAX_NAME + 1] = "GPU\x1b[31m\n";

    vn_identity_clean_name(name);
    ck_assert_str_eq(name, "GPU?[31m?");
}
END_TEST

static Suite *identity_suite(void)
{
    Suite *s = suite_create("identity");
    TCase *tc = tcase_create("identity");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_named);
    tcase_add_test(tc, test_storage_size);
    tcase_add_test(tc, test_unknown_ids);
    tcase_add_test(tc, test_clean_name);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(identity_suite());
}
