/*
 * File descriptors over UNIX stream sockets (see fdpass.h).
 */
#include "fdpass.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef union ControlBuf {
    char buf[CMSG_SPACE(sizeof(int) * VN_FDPASS_MAX)];
    struct cmsghdr align;
} ControlBuf;

static void take_fds(struct msghdr *mh, int *fds, unsigned cap, unsigned *nfds, bool *overflow)
{
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm)) {
        size_t n;

        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
            if (*nfds < cap) {
                fds[(*nfds)++] = fd;
            } else {
                close(fd);
                *overflow = true;
            }
        }
    }
    if (mh->msg_flags & MSG_CTRUNC) {
        *overflow = true; /* the kernel closed what did not fit */
    }
}

ssize_t vn_fdpass_recv(int sock, void *dst, size_t len, int *fds, unsigned cap, unsigned *nfds,
                       bool *overflow)
{
    ControlBuf cbuf;
    struct iovec iov = { .iov_base = dst, .iov_len = len };
    struct msghdr mh = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = cbuf.buf,
        .msg_controllen = sizeof(cbuf.buf),
    };
    ssize_t n;

    do {
        n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    }
    if (n == 0) {
        return -ECONNRESET;
    }
    take_fds(&mh, fds, cap, nfds, overflow);
    return n;
}

ssize_t vn_fdpass_send(int sock, const struct iovec *iov, int iovcnt, const int *fds, unsigned nfds)
{
    return vn_fdpass_send_flags(sock, iov, iovcnt, fds, nfds, 0);
}

ssize_t vn_fdpass_send_flags(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                             unsigned nfds, int flags)
{
    ControlBuf cbuf;
    struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
    ssize_t n;

    if (nfds > VN_FDPASS_MAX) {
        return -EINVAL;
    }
    if (nfds > 0) {
        struct cmsghdr *cm;

        memset(cbuf.buf, 0, sizeof(cbuf.buf));
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    do {
        n = sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}
