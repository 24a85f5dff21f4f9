/*
 * Interrupt routes (see fabric.h): the node that takes interrupts exports an
 * eventfd of its own; its peer opens the route through the backend and gets
 * a local fd that its device signals.  Only backends with
 * VN_FABRIC_CAP_DIRECT_ROUTES carry them; everyone else relays interrupts
 * as doorbells.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "fabric-int.h"

#include "common/name.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "trace-fabric.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <unistd.h>

static bool routes_supported(VnFabric *fab, GError **error)
{
    if ((fab->caps & VN_FABRIC_CAP_DIRECT_ROUTES) == 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "node %s: the %s fabric carries no interrupt routes (relay interrupts "
                    "as doorbells)",
                    fab->node, fab->ops->name);
        return false;
    }
    return true;
}

/* What an export of a route takes here: our dup of @eventfd, or -1 with @error. */
static int route_check(VnFabric *fab, int eventfd, const char *peer, GError **error)
{
    int copy;

    if (!routes_supported(fab, error)) {
        return -1;
    }
    if (!vn_name_valid(VN_NAME_NODE, peer)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot route interrupts from \"%s\": not a node name", fab->node,
                    peer != NULL ? peer : "(null)");
        return -1;
    }
    if (g_hash_table_size(fab->routes) >= VN_FABRIC_MAX_ROUTES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: already %u interrupt routes exported", fab->node,
                    (unsigned)VN_FABRIC_MAX_ROUTES);
        return -1;
    }
    /* The peer's device signals what we hand out; a pipe or a socket there
     * could wedge it. */
    if (vn_peerfd_eventfd(eventfd) < 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: fd %d is not an eventfd", fab->node, eventfd);
        return -1;
    }
    copy = fcntl(eventfd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "node %s: cannot keep fd %d: %s",
                    fab->node, eventfd, g_strerror(e));
    }
    return copy;
}

uint64_t vn_fabric_route_export(VnFabric *fab, int eventfd, const char *peer, GError **error)
{
    int copy;

    if (vn_fabric_waits_refused(fab, fab->ops->export_async != NULL, "an export", error)) {
        return 0;
    }
    copy = route_check(fab, eventfd, peer, error);
    return copy < 0
               ? 0
               : vn_fabric_export_insert(fab, ++fab->last_route, copy, 0, 0, false, peer, error);
}

void vn_fabric_route_export_async(VnFabric *fab, int eventfd, const char *peer,
                                  VnFabricExportFn done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    int copy = route_check(fab, eventfd, peer, &error);

    if (copy < 0) {
        done(opaque, 0, error);
        return;
    }
    vn_fabric_export_start(fab, copy, 0, 0, false, peer, done, opaque);
}

void vn_fabric_route_unexport(VnFabric *fab, uint64_t id)
{
    VnFabricSegment *route = g_hash_table_lookup(fab->routes, &id);

    if (route == NULL) {
        return;
    }
    g_hash_table_steal(fab->routes, &id);
    if (fab->ops->unexport != NULL && fab->backend != NULL) {
        fab->ops->unexport(fab->backend, true, id);
    }
    trace_fabric_route_unexport(fab->node, id, route->peer);
    vn_fabric_segment_free(route);
}

int vn_fabric_backend_route(VnFabric *fab, const char *peer, uint64_t id)
{
    int err = 0;
    VnFabricSegment *route = vn_fabric_exported(fab, fab->routes, "route", peer, id, &err);

    if (route == NULL) {
        return err;
    }
    if (route->fd < 0) {
        return -ESTALE; /* adopted after a restart: the fd stayed with its worker */
    }
    trace_fabric_route_given(fab->node, id, peer);
    return route->fd;
}

/* Whether route @id of @peer may be asked for at all. */
static int open_check(VnFabric *fab, const char *peer, uint64_t id, GError **error)
{
    if (!routes_supported(fab, error)) {
        return -ENOTSUP;
    }
    if (!vn_name_valid(VN_NAME_NODE, peer) || id == 0 || fab->backend == NULL ||
        vn_fabric_peer(fab, peer) == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_CONNECTED,
                    "node %s: no route %" PRIu64 " of \"%s\" to open (no link)", fab->node, id,
                    peer != NULL ? peer : "(null)");
        return -ENOTCONN;
    }
    return 0;
}

/* The backend's answer @fd (or -errno) to the open of @peer's route @id, checked. */
static int open_finish(VnFabric *fab, const char *peer, uint64_t id, int fd, GError **error)
{
    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-fd),
                    "node %s: cannot open %s's interrupt route %" PRIu64 ": %s", fab->node, peer,
                    id,
                    fd == -ENOENT   ? "it has no such route"
                    : fd == -EACCES ? "it is not exported to us"
                                    : g_strerror(-fd));
        return fd;
    }
    /* What the device will signal from its own thread: an eventfd only. */
    if (vn_peerfd_eventfd(fd) < 0) {
        fab->stats.bad_messages++;
        close(fd);
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "node %s: %s's interrupt route %" PRIu64 " is not an eventfd", fab->node, peer,
                    id);
        return -EINVAL;
    }
    fab->stats.routes_opened++;
    trace_fabric_route_open(fab->node, id, peer);
    return fd;
}

/* A route open under way (vn_fabric_route_open_async). */
typedef struct VnFabricRouting {
    VnFabric *fab;
    char peer[VN_MAX_NODE_NAME + 1];
    uint64_t id;
    VnFabricRouteFn done;
    void *opaque;
} VnFabricRouting;

static void route_opened(void *opaque, int fd)
{
    VnFabricRouting *r = opaque;
    VnFabric *fab = r->fab;
    g_autoptr(GError) error = NULL;

    if (fab->backend == NULL) {
        /* Closing: the route goes with the fabric. */
        vn_util_close_fd(&fd);
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_CANCELLED, "node %s: closing", fab->node);
        fd = -ECANCELED;
    } else {
        fd = open_finish(fab, r->peer, r->id, fd, &error);
    }
    r->done(r->opaque, fd, error);
    g_free(r);
}

void vn_fabric_route_open_async(VnFabric *fab, const char *peer, uint64_t id, VnFabricRouteFn done,
                                void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnFabricRouting *r;
    int fd;

    fd = open_check(fab, peer, id, &error);
    if (fd < 0) {
        done(opaque, fd, error);
        return;
    }
    r = g_new0(VnFabricRouting, 1);
    *r = (VnFabricRouting){ .fab = fab, .id = id, .done = done, .opaque = opaque };
    g_strlcpy(r->peer, peer, sizeof(r->peer));
    fab->ops->open_route_async(fab->backend, peer, id, fab->request_timeout_ms, route_opened, r);
}

void vn_fabric_routes_init(VnFabric *fab)
{
    fab->routes = g_hash_table_new(g_int64_hash, g_int64_equal);
}

static gboolean route_remove(gpointer key, gpointer value, gpointer data)
{
    vn_fabric_segment_free(value);
    return TRUE;
}

void vn_fabric_routes_close(VnFabric *fab)
{
    if (fab->routes != NULL) {
        g_hash_table_foreach_remove(fab->routes, route_remove, NULL);
        g_clear_pointer(&fab->routes, g_hash_table_unref);
    }
}
