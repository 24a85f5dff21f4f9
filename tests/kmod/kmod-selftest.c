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
 * Faults are part of the contract (a revoked mapping is SIGBUS): children die of them where a
 * process is the thing observed; threads catch them (sigsetjmp in a SIGBUS handler) where
 * many accesses are.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/capability.h>
#include <linux/vfio.h>

#include "kmod/vfio_ntb_uapi.h"

/* The ioctls the contract removed, as the old header defined them (13: a 32-byte struct). */
#define OLD_MW_EXPORT_BAR _IOWR(VN_NTB_TYPE, 13, char[32])
#define OLD_MW_ZAP _IOW(VN_NTB_TYPE, 16, __u32)

#define MOCK_ID "0x1af4 0x1110"
#define TESTDEV_ID "0x1b36 0x0005"
#define KIB 1024ul
#define MIB (1024ul * 1024ul)

static struct {
    char bdf[64];
    char testdev[64];
    const char *only;
    long iterations;
    int max_seconds;
    long removal_every;
} opt = { .iterations = 50000, .max_seconds = 420, .removal_every = 500 };

static char dev_path[128];
static char debugfs_dir[160];
static long page;
static int n_passed, n_failed;
static int kmsg_fd = -1;

/* --- results --------------------------------------------------------------------------- */

struct tcase {
    const char *name;
    bool ok;
    char kv[2048];
    char why[200];
};

static void kv(struct tcase *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kv(struct tcase *t, const char *fmt, ...)
{
    size_t n = strlen(t->kv);
    va_list ap;

    if (n + 2 >= sizeof(t->kv)) {
        return;
    }
    t->kv[n++] = ' ';
    va_start(ap, fmt);
    vsnprintf(t->kv + n, sizeof(t->kv) - n, fmt, ap);
    va_end(ap);
}

/* @cond, or the case fails and (the first time) says why. */
static bool check(struct tcase *t, bool cond, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool check(struct tcase *t, bool cond, const char *fmt, ...)
{
    va_list ap;

    if (cond) {
        return true;
    }
    if (t->ok) {
        va_start(ap, fmt);
        vsnprintf(t->why, sizeof(t->why), fmt, ap);
        va_end(ap);
    }
    t->ok = false;
    return false;
}

static void finish(struct tcase *t)
{
    for (char *c = t->why; *c; c++) {
        if (*c == ' ') {
            *c = '_';
        }
    }
    printf("RESULT %s %s%s%s%s\n", t->name, t->ok ? "PASS" : "FAIL", t->kv,
           t->why[0] ? " why=" : "", t->why);
    fflush(stdout);
    if (t->ok) {
        n_passed++;
    } else {
        n_failed++;
    }
}

/* --- small helpers ----------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

    nanosleep(&ts, NULL);
}

/* An ioctl's result: what it returned, or -errno. */
static int vn_ioctl(int fd, unsigned long req, void *arg)
{
    int r = ioctl(fd, req, arg);

    return r < 0 ? -errno : r;
}

static int write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t n;
    int err;

    if (fd < 0) {
        return -errno;
    }
    n = write(fd, text, strlen(text));
    err = n < 0 ? -errno : 0;
    close(fd);
    return err;
}

static int read_text(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0) {
        return -errno;
    }
    n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0) {
        return -errno;
    }
    buf[n] = '\0';
    return 0;
}

/* kB of VmLck in /proc/@pid/status (0: self); -1 when unreadable. */
static long vmlck_kb(pid_t pid)
{
    char path[64], buf[4096];
    const char *p;

    if (pid) {
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    } else {
        snprintf(path, sizeof(path), "/proc/self/status");
    }
    if (read_text(path, buf, sizeof(buf)) < 0 || !(p = strstr(buf, "VmLck:"))) {
        return -1;
    }
    return strtol(p + 6, NULL, 10);
}

static void *map(int fd, size_t size, uint64_t offset)
{
    return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
}

static void *anon(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p != MAP_FAILED) {
        memset(p, 0x5a, size);
    }
    return p;
}

/* --- faults -------------------------------------------------------------------------- */

/* Where the faulting thread's guarded access resumes; NULL: not in one (default action).
 * volatile: its stores stay ordered around the (volatile) access they guard. */
static __thread sigjmp_buf *volatile fault_jmp;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *j = fault_jmp;

    if (j) {
        fault_jmp = NULL;
        siglongjmp(*j, sig);
    }
    /* Not ours to catch: die of it (the access repeats on return). */
    signal(sig, SIG_DFL);
}

static void catch_faults(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGSEGV, &sa, NULL);
}

/* Reads, then writes @val to, the word at @p: 0, or the signal the access raised. */
static int touch(volatile uint32_t *p, uint32_t *seen, uint32_t val)
{
    sigjmp_buf jb;
    int sig = sigsetjmp(jb, 1);

    if (sig) {
        return sig;
    }
    fault_jmp = &jb;
    *seen = *p;
    if (val) {
        *p = val;
    }
    fault_jmp = NULL;
    return 0;
}

static int peek(volatile uint32_t *p, uint32_t *seen)
{
    return touch(p, seen, 0);
}

/* Waits for @pid up to @secs; its wait status, or -1 (then it was killed). */
static int reap(pid_t pid, double secs)
{
    double end = now_s() + secs;
    int st;

    while (now_s() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);

        if (r == pid) {
            return st;
        }
        if (r < 0) {
            return -1;
        }
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static const char *how_died(int st, char *buf, size_t size)
{
    if (st == -1) {
        snprintf(buf, size, "hung");
    } else if (WIFSIGNALED(st)) {
        snprintf(buf, size, "%s",
                 WTERMSIG(st) == SIGBUS    ? "SIGBUS"
                 : WTERMSIG(st) == SIGSEGV ? "SIGSEGV"
                                           : "signal");
    } else {
        snprintf(buf, size, "exit%d", WEXITSTATUS(st));
    }
    return buf;
}

/* --- the device ------------------------------------------------------------------------ */

static int dev_open(void)
{
    int fd = open(dev_path, O_RDWR | O_CLOEXEC);

    return fd < 0 ? -errno : fd;
}

static int info(int dev, struct vn_ntb_info *in)
{
    memset(in, 0, sizeof(*in));
    in->argsz = sizeof(*in);
    return vn_ioctl(dev, VN_NTB_INFO, in);
}

static int mw_info(int dev, unsigned idx, struct vn_ntb_mw_info *mi)
{
    memset(mi, 0, sizeof(*mi));
    mi->argsz = sizeof(*mi);
    mi->index = idx;
    return vn_ioctl(dev, VN_NTB_MW_INFO, mi);
}

static int u32_ioctl(int dev, unsigned long req, __u32 v)
{
    return vn_ioctl(dev, req, &v);
}

static int window_fd(int dev, unsigned idx, unsigned flags)
{
    struct vn_ntb_mw_fd a = { .argsz = sizeof(a), .index = idx, .flags = flags };

    return vn_ioctl(dev, VN_NTB_MW_FD, &a);
}

static int mw_export(int dev, unsigned idx, const void *vaddr, size_t size)
{
    struct vn_ntb_mw_export e = { .index = idx, .vaddr = (uintptr_t)vaddr, .size = size };

    return vn_ioctl(dev, VN_NTB_MW_EXPORT, &e);
}

static int mw_alloc(int dev, unsigned idx, size_t size)
{
    struct vn_ntb_mw_alloc a = { .index = idx, .size = size };

    return vn_ioctl(dev, VN_NTB_MW_ALLOC, &a);
}

/* Link @on, and waits (5 s) until VN_NTB_INFO says so: 0 or -errno (-ETIMEDOUT). */
static int link_set(int dev, bool on)
{
    struct vn_ntb_info in;
    double end = now_s() + 5;
    int r = u32_ioctl(dev, VN_NTB_LINK, on);

    if (r < 0) {
        return r;
    }
    while (now_s() < end) {
        r = info(dev, &in);
        if (r < 0) {
            return r;
        }
        if (!!(in.flags & VN_NTB_INFO_LINK_UP) == on) {
            return 0;
        }
        sleep_ms(5);
    }
    return -ETIMEDOUT;
}

/* The device opened with its link up; -1 (and the case failed) if not. */
static int open_linked(struct tcase *t)
{
    int dev = dev_open();
    int r;

    if (!check(t, dev >= 0, "open %s: %s", dev_path, strerror(-dev))) {
        return -1;
    }
    r = link_set(dev, true);
    if (!check(t, r == 0, "link up: %s", strerror(-r))) {
        close(dev);
        return -1;
    }
    return dev;
}

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

static void case_window_revoke(void)
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

/* --- kmod-refusals ----------------------------------------------------------------------- */

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

/* A BAR's first page mapped through VFIO: the pci-testdev bound to vfio-pci, a container
 * with type1v2.  Fds in @fds (container, group, device), unbound again by vfio_unbind(). */
static void *vfio_bar0(struct tcase *t, int fds[3])
{
    char path[256], link[256], *group;
    struct vfio_group_status gs = { .argsz = sizeof(gs) };
    struct vfio_region_info ri = { .argsz = sizeof(ri), .index = VFIO_PCI_BAR0_REGION_INDEX };
    ssize_t n;
    void *p;
    int r;

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver_override", opt.testdev);
    r = write_text(path, "vfio-pci");
    if (!check(t, r == 0, "driver_override: %s", strerror(-r))) {
        return MAP_FAILED;
    }
    write_text("/sys/bus/pci/drivers_probe", opt.testdev);
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/iommu_group", opt.testdev);
    n = readlink(path, link, sizeof(link) - 1);
    if (!check(t, n > 0, "%s: %s", path, strerror(errno))) {
        return MAP_FAILED;
    }
    link[n] = '\0';
    group = strrchr(link, '/') + 1;
    snprintf(path, sizeof(path), "/dev/vfio/%s", group);
    fds[0] = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
    fds[1] = open(path, O_RDWR | O_CLOEXEC);
    if (!check(t, fds[0] >= 0 && fds[1] >= 0, "open /dev/vfio/vfio or %s: %s", path,
               strerror(errno)) ||
        !check(t,
               ioctl(fds[1], VFIO_GROUP_GET_STATUS, &gs) == 0 &&
                   (gs.flags & VFIO_GROUP_FLAGS_VIABLE),
               "group %s not viable", group) ||
        !check(t,
               ioctl(fds[1], VFIO_GROUP_SET_CONTAINER, &fds[0]) == 0 &&
                   ioctl(fds[0], VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) == 0,
               "container: %s", strerror(errno))) {
        return MAP_FAILED;
    }
    fds[2] = ioctl(fds[1], VFIO_GROUP_GET_DEVICE_FD, opt.testdev);
    if (!check(t, fds[2] >= 0, "VFIO_GROUP_GET_DEVICE_FD: %s", strerror(errno)) ||
        !check(t,
               ioctl(fds[2], VFIO_DEVICE_GET_REGION_INFO, &ri) == 0 &&
                   (ri.flags & VFIO_REGION_INFO_FLAG_MMAP) && ri.size >= (uint64_t)page,
               "BAR0 region: %s flags %x size %llu", strerror(errno), ri.flags,
               (unsigned long long)ri.size)) {
        return MAP_FAILED;
    }
    p = map(fds[2], page, ri.offset);
    check(t, p != MAP_FAILED, "mmap of BAR0 through VFIO: %s", strerror(errno));
    return p;
}

static void vfio_unbind(int fds[3])
{
    char path[256];

    for (int i = 2; i >= 0; i--) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
    write_text("/sys/bus/pci/drivers/vfio-pci/unbind", opt.testdev);
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver_override", opt.testdev);
    write_text(path, "\n");
}

static void case_refusals(void)
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

static void case_accounting(void)
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

static int mock_state(const char *file, char *buf, size_t size)
{
    char path[256];

    snprintf(path, sizeof(path), "%s/%s", debugfs_dir, file);
    return read_text(path, buf, size);
}

/* Inbound windows the mock has a translation for, from its `trans`. */
static int mock_translations(void)
{
    char buf[512], *line, *save = NULL;
    int n = 0;

    if (mock_state("trans", buf, sizeof(buf)) < 0) {
        return -1;
    }
    for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned long long addr, size;
        int idx;

        if (sscanf(line, "%d %llx %llx", &idx, &addr, &size) != 3) {
            return -1;
        }
        n += addr || size;
    }
    return n;
}

static unsigned long long mock_hex(const char *file)
{
    char buf[64];

    return mock_state(file, buf, sizeof(buf)) < 0 ? ~0ull : strtoull(buf, NULL, 16);
}

static void case_release(void)
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

/* --- kmod-map-races ---------------------------------------------------------------------- */

/*
 * Three threads race over one device: T1 maps, touches and unmaps window files (and keeps one
 * mapping it touches across iterations), T2 revokes the window and makes its next file, T3
 * sets, maps and clears an inbound buffer (and pins and unpins exported pages); every
 * removal_every iterations the main thread removes the mock (PCI unbind) under them, checks
 * what it had mapped, binds it again and reopens the device.
 *
 * The checker: a window file made after the g-th completed revoke is "of generation g";
 * once revokes_done > g (read before the access), a mapping of it that still reads is
 * stale, and so is one of an inbound buffer after its MW_CLEAR returned.  A fault or an
 * error is expected only after a revoke started (revokes_started > g) or while the device
 * is being removed; anything else is "unexpected".
 */
struct races {
    pthread_rwlock_t dev_lock; /* read: a worker's iteration; write: main swaps the device */
    int dev;                   /* under dev_lock (written by main with it held for writing) */
    uint64_t out_off;
    pthread_mutex_t wfd_lock;
    int wfd;      /* the current window file (T2 replaces it), under wfd_lock */
    long wfd_gen; /* revokes_done when it was made */
    atomic_long revokes_started, revokes_done;
    atomic_int removing, stop;
    atomic_long iters, removals, faults;
    atomic_long stale, unexpected, checks;
    pthread_mutex_t err_lock;
    char first[160]; /* the first stale access or unexpected error, under err_lock */
};

static void races_note(struct races *r, atomic_long *counter, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void races_note(struct races *r, atomic_long *counter, const char *fmt, ...)
{
    va_list ap;

    atomic_fetch_add(counter, 1);
    pthread_mutex_lock(&r->err_lock);
    if (!r->first[0]) {
        va_start(ap, fmt);
        vsnprintf(r->first, sizeof(r->first), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&r->err_lock);
}

/* An error @what (-errno or a signal) the worker met: fine while removing, else unexpected. */
static void races_error(struct races *r, const char *what, int err)
{
    if (!atomic_load(&r->removing)) {
        races_note(r, &r->unexpected, "%s: %d", what, err);
    }
}

static int races_wfd(struct races *r, long *gen)
{
    int fd;

    pthread_mutex_lock(&r->wfd_lock);
    fd = r->wfd >= 0 ? fcntl(r->wfd, F_DUPFD_CLOEXEC, 0) : -1;
    *gen = r->wfd_gen;
    pthread_mutex_unlock(&r->wfd_lock);
    return fd;
}

/* After a fault on a mapping of generation @gen: was a revoke under way, or a removal? */
static void races_fault(struct races *r, const char *what, int sig, long gen)
{
    atomic_fetch_add(&r->faults, 1);
    if (sig != SIGBUS) {
        races_note(r, &r->unexpected, "%s: signal %d", what, sig);
    } else if (atomic_load(&r->revokes_started) <= gen) {
        races_error(r, what, -EFAULT);
    }
}

struct t1_keep {
    volatile uint32_t *p;
    long gen;
    long epoch; /* removals when it was made */
};

static void t1_once(struct races *r, struct t1_keep *keep)
{
    long gen, done;
    volatile uint32_t *p;
    uint32_t seen;
    int fd = races_wfd(r, &gen), sig;

    if (fd < 0) {
        return;
    }
    done = atomic_load(&r->revokes_done);
    p = map(fd, page, 0);
    if (p == MAP_FAILED) {
        if (!(errno == ENODEV && atomic_load(&r->revokes_started) > gen)) {
            races_error(r, "t1 mmap", -errno);
        }
        close(fd);
        return;
    }
    if (done > gen) {
        races_note(r, &r->stale, "t1: a file revoked before mmap mapped");
    }
    done = atomic_load(&r->revokes_done);
    sig = touch(p, &seen, 0x71717171);
    atomic_fetch_add(&r->checks, 1);
    if (!sig && done > gen) {
        races_note(r, &r->stale, "t1: a mapping read after its file's revoke");
    } else if (sig) {
        races_fault(r, "t1 touch", sig, gen);
    }
    /* The long-lived mapping: made from an earlier file (of a device since removed,
     * maybe), touched now. */
    if (keep->p) {
        bool removed = atomic_load(&r->removals) != keep->epoch;

        done = atomic_load(&r->revokes_done);
        sig = peek(keep->p, &seen);
        atomic_fetch_add(&r->checks, 1);
        if (!sig && removed) {
            races_note(r, &r->stale, "t1: a kept mapping read after its device was removed");
        } else if (!sig && done > keep->gen) {
            races_note(r, &r->stale, "t1: a kept mapping read after its revoke");
        } else if (sig && removed) {
            atomic_fetch_add(&r->faults, 1);
        } else if (sig) {
            races_fault(r, "t1 kept", sig, keep->gen);
        }
        if (sig) {
            munmap((void *)keep->p, page);
            keep->p = NULL;
        }
    }
    if (!keep->p) {
        keep->p = p;
        keep->gen = gen;
        keep->epoch = atomic_load(&r->removals);
    } else {
        munmap((void *)p, page);
    }
    close(fd);
}

static void t2_once(struct races *r)
{
    volatile uint32_t *wm, *dm;
    long gen, started;
    uint32_t seen;
    int fd = races_wfd(r, &gen), nf, err, sig;
    void *x;

    if (fd < 0) {
        return;
    }
    /* Mappings made before the revoke: through the file, through the device. */
    wm = map(fd, page, 0);
    dm = map(r->dev, page, r->out_off);
    if (wm == MAP_FAILED || dm == MAP_FAILED) {
        races_error(r, "t2 mmap", -errno);
        goto out;
    }
    if ((sig = peek(wm, &seen)) || (sig = peek(dm, &seen))) {
        races_fault(r, "t2 before", sig, gen);
    }
    started = atomic_fetch_add(&r->revokes_started, 1);
    err = u32_ioctl(r->dev, VN_NTB_MW_REVOKE, 0);
    if (err) {
        atomic_store(&r->revokes_started, started);
        races_error(r, "t2 revoke", err);
        goto out;
    }
    atomic_fetch_add(&r->revokes_done, 1);
    atomic_fetch_add(&r->checks, 3);
    if (!peek(wm, &seen)) {
        races_note(r, &r->stale, "t2: the file's mapping read after the revoke");
    }
    if (!peek(dm, &seen)) {
        races_note(r, &r->stale, "t2: the device's mapping read after the revoke");
    }
    x = map(fd, page, 0);
    if (x != MAP_FAILED) {
        races_note(r, &r->stale, "t2: a revoked file mapped again");
        munmap(x, page);
    } else if (errno != ENODEV) {
        races_error(r, "t2 dead file mmap", -errno);
    }
    nf = window_fd(r->dev, 0, 0);
    if (nf < 0) {
        races_error(r, "t2 MW_FD", nf);
        goto out;
    }
    pthread_mutex_lock(&r->wfd_lock);
    close(r->wfd);
    r->wfd = nf;
    r->wfd_gen = atomic_load(&r->revokes_done);
    pthread_mutex_unlock(&r->wfd_lock);
out:
    if (wm != MAP_FAILED) {
        munmap((void *)wm, page);
    }
    if (dm != MAP_FAILED) {
        munmap((void *)dm, page);
    }
    close(fd);
}

static void t3_once(struct races *r, void *pages, long n)
{
    struct vn_ntb_mw_info mi;
    volatile uint32_t *p;
    uint32_t seen;
    int err, sig;

    if (n % 4 == 3) {
        /* Pages pinned and unpinned. */
        err = mw_export(r->dev, 0, pages, 64 * KIB);
        if (err) {
            races_error(r, "t3 export", err);
            return;
        }
        err = u32_ioctl(r->dev, VN_NTB_MW_CLEAR, 0);
        if (err) {
            races_error(r, "t3 clear export", err);
        }
        return;
    }
    err = mw_alloc(r->dev, 0, 64 * KIB);
    if (err) {
        races_error(r, "t3 alloc", err);
        return;
    }
    err = mw_info(r->dev, 0, &mi);
    p = err ? MAP_FAILED : map(r->dev, 64 * KIB, mi.in_mmap_offset);
    if (p == MAP_FAILED) {
        races_error(r, "t3 mmap", err ? err : -errno);
    } else if ((sig = touch(p, &seen, 0x73737373))) {
        atomic_fetch_add(&r->faults, 1);
        races_error(r, "t3 touch", sig);
    }
    err = u32_ioctl(r->dev, VN_NTB_MW_CLEAR, 0);
    if (err) {
        races_error(r, "t3 clear", err);
    } else if (p != MAP_FAILED) {
        atomic_fetch_add(&r->checks, 1);
        if (!peek(p, &seen)) {
            races_note(r, &r->stale, "t3: an inbound buffer read after its MW_CLEAR");
        } else {
            atomic_fetch_add(&r->faults, 1);
        }
    }
    if (p != MAP_FAILED) {
        munmap((void *)p, 64 * KIB);
    }
}

struct worker {
    struct races *r;
    int which;
    pthread_t thread;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct races *r = w->r;
    struct t1_keep keep = { NULL, 0, 0 };
    void *pages = anon(64 * KIB);
    long n = 0;

    while (!atomic_load(&r->stop)) {
        pthread_rwlock_rdlock(&r->dev_lock);
        if (w->which == 1) {
            t1_once(r, &keep);
        } else if (w->which == 2) {
            t2_once(r);
        } else {
            t3_once(r, pages, n);
        }
        pthread_rwlock_unlock(&r->dev_lock);
        atomic_fetch_add(&r->iters, 1);
        n++;
        if (atomic_load(&r->removing)) {
            sleep_ms(1);
        }
    }
    if (keep.p) {
        munmap((void *)keep.p, page);
    }
    munmap(pages, 64 * KIB);
    return NULL;
}

static void *unbind_main(void *arg)
{
    intptr_t r = write_text("/sys/bus/pci/drivers/ntb_mock/unbind", opt.bdf);

    return (void *)r;
}

/* The device again after a bind: open it (10 s), link up, a window file. 0 or -errno. */
static int races_attach(struct races *r)
{
    struct vn_ntb_mw_info mi;
    double end = now_s() + 10;
    int dev, err;

    do {
        dev = dev_open();
        if (dev >= 0) {
            break;
        }
        sleep_ms(10);
    } while (now_s() < end);
    if (dev < 0) {
        return dev;
    }
    err = link_set(dev, true);
    if (!err) {
        err = mw_info(dev, 0, &mi);
    }
    if (!err) {
        err = window_fd(dev, 0, 0);
    }
    if (err < 0) {
        close(dev);
        return err;
    }
    r->dev = dev;
    r->out_off = mi.out_mmap_offset;
    r->wfd = err;
    r->wfd_gen = atomic_load(&r->revokes_done);
    return 0;
}

/*
 * The mock removed under the workers: what main had mapped (the window through the device
 * and a file, an inbound buffer) faults and every call answers ENODEV; then the device comes
 * back.  false when the removal hung or the device did not come back (the case cannot go on).
 */
static bool races_remove(struct races *r, struct tcase *t)
{
    volatile uint32_t *dm, *wm = MAP_FAILED, *im = MAP_FAILED;
    struct vn_ntb_mw_info mi;
    struct vn_ntb_info in;
    struct timespec ts;
    pthread_t th;
    uint32_t seen;
    void *ret;
    long gen;
    int fd, err;

    pthread_rwlock_rdlock(&r->dev_lock);
    dm = map(r->dev, page, r->out_off);
    fd = races_wfd(r, &gen);
    if (fd >= 0) {
        wm = map(fd, page, 0);
        close(fd);
    }
    if (!mw_alloc(r->dev, 1, 64 * KIB) && !mw_info(r->dev, 1, &mi)) {
        im = map(r->dev, 64 * KIB, mi.in_mmap_offset);
    }
    pthread_rwlock_unlock(&r->dev_lock);

    atomic_store(&r->removing, 1);
    pthread_create(&th, NULL, unbind_main, NULL);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    if (pthread_timedjoin_np(th, &ret, &ts)) {
        check(t, false, "unbind of the mock hung (60 s)");
        return false;
    }
    if (!check(t, ret == NULL, "unbind: %s", strerror(-(int)(intptr_t)ret))) {
        return false;
    }
    atomic_fetch_add(&r->removals, 1);
    /* Gone: every mapping faults, every call is ENODEV. */
    atomic_fetch_add(&r->checks, 3);
    if (dm != MAP_FAILED && !peek(dm, &seen)) {
        races_note(r, &r->stale, "removal: the device's mapping still reads");
    }
    if (wm != MAP_FAILED && !peek(wm, &seen)) {
        races_note(r, &r->stale, "removal: a window file's mapping still reads");
    }
    if (im != MAP_FAILED && !peek(im, &seen)) {
        races_note(r, &r->stale, "removal: an inbound buffer's mapping still reads");
    }

    pthread_rwlock_wrlock(&r->dev_lock);
    err = info(r->dev, &in);
    if (err != -ENODEV) {
        races_note(r, &r->unexpected, "removal: INFO answered %d, not ENODEV", err);
    }
    if (dm != MAP_FAILED) {
        munmap((void *)dm, page);
    }
    if (wm != MAP_FAILED) {
        munmap((void *)wm, page);
    }
    if (im != MAP_FAILED) {
        munmap((void *)im, 64 * KIB);
    }
    close(r->dev);
    close(r->wfd);
    r->dev = r->wfd = -1;
    err = write_text("/sys/bus/pci/drivers/ntb_mock/bind", opt.bdf);
    if (check(t, err == 0, "bind of the mock: %s", strerror(-err))) {
        err = races_attach(r);
        check(t, err == 0, "the device after the bind: %s", strerror(-err));
    }
    atomic_store(&r->removing, 0);
    pthread_rwlock_unlock(&r->dev_lock);
    return err == 0;
}

/* Kernel log lines since the suite started that tell of a kernel bug; the first in @first. */
static int kmsg_bad(char *first, size_t size)
{
    static const char *const bad[] = { "BUG", "WARNING", "Oops", "general protection", "cut here" };
    char rec[2048];
    int n = 0;

    if (kmsg_fd < 0) {
        snprintf(first, size, "no-kmsg");
        return 1;
    }
    for (;;) {
        ssize_t len = read(kmsg_fd, rec, sizeof(rec) - 1);
        const char *msg;

        if (len < 0 && errno == EPIPE) {
            continue; /* records overwritten: read on */
        }
        if (len <= 0) {
            break;
        }
        rec[len] = '\0';
        msg = strchr(rec, ';');
        msg = msg ? msg + 1 : rec;
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            if (strstr(msg, bad[i])) {
                if (!n++) {
                    snprintf(first, size, "%.60s", msg);
                    for (char *c = first; *c; c++) {
                        if (*c == ' ' || *c == '\n') {
                            *c = '_';
                        }
                    }
                }
                break;
            }
        }
    }
    return n;
}

static void case_map_races(void)
{
    struct tcase t = { .name = "kmod-map-races", .ok = true };
    struct races r = { .dev = -1, .wfd = -1 };
    struct worker w[3];
    pthread_rwlockattr_t attr;
    long next_removal = opt.removal_every;
    double t0 = now_s(), last_progress = t0, elapsed;
    char first_bad[80] = "";
    int err, bad;
    bool alive = true;

    pthread_rwlockattr_init(&attr);
    /* The main thread must get its turn between the workers' iterations. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r.dev_lock, &attr);
    pthread_mutex_init(&r.wfd_lock, NULL);
    pthread_mutex_init(&r.err_lock, NULL);
    err = races_attach(&r);
    if (!check(&t, err == 0, "the device: %s", strerror(-err))) {
        finish(&t);
        return;
    }
    for (int i = 0; i < 3; i++) {
        w[i] = (struct worker){ .r = &r, .which = i + 1 };
        pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
    }
    while (atomic_load(&r.iters) < opt.iterations && now_s() - t0 < opt.max_seconds) {
        sleep_ms(20);
        if (now_s() - last_progress >= 10) {
            last_progress = now_s();
            printf("kmod-map-races: %.0f s: iterations=%ld revokes=%ld removals=%ld checks=%ld "
                   "faults=%ld stale=%ld unexpected=%ld\n",
                   last_progress - t0, atomic_load(&r.iters), atomic_load(&r.revokes_done),
                   atomic_load(&r.removals), atomic_load(&r.checks), atomic_load(&r.faults),
                   atomic_load(&r.stale), atomic_load(&r.unexpected));
            fflush(stdout);
        }
        if (opt.removal_every > 0 && atomic_load(&r.iters) >= next_removal) {
            next_removal += opt.removal_every;
            alive = races_remove(&r, &t);
            if (!alive) {
                break;
            }
        }
    }
    if (!alive) {
        /* A worker may be stuck in the module: report and leave without them. */
        kv(&t, "iterations=%ld removals=%ld", atomic_load(&r.iters), atomic_load(&r.removals));
        finish(&t);
        printf("kmod-selftest: %d passed, %d failed\n", n_passed, n_failed);
        fflush(stdout);
        _exit(1);
    }
    atomic_store(&r.stop, 1);
    for (int i = 0; i < 3; i++) {
        pthread_join(w[i].thread, NULL);
    }
    elapsed = now_s() - t0;
    close(r.wfd);
    close(r.dev);

    kv(&t,
       "iterations=%ld elapsed_s=%.1f revokes=%ld removals=%ld checks=%ld faults=%ld "
       "stale=%ld unexpected=%ld",
       atomic_load(&r.iters), elapsed, atomic_load(&r.revokes_done), atomic_load(&r.removals),
       atomic_load(&r.checks), atomic_load(&r.faults), atomic_load(&r.stale),
       atomic_load(&r.unexpected));
    check(&t, atomic_load(&r.stale) == 0 && atomic_load(&r.unexpected) == 0, "%s", r.first);
    check(&t, atomic_load(&r.iters) >= opt.iterations, "only %ld iterations in %d s",
          atomic_load(&r.iters), opt.max_seconds);
    check(&t, atomic_load(&r.revokes_done) > 0 && atomic_load(&r.faults) > 0,
          "no revoke or no fault seen: nothing was checked");
    check(&t, opt.removal_every <= 0 || atomic_load(&r.removals) > 0, "no removal done");

    err = syscall(SYS_delete_module, "vfio_ntb", O_NONBLOCK) ? -errno : 0;
    kv(&t, "rmmod=%s", err ? strerror(-err) : "ok");
    check(&t, err == 0, "rmmod vfio_ntb: %s", strerror(-err));
    sleep_ms(200);
    bad = kmsg_bad(first_bad, sizeof(first_bad));
    kv(&t, "kernel_log_bad=%d%s%s", bad, bad ? " first=" : "", first_bad);
    check(&t, bad == 0, "the kernel log has %d bad lines", bad);
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
    if (selected("kmod-accounting")) {
        case_accounting();
    }
    if (selected("kmod-release")) {
        case_release();
    }
    if (selected("kmod-map-races")) {
        case_map_races();
    }
    printf("kmod-selftest: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
