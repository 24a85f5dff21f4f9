/*
 * Segments through windows on the `ntb` backend (ntb.h), and the requests that wait for a
 * peer's answer (maps here, routes' opens in ntb-route.c): the exporter
 * points one of its inbound windows 1..N-1 at the segment and answers which;
 * the mapper maps its outbound window of that number.  An answer that comes
 * after its map gave up has its window handed back at once, so a slow
 * answer never leaks one of the exporter's scarce windows.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntb-int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

/*
 * A map (or a route's open, ntb-route.c) waiting for the exporter's answer, or for its
 * answer to be told: in the node's list until then, so that closing cancels it.
 */
struct VnNtbMapping {
    VnNtb *ntb;
    VnNtbLink *l;  /* NULL: refused before it was asked */
    uint16_t kind; /* the request's record: VN_NTB_REC_MAP or _ROUTE */
    uint64_t seq;
    uint64_t id;
    VnNtbMapDone done;
    void *opaque;
    GSource *src; /* its timeout, then its delivery */
    bool finished;
    int fd; /* or -errno */
    uint64_t size, offset;
};

static void mapping_free(VnNtbMapping *m)
{
    if (m->src != NULL) {
        g_source_destroy(m->src);
        g_source_unref(m->src);
    }
    if (m->fd >= 0) {
        close(m->fd);
    }
    g_free(m);
}

/* The source of @m is running and ends as it returns: told, then freed. */
static gboolean mapping_tell(VnNtbMapping *m, int fd)
{
    g_queue_remove(&m->ntb->maps, m);
    g_clear_pointer(&m->src, g_source_unref);
    m->fd = -1;
    m->done(m->opaque, fd, m->size, m->offset);
    mapping_free(m);
    return G_SOURCE_REMOVE;
}

static gboolean mapping_deliver(gpointer data)
{
    VnNtbMapping *m = data;

    return mapping_tell(m, m->fd); /* the fd is the caller's now */
}

static gboolean mapping_timeout(gpointer data)
{
    VnNtbMapping *m = data;

    m->size = m->offset = 0;
    return mapping_tell(m, -ETIMEDOUT); /* a late answer gives its window back */
}

/* The answer is in (@fd or -errno): the map hears it from the loop, never from inside
 * whatever call received it. */
static void mapping_finish(VnNtbMapping *m, int fd, uint64_t size, uint64_t offset)
{
    m->finished = true;
    m->fd = fd;
    m->size = size;
    m->offset = offset;
    if (m->src != NULL) {
        g_source_destroy(m->src);
        g_source_unref(m->src);
    }
    m->src = g_idle_source_new();
    g_source_set_callback(m->src, mapping_deliver, m, NULL);
    g_source_attach(m->src, m->ntb->ctx);
}

void vn_ntb_maps_end(VnNtb *ntb, VnNtbLink *l, int err)
{
    GList *next;

    for (GList *it = ntb->maps.head; it != NULL; it = next) {
        VnNtbMapping *m = it->data;

        next = it->next;
        if (l != NULL && m->l != l) {
            continue;
        }
        if (err == -ECANCELED) {
            /* Closing: told now, as fabric.h allows. */
            g_queue_delete_link(&ntb->maps, it);
            m->done(m->opaque, -ECANCELED, 0, 0);
            mapping_free(m);
        } else if (!m->finished) {
            mapping_finish(m, err, 0, 0);
        }
    }
}

VnNtbMapping *vn_ntb_asked(VnNtbLink *l, uint16_t kind, uint64_t seq)
{
    for (GList *it = l->ntb->maps.head; it != NULL; it = it->next) {
        VnNtbMapping *m = it->data;

        if (m->l == l && !m->finished && m->seq == seq && m->kind == kind) {
            return m;
        }
    }
    return NULL;
}

uint64_t vn_ntb_asked_id(const VnNtbMapping *m)
{
    return m->id;
}

void vn_ntb_ask_finish(VnNtbMapping *m, int fd, uint64_t size, uint64_t offset)
{
    mapping_finish(m, fd, size, offset);
}

VnNtbMapping *vn_ntb_ask(VnNtb *ntb, VnNtbLink *l, uint16_t kind, uint64_t id, int timeout_ms,
                         VnNtbMapDone done, void *opaque)
{
    VnNtbMap req = { .id = id };
    VnNtbMapping *m = g_new0(VnNtbMapping, 1);
    unsigned waiting = 0;
    int err = 0;

    *m = (VnNtbMapping){
        .ntb = ntb, .kind = kind, .id = id, .done = done, .opaque = opaque, .fd = -1
    };
    g_queue_push_tail(&ntb->maps, m);
    for (GList *it = ntb->maps.head; l != NULL && it != NULL; it = it->next) {
        waiting += ((VnNtbMapping *)it->data)->l == l;
    }
    if (l == NULL || l->state != VN_NTB_LINK_OPEN) {
        err = -ENOTCONN;
    } else if (waiting >= VN_NTB_MAX_MAPS_PENDING) {
        err = -EBUSY;
    } else {
        req.seq = ++l->map_seq;
        err = vn_ntb_queue(l, kind, 0, &req, sizeof(req)) < 0 ? -ENOBUFS : 0;
    }
    if (err < 0) {
        mapping_finish(m, err, 0, 0);
        return m;
    }
    m->l = l;
    m->seq = req.seq;
    vn_ntb_flush(l);
    m->src = g_timeout_source_new((guint)timeout_ms);
    g_source_set_callback(m->src, mapping_timeout, m, NULL);
    g_source_attach(m->src, ntb->ctx);
    return m;
}

void vn_ntb_map_segment_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                              VnNtbMapDone done, void *opaque)
{
    VnNtb *ntb = backend;

    vn_ntb_ask(ntb, vn_ntb_link_of(ntb, peer), VN_NTB_REC_MAP, id, timeout_ms, done, opaque);
}

/* ---- the exporter's side ------------------------------------------------- */

void vn_ntb_on_map(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbMapped ans = { .status = EINVAL };
    uint64_t size = 0, offset = 0;
    bool device = false;
    VnNtbMap req;
    uint32_t w;
    int fd, ret;

    if (len != sizeof(req) || !l->reported) {
        vn_ntb_session_broken(l, "a bad MAP");
        return;
    }
    memcpy(&req, payload, sizeof(req));
    ans.seq = req.seq;
    fd = vn_fabric_backend_segment(l->ntb->fab, l->peer, req.id, &size, &offset, &device);
    for (w = 1; w < l->port->info.windows && l->exported[w] != 0; w++) {
    }
    if (fd < 0) {
        ans.status = -fd;
    } else if (w == l->port->info.windows) {
        ans.status = ENOSPC;
        g_info("node %s: ntb port %s: %s's map of segment %" PRIu64 " refused: all %u windows "
               "to it in use",
               l->ntb->node, l->port->spec, l->peer, req.id, l->port->info.windows - 1);
    } else if ((ret = l->port->ops->in_export(l->port, w, fd, offset, size)) < 0) {
        ans.status = -ret;
    } else {
        /* The mapper maps a device's registers uncached, memory write-combining. */
        l->exported[w] = req.id;
        ans = (VnNtbMapped){ .seq = req.seq,
                             .status = 0,
                             .window = w,
                             .size = size,
                             .flags = device ? VN_NTB_MAPPED_DEVICE : 0 };
        vn_ntb_stash_save(l);
    }
    vn_ntb_queue(l, VN_NTB_REC_MAPPED, 0, &ans, sizeof(ans));
    vn_ntb_flush(l);
}

void vn_ntb_on_unmap(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbMap m;

    if (len != sizeof(m)) {
        vn_ntb_session_broken(l, "a bad UNMAP");
        return;
    }
    memcpy(&m, payload, sizeof(m));
    /* Only a window this peer holds; id 0: whichever segment is there (a
     * map it gave up on before our answer came). */
    if (m.seq > 0 && m.seq < l->port->info.windows && l->exported[m.seq] != 0 &&
        (m.id == 0 || l->exported[m.seq] == m.id)) {
        l->port->ops->in_clear(l->port, (uint32_t)m.seq);
        l->exported[m.seq] = 0;
        vn_ntb_stash_save(l);
    }
}

/* ---- the mapper's side -------------------------------------------------- */

static void give_back(VnNtbLink *l, uint32_t window, uint64_t id)
{
    VnNtbMap m = { .seq = window, .id = id };

    vn_ntb_queue(l, VN_NTB_REC_UNMAP, 0, &m, sizeof(m));
    vn_ntb_flush(l);
}

void vn_ntb_on_mapped(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    uint64_t offset = 0, wsize = 0;
    VnNtbMapping *m;
    VnNtbMapped a;
    int fd;

    if (len != sizeof(a)) {
        vn_ntb_session_broken(l, "a bad MAPPED");
        return;
    }
    memcpy(&a, payload, sizeof(a));
    m = vn_ntb_asked(l, VN_NTB_REC_MAP, a.seq);
    if (a.status == 0 &&
        (a.window == 0 || a.window >= l->port->info.windows || l->mapped[a.window] != 0 ||
         a.size == 0 || (a.flags & ~VN_NTB_MAPPED_DEVICE) != 0 || a.reserved != 0)) {
        vn_ntb_session_broken(l, "a MAPPED naming a window we cannot use");
        return;
    }
    if (m == NULL) {
        if (a.status == 0 && a.seq <= l->map_seq) {
            give_back(l, a.window, 0); /* id unknown here: the exporter checks */
        }
        return;
    }
    if (a.status != 0) {
        mapping_finish(m, a.status > 0 && a.status < 4096 ? -a.status : -EIO, 0, 0);
        return;
    }
    /* The window reaches a new target now: what was mapped for its last one (a QEMU that
     * outlived its lease) must not. */
    if (l->port->ops->out_revoke != NULL && l->port->ops->out_revoke(l->port, a.window) < 0) {
        g_warning("node %s: ntb port %s: window %u: its old mappings could not be revoked",
                  l->ntb->node, l->port->spec, a.window);
    }
    fd =
        l->port->ops->out_fd(l->port, a.window, !(a.flags & VN_NTB_MAPPED_DEVICE), &offset, &wsize);
    if (fd >= 0 && a.size > wsize) {
        close(fd);
        fd = -EIO;
    }
    if (fd < 0) {
        give_back(l, a.window, m->id);
        mapping_finish(m, fd, 0, 0);
        return;
    }
    l->mapped[a.window] = m->id;
    vn_ntb_stash_save(l);
    mapping_finish(m, fd, a.size, offset);
}

void vn_ntb_unmap_segment(void *backend, const char *peer, uint64_t id)
{
    VnNtbLink *l = vn_ntb_link_of(backend, peer);

    for (uint32_t w = 1; l != NULL && w < l->port->info.windows; w++) {
        if (l->mapped[w] == id) {
            /* Whatever still maps it (a QEMU that outlived its device) faults from now on,
             * before the exporter can give the window a new target. */
            if (l->port->ops->out_revoke != NULL) {
                l->port->ops->out_revoke(l->port, w);
            }
            l->mapped[w] = 0;
            vn_ntb_stash_save(l);
            give_back(l, w, id);
            return;
        }
    }
}

/* Our windows onto @peer's segments @ids as one file (a BAR larger than a window). */
int vn_ntb_join(void *backend, const char *peer, const uint64_t *ids, uint32_t n, uint64_t chunk,
                bool device, uint64_t *offset)
{
    VnNtbLink *l = vn_ntb_link_of(backend, peer);
    uint32_t wins[VN_FABRIC_MAX_JOIN];

    if (l == NULL || n > VN_FABRIC_MAX_JOIN) {
        return l == NULL ? -ENOTCONN : -EINVAL;
    }
    if (l->port->ops->out_span_fd == NULL) {
        return -ENOTSUP;
    }
    for (uint32_t k = 0; k < n; k++) {
        wins[k] = 0;
        for (uint32_t w = 1; w < l->port->info.windows && wins[k] == 0; w++) {
            wins[k] = l->mapped[w] == ids[k] ? w : 0;
        }
        if (wins[k] == 0) {
            return -ENOENT;
        }
    }
    *offset = 0;
    return l->port->ops->out_span_fd(l->port, wins, n, chunk, !device);
}

/* A withdrawn segment: the windows that reach it reach nothing any more. */
void vn_ntb_unexport(void *backend, bool route, uint64_t id)
{
    VnNtb *ntb = backend;

    if (route) {
        vn_ntb_route_unexport(ntb, id);
        return;
    }
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        for (uint32_t w = 1; w < l->port->info.windows; w++) {
            if (l->exported[w] == id) {
                if (!l->withheld[w]) {
                    l->port->ops->in_clear(l->port, w);
                }
                l->exported[w] = 0;
                l->withheld[w] = false;
                vn_ntb_stash_save(l);
            }
        }
    }
}

/* A withheld segment: its windows' translations are cleared (the peer's accesses complete
 * with nothing, all ones, and reach nothing here) and set again when it is given back;
 * the peer keeps its windows meanwhile. */
int vn_ntb_withhold(void *backend, uint64_t id, bool withhold)
{
    VnNtb *ntb = backend;
    int first = 0, changed = 0;

    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        for (uint32_t w = 1; w < l->port->info.windows; w++) {
            uint64_t size = 0, offset = 0;
            int fd, ret = 0;

            if (l->exported[w] != id || l->withheld[w] == withhold) {
                continue;
            }
            if (withhold) {
                ret = l->port->ops->in_clear(l->port, w);
            } else if ((fd = vn_fabric_backend_segment(ntb->fab, l->peer, id, &size, &offset,
                                                       NULL)) < 0) {
                ret = fd;
            } else {
                ret = l->port->ops->in_export(l->port, w, fd, offset, size);
            }
            if (ret == 0) {
                l->withheld[w] = withhold;
                vn_ntb_stash_save(l);
                changed++;
            }
            g_info("node %s: ntb port %s: window %u onto segment %" PRIu64 " %s: %s", ntb->node,
                   l->port->spec, w, id, withhold ? "withheld" : "given back",
                   ret < 0 ? g_strerror(-ret) : "ok");
            first = first != 0 ? first : ret;
        }
    }
    return first < 0 ? first : changed;
}
