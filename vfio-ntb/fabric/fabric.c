/*
 * The NTB fabric (see fabric.h): the backend registry and a node's life.  Its links and
 * the receive path that checks every frame before anything acts on it are in link.c;
 * requests, replies, events and doorbells in msg.c; segments and windows in window.c;
 * the frame codec in frame.c.
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
    fab->peers = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, vn_fabric_peer_free);
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
    vn_fabric_links_close(fab);
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
