/*
 * kmod-selftest: the vfio_ntb module's own tests, against its contract (vfio_ntb_uapi.h), in a
 * VM where tests/kmod/ntb_mock.ko plays the NTB hardware on QEMU's ivshmem-plain
 * (tests/e2e/test_kmod.py boots it; kmod_inner.py runs this there as root).
 *
 *   kmod-selftest [--bdf BDF] [--testdev BDF] [--case NAME] [--iterations N]
 *                 [--max-seconds S] [--removal-every N]
 *
 * BDF: the mock's PCI function (default: the first ivshmem, 1af4:1110), whose device is
 * /dev/vfio-ntb/BDF and whose debugfs is /sys/kernel/debug/ntb_mock/BDF; --testdev: a
 * pci-testdev (1b36:0005) for the BAR exports (default: the first one).  Prints one line per
 * case, `RESULT <name> PASS|FAIL key=value...`, then `kmod-selftest: N passed, N failed`;
 * exits 1 when any failed.  kmod-map-races runs last: it ends by unloading vfio_ntb.
 *
 * Here: main, and the cases kmod-window-revoke, kmod-accounting and kmod-release.  The harness
 * they share is kselftest.h; kmod-refusals is in kmod-refusals.c, kmod-window-span in
 * kmod-span.c, kmod-bar-revoke in kmod-bar.c, kmod-map-races in kmod-races.c.
 *
 * Faults are part of the contract (a revoked mapping is SIGBUS): children die of them where a
 * process is the thing observed; threads catch them (sigsetjmp in a SIGBUS handler) where
 * many accesses are.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/capability.h>

#include "kselftest.h"

#define MOCK_ID "0x1af4 0x1110"
#define TESTDEV_ID "0x1b36 0x0005"

/* --- kmod-window-revoke ------------------------------------------------------------------ */

static void signal_go(int fd)
{
    if (write(fd, "g", 1) != 1) {
        _exit(98);
    }
}

static char wait_byte(int fd)
{
    char c = 0;

    if (read(fd, &c, 1) != 1) {
        return 0;
    }
    return c;
}

void case_window_revoke(void)
{
    struct tcase t = { .name = "kmod-window-revoke", .ok = true };
    const uint32_t first = 0x4b4d0001, second = 0x4b4d0002;
    volatile uint32_t *devmap = MAP_FAILED, *devmap2 = MAP_FAILED, *newmap = MAP_FAILED;
    int dev, wfd = -1, wfd2 = -1, go_a[2], go_b[2], ready_b[2], st;
    struct vn_ntb_mw_info mi;
    struct statfs sfs;
    pid_t a, b, c;
    uint32_t seen;
    char how[32];
    int r;

    dev = open_linked(&t);
    if (dev < 0) {
        goto out;
    }
    r = mw_info(dev, 0, &mi);
    if (!check(&t, r == 0 && mi.out_size >= (uint64_t)page, "MW_INFO(0): %d size %llu", r,
               (unsigned long long)mi.out_size)) {
        goto out;
    }
    devmap = map(dev, page, mi.out_mmap_offset);
    wfd = window_fd(dev, 0, 0);
    if (!check(&t, devmap != MAP_FAILED, "mmap of the device: %s", strerror(errno)) ||
        !check(&t, wfd >= 0, "MW_FD(0): %s", strerror(-wfd))) {
        goto out;
    }
    check(&t, fstatfs(wfd, &sfs) == 0 && sfs.f_type == VN_NTB_WINDOW_FS_MAGIC,
          "window file's f_type %lx", (unsigned long)sfs.f_type);
    r = touch(devmap, &seen, first);
    if (!check(&t, r == 0, "the device's mapping of window 0 faulted (signal %d)", r)) {
        goto out;
    }

    if (pipe2(go_a, O_CLOEXEC) || pipe2(go_b, O_CLOEXEC) || pipe2(ready_b, O_CLOEXEC)) {
        check(&t, false, "pipe: %s", strerror(errno));
        goto out;
    }
    /* A: keeps the window file only; after the revoke, maps it. */
    a = fork();
    if (a == 0) {
        void *p;

        wait_byte(go_a[0]);
        p = map(wfd, page, 0);
        if (p != MAP_FAILED) {
            _exit(100);
        }
        _exit(errno == ENODEV ? 0 : errno);
    }
    /* B: keeps a mapping of it; reads the first target, then (after the revoke) again. */
    b = fork();
    if (b == 0) {
        volatile uint32_t *p = map(wfd, page, 0);

        if (p == MAP_FAILED) {
            signal_go(ready_b[1]);
            _exit(2);
        }
        if (write(ready_b[1], p[0] == first ? "1" : "0", 1) != 1) {
            _exit(99);
        }
        wait_byte(go_b[0]);
        _exit(p[0] == second ? 3 : 4);
    }
    check(&t, wait_byte(ready_b[0]) == '1', "child B did not read the first marker");

    r = u32_ioctl(dev, VN_NTB_MW_REVOKE, 0);
    check(&t, r == 0, "MW_REVOKE(0): %s", strerror(-r));
    /* The next target's bytes, through a new file of the window. */
    wfd2 = window_fd(dev, 0, 0);
    if (check(&t, wfd2 >= 0, "MW_FD after the revoke: %s", strerror(-wfd2))) {
        newmap = map(wfd2, page, 0);
        if (check(&t, newmap != MAP_FAILED, "mmap of the new file: %s", strerror(errno))) {
            r = touch(newmap, &seen, second);
            check(&t, r == 0, "the new file's mapping faulted (signal %d)", r);
            r = peek(newmap, &seen);
            kv(&t, "new_file=%s", r ? "fault" : seen == second ? "second" : "other");
            check(&t, r == 0 && seen == second, "the new file does not read back");
        }
    }
    signal_go(go_a[1]);
    signal_go(go_b[1]);
    for (int i = 0; i < 2; i++) {
        close(go_a[i]);
        close(go_b[i]);
        close(ready_b[i]);
    }
    st = reap(a, 10);
    kv(&t, "old_file_mmap=%s",
       st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0     ? "ENODEV"
       : st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 100 ? "mapped"
                                                             : how_died(st, how, sizeof(how)));
    check(&t, st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "child A's mmap of its old file was not ENODEV");
    st = reap(b, 10);
    kv(&t, "old_mapping=%s",
       st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 3 ? "read-second"
                                                         : how_died(st, how, sizeof(how)));
    check(&t, st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS,
          "child B's old mapping did not SIGBUS");

    /* The device's own mapping, made before the revoke. */
    c = fork();
    if (c == 0) {
        _exit(devmap[0] == second ? 3 : 4);
    }
    st = reap(c, 10);
    kv(&t, "old_device_mapping=%s",
       st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 3 ? "read-second"
                                                         : how_died(st, how, sizeof(how)));
    check(&t, st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS,
          "the device mapping made before the revoke did not SIGBUS");
    r = peek(devmap, &seen);
    check(&t, r == SIGBUS, "the old device mapping read in the parent (signal %d)", r);

    /* After the revoke: the device maps the window again, the old file stays dead. */
    devmap2 = map(dev, page, mi.out_mmap_offset);
    if (check(&t, devmap2 != MAP_FAILED, "mmap of the device after the revoke: %s",
              strerror(errno))) {
        r = peek(devmap2, &seen);
        kv(&t, "new_device_mapping=%s", r ? "fault" : seen == second ? "second" : "other");
        check(&t, r == 0 && seen == second, "the device mapping after the revoke does not read");
    }
    errno = 0;
    check(&t, map(wfd, page, 0) == MAP_FAILED && errno == ENODEV,
          "the old file maps in the parent (errno %d)", errno);
    r = u32_ioctl(dev, VN_NTB_MW_REVOKE, 9);
    kv(&t, "revoke_9=%s", r == -EINVAL ? "EINVAL" : r == 0 ? "0" : strerror(-r));
    check(&t, r == -EINVAL, "MW_REVOKE(9) was not EINVAL");
    r = window_fd(dev, 0, VN_NTB_MW_FD_WC);
    if (check(&t, r >= 0, "MW_FD(0, WC): %s", strerror(-r))) {
        volatile uint32_t *wc = map(r, page, 0);

        check(&t, wc != MAP_FAILED && peek(wc, &seen) == 0 && seen == second,
              "a write-combining file does not read the window");
        if (wc != MAP_FAILED) {
            munmap((void *)wc, page);
        }
        close(r);
    }

out:
    if (devmap != MAP_FAILED) {
        munmap((void *)devmap, page);
    }
    if (devmap2 != MAP_FAILED) {
        munmap((void *)devmap2, page);
    }
    if (newmap != MAP_FAILED) {
        munmap((void *)newmap, page);
    }
    if (wfd >= 0) {
        close(wfd);
    }
    if (wfd2 >= 0) {
        close(wfd2);
    }
    if (dev >= 0) {
        close(dev);
    }
    finish(&t);
}

/* --- kmod-accounting --------------------------------------------------------------------- */

struct acct {
    int enomem, export1, clear1, export2, closed;
    long lck0, lck_refused, lck_export, lck_clear, lck_export2, lck_close;
    char err[200];
};

static bool drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
    struct __user_cap_data_struct d[2];
    int i = CAP_TO_INDEX(CAP_IPC_LOCK);

    if (syscall(SYS_capget, &h, d)) {
        return false;
    }
    d[i].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    d[i].permitted &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    d[i].inheritable &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    return syscall(SYS_capset, &h, d) == 0;
}

/* The child's side: no CAP_IPC_LOCK, 1 MiB of RLIMIT_MEMLOCK. */
static void accounting_child(struct acct *a)
{
    struct rlimit rl = { MIB, MIB };
    struct tcase t = { .name = "child", .ok = true };
    char *buf;
    int dev;

    if (!drop_ipc_lock() || setrlimit(RLIMIT_MEMLOCK, &rl)) {
        snprintf(a->err, sizeof(a->err), "capset or setrlimit: %s", strerror(errno));
        return;
    }
    buf = anon(2 * MIB);
    dev = open_linked(&t);
    if (dev < 0 || buf == MAP_FAILED) {
        snprintf(a->err, sizeof(a->err), "%s", t.why[0] ? t.why : "no memory");
        return;
    }
    a->lck0 = vmlck_kb(0);
    a->enomem = mw_export(dev, 0, buf, 2 * MIB);
    a->lck_refused = vmlck_kb(0);
    a->export1 = mw_export(dev, 0, buf, 512 * KIB);
    a->lck_export = vmlck_kb(0);
    a->clear1 = u32_ioctl(dev, VN_NTB_MW_CLEAR, 0);
    a->lck_clear = vmlck_kb(0);
    a->export2 = mw_export(dev, 1, buf + MIB, 512 * KIB);
    a->lck_export2 = vmlck_kb(0);
    a->closed = close(dev) ? -errno : 0;
    a->lck_close = vmlck_kb(0);
}

void case_accounting(void)
{
    struct tcase t = { .name = "kmod-accounting", .ok = true };
    struct acct *a =
        mmap(NULL, sizeof(*a), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char how[32];
    pid_t pid;
    int st;

    if (!check(&t, a != MAP_FAILED, "mmap: %s", strerror(errno))) {
        finish(&t);
        return;
    }
    memset(a, 0, sizeof(*a));
    a->enomem = a->export1 = a->clear1 = a->export2 = a->closed = 1;
    pid = fork();
    if (pid == 0) {
        accounting_child(a);
        _exit(0);
    }
    st = reap(pid, 60);
    check(&t, st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child %s",
          how_died(st, how, sizeof(how)));
    check(&t, !a->err[0], "%s", a->err);
    kv(&t, "export_2m=%s",
       a->enomem == -ENOMEM ? "ENOMEM"
       : a->enomem          ? strerror(-a->enomem)
                            : "0");
    kv(&t, "vmlck_kb=%ld,%ld,%ld,%ld,%ld,%ld", a->lck0, a->lck_refused, a->lck_export, a->lck_clear,
       a->lck_export2, a->lck_close);
    check(&t, a->enomem == -ENOMEM, "2 MiB over a 1 MiB limit: %d, not ENOMEM", a->enomem);
    check(&t, a->lck_refused == a->lck0, "the refused export left VmLck at %ld kB (from %ld)",
          a->lck_refused, a->lck0);
    check(&t, a->export1 == 0, "512 KiB export: %d", a->export1);
    check(&t, a->lck_export == a->lck0 + 512, "VmLck after 512 KiB: %ld kB (from %ld)",
          a->lck_export, a->lck0);
    check(&t, a->clear1 == 0 && a->lck_clear == a->lck0, "VmLck after MW_CLEAR: %ld kB (%d)",
          a->lck_clear, a->clear1);
    check(&t, a->export2 == 0 && a->lck_export2 == a->lck0 + 512,
          "VmLck after a second export: %ld kB (%d)", a->lck_export2, a->export2);
    check(&t, a->closed == 0 && a->lck_close == a->lck0, "VmLck after close: %ld kB", a->lck_close);
    munmap(a, sizeof(*a));
    finish(&t);
}

/* --- kmod-release -------------------------------------------------------------------------- */

static unsigned long long mock_hex(const char *file)
{
    char buf[64];

    return mock_state(file, buf, sizeof(buf)) < 0 ? ~0ull : strtoull(buf, NULL, 16);
}

void case_release(void)
{
    struct tcase t = { .name = "kmod-release", .ok = true };
    struct vn_ntb_info in;
    void *buf = anon(64 * KIB);
    int dev, efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), r;
    struct pollfd pfd = { .fd = efd, .events = POLLIN };

    dev = open_linked(&t);
    if (dev < 0) {
        goto out;
    }
    r = info(dev, &in);
    check(&t, r == 0 && in.db_valid_mask, "INFO: %d", r);
    r = mw_alloc(dev, 0, 64 * KIB);
    check(&t, r == 0, "MW_ALLOC(0): %s", strerror(-r));
    r = mw_export(dev, 1, buf, 64 * KIB);
    check(&t, r == 0, "MW_EXPORT(1): %s", strerror(-r));
    {
        struct vn_ntb_db_eventfd d = { .fd = efd, .bits = 1 };
        __u64 bits = 1;

        r = vn_ioctl(dev, VN_NTB_DB_EVENTFD, &d);
        check(&t, r == 0, "DB_EVENTFD: %s", strerror(-r));
        /* The mock's peer doorbells are ours. */
        r = vn_ioctl(dev, VN_NTB_PEER_DB_SET, &bits);
        check(&t, r == 0, "PEER_DB_SET: %s", strerror(-r));
        r = poll(&pfd, 1, 2000);
        kv(&t, "doorbell_eventfd=%s", r == 1 ? "signalled" : "silent");
        check(&t, r == 1, "the doorbell's eventfd was not signalled");
    }
    r = mock_translations();
    kv(&t, "translations_open=%d link_open=%llu", r, mock_hex("link"));
    check(&t, r == 2, "the mock holds %d translations, not 2", r);
    close(dev);
    dev = -1;

    r = mock_translations();
    kv(&t, "translations_closed=%d db_mask=%llx valid=%llx link=%llu", r, mock_hex("db_mask"),
       (unsigned long long)in.db_valid_mask, mock_hex("link"));
    check(&t, r == 0, "%d translations left after close", r);
    check(&t, mock_hex("db_mask") == in.db_valid_mask, "doorbells not masked after close");
    check(&t, mock_hex("link") == 0, "the link is still enabled after close");
    dev = dev_open();
    check(&t, dev >= 0, "reopen after close: %s", strerror(-dev));
out:
    if (dev >= 0) {
        close(dev);
    }
    if (efd >= 0) {
        close(efd);
    }
    if (buf != MAP_FAILED) {
        munmap(buf, 64 * KIB);
    }
    finish(&t);
}

/* --- main ------------------------------------------------------------------------------ */

/* The first PCI function whose "VENDOR DEVICE" is @id, into @bdf. */
static void find_pci(const char *id, char *bdf, size_t size)
{
    FILE *ls = popen("ls /sys/bus/pci/devices", "r");
    char name[64], path[160], v[16], d[16], both[40];

    if (!ls) {
        return;
    }
    while (!bdf[0] && fscanf(ls, "%63s", name) == 1) {
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", name);
        if (read_text(path, v, sizeof(v)) < 0) {
            continue;
        }
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", name);
        if (read_text(path, d, sizeof(d)) < 0) {
            continue;
        }
        v[strcspn(v, "\n")] = d[strcspn(d, "\n")] = '\0';
        snprintf(both, sizeof(both), "%s %s", v, d);
        if (!strcmp(both, id)) {
            snprintf(bdf, size, "%s", name);
        }
    }
    pclose(ls);
}

static bool selected(const char *name)
{
    return !opt.only || !strcmp(opt.only, name);
}

static int usage(void)
{
    fprintf(stderr, "usage: kmod-selftest [--bdf BDF] [--testdev BDF] [--case NAME] "
                    "[--iterations N] [--max-seconds S] [--removal-every N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!v) {
            return usage();
        }
        i++;
        if (!strcmp(a, "--bdf")) {
            snprintf(opt.bdf, sizeof(opt.bdf), "%s", v);
        } else if (!strcmp(a, "--testdev")) {
            snprintf(opt.testdev, sizeof(opt.testdev), "%s", v);
        } else if (!strcmp(a, "--case")) {
            opt.only = v;
        } else if (!strcmp(a, "--iterations")) {
            opt.iterations = strtol(v, NULL, 10);
        } else if (!strcmp(a, "--max-seconds")) {
            opt.max_seconds = (int)strtol(v, NULL, 10);
        } else if (!strcmp(a, "--removal-every")) {
            opt.removal_every = strtol(v, NULL, 10);
        } else {
            return usage();
        }
    }
    page = sysconf(_SC_PAGESIZE);
    if (!opt.bdf[0]) {
        find_pci(MOCK_ID, opt.bdf, sizeof(opt.bdf));
    }
    if (!opt.testdev[0]) {
        find_pci(TESTDEV_ID, opt.testdev, sizeof(opt.testdev));
    }
    if (!opt.bdf[0]) {
        fprintf(stderr, "kmod-selftest: no ivshmem (1af4:1110) for the mock\n");
        return 1;
    }
    snprintf(dev_path, sizeof(dev_path), "/dev/vfio-ntb/%s", opt.bdf);
    snprintf(debugfs_dir, sizeof(debugfs_dir), "/sys/kernel/debug/ntb_mock/%s", opt.bdf);
    kmsg_fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (kmsg_fd >= 0) {
        lseek(kmsg_fd, 0, SEEK_END);
    }
    catch_faults();
    printf("kmod-selftest: device %s, pci-testdev %s\n", dev_path,
           opt.testdev[0] ? opt.testdev : "none");
    fflush(stdout);

    if (selected("kmod-window-revoke")) {
        case_window_revoke();
    }
    if (selected("kmod-refusals")) {
        case_refusals();
    }
    if (selected("kmod-window-span")) {
        case_window_span();
    }
    if (selected("kmod-bar-revoke")) {
        case_bar_revoke();
    }
    if (selected("kmod-accounting")) {
        case_accounting();
    }
    if (selected("kmod-release")) {
        case_release();
    }
    if (selected("kmod-doorbell-trigger")) {
        case_doorbell_trigger();
    }
    if (selected("kmod-keep")) {
        case_keep();
    }
    if (selected("kmod-map-races")) {
        case_map_races();
    }
    printf("kmod-selftest: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
