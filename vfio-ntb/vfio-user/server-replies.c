/*
 * Replies in the client's order (server-int.h), for a device that answers a
 * command later (VnDeviceOps.dma_map_async).
 *
 * vfio-user.rst lets a server answer out of order, but QEMU's client waits
 * for the last DMA_MAP of a memory transaction only and takes that as "all
 * done": so no reply overtakes an earlier one.  While any reply is deferred,
 * later ones (built at once, by the usual handlers) wait in s->replies
 * behind it, and go when everything before them has.
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "server-int.h"

#include "common/util.h"
#include "trace-vfio-user.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

struct VnServerReply {
    uint64_t id;     /* 0: built already (a reply queued behind a deferred one) */
    VnWireHdr req;   /* the command's header */
    GByteArray *out; /* the reply, once built; NULL: nothing to send (NO_REPLY) */
    int fds[VN_MAX_MSG_FDS];
    unsigned nfds;
    bool done;
    /* A deferred DMA_MAP: its range, and whether the client unmapped any of it
     * since (a failure then must not take a later mapping out of the table). */
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
    g_free(r);
}

/* Send what is at the head and done.  Returns 0 or the send's -errno. */
static int flush(VnServer *s)
{
    VnServerReply *r;
    int ret = 0;

    while (ret == 0 && (r = g_queue_peek_head(&s->replies)) != NULL && r->done) {
        g_queue_pop_head(&s->replies);
        if (r->out != NULL && s->client != NULL) {
            const VnWireHdr *hdr = (const VnWireHdr *)r->out->data;

            trace_server_reply(s->path, hdr->id, vn_wire_cmd_to_string(hdr->cmd), hdr->size,
                               hdr->error);
            ret = vn_transport_send(s->client, r->out->data, r->out->len, r->fds, r->nfds);
        }
        reply_free(r);
    }
    return ret;
}

int vn_server_replies_queue(VnServer *s, const GByteArray *out, const int *fds, unsigned nfds)
{
    VnServerReply *r = g_new0(VnServerReply, 1);

    r->out = g_byte_array_sized_new(out->len);
    g_byte_array_append(r->out, out->data, out->len);
    /* The device's fds (a region's mmap fd) are borrowed: the copy goes later. */
    for (unsigned i = 0; i < nfds && i < VN_MAX_MSG_FDS; i++) {
        r->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
        if (r->fds[i] < 0) {
            int err = -errno;

            r->nfds = i;
            reply_free(r);
            return err;
        }
        r->nfds = i + 1;
    }
    r->done = true;
    g_queue_push_tail(&s->replies, r);
    return flush(s);
}

uint64_t vn_server_replies_defer(VnServer *s, const VnWireHdr *req, uint64_t iova, uint64_t size)
{
    VnServerReply *r = g_new0(VnServerReply, 1);

    r->id = ++last_id;
    r->req = *req;
    r->iova = iova;
    r->size = size;
    g_queue_push_tail(&s->replies, r);
    s->deferred++;
    return r->id;
}

static VnServerReply *find(VnServer *s, uint64_t id)
{
    for (GList *l = s->replies.head; l != NULL; l = l->next) {
        VnServerReply *r = l->data;

        if (r->id == id && !r->done) {
            return r;
        }
    }
    return NULL;
}

void vn_server_replies_forget(VnServer *s, uint64_t id)
{
    VnServerReply *r = find(s, id);

    if (r != NULL) {
        g_queue_remove(&s->replies, r);
        reply_free(r);
        s->deferred--;
    }
}

void vn_server_replies_unmapped(VnServer *s, uint64_t iova, uint64_t size, bool all)
{
    for (GList *l = s->replies.head; l != NULL; l = l->next) {
        VnServerReply *r = l->data;

        if (r->id != 0 && !r->done &&
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

int vn_server_replies_done(VnServer *s, uint64_t reply_id, int err)
{
    VnServerReply *r = find(s, reply_id);

    if (r == NULL) {
        return 1;
    }
    s->deferred--;
    r->done = true;
    if (err < 0) {
        s->stats.errors++;
        if (!r->superseded) {
            vn_dma_unmap(s->dma, r->iova, r->size, false);
        }
        g_info("socket %s: id %u %s failed: %s", s->path, r->req.id,
               vn_wire_cmd_to_string(r->req.cmd), g_strerror(-err));
    } else {
        s->stats.dma_maps++;
    }
    if (!(r->req.flags & VN_WIRE_FLAG_NO_REPLY)) {
        r->out = g_byte_array_sized_new(VN_WIRE_HDR_SIZE);
        if (err < 0) {
            vn_wire_error_reply(r->out, &r->req, err);
        } else {
            vn_wire_begin_reply(r->out, &r->req);
            vn_wire_finish(r->out);
        }
    }
    return flush(s);
}
