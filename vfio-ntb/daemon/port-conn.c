/*
 * A worker's port (see port.h): the connection to its worker, and what is refused on it.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "port-conn.h"
#include "port.h"

#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <stdarg.h>
#include <string.h>

void vn_port_refuse(VnPort *p, const char *fmt, ...)
{
    g_autofree char *why = NULL;
    va_list ap;

    va_start(ap, fmt);
    why = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    p->refused++;
    g_info("port %s: refused from the worker of %s/%s: %s", p->path, p->peer, p->device, why);
}

void vn_port_conn_close(VnPort *p)
{
    if (p->src != NULL) {
        g_source_destroy(p->src);
        g_clear_pointer(&p->src, g_source_unref);
    }
    vn_record_reader_clear(&p->rx);
    g_clear_pointer(&p->to_worker, vn_record_out_free); /* before its socket goes */
    vn_util_close_fd(&p->fd);
    /* Its CONNECT's answer would reach the next connection, which did not ask. */
    g_clear_pointer(&p->connect, vn_fabric_connect_cancel);
}

bool vn_port_secret_ok(VnPort *p, const uint8_t *data, size_t len)
{
    return p->has_secret && data != NULL && len == VN_PORT_SECRET_LEN &&
           vn_util_equal_secret(data, p->secret, VN_PORT_SECRET_LEN);
}

/* The worker's connection took nothing for a while, or would have too much waiting. */
static void on_out_failed(void *opaque, int err)
{
    VnPort *p = opaque;

    g_info("port %s: cannot reach the worker: %s", p->path, vn_record_out_why(err));
    /* A worker that does not read its port is stuck: it reconnects when it is not. */
    vn_port_conn_close(p);
}

void vn_port_to_worker(VnPort *p, uint32_t op, uint64_t seq, int status, const char *peer,
                       uint64_t arg, uint64_t arg2, const void *data, size_t len, int fd)
{
    g_autofree uint8_t *buf = NULL;
    size_t n;

    if (p->fd < 0) {
        return;
    }
    if (p->to_worker == NULL) {
        p->to_worker = vn_record_out_new(p->fd, p->ctx, VN_PORT_MAX_QUEUED, VN_PORT_STALL_MS,
                                         on_out_failed, p);
    }
    buf = vn_host_record_new(op, seq, status, peer, arg, arg2, data, len, &n);
    /* Never waits: a worker that stops reading loses its connection (on_out_failed). */
    if (vn_record_out_send(p->to_worker, buf, n, VN_HOST_MAX_RECORD, fd) == -EMSGSIZE) {
        g_info("port %s: a record of %zu bytes is too large for the worker", p->path, n);
    }
}

void vn_port_reply(VnPort *p, const VnHostHdr *h, int err, uint64_t arg, uint64_t arg2, int fd)
{
    vn_port_to_worker(p, VN_HOST_REPLY, h->seq, err < 0 ? -err : err, NULL, arg, arg2, NULL, 0, fd);
}

/* The peer's requests the worker has not answered: they fail now. */
void vn_port_ins_fail(VnPort *p, int err, const char *why)
{
    for (guint i = 0; i < p->ins->len; i++) {
        VnPortIn *in = p->ins->pdata[i];

        vn_fabric_reply_error(p->fab, in->token, err, why);
        if (in->frame != NULL) {
            g_byte_array_unref(in->frame);
        }
        g_free(in);
    }
    g_ptr_array_set_size(p->ins, 0);
}
