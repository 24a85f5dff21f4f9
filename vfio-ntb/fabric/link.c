/*
 * A node's links (see fabric.h): what its backend reports -- frames received, links up
 * and down -- checked and handled in order, deferred while the node is inside a call of
 * its own into the backend (a send, its open), and the small things backends and the layers above
 * ask of a node.  fabric.c opens and closes nodes; msg.c handles the frames' messages.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "fabric-int.h"

#include "common/name.h"
#include "common/util.h"
#include "trace-fabric.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* ---- small things ----------------------------------------------------- */

void vn_fabric_limits_default(VnFabricLimits *l)
{
    *l = (VnFabricLimits){
        .max_windows = 8,
        .max_window_size = 4ull << 30,
        .window_align = 4096,
        .xlat_granularity = 4096,
        .doorbells = 32,
        .max_segments = 64,
    };
}

const char *vn_fabric_node(VnFabric *fab)
{
    return fab->node;
}

const VnFabricLimits *vn_fabric_limits(VnFabric *fab)
{
    return &fab->limits;
}

uint32_t vn_fabric_caps(VnFabric *fab)
{
    return fab->caps;
}

void vn_fabric_backend_set_caps(VnFabric *fab, uint32_t caps)
{
    fab->caps = caps & fab->ops->caps;
}

void vn_fabric_stats(VnFabric *fab, VnFabricStats *out)
{
    *out = fab->stats;
}

bool vn_fabric_link_up(VnFabric *fab, const char *peer)
{
    return peer != NULL && vn_fabric_peer(fab, peer) != NULL;
}

GMainContext *vn_fabric_backend_context(VnFabric *fab)
{
    return fab->ctx;
}

void vn_fabric_backend_set_limits(VnFabric *fab, const VnFabricLimits *limits)
{
    /* Only during ops->open: the window slots are sized from it after. */
    g_return_if_fail(fab->windows == NULL);
    fab->limits = *limits;
}

void vn_fabric_backend_set_max_asked(VnFabric *fab, unsigned n)
{
    g_return_if_fail(n > 0);
    fab->max_asked = MIN(n, VN_FABRIC_MAX_INFLIGHT);
}

void vn_fabric_backend_rejected(VnFabric *fab, const char *what)
{
    fab->stats.bad_messages++;
    g_info("node %s: rejected %s", fab->node, what);
}

void vn_fabric_peer_free(gpointer data)
{
    VnFabricPeer *p = data;

    /* Its held requests stay in the pending table, failed with the link's others
     * (vn_fabric_link_lost). */
    g_queue_clear(&p->held);
    if (p->db_flush != NULL) {
        g_source_destroy(p->db_flush);
        g_source_unref(p->db_flush);
    }
    g_free(p->name);
    g_free(p);
}

/* ---- the receive path ------------------------------------------------- */

/* Handle one frame of @peer's link @gen (perhaps a link already gone, when
 * the frame was queued before its link went down: it still counts). */
static void process_frame(VnFabric *fab, const char *peer, uint64_t gen, const uint8_t *buf,
                          size_t len)
{
    VnFabricFrame f;
    int ret;

    ret = vn_fabric_frame_decode(buf, len, &f);
    if (ret < 0) {
        vn_fabric_bad_frame(fab, peer, &f, ret, "malformed frame");
        return;
    }
    trace_fabric_receive(fab->node, peer, vn_fabric_kind_to_string(f.hdr.flags), f.hdr.id,
                         f.hdr.type, vn_fabric_type_to_string(f.hdr.type), f.hdr.json_len,
                         f.hdr.data_len);

    switch (f.hdr.flags & VN_FABRIC_FLAG_KIND_MASK) {
    case VN_FABRIC_FLAG_REPLY:
        vn_fabric_reply_received(fab, peer, gen, &f);
        break;
    case VN_FABRIC_FLAG_REQUEST:
        vn_fabric_request_received(fab, peer, gen, &f);
        break;
    default:
        vn_fabric_event_received(fab, peer, &f);
        break;
    }
}

/* What the backend reported while we could not act on it. */
typedef enum VnFabricDeferredKind {
    VN_FABRIC_DEFERRED_FRAME,
    VN_FABRIC_DEFERRED_LINK_UP,
    VN_FABRIC_DEFERRED_LINK_DOWN,
    VN_FABRIC_DEFERRED_PATHS_LOST,
    VN_FABRIC_DEFERRED_LAST
} VnFabricDeferredKind;

typedef struct VnFabricDeferred {
    VnFabricDeferredKind kind;
    char peer[VN_MAX_NODE_NAME + 1];
    uint64_t gen;
    VnFabric *fab; /* for the peer's count */
    uint8_t *buf;
    size_t len;
} VnFabricDeferred;

static void deferred_free(gpointer data)
{
    VnFabricDeferred *d = data;
    VnFabricPeer *p = d->kind == VN_FABRIC_DEFERRED_FRAME && d->fab != NULL
                          ? vn_fabric_peer(d->fab, d->peer)
                          : NULL;

    /* The peer's count is of its current link's frames only. */
    if (p != NULL && p->gen == d->gen) {
        p->deferred_frames--;
        p->deferred_bytes -= d->len;
    }
    g_free(d->buf);
    g_free(d);
}

static void handle_link(VnFabric *fab, const char *peer, uint64_t gen, bool up)
{
    if (!up) {
        vn_fabric_link_lost(fab, gen);
    }
    if (fab->handlers.on_link != NULL) {
        fab->handlers.on_link(fab->opaque, peer, up);
    }
    /* Those waiting for it go on once the node has heard (on_link) of it. */
    if (up && fab->connects != NULL && vn_fabric_link_up(fab, peer)) {
        vn_fabric_connects_link_up(fab->connects, peer);
    }
}

static gboolean deferred_dispatch(gpointer data)
{
    VnFabric *fab = data;

    for (int i = 0; i < VN_FABRIC_DEFERRED_BATCH && fab->defer == 0; i++) {
        VnFabricDeferred *d = g_queue_pop_head(&fab->deferred);

        if (d == NULL) {
            break;
        }
        if (d->kind == VN_FABRIC_DEFERRED_FRAME) {
            process_frame(fab, d->peer, d->gen, d->buf, d->len);
        } else if (d->kind == VN_FABRIC_DEFERRED_PATHS_LOST) {
            if (fab->handlers.on_paths_lost != NULL) {
                fab->handlers.on_paths_lost(fab->opaque, d->peer);
            }
        } else {
            handle_link(fab, d->peer, d->gen, d->kind == VN_FABRIC_DEFERRED_LINK_UP);
        }
        deferred_free(d);
    }
    if (g_queue_is_empty(&fab->deferred)) {
        g_clear_pointer(&fab->deferred_src, g_source_unref);
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

/* A backend may report links and frames while it opens (the host backend
 * hears of its lender's peer in its greeting): they wait for the open. */
static bool attached(VnFabric *fab)
{
    return fab->backend != NULL || fab->opening;
}

static bool deferring(VnFabric *fab)
{
    return fab->defer > 0 || !g_queue_is_empty(&fab->deferred);
}

static VnFabricDeferred *defer_item(VnFabric *fab, VnFabricDeferredKind kind, const char *peer,
                                    uint64_t gen)
{
    VnFabricDeferred *d = g_new0(VnFabricDeferred, 1);

    d->kind = kind;
    g_strlcpy(d->peer, peer, sizeof(d->peer));
    d->gen = gen;
    g_queue_push_tail(&fab->deferred, d);
    if (fab->deferred_src == NULL) {
        /* Default priority, not idle: fd sources must not starve it, or
         * what is queued would wait behind a busy peer. */
        fab->deferred_src = g_idle_source_new();
        g_source_set_priority(fab->deferred_src, G_PRIORITY_DEFAULT);
        g_source_set_callback(fab->deferred_src, deferred_dispatch, fab, NULL);
        g_source_attach(fab->deferred_src, fab->ctx);
    }
    return d;
}

void vn_fabric_backend_received(VnFabric *fab, const char *peer, const uint8_t *buf, size_t len)
{
    char name[VN_MAX_NODE_NAME + 1];
    VnFabricPeer *p = peer != NULL ? vn_fabric_peer(fab, peer) : NULL;
    VnFabricDeferred *d;

    if (p == NULL || !attached(fab)) {
        /* A backend bug (frames before link up), or a closing node. */
        g_warning("node %s: frame from %s, whose link is not up, dropped", fab->node,
                  peer != NULL ? peer : "(null)");
        return;
    }
    if (!deferring(fab)) {
        /* A copy of the name: a handler may end the link and free @p. */
        g_strlcpy(name, p->name, sizeof(name));
        process_frame(fab, name, p->gen, buf, len);
        return;
    }
    if (p->dropping || p->deferred_frames >= VN_FABRIC_MAX_DEFERRED_FRAMES ||
        p->deferred_bytes + len > VN_FABRIC_MAX_DEFERRED_BYTES) {
        fab->stats.bad_messages++;
        if (!p->dropping) {
            g_warning("node %s: %s has %u frames (%zu bytes) queued while we wait on a "
                      "request, the most a peer may; dropping its link",
                      fab->node, p->name, p->deferred_frames, p->deferred_bytes);
            p->dropping = true;
            fab->ops->disconnect(fab->backend, p->name);
        }
        return;
    }
    d = defer_item(fab, VN_FABRIC_DEFERRED_FRAME, peer, p->gen);
    d->fab = fab;
    d->buf = g_memdup2(buf, len);
    d->len = len;
    p->deferred_frames++;
    p->deferred_bytes += len;
}

void vn_fabric_backend_link(VnFabric *fab, const char *peer, bool up)
{
    VnFabricPeer *p;
    uint64_t gen;

    if (!attached(fab) || !vn_name_valid(VN_NAME_NODE, peer)) {
        g_warning("node %s: link report for \"%s\" ignored", fab->node,
                  peer != NULL ? peer : "(null)");
        return;
    }
    p = vn_fabric_peer(fab, peer);
    if (up) {
        if (p != NULL) {
            return;
        }
        p = g_new0(VnFabricPeer, 1);
        p->name = g_strdup(peer);
        p->fab = fab;
        p->db_tokens = MIN(VN_FABRIC_DOORBELL_BURST, fab->doorbell_rate);
        p->db_refilled = g_get_monotonic_time();
        p->gen = ++fab->last_gen;
        gen = p->gen;
        g_hash_table_insert(fab->peers, p->name, p);
    } else {
        if (p == NULL) {
            return;
        }
        gen = p->gen;
        /* link_up() must tell the truth at once; what depends on the link
         * going (failing its requests, on_link) follows in order. */
        g_hash_table_remove(fab->peers, peer);
    }
    g_info("node %s: link to %s %s", fab->node, peer, up ? "up" : "down");
    if (deferring(fab)) {
        defer_item(fab, up ? VN_FABRIC_DEFERRED_LINK_UP : VN_FABRIC_DEFERRED_LINK_DOWN, peer, gen);
    } else {
        char name[VN_MAX_NODE_NAME + 1];

        g_strlcpy(name, peer, sizeof(name));
        handle_link(fab, name, gen, up);
    }
}

void vn_fabric_backend_paths_lost(VnFabric *fab, const char *peer)
{
    char name[VN_MAX_NODE_NAME + 1];

    if (!attached(fab) || !vn_name_valid(VN_NAME_NODE, peer)) {
        return;
    }
    g_info("node %s: the windows and routes with %s are gone", fab->node, peer);
    if (deferring(fab)) {
        defer_item(fab, VN_FABRIC_DEFERRED_PATHS_LOST, peer, 0);
    } else if (fab->handlers.on_paths_lost != NULL) {
        g_strlcpy(name, peer, sizeof(name));
        fab->handlers.on_paths_lost(fab->opaque, name);
    }
}

void vn_fabric_links_close(VnFabric *fab)
{
    if (fab->deferred_src != NULL) {
        g_source_destroy(fab->deferred_src);
        g_clear_pointer(&fab->deferred_src, g_source_unref);
    }
    g_queue_clear_full(&fab->deferred, deferred_free);
}
