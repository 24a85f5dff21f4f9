/*
 * Checks of fds received from peers (see peerfd.h).
 */
#include "peerfd.h"

#include "util.h"
#include "kmod/vfio_ntb_uapi.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <linux/vfio.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* What readlink(2) of /proc/self/fd/N says for an eventfd (fs/eventfd.c
 * names its anonymous inode "[eventfd]"). */
#define EVENTFD_LINK "anon_inode:[eventfd]"
/* And for a VFIO device fd from VFIO_GROUP_GET_DEVICE_FD (drivers/vfio). */
#define VFIO_DEVICE_LINK "anon_inode:[vfio-device]"
/* Regions looked through for the one a range lies in (vfio-pci has 9 and
 * a few device-specific ones). */
#define MAX_DEVICE_REGIONS 64u

/* 0 when /proc/self/fd says @fd is the anonymous inode @want; -EINVAL when
 * it is another file, -EBADF for no fd. */
static int fd_is(int fd, const char *want)
{
    char path[64];
    char link[64];
    ssize_t n;

    if (fd < 0) {
        return -EBADF;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link));
    if (n < 0) {
        return errno == ENOENT ? -EBADF : -errno;
    }
    return (size_t)n == strlen(want) && memcmp(link, want, (size_t)n) == 0 ? 0 : -EINVAL;
}

int vn_peerfd_eventfd(int fd)
{
    int flags, ret = fd_is(fd, EVENTFD_LINK);

    if (ret < 0) {
        return ret;
    }
    flags = fcntl(fd, F_GETFL);
    if (flags < 0) {
        return -errno;
    }
    if (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        return -errno;
    }
    return 0;
}

int vn_peerfd_signal(int fd)
{
    uint64_t one = 1;
    ssize_t n;

    do {
        n = write(fd, &one, sizeof(one));
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return -errno;
    }
    return n == sizeof(one) ? 0 : -EIO;
}

uint64_t vn_peerfd_drain(int fd)
{
    uint64_t n = 0;

    return fd >= 0 && read(fd, &n, sizeof(n)) == sizeof(n) ? n : 0;
}

int vn_peerfd_memory(int fd, uint64_t offset, uint64_t size, const char **why)
{
    const char *dummy;
    struct stat st;
    int seals;

    if (why == NULL) {
        why = &dummy;
    }
    *why = NULL;
    if (fstat(fd, &st) < 0) {
        int e = errno;

        *why = "cannot be inspected";
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = "is not a memfd (not even a regular file)";
        return -EINVAL;
    }
    /* EINVAL for a file that is no memfd; a tmpfs file that is none
     * reports F_SEAL_SEAL alone. */
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        *why = "is not a memfd";
        return -EINVAL;
    }
    if (!(seals & F_SEAL_SHRINK)) {
        *why = "is not a memfd sealed against shrinking (F_SEAL_SHRINK)";
        return -EINVAL;
    }
    /* Sealed: the size read now is the least it will ever be. */
    if (st.st_size < 0 || !vn_util_range_ok(offset, size, (uint64_t)st.st_size)) {
        *why = "is smaller than the range mapped from it";
        return -EINVAL;
    }
    return 0;
}

int vn_peerfd_device_memory(int fd, uint64_t offset, uint64_t size, const char **why)
{
    struct vfio_device_info info = { .argsz = sizeof(info) };
    const char *dummy;
    int ret;

    if (why == NULL) {
        why = &dummy;
    }
    *why = NULL;
    ret = fd_is(fd, VFIO_DEVICE_LINK);
    if (ret < 0) {
        *why = ret == -EINVAL ? "is not a VFIO device" : "cannot be inspected";
        return ret;
    }
    if (ioctl(fd, VFIO_DEVICE_GET_INFO, &info) < 0) {
        int e = errno;

        *why = "does not describe its device";
        return -e;
    }
    for (uint32_t i = 0; i < MIN(info.num_regions, MAX_DEVICE_REGIONS); i++) {
        /* argsz of the struct alone: no capabilities are read. */
        struct vfio_region_info ri = { .argsz = sizeof(ri), .index = i };

        if (ioctl(fd, VFIO_DEVICE_GET_REGION_INFO, &ri) < 0 || ri.size == 0 || offset < ri.offset ||
            !vn_util_range_ok(offset - ri.offset, size, ri.size)) {
            continue;
        }
        if (!(ri.flags & VFIO_REGION_INFO_FLAG_MMAP)) {
            *why = "has that range in a region VFIO does not let be mapped";
            return -EINVAL;
        }
        return 0;
    }
    *why = "has no region that holds the range";
    return -EINVAL;
}

/* An NTB window of our module's (a VN_NTB_MW_FD file, the only fd of it that is handed out):
 * the module checks each mmap against the window, and its mapping is device memory (all ones
 * once the peer is gone, SIGBUS once the adapter is or the window was zapped). */
static bool ntb_window(int fd)
{
    struct statfs fs;

    return fstatfs(fd, &fs) == 0 && fs.f_type == VN_NTB_WINDOW_FS_MAGIC;
}

int vn_peerfd_window(int fd, uint64_t offset, uint64_t size, bool *device, const char **why)
{
    *device = false;
    if (fd_is(fd, VFIO_DEVICE_LINK) == 0) {
        *device = true;
        return vn_peerfd_device_memory(fd, offset, size, why);
    }
    if (fd >= 0 && ntb_window(fd)) {
        *device = true;
        return 0;
    }
    return vn_peerfd_memory(fd, offset, size, why);
}

int vn_peerfd_memfd_new(const char *name, uint64_t size)
{
    int fd, e;

    if (size > (uint64_t)INT64_MAX) {
        return -EINVAL;
    }
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return -errno;
    }
    if (ftruncate(fd, (off_t)size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int vn_peerfd_same_file(int a, int b)
{
    pid_t self = getpid();
    long r = syscall(SYS_kcmp, self, self, KCMP_FILE, a, b);

    return r < 0 ? -errno : r == 0;
}
