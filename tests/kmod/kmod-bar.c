/*
 * kmod-bar-revoke: a window whose target is a BAR (mapped through VFIO) stops reaching it the
 * moment VFIO takes the BAR away, in the kernel, whatever the exporter does: here memory
 * decode cleared through VFIO's config region (VFIO zaps every mapping of the BAR), then the
 * exporter's own munmap.  Each time the window's translation is gone at once (the mock holds
 * none for it; MW_INFO's in_size reads 0), MW_CLEAR still releases it, and a new export of
 * the BAR, decode on again, is translated again.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <linux/pci_regs.h>
#include <linux/vfio.h>

#include "kselftest.h"

/* Write the pci-testdev's COMMAND through VFIO (its config region): 0 or -errno. */
static int command_write(int devfd, uint16_t value)
{
    struct vfio_region_info ri = { .argsz = sizeof(ri), .index = VFIO_PCI_CONFIG_REGION_INDEX };

    if (ioctl(devfd, VFIO_DEVICE_GET_REGION_INFO, &ri) < 0) {
        return -errno;
    }
    return pwrite(devfd, &value, sizeof(value), (off_t)(ri.offset + PCI_COMMAND)) == 2 ? 0 : -errno;
}

/* The window's size now, as MW_INFO says it (0: no translation); -1 when it cannot tell. */
static long long in_size(int dev, unsigned idx)
{
    struct vn_ntb_mw_info mi;

    return mw_info(dev, idx, &mi) == 0 ? (long long)mi.in_size : -1;
}

void case_bar_revoke(void)
{
    struct tcase t = { .name = "kmod-bar-revoke", .ok = true };
    int dev, vfds[3] = { -1, -1, -1 }, r;
    void *vbar = MAP_FAILED;
    uint32_t seen;

    dev = open_linked(&t);
    if (dev < 0 || !check(&t, opt.testdev[0], "no pci-testdev (1b36:0005) in this machine")) {
        goto out;
    }
    vbar = vfio_bar0(&t, vfds);
    if (vbar == MAP_FAILED) {
        goto out;
    }
    peek(vbar, &seen);

    /* Memory decode off through VFIO: the translation goes with VFIO's zap. */
    r = mw_export(dev, 1, vbar, page);
    check(&t, r == 0 && mock_translations() == 1 && in_size(dev, 1) == page,
          "the VFIO BAR export: %s, %d translations", strerror(-r), mock_translations());
    r = command_write(vfds[2], PCI_COMMAND_MASTER);
    check(&t, r == 0, "COMMAND through VFIO: %s", strerror(-r));
    kv(&t, "mem_off=%s", mock_translations() == 0 && in_size(dev, 1) == 0 ? "cleared" : "kept");
    check(&t, mock_translations() == 0, "the translation outlived memory decode off");
    check(&t, in_size(dev, 1) == 0, "MW_INFO still reports the BAR's translation");
    r = u32_ioctl(dev, VN_NTB_MW_CLEAR, 1);
    check(&t, r == 0, "MW_CLEAR of the revoked window: %s", strerror(-r));

    /* Decode on again: exported anew, translated again. */
    command_write(vfds[2], PCI_COMMAND_MASTER | PCI_COMMAND_MEMORY);
    peek(vbar, &seen);
    r = mw_export(dev, 1, vbar, page);
    kv(&t, "export_again=%s", r == 0 ? "0" : strerror(-r));
    check(&t, r == 0 && mock_translations() == 1, "the export after decode on: %s", strerror(-r));

    /* The exporter lets go of its mapping: the window reaches nothing from then on. */
    munmap(vbar, page);
    vbar = MAP_FAILED;
    kv(&t, "munmap=%s", mock_translations() == 0 ? "cleared" : "kept");
    check(&t, mock_translations() == 0 && in_size(dev, 1) == 0,
          "the translation outlived the exporter's mapping");
    r = u32_ioctl(dev, VN_NTB_MW_CLEAR, 1);
    check(&t, r == 0, "MW_CLEAR after the munmap: %s", strerror(-r));

out:
    if (vbar != MAP_FAILED) {
        munmap(vbar, page);
    }
    if (vfds[0] >= 0 || vfds[1] >= 0) {
        vfio_unbind(vfds);
    }
    if (dev >= 0) {
        close(dev);
    }
    finish(&t);
}
