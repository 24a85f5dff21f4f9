/*
 * The NTB fabric (see fabric.h): the backend registry, a node's life, its
 * links, and the receive path that checks every frame before anything acts
 * on it.  Requests, replies, events and doorbells are in msg.c; segments and
 * windows in window.c; the frame codec in frame.c.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "fabric-int.h"
#include "host.h"
#include "ntb.h"
#include "shm.h"

#include "common/lock.h"
#include "common/name.h"
#include "common/util.h"
#include "trace-fabric.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <string.h>

/* ---- backend registry ------------------------------------------------- */

/* Registration may come from any thread; lookups take the same lock. */
static VnMutex registry_lock = VN_MUTEX_INIT;
static GHashTable *registry; /* name -> const VnFabricOps * */

bool vn_fabric_ops_valid(const VnFabricOps *ops, GError **error)
{
    const char *missing = NULL;

    if (ops == NULL) {
        missing = "the table";
    } else if (ops->name == NULL || ops->name[0] == '\0') {
        missing = "name";
    } else if (ops->open == NULL) {
        missing = "open";
    } else if (ops->close == NULL) {
        missing = "close";
    } else if (ops->connect == NULL) {
        missing = "connect";
    } else if (ops->send == NULL) {
        missing = "send";
    } else if (ops->disconnect == NULL) {
        missing = "disconnect";
    } else if (ops->map_segment_async == NULL) {
        missing = "map_segment_async";
    } else if ((ops->caps & VN_FABRIC_CAP_DIRECT_ROUTES) && ops->open_route_async == NULL) {
        missing = "open_route_async (for VN_FABRIC_CAP_DIRECT_ROUTES)";
    }
    /* check_params, ping and discover are optional. */
    if (missing != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "fabric ops: %s is required",
                    missing);
        return false;
    }
    if ((ops->caps & ~VN_FABRIC_CAPS_KNOWN) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "fabric ops %s: unknown capability flags 0x%x", ops->name,
                    ops->caps & ~VN_FABRIC_CAPS_KNOWN);
        return false;
    }
    return true;
}

bool vn_fabric_register(const VnFabricOps *ops, GError **error)
{
    bool ok = true;

    if (!vn_fabric_ops_valid(ops, error)) {
        return false;
    }
    vn_mutex_lock(&registry_lock);
    if (registry == NULL) {
        registry = g_hash_table_new(g_str_hash, g_str_equal);
    }
    if (g_hash_table_contains(registry, ops->name)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_EXISTS, "fabric backend %s is already registered",
                    ops->name);
        ok = false;
    } else {
        g_hash_table_insert(registry, (gpointer)ops->name, (gpointer)ops);
    }
    vn_mutex_unlock(&registry_lock);
    return ok;
}

static gpointer register_builtin(gpointer data)
{
    /* Fails only when the program registered its own "shm" or "host"
     * first: then that one is used, which is what it asked for. */
    vn_fabric_register(&vn_shm_ops, NULL);
    vn_fabric_register(&vn_host_ops, NULL);
    vn_fabric_register(&vn_ntb_ops, NULL);
    return NULL;
}

static const VnFabricOps *backend_lookup(const char *name)
{
    static GOnce once = G_ONCE_INIT;
    const VnFabricOps *ops;

    g_once(&once, register_builtin, NULL);
    vn_mutex_lock(&registry_lock);
    ops = name != NULL ? g_hash_table_lookup(registry, name) : NULL;
    vn_mutex_unlock(&registry_lock);
    return ops;
}

static int by_name(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "no fabric backend X (known: host, ntb, shm)": every registered one. */
static void no_backend(const char *name, GError **error)
{
    g_autoptr(GPtrArray) names = g_ptr_array_new();
    g_autofree char *list = NULL;
    GHashTableIter it;
    gpointer key;

    (void)backend_lookup(NULL); /* registers the built-in ones */
    vn_mutex_lock(&registry_lock);
    g_hash_table_iter_init(&it, registry);
    while (g_hash_table_iter_next(&it, &key, NULL)) {
        g_ptr_array_add(names, key);
    }
    vn_mutex_unlock(&registry_lock);
    g_ptr_array_sort(names, by_name);
    g_ptr_array_add(names, NULL);
    list = g_strjoinv(", ", (char **)names->pdata);
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND, "no fabric backend \"%.40s\" (known: %s)",
                name != NULL ? name : "(null)", list);
}

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

VnFabricPeer *vn_fabric_peer(VnFabric *fab, const char *name)
{
    return g_hash_table_lookup(fab->peers, name);
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

void vn_fabric_backend_hold(VnFabric *fab)
{
    fab->defer++;
}

void vn_fabric_backend_release(VnFabric *fab)
{
    fab->defer--;
}

void vn_fabric_backend_rejected(VnFabric *fab, const char *what)
{
    fab->stats.bad_messages++;
    g_info("node %s: rejected %s", fab->node, what);
}

static void peer_free(gpointer data)
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

void vn_fabric_msg_view(VnFabricMsg *msg, const char *peer, const VnFabricFrame *f)
{
    memset(msg, 0, sizeof(*msg));
    msg->peer = peer;
    msg->type = f->hdr.type;
    msg->json = f->json;
    msg->data = f->data;
    msg->data_len = f->hdr.data_len;
}

void vn_fabric_bad_frame(VnFabric *fab, const char *peer, const VnFabricFrame *f, int err,
                         const char *why)
{
    g_autofree char *message = g_strdup_printf("%s: %s", why, g_strerror(-err));

    fab->stats.bad_messages++;
    g_info("node %s: bad frame from %s (%s id %" PRIu64 " type 0x%x): %s", fab->node, peer,
           vn_fabric_kind_to_string(f->hdr.flags), f->hdr.id, f->hdr.type, message);
    if (vn_fabric_frame_replyable(f)) {
        vn_fabric_send_error(fab, peer, f->hdr.id, f->hdr.type, err, message);
    }
}

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

/* ---- a node's life ---------------------------------------------------- */

/* The fabric's own parameters into @fab (request-timeout-ms, doorbell-rate); the rest go
 * to the backend (into @rest). */
static bool take_params(GHashTable *params, VnFabric *fab, GHashTable *rest, const char **bad,
                        GError **error)
{
    GHashTableIter it;
    gpointer key, value;

    if (params == NULL) {
        return true;
    }
    g_hash_table_iter_init(&it, params);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        if (strcmp(key, "request-timeout-ms") == 0) {
            guint64 ms;

            if (!g_ascii_string_to_unsigned(value, 10, 1, VN_FABRIC_MAX_TIMEOUT_MS, &ms, error)) {
                g_prefix_error(error, "request-timeout-ms: ");
                *bad = key;
                return false;
            }
            fab->request_timeout_ms = (int)ms;
        } else if (strcmp(key, "doorbell-rate") == 0) {
            guint64 rate;

            if (!g_ascii_string_to_unsigned(value, 10, VN_FABRIC_MIN_DOORBELL_RATE,
                                            VN_FABRIC_MAX_DOORBELL_RATE, &rate, error)) {
                g_prefix_error(error, "doorbell-rate: ");
                *bad = key;
                return false;
            }
            fab->doorbell_rate = (uint32_t)rate;
        } else {
            g_hash_table_insert(rest, key, value);
        }
    }
    return true;
}

bool vn_fabric_params_check(const char *backend, GHashTable *params, const char **bad,
                            GError **error)
{
    g_autoptr(GHashTable) rest = g_hash_table_new(g_str_hash, g_str_equal);
    const VnFabricOps *ops = backend_lookup(backend);
    const char *key = NULL;
    VnFabric scratch = { 0 };

    if (ops == NULL) {
        no_backend(backend, error);
    } else if (take_params(params, &scratch, rest, &key, error) &&
               (ops->check_params == NULL || ops->check_params(rest, &key, error))) {
        return true;
    }
    if (bad != NULL) {
        *bad = key;
    }
    return false;
}

VnFabric *vn_fabric_open(const char *backend, const char *node, GHashTable *params,
                         const VnFabricHandlers *handlers, void *opaque, GMainContext *ctx,
                         GError **error)
{
    g_autoptr(VnFabric) fab = NULL;
    g_autoptr(GHashTable) rest = g_hash_table_new(g_str_hash, g_str_equal);
    const VnFabricOps *ops = backend_lookup(backend);
    const char *bad = NULL;

    if (ops == NULL) {
        no_backend(backend, error);
        return NULL;
    }
    if (!vn_name_valid(VN_NAME_NODE, node)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node name \"%s\" is invalid (want [a-z0-9][a-z0-9-]*, at most %d)",
                    node != NULL ? node : "(null)", VN_MAX_NODE_NAME);
        return NULL;
    }
    fab = g_new0(VnFabric, 1);
    fab->node = g_strdup(node);
    fab->ops = ops;
    fab->caps = ops->caps;
    /* Ids are never reused, not even by a node that restarted (a peer may
     * still hold a window onto an old one): they start at the wall clock's
     * microseconds, below 2^53 (exact as JSON numbers) for centuries. */
    fab->last_segment = (uint64_t)g_get_real_time();
    fab->last_route = fab->last_segment;
    if (handlers != NULL) {
        fab->handlers = *handlers;
    }
    fab->opaque = opaque;
    fab->ctx = g_main_context_ref(ctx != NULL ? ctx : g_main_context_default());
    fab->connects = g_ptr_array_new();
    vn_fabric_limits_default(&fab->limits);
    fab->request_timeout_ms = VN_FABRIC_REQUEST_TIMEOUT_MS;
    fab->max_asked = VN_FABRIC_MAX_INFLIGHT;
    fab->peers = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, peer_free);
    fab->pending = g_hash_table_new(g_int64_hash, g_int64_equal);
    fab->tokens = g_hash_table_new(g_int64_hash, g_int64_equal);
    fab->segments = g_hash_table_new(g_int64_hash, g_int64_equal);
    g_queue_init(&fab->deferred);
    fab->out = g_byte_array_new();

    fab->doorbell_rate = VN_FABRIC_DOORBELL_RATE;
    if (!take_params(params, fab, rest, &bad, error)) {
        g_prefix_error(error, "node %s: ", node);
        return NULL;
    }
    fab->defer++;
    fab->opening = true;
    fab->backend = ops->open(fab, node, rest, error);
    fab->opening = false;
    fab->defer--;
    if (fab->backend == NULL) {
        return NULL;
    }
    vn_fabric_windows_init(fab);
    vn_fabric_routes_init(fab);
    g_info("node %s: attached to the %s fabric (%u windows of at most %" PRIu64 " bytes)", node,
           ops->name, fab->limits.max_windows, fab->limits.max_window_size);
    return g_steal_pointer(&fab);
}

void vn_fabric_close(VnFabric *fab)
{
    void *backend;

    if (fab == NULL) {
        return;
    }
    backend = g_steal_pointer(&fab->backend);
    if (backend != NULL) {
        fab->ops->close(backend);
        g_info("node %s: detached from the fabric", fab->node);
    }
    if (fab->connects != NULL) {
        vn_fabric_connects_close(g_steal_pointer(&fab->connects));
    }
    if (fab->deferred_src != NULL) {
        g_source_destroy(fab->deferred_src);
        g_clear_pointer(&fab->deferred_src, g_source_unref);
    }
    g_queue_clear_full(&fab->deferred, deferred_free);
    vn_fabric_msgs_close(fab);
    vn_fabric_windows_close(fab);
    vn_fabric_routes_close(fab);
    g_clear_pointer(&fab->peers, g_hash_table_unref);
    g_clear_pointer(&fab->pending, g_hash_table_unref);
    g_clear_pointer(&fab->tokens, g_hash_table_unref);
    g_clear_pointer(&fab->segments, g_hash_table_unref);
    if (fab->out != NULL) {
        g_byte_array_unref(fab->out);
    }
    if (fab->ctx != NULL) {
        g_main_context_unref(fab->ctx);
    }
    g_free(fab->node);
    g_free(fab);
}

GPtrArray *vn_fabric_discover(VnFabric *fab)
{
    if (fab->backend == NULL || fab->ops->discover == NULL) {
        return g_ptr_array_new_with_free_func(g_free);
    }
    return fab->ops->discover(fab->backend);
}

/* ops->connect for @peer (checked first): 0, -EINPROGRESS or -errno, with @error said for
 * the last two. */
static int connect_start(VnFabric *fab, const char *peer, GError **error)
{
    int ret;

    if (!vn_name_valid(VN_NAME_NODE, peer) || strcmp(peer, fab->node) == 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot connect to \"%s\"", fab->node, peer != NULL ? peer : "(null)");
        return -EINVAL;
    }
    if (fab->backend == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_CLOSED, "node %s: closing", fab->node);
        return -ESHUTDOWN;
    }
    if (vn_fabric_link_up(fab, peer)) {
        return 0;
    }
    /* The backend reports the link up from inside; on_link then runs from
     * the main loop, not inside the caller's call. */
    fab->defer++;
    ret = fab->ops->connect(fab->backend, peer);
    fab->defer--;
    if (ret == -EINPROGRESS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_PENDING, "node %s: the link to %s is on its way",
                    fab->node, peer);
    } else if (ret < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret),
                    "node %s: cannot connect to %s: %s", fab->node, peer, g_strerror(-ret));
    }
    return ret;
}

bool vn_fabric_connect(VnFabric *fab, const char *peer, GError **error)
{
    return connect_start(fab, peer, error) == 0;
}

VnFabricConnect *vn_fabric_connect_async(VnFabric *fab, const char *peer, VnFabricConnected done,
                                         void *opaque)
{
    int ret;

    if (fab->connects == NULL) {
        return NULL;
    }
    ret = connect_start(fab, peer, NULL);
    /* Up now, yet reported from the loop (deferred): the answer is 0 at once all the same. */
    return vn_fabric_connects_add(fab->connects, fab->ctx, peer, ret, done, opaque);
}
