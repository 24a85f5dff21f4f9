/*
 * Checks of fds received from peers (see peerfd.h).
 */
#include "peerfd.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* What readlink(2) of /proc/self/fd/N says for an eventfd (fs/eventfd.c
 * names its anonymous inode "[eventfd]"). */
#define EVENTFD_LINK "anon_inode:[eventfd]"

int vn_peerfd_eventfd(int fd)
{
    char path[64];
    char link[sizeof(EVENTFD_LINK) + 1];
    ssize_t n;
    int flags;

    if (fd < 0) {
        return -EBADF;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link));
    if (n < 0) {
        return errno == ENOENT ? -EBADF : -errno;
    }
    if ((size_t)n != strlen(EVENTFD_LINK) || memcmp(link, EVENTFD_LINK, (size_t)n) != 0) {
        return -EINVAL;
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
