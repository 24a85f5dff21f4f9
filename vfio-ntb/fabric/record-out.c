/*
 * Records sent without blocking (see record.h, VnRecordOut): what the socket does not take at
 * once waits in a bounded queue, in order, and goes as the socket drains, from the loop.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "record.h"

#include "common/fdpass.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <glib-unix.h>
#include <string.h>
#include <sys/socket.h>

/* One record on its way: its bytes (the length prefix first), how many went, and the fd
 * that goes with its first byte (ours, a dup; -1: none). */
typedef struct OutRecord {
    uint8_t *bytes;
    size_t len, sent;
    int fd;
} OutRecord;

struct VnRecordOut {
    int sock; /* borrowed */
    GMainContext *ctx;
    size_t max_queued;
    unsigned stall_ms;
    VnRecordOutFailFn fail;
    void *opaque;
    GQueue records;    /* OutRecord */
    size_t queued;     /* their bytes not yet taken */
    GSource *writable; /* while a record waits */
    GSource *stall;    /* ... and whether the socket took any of it in stall_ms */
    bool moved;
    bool failed; /* the stream is lost: nothing more is sent */
};

VnRecordOut *vn_record_out_new(int sock, GMainContext *ctx, size_t max_queued, unsigned stall_ms,
                               VnRecordOutFailFn fail, void *opaque)
{
    VnRecordOut *o = g_new0(VnRecordOut, 1);

    *o = (VnRecordOut){ .sock = sock,
                        .ctx = ctx,
                        .max_queued = max_queued,
                        .stall_ms = stall_ms,
                        .fail = fail,
                        .opaque = opaque };
    g_queue_init(&o->records);
    return o;
}

static void record_free(OutRecord *r)
{
    vn_util_close_fd(&r->fd);
    g_free(r->bytes);
    g_free(r);
}

static void out_idle(VnRecordOut *o)
{
    if (o->writable != NULL) {
        g_source_destroy(o->writable);
        g_clear_pointer(&o->writable, g_source_unref);
    }
    if (o->stall != NULL) {
        g_source_destroy(o->stall);
        g_clear_pointer(&o->stall, g_source_unref);
    }
}

void vn_record_out_free(VnRecordOut *o)
{
    if (o == NULL) {
        return;
    }
    out_idle(o);
    g_queue_clear_full(&o->records, (GDestroyNotify)record_free);
    g_free(o);
}

size_t vn_record_out_queued(const VnRecordOut *o)
{
    return o->queued;
}

const char *vn_record_out_why(int err)
{
    return err == -ENOBUFS     ? "it leaves too much unread"
           : err == -ETIMEDOUT ? "it reads nothing"
                               : g_strerror(-err);
}

/* The stream is lost (@err): said once, last (@fail may free @o). */
static void out_fail(VnRecordOut *o, int err)
{
    if (o->failed) {
        return;
    }
    o->failed = true;
    out_idle(o);
    o->fail(o->opaque, err);
}

/* Send what the socket takes now: 0 (all or some of it), or -errno (the stream is lost). */
static int out_flush(VnRecordOut *o)
{
    OutRecord *r;

    while ((r = g_queue_peek_head(&o->records)) != NULL) {
        struct iovec iov = { r->bytes + r->sent, r->len - r->sent };
        bool with_fd = r->sent == 0 && r->fd >= 0;
        ssize_t n = vn_fdpass_send_flags(o->sock, &iov, 1, with_fd ? &r->fd : NULL, with_fd ? 1 : 0,
                                         MSG_DONTWAIT);

        if (n < 0) {
            return n == -EAGAIN || n == -EWOULDBLOCK ? 0 : (int)n;
        }
        r->sent += (size_t)n;
        o->queued -= (size_t)n;
        o->moved = true;
        if (with_fd) {
            vn_util_close_fd(&r->fd); /* the peer has its own now */
        }
        if (r->sent < r->len) {
            return 0;
        }
        record_free(g_queue_pop_head(&o->records));
    }
    return 0;
}

static gboolean on_writable(gint fd, GIOCondition cond, gpointer data)
{
    VnRecordOut *o = data;
    int ret = out_flush(o);

    if (ret < 0) {
        out_fail(o, ret);
        return G_SOURCE_REMOVE; /* destroyed already; @o may be gone */
    }
    if (o->queued == 0) {
        out_idle(o);
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

static gboolean on_stall_check(gpointer data)
{
    VnRecordOut *o = data;

    if (!o->moved) {
        out_fail(o, -ETIMEDOUT);
        return G_SOURCE_REMOVE;
    }
    o->moved = false;
    return G_SOURCE_CONTINUE;
}

/* Nothing waits: the record straight from the caller's buffer, without a copy.  The bytes
 * the socket took (the fd went with the first), or -errno when the stream is lost. */
static ssize_t send_direct(VnRecordOut *o, const uint32_t *prefix, const void *buf, size_t len,
                           int fd)
{
    struct iovec iov[2] = { { (void *)prefix, sizeof(*prefix) }, { (void *)buf, len } };
    ssize_t n = vn_fdpass_send_flags(o->sock, iov, len > 0 ? 2 : 1, fd >= 0 ? &fd : NULL,
                                     fd >= 0 ? 1 : 0, MSG_DONTWAIT);

    if (n == -EAGAIN || n == -EWOULDBLOCK) {
        return 0;
    }
    if (n > 0) {
        o->moved = true;
    }
    return n;
}

int vn_record_out_send(VnRecordOut *o, const void *buf, size_t len, size_t max_len, int fd)
{
    uint32_t prefix = GUINT32_TO_LE((uint32_t)len);
    size_t total = sizeof(prefix) + len;
    ssize_t sent = 0;
    OutRecord *r;
    int ret;

    if (len > max_len || len > UINT32_MAX - sizeof(prefix)) {
        return -EMSGSIZE;
    }
    if (o->failed) {
        return -EPIPE;
    }
    if (g_queue_is_empty(&o->records)) {
        sent = send_direct(o, &prefix, buf, len, fd);
        if (sent < 0) {
            out_fail(o, (int)sent);
            return (int)sent;
        }
        if ((size_t)sent == total) {
            return 0;
        }
    }
    /* What the socket did not take waits, in order. */
    if (o->queued + total - (size_t)sent > o->max_queued) {
        out_fail(o, -ENOBUFS);
        return -ENOBUFS;
    }
    r = g_new0(OutRecord, 1);
    r->fd = -1;
    if (sent == 0 && fd >= 0 && (r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        ret = -errno;
        g_free(r);
        return ret; /* nothing was sent or queued: the stream is as it was */
    }
    r->len = total;
    r->sent = (size_t)sent;
    r->bytes = g_malloc(r->len);
    memcpy(r->bytes, &prefix, sizeof(prefix));
    if (len > 0) {
        memcpy(r->bytes + sizeof(prefix), buf, len);
    }
    g_queue_push_tail(&o->records, r);
    o->queued += r->len - r->sent;
    /* Behind what waits already, if anything: the socket may have room for it by now. */
    ret = out_flush(o);
    if (ret < 0) {
        out_fail(o, ret);
        return ret;
    }
    if (o->queued > 0 && o->writable == NULL) {
        o->moved = false;
        o->writable = vn_util_fd_source_new(o->sock, G_IO_OUT);
        g_source_set_callback(o->writable, G_SOURCE_FUNC(on_writable), o, NULL);
        g_source_attach(o->writable, o->ctx);
        o->stall = g_timeout_source_new(o->stall_ms);
        g_source_set_callback(o->stall, on_stall_check, o, NULL);
        g_source_attach(o->stall, o->ctx);
    }
    return 0;
}

int vn_record_out_flush(VnRecordOut *o)
{
    int ret;

    if (o->failed) {
        return -EPIPE;
    }
    ret = out_flush(o);
    if (ret < 0) {
        out_fail(o, ret);
        return ret;
    }
    if (o->queued == 0) {
        out_idle(o);
    }
    return 0;
}
