/*
 * Length-prefixed records with an fd (see record.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "record.h"

#include "common/fdpass.h"
#include "common/util.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* One non-blocking read; bytes, 0 when none yet, or -errno.  One fd beyond
 * the limit is kept: that is enough for the caller to refuse the record. */
static ssize_t recv_some(VnRecordReader *r, int fd, void *dst, size_t len)
{
    return vn_fdpass_recv(fd, dst, len, r->fds, G_N_ELEMENTS(r->fds), &r->nfds, &r->fds_overflow);
}

int vn_record_step(VnRecordReader *r, int fd, uint32_t max_len, VnRecord *out)
{
    uint32_t len;
    ssize_t n;

    while (r->len_got < sizeof(r->len_buf)) {
        n = recv_some(r, fd, r->len_buf + r->len_got, sizeof(r->len_buf) - r->len_got);
        if (n <= 0) {
            return (int)n;
        }
        r->len_got += (size_t)n;
    }
    if (r->buf == NULL) {
        memcpy(&len, r->len_buf, sizeof(len));
        r->need = GUINT32_FROM_LE(len);
        if (r->need > max_len) {
            return -EMSGSIZE;
        }
        r->buf = g_malloc(MAX(r->need, 1));
        r->got = 0;
    }
    while (r->got < r->need) {
        n = recv_some(r, fd, r->buf + r->got, r->need - r->got);
        if (n <= 0) {
            return (int)n;
        }
        r->got += (size_t)n;
    }

    /* A whole record: hand it over and start the next. */
    out->buf = g_steal_pointer(&r->buf);
    out->len = r->need;
    out->nfds = r->nfds;
    memcpy(out->fds, r->fds, sizeof(int) * r->nfds);
    out->overflow = r->fds_overflow;
    r->nfds = 0;
    r->fds_overflow = false;
    r->len_got = 0;
    r->need = 0;
    r->got = 0;
    return 1;
}

void vn_record_reader_clear(VnRecordReader *r)
{
    vn_util_close_fds(r->fds, r->nfds);
    r->nfds = 0;
    g_clear_pointer(&r->buf, g_free);
}

int vn_record_send(int fd, const void *buf, size_t len, size_t max_len, const int *fds,
                   unsigned nfds)
{
    uint32_t prefix = GUINT32_TO_LE((uint32_t)len);
    size_t total = sizeof(prefix) + len;
    size_t sent = 0;

    if (len > max_len || len > UINT32_MAX) {
        return -EMSGSIZE;
    }
    if (nfds > 1) {
        return -EINVAL;
    }
    while (sent < total) {
        struct iovec iov[2];
        int iovcnt;
        ssize_t n;

        if (sent < sizeof(prefix)) {
            iov[0] = (struct iovec){ (uint8_t *)&prefix + sent, sizeof(prefix) - sent };
            iov[1] = (struct iovec){ (void *)buf, len };
            iovcnt = len > 0 ? 2 : 1;
        } else {
            iov[0] = (struct iovec){ (uint8_t *)buf + (sent - sizeof(prefix)), total - sent };
            iovcnt = 1;
        }
        n = vn_fdpass_send(fd, iov, iovcnt, fds, sent == 0 ? nfds : 0);
        if (n < 0) {
            return (int)n;
        }
        sent += (size_t)n;
    }
    return 0;
}

int vn_record_send_fresh(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    uint32_t prefix = GUINT32_TO_LE((uint32_t)len);
    struct iovec iov[2] = { { &prefix, sizeof(prefix) }, { (void *)buf, len } };
    ssize_t n;

    if (len > VN_RECORD_MAX_FRESH || nfds > 1) {
        return -EINVAL;
    }
    n = vn_fdpass_send_flags(fd, iov, len > 0 ? 2 : 1, fds, nfds, MSG_DONTWAIT);
    if (n < 0) {
        return (int)n;
    }
    return (size_t)n == sizeof(prefix) + len ? 0 : -EAGAIN;
}

int vn_record_dial(const char *path, int send_timeout_s)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    struct timeval tv = { .tv_sec = send_timeout_s };
    int fd, e;

    if (strlen(path) >= sizeof(addr.sun_path)) {
        return -ENAMETOOLONG;
    }
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}
