/*
 * kmod-refusals: what the module must refuse, and with which errno (vfio_ntb_uapi.h): a second
 * open, inbound windows before the link is up, reserved fields, unknown flags, short argsz,
 * indexes and sizes out of range, the ioctls the contract removed, a window file used as a
 * device, and a BAR mapped through sysfs as an export's target (one mapped through VFIO is
 * taken).  One case, its wrong rows listed in its RESULT line.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <linux/vfio.h>

#include "kselftest.h"

/* The ioctls the contract removed, as the old header defined them (13: a 32-byte struct). */
#define OLD_MW_EXPORT_BAR _IOWR(VN_NTB_TYPE, 13, char[32])
#define OLD_MW_ZAP _IOW(VN_NTB_TYPE, 16, __u32)

struct refusals {
    struct tcase *t;
    int checked;
    char wrong[600];
};

/* One row: the call @what answered @got (an ioctl's result or -errno), @want was due. */
static void expect(struct refusals *rf, const char *what, int got, int want)
{
    size_t n = strlen(rf->wrong);

    rf->checked++;
    if (got == want) {
        return;
    }
    snprintf(rf->wrong + n, sizeof(rf->wrong) - n, "%s%s:%s", n ? "," : "", what,
             got >= 0                ? "ok"
             : strerrorname_np(-got) ? strerrorname_np(-got)
                                     : "?");
    check(rf->t, false, "%s answered %d, not %d", what, got, want);
}

void case_refusals(void)
{
    struct tcase t = { .name = "kmod-refusals", .ok = true };
    struct refusals rf = { .t = &t };
    int dev, r, efd = -1, res = -1, vfds[3] = { -1, -1, -1 };
    void *buf = MAP_FAILED, *sysbar = MAP_FAILED, *vbar = MAP_FAILED;
    struct vn_ntb_mw_info mi;
    struct vn_ntb_info in;
    char path[256];

    dev = dev_open();
    if (!check(&t, dev >= 0, "open: %s", strerror(-dev))) {
        goto out;
    }
    expect(&rf, "second-open", dev_open(), -EBUSY);
    buf = anon(256 * KIB);
    efd = eventfd(0, EFD_CLOEXEC);

    /* Inbound windows wait for the link. */
    r = link_set(dev, false);
    check(&t, r == 0, "link down: %s", strerror(-r));
    expect(&rf, "alloc-link-down", mw_alloc(dev, 0, 64 * KIB), -ENOTCONN);
    expect(&rf, "export-link-down", mw_export(dev, 0, buf, 64 * KIB), -ENOTCONN);
    r = mw_info(dev, 0, &mi);
    expect(&rf, "mw-info-link-down", r == 0 && (mi.in_size_max | mi.in_addr_align) ? 1 : r, 0);
    r = link_set(dev, true);
    if (!check(&t, r == 0, "link up: %s", strerror(-r))) {
        goto out;
    }
    r = mw_info(dev, 0, &mi);
    if (!check(&t, r == 0 && mi.in_size_max >= 64 * KIB, "MW_INFO(0) with the link up: %d", r)) {
        goto out;
    }

    /* Reserved fields, unknown flags, argsz. */
    {
        struct vn_ntb_mw_export e = {
            .index = 0, .reserved = 1, .vaddr = (uintptr_t)buf, .size = 64 * KIB
        };
        struct vn_ntb_mw_alloc a = { .index = 0, .reserved = 1, .size = 64 * KIB };
        struct vn_ntb_mw_fd f = { .argsz = sizeof(f), .index = 0, .reserved = 1 };
        struct vn_ntb_db_eventfd d = { .fd = efd, .reserved = 1, .bits = 1 };

        expect(&rf, "export-reserved", vn_ioctl(dev, VN_NTB_MW_EXPORT, &e), -EINVAL);
        expect(&rf, "alloc-reserved", vn_ioctl(dev, VN_NTB_MW_ALLOC, &a), -EINVAL);
        expect(&rf, "mw-fd-reserved", vn_ioctl(dev, VN_NTB_MW_FD, &f), -EINVAL);
        expect(&rf, "db-eventfd-reserved", vn_ioctl(dev, VN_NTB_DB_EVENTFD, &d), -EINVAL);
        f.reserved = 0;
        f.flags = 1u << 7;
        expect(&rf, "mw-fd-flags", vn_ioctl(dev, VN_NTB_MW_FD, &f), -EINVAL);
        f.flags = 0;
        f.argsz = 8;
        expect(&rf, "mw-fd-argsz", vn_ioctl(dev, VN_NTB_MW_FD, &f), -EINVAL);
    }
    memset(&in, 0, sizeof(in));
    in.argsz = 4;
    expect(&rf, "info-argsz", vn_ioctl(dev, VN_NTB_INFO, &in), -EINVAL);
    memset(&mi, 0, sizeof(mi));
    mi.argsz = 8;
    expect(&rf, "mw-info-argsz", vn_ioctl(dev, VN_NTB_MW_INFO, &mi), -EINVAL);

    /* Indexes and sizes. */
    expect(&rf, "mw-fd-index", window_fd(dev, 9, 0), -EINVAL);
    expect(&rf, "alloc-index", mw_alloc(dev, 9, 64 * KIB), -EINVAL);
    expect(&rf, "clear-index", u32_ioctl(dev, VN_NTB_MW_CLEAR, 9), -EINVAL);
    expect(&rf, "revoke-index", u32_ioctl(dev, VN_NTB_MW_REVOKE, 9), -EINVAL);
    expect(&rf, "export-size-unaligned", mw_export(dev, 0, buf, 64 * KIB + 100), -EINVAL);
    expect(&rf, "export-vaddr-unaligned", mw_export(dev, 0, (char *)buf + 8, 64 * KIB), -EINVAL);
    r = mw_info(dev, 0, &mi);
    expect(&rf, "alloc-over-max", mw_alloc(dev, 0, mi.in_size_max + (uint64_t)page), -EINVAL);
    {
        struct vn_ntb_spad s = { .index = 4096 };

        expect(&rf, "spad-index", vn_ioctl(dev, VN_NTB_SPAD_READ, &s), -EINVAL);
    }

    /* The ioctls the contract removed. */
    {
        char old[32] = { 0 };

        expect(&rf, "old-ioctl-13", vn_ioctl(dev, OLD_MW_EXPORT_BAR, old), -ENOTTY);
        expect(&rf, "ioctl-13", vn_ioctl(dev, _IO(VN_NTB_TYPE, 13), NULL), -ENOTTY);
        expect(&rf, "old-ioctl-16", u32_ioctl(dev, OLD_MW_ZAP, 0), -ENOTTY);
    }

    /* A window file does nothing but mmap. */
    r = window_fd(dev, 0, 0);
    if (check(&t, r >= 0, "MW_FD(0): %s", strerror(-r))) {
        expect(&rf, "window-file-info", info(r, &in), -ENOTTY);
        expect(&rf, "window-file-mw-fd", window_fd(r, 0, 0), -ENOTTY);
        close(r);
    }

    /* Device targets: a BAR mapped through sysfs is refused, one mapped through VFIO taken. */
    if (!opt.testdev[0]) {
        check(&t, false, "no pci-testdev (1b36:0005) in this machine");
        goto out;
    }
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource0", opt.testdev);
    res = open(path, O_RDWR | O_SYNC | O_CLOEXEC);
    sysbar = res >= 0 ? map(res, page, 0) : MAP_FAILED;
    if (check(&t, sysbar != MAP_FAILED, "mmap %s: %s", path, strerror(errno))) {
        r = mw_export(dev, 1, sysbar, page);
        expect(&rf, "export-sysfs-bar", r, -EINVAL);
        if (r == 0) {
            u32_ioctl(dev, VN_NTB_MW_CLEAR, 1);
        }
    }
    vbar = vfio_bar0(&t, vfds);
    if (vbar != MAP_FAILED) {
        uint32_t seen;

        /* Fault it in as a user of the BAR would have. */
        peek(vbar, &seen);
        r = mw_export(dev, 1, vbar, page);
        kv(&t, "vfio_bar_export=%s", r == 0 ? "0" : strerror(-r));
        expect(&rf, "export-vfio-bar", r, 0);
        expect(&rf, "clear-vfio-bar", u32_ioctl(dev, VN_NTB_MW_CLEAR, 1), r == 0 ? 0 : -EINVAL);
    }

out:
    kv(&t, "checked=%d wrong=%s", rf.checked, rf.wrong[0] ? rf.wrong : "none");
    if (vbar != MAP_FAILED) {
        munmap(vbar, page);
    }
    if (vfds[0] >= 0 || vfds[1] >= 0 || vbar != MAP_FAILED) {
        vfio_unbind(vfds);
    }
    if (sysbar != MAP_FAILED) {
        munmap(sysbar, page);
    }
    if (res >= 0) {
        close(res);
    }
    if (buf != MAP_FAILED) {
        munmap(buf, 256 * KIB);
    }
    if (efd >= 0) {
        close(efd);
    }
    if (dev >= 0) {
        close(dev);
    }
    finish(&t);
}
