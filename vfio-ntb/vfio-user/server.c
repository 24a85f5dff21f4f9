/*
 * vfio-user server engine (see server.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "server-int.h"

#include "common/peerfd.h"
#include "common/util.h"
#include "trace-vfio-user.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <json-glib/json-glib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

bool vn_device_ops_valid(const VnDeviceOps *ops, GError **error)
{
    const char *missing = NULL;

    if (ops == NULL) {
        missing = "the table";
    } else if (ops->region_read == NULL) {
        missing = "region_read";
    } else if (ops->region_write == NULL) {
        missing = "region_write";
    }
    if (missing != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "device ops: %s is required",
                    missing);
        return false;
    }
    return true;
}

static bool info_valid(const VnDeviceInfo *info, GError **error)
{
    if (info->num_regions > VN_MAX_REGIONS || info->num_irqs > VN_MAX_IRQ_INDEXES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "device info: %u regions / %u irq indexes is above the limit",
                    info->num_regions, info->num_irqs);
        return false;
    }
    for (uint32_t i = 0; i < info->num_regions; i++) {
        const VnRegion *r = &info->regions[i];

        if (r->nr_sparse > VN_MAX_SPARSE_AREAS) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "device info: region %u has too many sparse areas", i);
            return false;
        }
        for (uint32_t a = 0; a < r->nr_sparse; a++) {
            if (!vn_util_range_ok(r->sparse[a].offset, r->sparse[a].size, r->size)) {
                g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                            "device info: region %u sparse area %u is outside it", i, a);
                return false;
            }
        }
    }
    return true;
}

static gboolean on_listen(int fd, GIOCondition cond, gpointer data);
static gboolean on_client(int fd, GIOCondition cond, gpointer data);
/* Watch the client's socket again (@on) and serve what it sent meanwhile soon, or stop
 * watching it (the client's commands wait in the socket). */
static void client_watch(VnServer *s, bool on);

static void listen_arm(VnServer *s)
{
    if (s->listen_src != NULL) {
        return;
    }
    s->listen_src = vn_util_fd_source_new(s->listen_fd, G_IO_IN);
    g_source_set_callback(s->listen_src, G_SOURCE_FUNC(on_listen), s, NULL);
    g_source_attach(s->listen_src, s->ctx);
}

static void listen_disarm(VnServer *s)
{
    if (s->listen_src != NULL) {
        g_source_destroy(s->listen_src);
        g_clear_pointer(&s->listen_src, g_source_unref);
    }
}

static void held_clear(VnServer *s)
{
    VnTransportMsg *m;

    while ((m = g_queue_pop_head(&s->held)) != NULL) {
        vn_transport_msg_clear(m);
        g_free(m);
    }
    if (s->held_src != NULL) {
        g_source_destroy(s->held_src);
        g_clear_pointer(&s->held_src, g_source_unref);
    }
    s->held_error = 0;
}

static void client_drop(VnServer *s, const char *why)
{
    if (s->client == NULL) {
        return;
    }
    g_info("socket %s: client disconnected (%s)", s->path, why);
    if (s->client_src != NULL) {
        g_source_destroy(s->client_src);
        g_clear_pointer(&s->client_src, g_source_unref);
    }
    s->paused = false;
    s->stopped = 0;
    s->versioned = false;
    held_clear(s);
    vn_server_replies_clear(s);
    vn_server_asked_fail(s);

    /* The device must stop using guest memory and interrupts before they
     * go: a new client gets a clean device. */
    if (s->ops->client_leaving != NULL) {
        s->ops->client_leaving(s->opaque);
    }
    if (s->ops->dma_unmapping != NULL) {
        s->ops->dma_unmapping(s->opaque, 0, 0, true);
    }
    vn_dma_unmap(s->dma, 0, 0, true);
    vn_irqs_reset(s->irqs);
    if (s->ops->reset != NULL) {
        s->ops->reset(s->opaque);
    }
    if (s->ops->client_gone != NULL) {
        s->ops->client_gone(s->opaque);
    }
    /* Last: vn_server_has_client() turns false only once all is undone. */
    g_clear_pointer(&s->client, vn_transport_free);
    listen_arm(s);
}

static void client_attach(VnServer *s, int cfd);

static gboolean on_listen(int fd, GIOCondition cond, gpointer data)
{
    VnServer *s = data;
    int cfd;

    cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0) {
        if (errno != EAGAIN && errno != EINTR) {
            g_warning("socket %s: accept failed: %s", s->path, g_strerror(errno));
        }
        return G_SOURCE_CONTINUE;
    }
    client_attach(s, cfd);
    s->stats.clients++;
    g_info("socket %s: client connected", s->path);
    if (s->ops->client_new != NULL) {
        s->ops->client_new(s->opaque);
    }
    /* One client at a time: the next waits in the backlog until this one
     * goes (that is how a hot-unplugged and re-plugged device reconnects). */
    g_clear_pointer(&s->listen_src, g_source_unref);
    return G_SOURCE_REMOVE;
}

/* Send the reply in s->out, with fds, unless the command asked for none; the template of
 * the reply the device answers later (vn_server_later()), with the REGION_READ bytes it
 * owes at @data_at. */
static int reply_send_data(VnServer *s, const VnWireHdr *req, const int *fds, unsigned nfds,
                           size_t data_at, uint32_t data_len)
{
    VnWireHdr *hdr = (VnWireHdr *)s->out->data;

    if (s->later != 0) {
        uint64_t id = s->later;

        s->later = 0;
        s->stats.errors += (hdr->flags & VN_WIRE_FLAG_ERROR) != 0; /* refused here after all */
        return vn_server_replies_built(s, id, s->out, data_at, data_len);
    }
    if (req->flags & VN_WIRE_FLAG_NO_REPLY) {
        return 0;
    }
    if (hdr->flags & VN_WIRE_FLAG_ERROR) {
        s->stats.errors++;
    }
    if (s->replies.length > 0) {
        return vn_server_replies_queue(s, s->out, fds, nfds); /* not before earlier ones */
    }
    trace_server_reply(s->path, hdr->id, vn_wire_cmd_to_string(hdr->cmd), hdr->size, hdr->error);
    return vn_transport_send(s->client, s->out->data, s->out->len, fds, nfds);
}

static int reply_send(VnServer *s, const VnWireHdr *req, const int *fds, unsigned nfds)
{
    return reply_send_data(s, req, fds, nfds, 0, 0);
}

/* What a device op returned, once it asked to answer later: success for now. */
static int op_result(VnServer *s, int ret)
{
    return s->later != 0 ? 0 : ret;
}

static int reply_error(VnServer *s, const VnWireHdr *req, int err)
{
    if (req->flags & VN_WIRE_FLAG_NO_REPLY) {
        s->stats.errors++;
        g_info("socket %s: id %u %s failed: %s (no reply requested)", s->path, req->id,
               vn_wire_cmd_to_string(req->cmd), g_strerror(-err));
        return 0;
    }
    vn_wire_error_reply(s->out, req, err);
    return reply_send(s, req, NULL, 0);
}

static int handle_version(VnServer *s, const VnWireRequest *req)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *caps = NULL;
    VnWireVersion v = { VN_WIRE_VERSION_MAJOR, VN_WIRE_VERSION_MINOR };

    if (req->u.version.major != VN_WIRE_VERSION_MAJOR) {
        g_info("socket %s: client speaks vfio-user %u.%u, we speak %u.%u", s->path,
               req->u.version.major, req->u.version.minor, (unsigned)VN_WIRE_VERSION_MAJOR,
               (unsigned)VN_WIRE_VERSION_MINOR);
        return reply_error(s, &req->hdr, -ENOTSUP);
    }
    if (!vn_wire_parse_caps(req->u.version.json, &s->caps, &error)) {
        g_info("socket %s: VERSION: %s", s->path, error->message);
        return reply_error(s, &req->hdr, -EINVAL);
    }
    caps = vn_wire_caps_json();
    vn_wire_begin_reply(s->out, &req->hdr);
    g_byte_array_append(s->out, (const guint8 *)&v, sizeof(v));
    /* vfio-user.rst: VERSION: QEMU receives the reply into a buffer the size
     * of its request, so a reply must never be longer than the request. */
    if (s->out->len + strlen(caps) + 1 <= req->hdr.size) {
        g_byte_array_append(s->out, (const guint8 *)caps, strlen(caps) + 1);
    } else if (s->out->len + 3 <= req->hdr.size) {
        g_byte_array_append(s->out, (const guint8 *)"{}", 3);
    }
    vn_wire_finish(s->out);
    s->versioned = true;
    return reply_send(s, &req->hdr, NULL, 0);
}

static int handle_dma_map(VnServer *s, const VnWireRequest *req, VnTransportMsg *msg)
{
    const VnWireDmaMap *m = &req->u.dma_map;
    int fd = -1;
    int ret;

    if (msg->nfds == 1) {
        fd = msg->fds[0];
        msg->fds[0] = -1;
    }
    /* the table takes the fd, on failure too */
    ret = vn_dma_map(s->dma, m->iova, m->size, m->offset, m->flags, fd);
    trace_server_dma_map(s->path, m->iova, m->size, fd >= 0 ? "yes" : "no", m->offset, m->flags,
                         ret);
    if (ret < 0) {
        return reply_error(s, &req->hdr, ret);
    }
    if (s->ops->dma_mapped != NULL) {
        VnDmaMapping view = {
            .iova = m->iova, .size = m->size, .offset = m->offset, .prot = m->flags, .fd = -1
        };

        vn_dma_lookup(s->dma, m->iova, &view);
        ret = op_result(s, s->ops->dma_mapped(s->opaque, &view));
        if (ret < 0) {
            vn_dma_unmap(s->dma, m->iova, m->size, false);
            return reply_error(s, &req->hdr, ret);
        }
    }
    s->stats.dma_maps += s->later == 0; /* an answer later counts when it comes */
    vn_wire_begin_reply(s->out, &req->hdr);
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, NULL, 0);
}

static int handle_dma_unmap(VnServer *s, const VnWireRequest *req)
{
    const VnWireDmaUnmap *u = &req->u.dma_unmap;
    VnWireDmaUnmap reply = *u;
    bool all = u->flags & VFIO_DMA_UNMAP_FLAG_ALL;
    int64_t ret;

    if (s->ops->dma_unmapping != NULL) {
        s->ops->dma_unmapping(s->opaque, u->iova, u->size, all);
    }
    vn_server_replies_unmapped(s, u->iova, u->size, all);
    ret = vn_dma_unmap(s->dma, u->iova, u->size, all);
    trace_server_dma_unmap(s->path, u->iova, u->size, all, ret);
    if (ret < 0) {
        return reply_error(s, &req->hdr, (int)ret);
    }
    s->stats.dma_unmaps++;
    /* The reply says how much was unmapped, as type1 does: 0 when nothing was there (a
     * guest's IOMMU unmapping its whole space in chunks at shutdown is no error). */
    reply.size = (uint64_t)ret;
    vn_wire_begin_reply(s->out, &req->hdr);
    g_byte_array_append(s->out, (const guint8 *)&reply, sizeof(reply));
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, NULL, 0);
}

static int handle_device_info(VnServer *s, const VnWireRequest *req)
{
    VnWireDeviceInfo di = {
        .argsz = sizeof(di),
        .flags = s->info.flags,
        .num_regions = s->info.num_regions,
        .num_irqs = s->info.num_irqs,
    };

    vn_wire_begin_reply(s->out, &req->hdr);
    g_byte_array_append(s->out, (const guint8 *)&di, sizeof(di));
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, NULL, 0);
}

static int handle_region_info(VnServer *s, const VnWireRequest *req)
{
    const struct vfio_region_info *q = &req->u.region_info;
    struct vfio_region_info ri = { 0 };
    struct vfio_region_info_cap_sparse_mmap cap = { 0 };
    const VnRegion *r;
    uint32_t full;
    int fd = -1;

    if (q->index >= s->info.num_regions) {
        return reply_error(s, &req->hdr, -EINVAL);
    }
    r = &s->info.regions[q->index];
    ri.index = q->index;
    ri.size = r->size;
    ri.flags = r->flags;
    full = sizeof(ri);
    if ((r->flags & VFIO_REGION_INFO_FLAG_MMAP) && r->mmap_fd >= 0) {
        fd = r->mmap_fd;
        ri.offset = r->mmap_offset;
        if (r->nr_sparse > 0) {
            ri.flags |= VFIO_REGION_INFO_FLAG_CAPS;
            ri.cap_offset = sizeof(ri);
            full += sizeof(cap) + r->nr_sparse * sizeof(struct vfio_region_sparse_mmap_area);
        }
    } else {
        /* No fd, no mmap: QEMU would otherwise warn and trap anyway. */
        ri.flags &= ~(uint32_t)VFIO_REGION_INFO_FLAG_MMAP;
    }
    ri.argsz = full;

    vn_wire_begin_reply(s->out, &req->hdr);
    g_byte_array_append(s->out, (const guint8 *)&ri, sizeof(ri));
    /* linux/vfio.h: when argsz is too small for the capabilities, return the
     * fixed part with the size needed; the client asks again (QEMU does). */
    if (full > sizeof(ri) && q->argsz >= full) {
        cap.header.id = VFIO_REGION_INFO_CAP_SPARSE_MMAP;
        cap.header.version = 1;
        cap.nr_areas = r->nr_sparse;
        g_byte_array_append(s->out, (const guint8 *)&cap, sizeof(cap));
        for (uint32_t a = 0; a < r->nr_sparse; a++) {
            struct vfio_region_sparse_mmap_area area = {
                .offset = r->sparse[a].offset,
                .size = r->sparse[a].size,
            };

            g_byte_array_append(s->out, (const guint8 *)&area, sizeof(area));
        }
    }
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

static int handle_irq_info(VnServer *s, const VnWireRequest *req)
{
    struct vfio_irq_info ii = { .argsz = sizeof(ii) };
    uint32_t index = req->u.irq_info.index;

    if (index >= s->info.num_irqs) {
        return reply_error(s, &req->hdr, -EINVAL);
    }
    ii.index = index;
    ii.flags = s->info.irq_flags[index];
    ii.count = s->info.irq_count[index];
    vn_wire_begin_reply(s->out, &req->hdr);
    g_byte_array_append(s->out, (const guint8 *)&ii, sizeof(ii));
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, NULL, 0);
}

static int handle_set_irqs(VnServer *s, const VnWireRequest *req, VnTransportMsg *msg)
{
    const VnWireIrqSet *set = &req->u.irq_set.set;
    int ret = 0;

    /* Checked here, once, whoever consumes them (our table or a device
     * that forwards them): anything but an eventfd could block the thread
     * that signals it; an eventfd is made non-blocking. */
    for (unsigned i = 0; i < msg->nfds && ret == 0; i++) {
        ret = vn_peerfd_eventfd(msg->fds[i]) < 0 ? -EINVAL : 0;
    }
    if (ret < 0) {
        /* refused below (the trace says so) */
    } else if (set->index >= s->info.num_irqs) {
        ret = -EINVAL;
    } else if (s->ops->set_irqs != NULL) {
        ret = op_result(s, s->ops->set_irqs(s->opaque, set->flags, set->index, set->start,
                                            set->count, req->u.irq_set.bools, msg->fds, msg->nfds));
    } else {
        ret = vn_irqs_set(s->irqs, set->flags, set->index, set->start, set->count,
                          req->u.irq_set.bools, msg->fds, msg->nfds);
    }
    trace_server_set_irqs(s->path, set->index, set->start, set->count, set->flags, msg->nfds, ret);
    if (ret < 0) {
        return reply_error(s, &req->hdr, ret);
    }
    if (s->ops->irqs_changed != NULL) {
        s->ops->irqs_changed(s->opaque, set->index);
    }
    vn_wire_begin_reply(s->out, &req->hdr);
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, NULL, 0);
}

static int handle_region_rw(VnServer *s, const VnWireRequest *req, bool write)
{
    const VnWireRegionRw *rw = &req->u.region.rw;
    const VnRegion *r;
    uint32_t need = write ? VFIO_REGION_INFO_FLAG_WRITE : VFIO_REGION_INFO_FLAG_READ;
    size_t at;
    int ret;

    if (rw->region >= s->info.num_regions) {
        return reply_error(s, &req->hdr, -EINVAL);
    }
    r = &s->info.regions[rw->region];
    if (!(r->flags & need) || !vn_util_range_ok(rw->offset, rw->count, r->size)) {
        return reply_error(s, &req->hdr, -EINVAL);
    }
    if (rw->count > s->caps.max_data_xfer_size) {
        return reply_error(s, &req->hdr, -E2BIG);
    }
    s->stats.per_region_rw[rw->region]++;
    trace_server_region_rw(s->path, write ? "write" : "read", rw->region, rw->offset, rw->count);
    vn_wire_begin_reply(s->out, &req->hdr);
    g_byte_array_append(s->out, (const guint8 *)rw, sizeof(*rw));
    at = s->out->len;
    if (write) {
        s->stats.region_writes++;
        ret =
            s->ops->region_write(s->opaque, rw->region, rw->offset, req->u.region.data, rw->count);
    } else {
        s->stats.region_reads++;
        g_byte_array_set_size(s->out, at + rw->count);
        ret = s->ops->region_read(s->opaque, rw->region, rw->offset, s->out->data + at, rw->count);
    }
    ret = op_result(s, ret);
    if (ret < 0) {
        return reply_error(s, &req->hdr, ret);
    }
    vn_wire_finish(s->out);
    return reply_send_data(s, &req->hdr, NULL, 0, at, write ? 0 : rw->count);
}

static int handle_reset(VnServer *s, const VnWireRequest *req)
{
    int ret = 0;

    g_info("socket %s: device reset requested", s->path);
    if (s->ops->reset != NULL) {
        ret = op_result(s, s->ops->reset(s->opaque));
    }
    if (ret < 0) {
        return reply_error(s, &req->hdr, ret);
    }
    s->stats.resets++;
    vn_wire_begin_reply(s->out, &req->hdr);
    vn_wire_finish(s->out);
    return reply_send(s, &req->hdr, NULL, 0);
}

static int dispatch(VnServer *s, const VnWireRequest *req, VnTransportMsg *msg);
static void answered(VnServer *s, int ret);

/* Handle one message; returns < 0 when the client must be dropped. */
static int handle_msg(VnServer *s, VnTransportMsg *msg)
{
    VnWireRequest req;
    int ret;

    s->stats.messages++;
    if (msg->len >= VN_WIRE_HDR_SIZE) {
        VnWireHdr hdr;

        memcpy(&hdr, msg->data, sizeof(hdr));
        if (vn_server_asked_is_answer(&hdr)) {
            return msg->nfds == 0 ? vn_server_asked_answer(s, &hdr) : -EPROTO;
        }
    }
    ret = vn_wire_decode_request(msg->data, msg->len, msg->nfds, &req);
    if (ret == 0 && msg->fds_overflow) {
        ret = -EINVAL;
    }
    if (ret < 0 && msg->len >= VN_WIRE_HDR_SIZE) {
        VnWireHdr hdr;

        memcpy(&hdr, msg->data, sizeof(hdr));
        if ((hdr.flags & VN_WIRE_FLAG_TYPE_MASK) != VN_WIRE_FLAG_COMMAND && s->dma_asked &&
            (hdr.cmd == VN_CMD_DMA_READ || hdr.cmd == VN_CMD_DMA_WRITE)) {
            /* A late answer to a client DMA of ours (a read that timed out, a posted
             * write that failed): nothing waits for it. */
            s->stats.client_dma_failures += (hdr.flags & VN_WIRE_FLAG_ERROR) != 0;
            return 0;
        }
        if ((hdr.flags & VN_WIRE_FLAG_TYPE_MASK) != VN_WIRE_FLAG_COMMAND) {
            /* We send only client DMA commands, so another reply is a confused peer. */
            g_info("socket %s: unexpected reply id %u from client", s->path, hdr.id);
            return -EPROTO;
        }
        g_info("socket %s: id %u %s (%u) rejected: %s", s->path, hdr.id,
               vn_wire_cmd_to_string(hdr.cmd), hdr.cmd, g_strerror(-ret));
        return reply_error(s, &hdr, ret);
    }
    trace_server_request(s->path, req.hdr.id, vn_wire_cmd_to_string(req.hdr.cmd), req.hdr.size,
                         msg->nfds);

    if (!s->versioned && req.hdr.cmd != VN_CMD_VERSION) {
        /* vfio-user.rst: VERSION is the first message of a session. */
        return reply_error(s, &req.hdr, -EINVAL);
    }
    s->handling = &req;
    ret = dispatch(s, &req, msg);
    s->handling = NULL;
    if (s->later != 0) {
        /* An op asked to answer later and its handler sent nothing after all: the client
         * still gets its (error) reply in its place. */
        uint64_t id = s->later;

        s->later = 0;
        vn_wire_error_reply(s->out, &req.hdr, -EIO);
        vn_server_replies_built(s, id, s->out, 0, 0);
        answered(s, vn_server_replies_done(s, id, -EIO, NULL, 0));
    }
    return ret;
}

static int dispatch(VnServer *s, const VnWireRequest *req, VnTransportMsg *msg)
{
    switch (req->hdr.cmd) {
    case VN_CMD_VERSION:
        return handle_version(s, req);
    case VN_CMD_DMA_MAP:
        return handle_dma_map(s, req, msg);
    case VN_CMD_DMA_UNMAP:
        return handle_dma_unmap(s, req);
    case VN_CMD_DEVICE_GET_INFO:
        return handle_device_info(s, req);
    case VN_CMD_DEVICE_GET_REGION_INFO:
        return handle_region_info(s, req);
    case VN_CMD_DEVICE_GET_IRQ_INFO:
        return handle_irq_info(s, req);
    case VN_CMD_DEVICE_SET_IRQS:
        return handle_set_irqs(s, req, msg);
    case VN_CMD_REGION_READ:
        return handle_region_rw(s, req, false);
    case VN_CMD_REGION_WRITE:
        return handle_region_rw(s, req, true);
    case VN_CMD_DEVICE_RESET:
        return handle_reset(s, req);
    default:
        return reply_error(s, &req->hdr, -ENOTSUP);
    }
}

/* The client's next message (1), those held during a client DMA first; 0 while none is
 * whole yet; -errno (a receive error met during a client DMA counts). */
static int next_msg(VnServer *s, VnTransportMsg *msg)
{
    g_autofree VnTransportMsg *held = g_queue_pop_head(&s->held);

    if (held != NULL) {
        *msg = *held; /* its data and fds are msg's now */
        return 1;
    }
    return s->held_error != 0 ? s->held_error : vn_transport_recv(s->client, msg);
}

/*
 * Serve the client's messages, at most 64 (so that one busy client cannot
 * starve the loop): those held during a client DMA first, then the socket's.
 * False once the client was dropped.
 */
static bool serve_client(VnServer *s)
{
    for (int i = 0; i < 64 && s->client != NULL; i++) {
        VnTransportMsg msg = { 0 };
        int ret;

        if ((s->deferred >= VN_SERVER_MAX_DEFERRED || s->stopped > 0) && s->held_error == 0) {
            /* The device owes that many answers, or an op of its waits on something before
             * the next command may be looked at: the rest wait in the socket (and in the
             * client) until one comes (vn_server_complete, vn_server_resume). */
            client_watch(s, false);
            return true;
        }
        ret = next_msg(s, &msg);

        if (ret == 0) {
            return true;
        }
        if (ret < 0) {
            client_drop(s, ret == -ECONNRESET ? "closed" : g_strerror(-ret));
            return false;
        }
        ret = handle_msg(s, &msg);
        vn_transport_msg_clear(&msg);
        if (ret < 0) {
            client_drop(s, g_strerror(-ret));
            return false;
        }
    }
    return s->client != NULL;
}

static gboolean on_client(int fd, GIOCondition cond, gpointer data)
{
    return serve_client(data) ? G_SOURCE_CONTINUE : G_SOURCE_REMOVE;
}

static gboolean on_held(gpointer data)
{
    VnServer *s = data;

    if (!serve_client(s)) {
        return G_SOURCE_REMOVE; /* client_drop() destroyed this source */
    }
    if (s->held.length > 0 && !s->paused) { /* paused: client_watch() arms us */
        return G_SOURCE_CONTINUE;
    }
    g_clear_pointer(&s->held_src, g_source_unref);
    return G_SOURCE_REMOVE;
}

void vn_server_held_arm(VnServer *s)
{
    if (s->held_src != NULL) {
        return;
    }
    s->held_src = g_idle_source_new();
    g_source_set_callback(s->held_src, on_held, s, NULL);
    g_source_attach(s->held_src, s->ctx);
}

/* The parts of a server that do not depend on where its sockets come from. */
static VnServer *server_alloc(const char *socket_path, const VnDeviceInfo *info,
                              const VnDeviceOps *ops, void *opaque, GMainContext *ctx,
                              GError **error)
{
    struct sockaddr_un addr;
    VnServer *s;

    if (!vn_device_ops_valid(ops, error) || !info_valid(info, error)) {
        return NULL;
    }
    if (strlen(socket_path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "socket %s: path too long",
                    socket_path);
        return NULL;
    }
    s = g_new0(VnServer, 1);
    s->listen_fd = -1;
    s->path = g_strdup(socket_path);
    s->ctx = g_main_context_ref(ctx != NULL ? ctx : g_main_context_default());
    s->info = *info;
    s->ops = ops;
    s->opaque = opaque;
    s->dma = vn_dma_new();
    s->irqs = vn_irqs_new(info->irq_count, info->num_irqs);
    s->out = g_byte_array_sized_new(4096);
    vn_wire_parse_caps(NULL, &s->caps, NULL);
    return s;
}

static void client_src_new(VnServer *s)
{
    s->client_src =
        vn_util_fd_source_new(vn_transport_fd(s->client), G_IO_IN | G_IO_HUP | G_IO_ERR);
    g_source_set_callback(s->client_src, G_SOURCE_FUNC(on_client), s, NULL);
    g_source_attach(s->client_src, s->ctx);
}

/* Serve @cfd, a connected client's socket (taken). */
static void client_attach(VnServer *s, int cfd)
{
    s->client = vn_transport_new(cfd);
    s->client_gen++;
    client_src_new(s);
}

uint64_t vn_server_later(VnServer *s)
{
    if (s->handling == NULL) {
        return 0; /* no command: a client going (client_drop()) waits for nothing */
    }
    if (s->later == 0) {
        s->later = vn_server_replies_owe(s, s->handling);
    }
    return s->later;
}

static void answered(VnServer *s, int ret)
{
    if (ret > 0) {
        return;
    }
    if (ret < 0 && s->held_error == 0) {
        s->held_error = ret; /* dropped by the loop (on_held), not inside the device's call */
    }
    if (ret < 0 || (s->paused && s->deferred < VN_SERVER_MAX_DEFERRED && s->stopped == 0)) {
        client_watch(s, true);
    }
}

uint64_t vn_server_pause(VnServer *s)
{
    if (s->client == NULL) {
        return 0;
    }
    s->stopped++;
    return s->client_gen;
}

bool vn_server_resume(VnServer *s, uint64_t pause)
{
    if (pause == 0 || pause != s->client_gen || s->client == NULL || s->stopped == 0) {
        return false;
    }
    if (--s->stopped == 0 && s->paused && s->deferred < VN_SERVER_MAX_DEFERRED) {
        client_watch(s, true);
    }
    return true;
}

void vn_server_complete_read(VnServer *s, uint64_t reply_id, const void *data, uint32_t count)
{
    answered(s, vn_server_replies_done(s, reply_id, 0, data, count));
}

void vn_server_complete(VnServer *s, uint64_t reply_id, int err)
{
    answered(s, vn_server_replies_done(s, reply_id, err, NULL, 0));
}

static void client_watch(VnServer *s, bool on)
{
    if (s->client == NULL) {
        return;
    }
    if (!on) {
        if (s->client_src != NULL) {
            g_source_destroy(s->client_src);
            g_clear_pointer(&s->client_src, g_source_unref);
        }
        s->paused = true;
        return;
    }
    if (s->paused) {
        s->paused = false;
        client_src_new(s);
    }
    vn_server_held_arm(s); /* what the transport read already, or held_error */
}

static bool socket_is(int fd, bool listening)
{
    int type = 0, acc = 0;
    socklen_t len = sizeof(type), alen = sizeof(acc);
    struct sockaddr_un addr;
    socklen_t addrlen = sizeof(addr);

    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
           getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) == 0 && (acc != 0) == listening &&
           getsockname(fd, (struct sockaddr *)&addr, &addrlen) == 0 && addr.sun_family == AF_UNIX;
}

VnServer *vn_server_adopt(const char *socket_path, int listen_fd, int client_fd,
                          const VnWireCaps *caps, const VnDeviceInfo *info, const VnDeviceOps *ops,
                          void *opaque, GMainContext *ctx, GError **error)
{
    g_autoptr(VnServer) s = NULL;

    if (!socket_is(listen_fd, true) || (client_fd >= 0 && !socket_is(client_fd, false))) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "socket %s: the fds to take over are no listening UNIX socket and its "
                    "client",
                    socket_path);
        vn_util_close_fd(&listen_fd);
        vn_util_close_fd(&client_fd);
        return NULL;
    }
    s = server_alloc(socket_path, info, ops, opaque, ctx, error);
    if (s == NULL || !g_unix_set_fd_nonblocking(listen_fd, TRUE, error)) {
        if (s != NULL) {
            g_clear_pointer(&s->path, g_free); /* not ours to unlink */
        }
        vn_util_close_fd(&listen_fd);
        vn_util_close_fd(&client_fd);
        return NULL;
    }
    s->listen_fd = listen_fd;
    if (client_fd < 0) {
        listen_arm(s);
    } else {
        client_attach(s, client_fd);
        s->caps = *caps;
        s->versioned = true;
        s->stats.clients++;
    }
    g_info("socket %s: taken over%s", socket_path, client_fd >= 0 ? ", with its client" : "");
    return g_steal_pointer(&s);
}

VnServer *vn_server_new(const char *socket_path, const VnDeviceInfo *info, const VnDeviceOps *ops,
                        void *opaque, GMainContext *ctx, GError **error)
{
    g_autoptr(VnServer) s = server_alloc(socket_path, info, ops, opaque, ctx, error);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };

    if (s == NULL) {
        return NULL;
    }
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->listen_fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "socket %s: %s", socket_path,
                    g_strerror(errno));
        return NULL;
    }
    strcpy(addr.sun_path, socket_path);
    /* A socket our last run left (killed, it could not unlink it) is taken
     * over; one a live server listens on is not. */
    if (vn_util_socket_path_claim(socket_path) == VN_UTIL_SOCKET_LIVE) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE,
                    "socket %s: another server listens on it", socket_path);
        g_clear_pointer(&s->path, g_free); /* not ours to unlink on free */
        return NULL;
    }
    if (bind(s->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        chmod(socket_path, 0600) < 0 || listen(s->listen_fd, 4) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "socket %s: %s", socket_path,
                    g_strerror(errno));
        if (errno != EADDRINUSE) {
            unlink(socket_path);
        }
        g_clear_pointer(&s->path, g_free); /* not ours to unlink on free */
        return NULL;
    }
    listen_arm(s);
    g_info("socket %s: listening", socket_path);
    return g_steal_pointer(&s);
}

void vn_server_free(VnServer *s)
{
    if (s == NULL) {
        return;
    }
    if (s->ops != NULL && s->client != NULL) {
        client_drop(s, "server stopping");
    }
    held_clear(s);
    listen_disarm(s);
    vn_util_close_fd(&s->listen_fd);
    if (s->path != NULL) {
        unlink(s->path);
    }
    vn_irqs_free(s->irqs);
    vn_dma_free(s->dma);
    if (s->out != NULL) {
        g_byte_array_unref(s->out);
    }
    if (s->ctx != NULL) {
        g_main_context_unref(s->ctx);
    }
    g_free(s->path);
    g_free(s);
}

VnDma *vn_server_dma(VnServer *s)
{
    return s->dma;
}

VnIrqs *vn_server_irqs(VnServer *s)
{
    return s->irqs;
}

bool vn_server_has_client(VnServer *s)
{
    return s->client != NULL;
}

void vn_server_disconnect(VnServer *s)
{
    client_drop(s, "dropped by the server");
}

void vn_server_stats(VnServer *s, VnServerStats *out)
{
    *out = s->stats;
}

typedef struct Counter {
    const char *name;
    uint64_t value;
} Counter;

static void add_counters(JsonBuilder *b, const Counter *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_builder_set_member_name(b, c[i].name);
        json_builder_add_int_value(b, (gint64)c[i].value);
    }
}

char *vn_server_stats_json(VnServer *s)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    const Counter head[] = {
        { "clients", s->stats.clients },
        { "messages", s->stats.messages },
        { "errors", s->stats.errors },
        { "region_reads", s->stats.region_reads },
        { "region_writes", s->stats.region_writes },
    };
    const Counter tail[] = {
        { "dma_maps", s->stats.dma_maps },
        { "dma_unmaps", s->stats.dma_unmaps },
        { "dma_mappings_now", vn_dma_count(s->dma) },
        { "irqs_signalled", vn_irqs_signalled(s->irqs) },
        { "irq_vectors_armed", vn_irqs_armed(s->irqs) },
        { "resets", s->stats.resets },
        { "client_dma_reads", s->stats.client_dma_reads },
        { "client_dma_writes", s->stats.client_dma_writes },
        { "client_dma_failures", s->stats.client_dma_failures },
        { "region_maps", s->stats.region_maps },
        { "region_map_failures", s->stats.region_map_failures },
    };

    json_builder_begin_object(b);
    add_counters(b, head, G_N_ELEMENTS(head));
    json_builder_set_member_name(b, "region_rw");
    json_builder_begin_object(b);
    for (uint32_t i = 0; i < s->info.num_regions; i++) {
        g_autofree char *key = g_strdup_printf("%u", i);

        json_builder_set_member_name(b, key);
        json_builder_add_int_value(b, (gint64)s->stats.per_region_rw[i]);
    }
    json_builder_end_object(b);
    add_counters(b, tail, G_N_ELEMENTS(tail));
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return json_to_string(root, FALSE);
}

bool vn_server_client_maps_regions(VnServer *s)
{
    return s->client != NULL && s->versioned && s->caps.region_map;
}

const VnWireCaps *vn_server_caps(VnServer *s)
{
    return &s->caps;
}

int vn_server_listen_fd(VnServer *s)
{
    return s->listen_fd;
}

int vn_server_client_fd(VnServer *s)
{
    return s->client != NULL ? vn_transport_fd(s->client) : -1;
}
