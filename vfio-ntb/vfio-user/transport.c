/*
 * vfio-user socket transport (see transport.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "transport.h"

#include "common/fdpass.h"
#include "common/util.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

struct VnTransport {
    int fd;
    VnWireHdr hdr; /* the header being received */
    size_t hdr_got;
    uint8_t *buf; /* the message being received, hdr.size bytes */
    size_t got;
    int fds[VN_MAX_MSG_FDS];
    unsigned nfds;
    bool fds_overflow;
};

void vn_transport_msg_clear(VnTransportMsg *msg)
{
    vn_util_close_fds(msg->fds, msg->nfds);
    msg->nfds = 0;
    g_clear_pointer(&msg->data, g_free);
    msg->len = 0;
    msg->fds_overflow = false;
}

VnTransport *vn_transport_new(int fd)
{
    VnTransport *t = g_new0(VnTransport, 1);
    struct timeval tv = { .tv_sec = VN_TRANSPORT_SEND_TIMEOUT_S };

    t->fd = fd;
    /* Failure only loses the bound on a stuck peer; sending still works. */
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
        g_warning("transport fd %d: cannot set a send timeout: %s", fd, g_strerror(errno));
    }
    return t;
}

/*
 * Closing a socket with unread data in it sends a reset, not an end of file,
 * and QEMU's vfio-user client (10.2 to 11.1) aborts the whole VM on a reset
 * (qemu-patches/0005).  So: FIN first, then read until the peer's end of
 * file or the linger time, so nothing is left unread when we close.  Fds in
 * what we drop are closed by the kernel (no control buffer).
 */
static void linger(int fd)
{
    gint64 deadline = g_get_monotonic_time() + VN_TRANSPORT_LINGER_MS * 1000;
    char buf[4096];

    if (shutdown(fd, SHUT_WR) < 0) {
        return; /* not connected any more */
    }
    for (;;) {
        gint64 left = (deadline - g_get_monotonic_time()) / 1000;
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) {
            return;
        }
        n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            return; /* end of file (or the peer is gone) */
        }
    }
}

void vn_transport_free(VnTransport *t)
{
    if (t == NULL) {
        return;
    }
    if (t->fd >= 0) {
        linger(t->fd);
    }
    vn_util_close_fds(t->fds, t->nfds);
    g_free(t->buf);
    vn_util_close_fd(&t->fd);
    g_free(t);
}

int vn_transport_fd(VnTransport *t)
{
    return t->fd;
}

/* One non-blocking read into @dst; bytes, 0 for none yet, or -errno. */
static ssize_t recv_some(VnTransport *t, void *dst, size_t len)
{
    return vn_fdpass_recv(t->fd, dst, len, t->fds, VN_MAX_MSG_FDS, &t->nfds, &t->fds_overflow);
}

int vn_transport_recv(VnTransport *t, VnTransportMsg *msg)
{
    ssize_t n;
    int ret;

    while (t->hdr_got < VN_WIRE_HDR_SIZE) {
        n = recv_some(t, (uint8_t *)&t->hdr + t->hdr_got, VN_WIRE_HDR_SIZE - t->hdr_got);
        if (n <= 0) {
            return (int)n;
        }
        t->hdr_got += (size_t)n;
    }
    if (t->buf == NULL) {
        ret = vn_wire_check_hdr(&t->hdr);
        if (ret < 0) {
            return ret;
        }
        t->buf = g_malloc(t->hdr.size);
        memcpy(t->buf, &t->hdr, VN_WIRE_HDR_SIZE);
        t->got = VN_WIRE_HDR_SIZE;
    }
    while (t->got < t->hdr.size) {
        n = recv_some(t, t->buf + t->got, t->hdr.size - t->got);
        if (n <= 0) {
            return (int)n;
        }
        t->got += (size_t)n;
    }

    msg->data = g_steal_pointer(&t->buf);
    msg->len = t->hdr.size;
    memcpy(msg->fds, t->fds, sizeof(int) * t->nfds);
    msg->nfds = t->nfds;
    msg->fds_overflow = t->fds_overflow;
    t->nfds = 0;
    t->fds_overflow = false;
    t->hdr_got = 0;
    t->got = 0;
    return 1;
}

int vn_transport_send(VnTransport *t, const void *data, size_t len, const int *fds, unsigned nfds)
{
    const uint8_t *p = data;
    bool first = true;

    if (nfds > VN_MAX_MSG_FDS) {
        return -EINVAL;
    }
    while (len > 0) {
        struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
        /* the fds ride on the first piece only */
        ssize_t n = vn_fdpass_send(t->fd, &iov, 1, fds, first ? nfds : 0);

        if (n < 0) {
            return (int)n;
        }
        first = false;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}
