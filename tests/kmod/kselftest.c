/*
 * kselftest.c: kmod-selftest's harness (kselftest.h): the results, the helpers and the ioctl
 * wrappers its cases share.
 *
 * Faults are part of the contract (a revoked mapping is SIGBUS): children die of them where a
 * process is the thing observed; threads catch them (sigsetjmp in a SIGBUS handler, touch()
 * and peek()) where many accesses are.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/vfio.h>

#include "kselftest.h"

struct kselftest_opts opt = { .iterations = 50000, .max_seconds = 420, .removal_every = 500 };

char dev_path[128];
char debugfs_dir[160];
long page;
int n_passed, n_failed;
int kmsg_fd = -1;

/* --- results --------------------------------------------------------------------------- */

void kv(struct tcase *t, const char *fmt, ...)
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
bool check(struct tcase *t, bool cond, const char *fmt, ...)
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

void finish(struct tcase *t)
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

double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

    nanosleep(&ts, NULL);
}

/* An ioctl's result: what it returned, or -errno. */
int vn_ioctl(int fd, unsigned long req, void *arg)
{
    int r = ioctl(fd, req, arg);

    return r < 0 ? -errno : r;
}

int write_text(const char *path, const char *text)
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

int read_text(const char *path, char *buf, size_t size)
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
long vmlck_kb(pid_t pid)
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

void *map(int fd, size_t size, uint64_t offset)
{
    return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
}

void *anon(size_t size)
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

void catch_faults(void)
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
int touch(volatile uint32_t *p, uint32_t *seen, uint32_t val)
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

int peek(volatile uint32_t *p, uint32_t *seen)
{
    return touch(p, seen, 0);
}

/* Waits for @pid up to @secs; its wait status, or -1 (then it was killed). */
int reap(pid_t pid, double secs)
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

const char *how_died(int st, char *buf, size_t size)
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

int dev_open(void)
{
    int fd = open(dev_path, O_RDWR | O_CLOEXEC);

    return fd < 0 ? -errno : fd;
}

int info(int dev, struct vn_ntb_info *in)
{
    memset(in, 0, sizeof(*in));
    in->argsz = sizeof(*in);
    return vn_ioctl(dev, VN_NTB_INFO, in);
}

int mw_info(int dev, unsigned idx, struct vn_ntb_mw_info *mi)
{
    memset(mi, 0, sizeof(*mi));
    mi->argsz = sizeof(*mi);
    mi->index = idx;
    return vn_ioctl(dev, VN_NTB_MW_INFO, mi);
}

int u32_ioctl(int dev, unsigned long req, __u32 v)
{
    return vn_ioctl(dev, req, &v);
}

int window_fd(int dev, unsigned idx, unsigned flags)
{
    struct vn_ntb_mw_fd a = { .argsz = sizeof(a), .index = idx, .flags = flags };

    return vn_ioctl(dev, VN_NTB_MW_FD, &a);
}

int mw_export(int dev, unsigned idx, const void *vaddr, size_t size)
{
    struct vn_ntb_mw_export e = { .index = idx, .vaddr = (uintptr_t)vaddr, .size = size };

    return vn_ioctl(dev, VN_NTB_MW_EXPORT, &e);
}

int mw_alloc(int dev, unsigned idx, size_t size)
{
    struct vn_ntb_mw_alloc a = { .index = idx, .size = size };

    return vn_ioctl(dev, VN_NTB_MW_ALLOC, &a);
}

/* Link @on, and waits (5 s) until VN_NTB_INFO says so: 0 or -errno (-ETIMEDOUT). */
int link_set(int dev, bool on)
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
int open_linked(struct tcase *t)
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

/* --- the kernel log ----------------------------------------------------------------- */

/* Kernel log lines since the suite started that tell of a kernel bug; the first in @first. */
int kmsg_bad(char *first, size_t size)
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

/* --- the mock's state and a BAR through VFIO ------------------------------------------- */

int mock_state(const char *file, char *buf, size_t size)
{
    char path[256];

    snprintf(path, sizeof(path), "%s/%s", debugfs_dir, file);
    return read_text(path, buf, size);
}

/* Inbound windows the mock has a translation for, from its `trans`. */
bool ev_readable(int fd, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    uint64_t n;

    if (poll(&p, 1, ms) != 1) {
        return false;
    }
    return read(fd, &n, sizeof(n)) == sizeof(n);
}

bool ev_signal(int fd)
{
    uint64_t one = 1;

    return write(fd, &one, sizeof(one)) == sizeof(one);
}

int peer_trigger(int dev, int fd, uint64_t bits)
{
    struct vn_ntb_db_eventfd d = { .fd = fd, .bits = bits };

    return vn_ioctl(dev, VN_NTB_PEER_DB_EVENTFD, &d);
}

int mock_translations(void)
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

/* A BAR's first page mapped through VFIO: the pci-testdev bound to vfio-pci, a container
 * with type1v2.  Fds in @fds (container, group, device), unbound again by vfio_unbind(). */
void *vfio_bar0(struct tcase *t, int fds[3])
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

void vfio_unbind(int fds[3])
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
