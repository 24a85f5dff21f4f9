/*
 * Replies in the client's order (server-int.h), for a device that answers a
 * command later (vn_server_later()).
 *
 * vfio-user.rst lets a server answer out of order, but QEMU's client waits
 * for the last DMA_MAP of a memory transaction only and takes that as "all
 * done": so no reply overtakes an earlier one.  While any reply is owed,
 * later ones (built at once, by the usual handlers) wait in s->replies
 * behind it, and go when everything before them has.
 *
 * An owed reply is built by its handler as if the device had answered
 * (the template: a REGION_READ's bytes still to come) and sent as that, or
 * as an error reply, once the device says which.
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "server-int.h"

#include "common/util.h"
#include "trace-vfio-user.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

struct VnServerReply {
    uint64_t id;     /* 0: built at once (queued behind an owed one) */
    VnWireHdr req;   /* the command's header */
    GByteArray *out; /* the reply (an owed one's template, once its handler built it) */
    int fds[VN_MAX_MSG_FDS];
    unsigned nfds;
    bool built;     /* out holds the template (or the whole reply) */
    bool answered;  /* the device said (err, data) */
    int err;        /* its answer */
    GBytes *data;   /* a REGION_READ's bytes, until they go into the template */
    size_t data_at; /* where in the template they go, and how many */
    uint32_t data_len;
    /* A DMA_MAP's range, and whether the client unmapped any of it since (a failure
     * then must not take a later mapping out of the table). */
    uint64_t iova, size;
    bool superseded;
};

/* Ids are unique in the process, so a late answer never matches another
 * server's or another client's reply. */
static uint64_t last_id;

static void reply_free(VnServerReply *r)
{
    for (unsigned i = 0; i < r->nfds; i++) {
        vn_util_close_fd(&r->fds[i]);
    }
    if (r->out != NULL) {
        g_byte_array_unref(r->out);
    }
    if (r->data != NULL) {
        g_bytes_unref(r->data);
    }
    g_free(r);
}

/* An owed reply that has its template and its answer becomes the bytes to send. */
static void settle(VnServer *s, VnServerReply *r)
{
    if (r->id == 0 || !r->built || !r->answered) {
        return;
    }
    if (r->err < 0) {
        s->stats.errors++;
        g_byte_array_set_size(r->out, 0);
        vn_wire_error_reply(r->out, &r->req, r->err);
    } else if (r->data_len > 0) {
        gsize n = 0;
        const void *p = r->data != NULL ? g_bytes_get_data(r->data, &n) : NULL;

        if (p != NULL && n == r->data_len && r->data_at + n <= r->out->len) {
            memcpy(r->out->data + r->data_at, p, n);
        } else {
            g_byte_array_set_size(r->out, 0);
            vn_wire_error_reply(r->out, &r->req, -EIO); /* the device broke its word */
        }
    }
    r->id = 0; /* ready */
}

/* Send what is at the head and ready.  Returns 0 or the send's -errno. */
static int flush(VnServer *s)
{
    VnServerReply *r;
    int ret = 0;

    while (ret == 0 && (r = g_queue_peek_head(&s->replies)) != NULL && r->id == 0) {
        g_queue_pop_head(&s->replies);
        if (!(r->req.flags & VN_WIRE_FLAG_NO_REPLY) && s->client != NULL) {
            const VnWireHdr *hdr = (const VnWireHdr *)r->out->data;

            trace_server_reply(s->path, hdr->id, vn_wire_cmd_to_string(hdr->cmd), hdr->size,
                               hdr->error);
            ret = vn_transport_send(s->client, r->out->data, r->out->len, r->fds, r->nfds);
        }
        reply_free(r);
    }
    return ret;
}

static VnServerReply *find(VnServer *s, uint64_t id)
{
    for (GList *l = s->replies.head; l != NULL && id != 0; l = l->next) {
        VnServerReply *r = l->data;

        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

/* @out copied, @fds (borrowed) duplicated: the device's own (a region's mmap fd). */
static int take_reply(VnServerReply *r, const GByteArray *out, const int *fds, unsigned nfds)
{
    r->out = g_byte_array_sized_new(out->len);
    g_byte_array_append(r->out, out->data, out->len);
    for (unsigned i = 0; i < nfds && i < VN_MAX_MSG_FDS; i++) {
        r->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
        if (r->fds[i] < 0) {
            return -errno;
        }
        r->nfds = i + 1;
    }
    r->built = true;
    return 0;
}

int vn_server_replies_queue(VnServer *s, const GByteArray *out, const int *fds, unsigned nfds)
{
    VnServerReply *r = g_new0(VnServerReply, 1);
    int ret = take_reply(r, out, fds, nfds);

    if (ret < 0) {
        reply_free(r);
        return ret;
    }
    g_queue_push_tail(&s->replies, r);
    return flush(s);
}

uint64_t vn_server_replies_owe(VnServer *s, const VnWireRequest *req)
{
    VnServerReply *r = g_new0(VnServerReply, 1);

    r->id = ++last_id;
    r->req = req->hdr;
    if (req->hdr.cmd == VN_CMD_DMA_MAP) {
        r->iova = req->u.dma_map.iova;
        r->size = req->u.dma_map.size;
    }
    g_queue_push_tail(&s->replies, r);
    s->deferred++;
    return r->id;
}

int vn_server_replies_built(VnServer *s, uint64_t id, const GByteArray *out, size_t data_at,
                            uint32_t data_len)
{
    VnServerReply *r = find(s, id);
    int ret;

    if (r == NULL) {
        return 0; /* the client went meanwhile */
    }
    ret = take_reply(r, out, NULL, 0);
    r->data_at = data_at;
    r->data_len = data_len;
    settle(s, r); /* answered already: from inside the device's op */
    return ret < 0 ? ret : flush(s);
}

void vn_server_replies_unmapped(VnServer *s, uint64_t iova, uint64_t size, bool all)
{
    for (GList *l = s->replies.head; l != NULL; l = l->next) {
        VnServerReply *r = l->data;

        if (r->id != 0 && r->req.cmd == VN_CMD_DMA_MAP && !r->answered &&
            (all || (r->iova < iova + size && iova < r->iova + r->size))) {
            r->superseded = true;
        }
    }
}

void vn_server_replies_clear(VnServer *s)
{
    g_queue_clear_full(&s->replies, (GDestroyNotify)reply_free);
    s->deferred = 0;
}

int vn_server_replies_done(VnServer *s, uint64_t id, int err, const void *data, uint32_t len)
{
    VnServerReply *r = find(s, id);

    if (r == NULL || r->answered) {
        return 1;
    }
    s->deferred--;
    r->answered = true;
    r->err = err < 0 ? err : 0;
    if (data != NULL && err >= 0) {
        r->data = g_bytes_new(data, len);
    }
    if (r->req.cmd == VN_CMD_DMA_MAP) {
        if (err < 0 && !r->superseded) {
            vn_dma_unmap(s->dma, r->iova, r->size, false);
        }
        s->stats.dma_maps += err >= 0;
    }
    if (err < 0) {
        g_info("socket %s: id %u %s failed: %s", s->path, r->req.id,
               vn_wire_cmd_to_string(r->req.cmd), g_strerror(-err));
    }
    settle(s, r);
    return flush(s);
}
