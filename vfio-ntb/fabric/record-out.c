/*
 * Records sent without blocking (see record.h, VnRecordOut): what the socket does not take at
 * once waits in a bounded queue and goes as the socket drains, from the loop.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "record.h"

#include <errno.h>
#include <glib-unix.h>
#include <string.h>
#include <sys/socket.h>

struct VnRecordOut {
    int fd; /* borrowed */
    GMainContext *ctx;
    size_t max_queued;
    unsigned stall_ms;
    VnRecordOutFailFn fail;
    void *opaque;
    GByteArray *queue; /* bytes the socket has not taken, from @head */
    size_t head;
    GSource *writable; /* while @queue holds something */
    GSource *stall;    /* ... and whether it moved in stall_ms */
    bool moved;
    bool failed; /* the stream is lost: nothing more is sent */
};

VnRecordOut *vn_record_out_new(int fd, GMainContext *ctx, size_t max_queued, unsigned stall_ms,
                               VnRecordOutFailFn fail, void *opaque)
{
    VnRecordOut *o = g_new0(VnRecordOut, 1);

    *o = (VnRecordOut){ .fd = fd,
                        .ctx = ctx,
                        .max_queued = max_queued,
                        .stall_ms = stall_ms,
                        .fail = fail,
                        .opaque = opaque,
                        .queue = g_byte_array_new() };
    return o;
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
    g_byte_array_unref(o->queue);
    g_free(o);
}

size_t vn_record_out_queued(const VnRecordOut *o)
{
    return o->queue->len - o->head;
}

/* The stream is lost (@err): said once; the caller's @fail shuts the socket. */
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
    while (vn_record_out_queued(o) > 0) {
        ssize_t n = send(o->fd, o->queue->data + o->head, vn_record_out_queued(o),
                         MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n < 0) {
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
        }
        o->head += (size_t)n;
        o->moved = true;
    }
    g_byte_array_set_size(o->queue, 0);
    o->head = 0;
    return 0;
}

static gboolean on_writable(gint fd, GIOCondition cond, gpointer data)
{
    VnRecordOut *o = data;
    int ret = out_flush(o);

    if (ret < 0) {
        out_fail(o, ret);
        return G_SOURCE_REMOVE; /* out_fail destroyed it */
    }
    if (vn_record_out_queued(o) == 0) {
        out_idle(o);
        return G_SOURCE_REMOVE;
    }
    /* What was taken leaves room at the front: keep the queue from growing. */
    if (o->head > o->queue->len / 2) {
        g_byte_array_remove_range(o->queue, 0, (guint)o->head);
        o->head = 0;
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

int vn_record_out_send(VnRecordOut *o, const void *buf, size_t len, size_t max_len)
{
    uint32_t prefix = GUINT32_TO_LE((uint32_t)len);
    int ret;

    if (len > max_len || len > UINT32_MAX) {
        return -EMSGSIZE;
    }
    if (o->failed) {
        return -EPIPE;
    }
    if (vn_record_out_queued(o) + sizeof(prefix) + len > o->max_queued) {
        out_fail(o, -ENOBUFS);
        return -ENOBUFS;
    }
    g_byte_array_append(o->queue, (const guint8 *)&prefix, sizeof(prefix));
    g_byte_array_append(o->queue, buf, (guint)len);
    /* Behind what waits already, if any: the socket may have room for it by now. */
    ret = out_flush(o);
    if (ret < 0) {
        out_fail(o, ret);
        return ret;
    }
    if (vn_record_out_queued(o) > 0 && o->writable == NULL) {
        o->moved = false;
        o->writable = g_unix_fd_source_new(o->fd, G_IO_OUT);
        g_source_set_callback(o->writable, G_SOURCE_FUNC(on_writable), o, NULL);
        g_source_attach(o->writable, o->ctx);
        o->stall = g_timeout_source_new(o->stall_ms);
        g_source_set_callback(o->stall, on_stall_check, o, NULL);
        g_source_attach(o->stall, o->ctx);
    }
    return 0;
}
