/*
 * Segments (see fabric.h): what a node exports for one peer to map, asked of its backend
 * without waiting where its daemon keeps them (a worker's), taken back after a restart,
 * withheld and given back, and looked up when a peer's map comes.  The exporter keeps a dup
 * of each segment's fd and the one peer allowed to map it; its backend answers maps with
 * vn_fabric_backend_segment().  route.c shares the export's bookkeeping.
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
#include <string.h>
#include <unistd.h>

void vn_fabric_segment_free(VnFabricSegment *seg)
{
    vn_util_close_fd(&seg->fd);
    g_free(seg->peer);
    g_free(seg);
}

uint64_t vn_fabric_segment_export(VnFabric *fab, int fd, uint64_t size, const char *peer,
                                  GError **error)
{
    return vn_fabric_segment_export_at(fab, fd, 0, size, peer, error);
}

/* What an export of a segment takes here: our dup of @fd, or -1 with @error. */
static int segment_check(VnFabric *fab, int fd, uint64_t offset, uint64_t size, const char *peer,
                         bool *device, GError **error)
{
    const char *why;
    int copy;

    if (!vn_name_valid(VN_NAME_NODE, peer)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot export a segment to \"%s\": not a node name", fab->node,
                    peer != NULL ? peer : "(null)");
        return -1;
    }
    if (size == 0 || size > VN_FABRIC_MAX_SEGMENT_SIZE) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: a segment of %" PRIu64 " bytes cannot be exported", fab->node, size);
        return -1;
    }
    /* Each export takes an inbound window (a translation) of the host's. */
    if (g_hash_table_size(fab->segments) >= MIN(fab->limits.max_segments, VN_FABRIC_MAX_SEGMENTS)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: all %u inbound windows in use (segments exported; the "
                    "fabric's max-segments)",
                    fab->node, fab->limits.max_segments);
        return -1;
    }
    /* Only what the mapper will accept (see fabric.h: sealed memfds, a
     * device's mappable regions). */
    if ((offset & (fab->limits.window_align - 1)) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot export fd %d from offset 0x%" PRIx64 ": not aligned to "
                    "a window",
                    fab->node, fd, offset);
        return -1;
    }
    if (vn_peerfd_window(fd, offset, size, device, &why) < 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot export %" PRIu64 " bytes of fd %d: it %s", fab->node, size, fd,
                    why);
        return -1;
    }
    copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "node %s: cannot keep fd %d: %s",
                    fab->node, fd, g_strerror(e));
    }
    return copy;
}

/* Segment @id (or route, @size 0: in fab->routes) of @copy (taken) for @peer, in its table;
 * its id, or 0 with @error (an id given twice: the backend's fault). */
uint64_t vn_fabric_export_insert(VnFabric *fab, uint64_t id, int copy, uint64_t offset,
                                 uint64_t size, bool device, const char *peer, GError **error)
{
    GHashTable *table = size > 0 ? fab->segments : fab->routes;
    VnFabricSegment *seg;

    if (id == 0 || g_hash_table_contains(table, &id)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_EXISTS, "node %s: %s id %" PRIu64 " given %s",
                    fab->node, size > 0 ? "segment" : "route", id, id == 0 ? "as none" : "twice");
        close(copy);
        return 0;
    }
    seg = g_new0(VnFabricSegment, 1);
    seg->id = id;
    seg->fd = copy;
    seg->offset = offset;
    seg->size = size;
    seg->device = device;
    seg->peer = g_strdup(peer);
    g_hash_table_insert(table, &seg->id, seg);
    if (size > 0) {
        trace_fabric_segment_export(fab->node, id, size, device ? " of a device" : "", peer);
    } else {
        trace_fabric_route_export(fab->node, id, peer);
    }
    return id;
}

/* A waiting form of the fabric's on a node whose backend answers later: refused. */
bool vn_fabric_waits_refused(VnFabric *fab, bool asks, const char *what, GError **error)
{
    if (asks) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "node %s: %s is asked of its daemon, without waiting (the _async form)",
                    fab->node, what);
    }
    return asks;
}

uint64_t vn_fabric_segment_export_at(VnFabric *fab, int fd, uint64_t offset, uint64_t size,
                                     const char *peer, GError **error)
{
    bool device = false;
    int copy;

    if (vn_fabric_waits_refused(fab, fab->ops->export_async != NULL, "an export", error)) {
        return 0;
    }
    copy = segment_check(fab, fd, offset, size, peer, &device, error);
    /* Ids are never reused, so a stale id names nothing rather than the
     * wrong memory. */
    return copy < 0 ? 0
                    : vn_fabric_export_insert(fab, ++fab->last_segment, copy, offset, size, device,
                                              peer, error);
}

/* An export asked of the backend: what to keep once it answers, and whom to tell. */
typedef struct VnFabricExporting {
    VnFabric *fab;
    int copy;
    uint64_t offset, size;
    bool device;
    char peer[VN_MAX_NODE_NAME + 1];
    VnFabricExportFn done;
    void *opaque;
} VnFabricExporting;

static void export_answered(void *opaque, int status, uint64_t value, int fd)
{
    VnFabricExporting *e = opaque;
    VnFabric *fab = e->fab;
    g_autoptr(GError) error = NULL;
    uint64_t id = 0;

    vn_util_close_fd(&fd);
    if (fab->backend == NULL) {
        status = -ECANCELED; /* closing: the entry would go at once */
    }
    if (status < 0) {
        close(e->copy);
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-status),
                    "node %s: the daemon did not export the %s for %s: %s", fab->node,
                    e->size > 0 ? "segment" : "route", e->peer, g_strerror(-status));
    } else {
        id = vn_fabric_export_insert(fab, value, e->copy, e->offset, e->size, e->device, e->peer,
                                     &error);
    }
    e->done(e->opaque, id, error);
    g_free(e);
}

void vn_fabric_export_start(VnFabric *fab, int copy, uint64_t offset, uint64_t size, bool device,
                            const char *peer, VnFabricExportFn done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnFabricExporting *e;
    uint64_t id = 0;

    if (fab->ops->export_async == NULL) {
        /* Ids are never reused, so a stale id names nothing rather than the wrong memory. */
        id = vn_fabric_export_insert(fab, size > 0 ? ++fab->last_segment : ++fab->last_route, copy,
                                     offset, size, device, peer, &error);
        done(opaque, id, error);
        return;
    }
    if (fab->backend == NULL) {
        close(copy);
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_CANCELLED, "node %s: closing", fab->node);
        done(opaque, 0, error);
        return;
    }
    e = g_new0(VnFabricExporting, 1);
    *e = (VnFabricExporting){ .fab = fab,
                              .copy = copy,
                              .offset = offset,
                              .size = size,
                              .device = device,
                              .done = done,
                              .opaque = opaque };
    g_strlcpy(e->peer, peer, sizeof(e->peer));
    fab->ops->export_async(fab->backend, copy, offset, size, peer, export_answered, e);
}

void vn_fabric_segment_export_async(VnFabric *fab, int fd, uint64_t offset, uint64_t size,
                                    const char *peer, VnFabricExportFn done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    bool device = false;
    int copy = segment_check(fab, fd, offset, size, peer, &device, &error);

    if (copy < 0) {
        done(opaque, 0, error);
        return;
    }
    vn_fabric_export_start(fab, copy, offset, size, device, peer, done, opaque);
}

static void segment_withdraw(VnFabric *fab, VnFabricSegment *seg)
{
    uint64_t id = seg->id;

    g_hash_table_remove(fab->segments, &id);
    if (fab->ops->unexport != NULL && fab->backend != NULL) {
        fab->ops->unexport(fab->backend, false, id);
    }
    trace_fabric_segment_unexport(fab->node, id, seg->peer);
    vn_fabric_segment_free(seg);
}

/* The share of segment @parent with @peer, or NULL. */
static VnFabricSegment *share_find(VnFabric *fab, uint64_t parent, const char *peer)
{
    GHashTableIter it;
    gpointer value;

    g_hash_table_iter_init(&it, fab->segments);
    while (g_hash_table_iter_next(&it, NULL, &value)) {
        VnFabricSegment *seg = value;

        if (seg->parent == parent && (peer == NULL || strcmp(seg->peer, peer) == 0)) {
            return seg;
        }
    }
    return NULL;
}

void vn_fabric_segment_unexport(VnFabric *fab, uint64_t id)
{
    VnFabricSegment *seg = g_hash_table_lookup(fab->segments, &id);
    VnFabricSegment *share;

    if (seg == NULL) {
        return;
    }
    /* Its shares go first: nobody may reach the memory through them once it is withdrawn. */
    while ((share = share_find(fab, id, NULL)) != NULL) {
        segment_withdraw(fab, share);
    }
    segment_withdraw(fab, seg);
}

uint64_t vn_fabric_segment_share(VnFabric *fab, uint64_t id, const char *peer, GError **error)
{
    VnFabricSegment *seg = g_hash_table_lookup(fab->segments, &id);
    VnFabricSegment *share;
    int copy;

    if (vn_fabric_waits_refused(fab, fab->ops->export_async != NULL, "a share", error)) {
        return 0;
    }
    if (seg == NULL || seg->fd < 0 || seg->parent != 0) {
        g_set_error(error, G_IO_ERROR, seg == NULL ? G_IO_ERROR_NOT_FOUND : G_IO_ERROR_FAILED,
                    "node %s: segment %" PRIu64 " cannot be shared: %s", fab->node, id,
                    seg == NULL   ? "we do not export it"
                    : seg->fd < 0 ? "its memory stayed with the worker that exported it"
                                  : "it is a share itself");
        return 0;
    }
    if (peer == NULL || !vn_name_valid(VN_NAME_NODE, peer)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot share segment %" PRIu64 " with \"%s\": not a node name",
                    fab->node, id, peer != NULL ? peer : "(null)");
        return 0;
    }
    if (strcmp(seg->peer, peer) == 0) {
        return id;
    }
    share = share_find(fab, id, peer);
    if (share != NULL) {
        return share->id;
    }
    if (g_hash_table_size(fab->segments) >= MIN(fab->limits.max_segments, VN_FABRIC_MAX_SEGMENTS)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: all %u inbound windows in use (segments exported; the fabric's "
                    "max-segments)",
                    fab->node, fab->limits.max_segments);
        return 0;
    }
    copy = fcntl(seg->fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "node %s: cannot share segment %" PRIu64 ": %s", fab->node, id, g_strerror(e));
        return 0;
    }
    id = vn_fabric_export_insert(fab, ++fab->last_segment, copy, seg->offset, seg->size,
                                 seg->device, peer, error);
    if (id != 0) {
        ((VnFabricSegment *)g_hash_table_lookup(fab->segments, &id))->parent = seg->id;
    }
    return id;
}

const char *vn_fabric_segment_peer(VnFabric *fab, uint64_t id)
{
    VnFabricSegment *seg = g_hash_table_lookup(fab->segments, &id);

    return seg != NULL ? seg->peer : NULL;
}

bool vn_fabric_export_entry_adopt(GHashTable *table, uint64_t id, const char *peer, bool route)
{
    VnFabricSegment *seg;

    if (id == 0 || g_hash_table_contains(table, &id)) {
        return false;
    }
    seg = g_new0(VnFabricSegment, 1);
    seg->id = id;
    seg->fd = -1;
    seg->size = route ? 0 : 1;
    seg->peer = g_strdup(peer);
    g_hash_table_insert(table, &seg->id, seg);
    return true;
}

bool vn_fabric_adopt(VnFabric *fab, VnFabricHeld kind, uint64_t id, const char *peer)
{
    static const char *const what[] = { "segment", "route", "window onto segment" };
    GHashTable *table = kind == VN_FABRIC_HELD_ROUTE ? fab->routes : fab->segments;
    bool window = kind == VN_FABRIC_HELD_WINDOW;

    if (kind >= VN_FABRIC_HELD_LAST || peer == NULL || !vn_name_valid(VN_NAME_NODE, peer) ||
        id == 0 ||
        (!window &&
         (g_hash_table_contains(table, &id) ||
          g_hash_table_size(table) >= MIN(fab->limits.max_segments, VN_FABRIC_MAX_SEGMENTS))) ||
        (fab->ops->adopt != NULL &&
         (fab->backend == NULL || !fab->ops->adopt(fab->backend, kind, id, peer)))) {
        return false;
    }
    trace_fabric_adopt(fab->node, what[kind], id, peer);
    return window || vn_fabric_export_entry_adopt(table, id, peer, kind == VN_FABRIC_HELD_ROUTE);
}

void vn_fabric_adopted_unmap(VnFabric *fab, const char *peer, uint64_t id)
{
    if (fab->ops->unmap_segment != NULL && fab->backend != NULL) {
        fab->ops->unmap_segment(fab->backend, peer, id);
    }
}

void vn_fabric_adopt_end(VnFabric *fab)
{
    if (fab->ops->adopt_end != NULL && fab->backend != NULL) {
        fab->ops->adopt_end(fab->backend);
    }
}

int vn_fabric_segment_withhold(VnFabric *fab, uint64_t id, bool withhold)
{
    VnFabricSegment *seg = g_hash_table_lookup(fab->segments, &id);
    int ret = 0;

    if (seg == NULL) {
        return -ENOENT;
    }
    if (fab->ops->withhold_async != NULL) {
        return -EOPNOTSUPP;
    }
    if (fab->ops->withhold != NULL && fab->backend != NULL) {
        ret = fab->ops->withhold(fab->backend, id, withhold);
    }
    trace_fabric_segment_withhold(fab->node, id, withhold ? "withheld" : "given back", seg->peer,
                                  ret);
    return ret;
}

/* A withhold asked of the backend: whom to tell. */
typedef struct VnFabricWithholding {
    VnFabric *fab;
    uint64_t id;
    bool withhold;
    void (*done)(void *opaque, int ret);
    void *opaque;
} VnFabricWithholding;

static void withhold_answered(void *opaque, int status, uint64_t value, int fd)
{
    VnFabricWithholding *w = opaque;
    /* How many windows changed, as the daemon says: bounded like any count of a peer's. */
    int ret = status < 0 ? status : (int)MIN(value, (uint64_t)VN_FABRIC_MAX_SEGMENTS * 16u);

    vn_util_close_fd(&fd);
    trace_fabric_segment_withhold(w->fab->node, w->id, w->withhold ? "withheld" : "given back",
                                  "its daemon", ret);
    w->done(w->opaque, ret);
    g_free(w);
}

void vn_fabric_segment_withhold_async(VnFabric *fab, uint64_t id, bool withhold,
                                      void (*done)(void *opaque, int ret), void *opaque)
{
    VnFabricWithholding *w;

    if (fab->ops->withhold_async == NULL) {
        done(opaque, vn_fabric_segment_withhold(fab, id, withhold)); /* the node's own */
        return;
    }
    if (fab->backend == NULL || !g_hash_table_contains(fab->segments, &id)) {
        done(opaque, fab->backend == NULL ? -ECANCELED : -ENOENT);
        return;
    }
    w = g_new0(VnFabricWithholding, 1);
    *w = (VnFabricWithholding){
        .fab = fab, .id = id, .withhold = withhold, .done = done, .opaque = opaque
    };
    fab->ops->withhold_async(fab->backend, id, withhold, withhold_answered, w);
}

VnFabricSegment *vn_fabric_exported(VnFabric *fab, GHashTable *table, const char *what,
                                    const char *peer, uint64_t id, int *err)
{
    VnFabricSegment *seg = g_hash_table_lookup(table, &id);

    if (seg != NULL && peer != NULL && strcmp(seg->peer, peer) == 0) {
        return seg;
    }
    *err = seg == NULL ? -ENOENT : -EACCES;
    fab->stats.bad_messages++;
    g_info("node %s: %s asked for %s %" PRIu64 ", which %s", fab->node, peer, what, id,
           seg == NULL ? "we do not export" : "is not exported to it");
    return NULL;
}

int vn_fabric_backend_segment(VnFabric *fab, const char *peer, uint64_t id, uint64_t *size,
                              uint64_t *offset, bool *device)
{
    int err = 0;
    VnFabricSegment *seg = vn_fabric_exported(fab, fab->segments, "segment", peer, id, &err);

    if (seg == NULL) {
        return err;
    }
    if (seg->fd < 0) {
        return -ESTALE; /* adopted after a restart: the fd stayed with its worker */
    }
    *size = seg->size;
    *offset = seg->offset;
    if (device != NULL) {
        *device = seg->device;
    }
    trace_fabric_segment_given(fab->node, id, peer);
    return seg->fd;
}

static gboolean segment_remove(gpointer key, gpointer value, gpointer data)
{
    vn_fabric_segment_free(value);
    return TRUE;
}

void vn_fabric_segments_close(VnFabric *fab)
{
    if (fab->segments != NULL) {
        g_hash_table_foreach_remove(fab->segments, segment_remove, NULL);
    }
}
