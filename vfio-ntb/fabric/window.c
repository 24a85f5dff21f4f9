/*
 * Segments and memory windows (see fabric.h).
 *
 * The exporter keeps a dup of each segment's fd and the one peer allowed to
 * map it; its backend answers maps with vn_fabric_backend_segment().  The
 * mapper's backend gives it a local fd and offset; the mapper spends one of its scarce
 * windows per mapping and enforces its NTB-like limits: a window is a power
 * of two of at least the translation granularity (Linux ntb_mw_get_align()
 * reports the same constraints of real adapters), no larger than
 * max_window_size, at most max_windows of them.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "fabric-int.h"

#include "common/json.h"
#include "common/name.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "trace-fabric.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <json-glib/json-glib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

void vn_fabric_export_ask(VnFabric *fab, int copy, uint64_t offset, uint64_t size, bool device,
                          const char *peer, VnFabricExportFn done, void *opaque)
{
    VnFabricExporting *e = g_new0(VnFabricExporting, 1);

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
    uint64_t id = 0;

    if (copy >= 0 && fab->ops->export_async != NULL) {
        if (fab->backend != NULL) {
            vn_fabric_export_ask(fab, copy, offset, size, device, peer, done, opaque);
            return;
        }
        close(copy);
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_CANCELLED, "node %s: closing", fab->node);
    } else if (copy >= 0) {
        id = vn_fabric_export_insert(fab, ++fab->last_segment, copy, offset, size, device, peer,
                                     &error);
    }
    done(opaque, id, error);
}

void vn_fabric_segment_unexport(VnFabric *fab, uint64_t id)
{
    VnFabricSegment *seg = g_hash_table_lookup(fab->segments, &id);

    if (seg == NULL) {
        return;
    }
    g_hash_table_remove(fab->segments, &id);
    if (fab->ops->unexport != NULL && fab->backend != NULL) {
        fab->ops->unexport(fab->backend, false, id);
    }
    trace_fabric_segment_unexport(fab->node, id, seg->peer);
    vn_fabric_segment_free(seg);
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

    if (fab->ops->withhold_async == NULL || !g_hash_table_contains(fab->segments, &id) ||
        fab->backend == NULL) {
        done(opaque, fab->ops->withhold_async == NULL
                         ? vn_fabric_segment_withhold(fab, id, withhold)
                     : fab->backend == NULL ? -ECANCELED
                                            : -ENOENT);
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

/* The window a segment of @size takes: 2^n >= size, >= @granularity (a
 * power of two); 0 when no such 64-bit size exists. */
static uint64_t window_size_for(uint64_t size, uint64_t granularity)
{
    uint64_t w = MAX(granularity, 1);

    if (size > (UINT64_C(1) << 63)) {
        return 0;
    }
    while (w < size) {
        w <<= 1;
    }
    return w;
}

/* A slot being filled by an asynchronous map. */
static VnFabricWindow reserved;

bool vn_fabric_window_slot_used(const VnFabricWindow *w)
{
    return w != NULL && w != &reserved;
}

/* The arguments, the link and a free slot; false with @error. */
static bool map_check(VnFabric *fab, const char *peer, uint64_t id, uint32_t *slot, GError **error)
{
    if (!vn_name_valid(VN_NAME_NODE, peer) || id == 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: no segment %" PRIu64 " of \"%s\" to map", fab->node, id,
                    peer != NULL ? peer : "(null)");
        return false;
    }
    for (*slot = 0; *slot < fab->limits.max_windows && fab->windows[*slot] != NULL; (*slot)++) {
    }
    if (*slot == fab->limits.max_windows) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: no memory window free for %s's segment %" PRIu64 " (all %u in use)",
                    fab->node, peer, id, fab->limits.max_windows);
        return false;
    }
    if (fab->backend == NULL || vn_fabric_peer(fab, peer) == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_CONNECTED,
                    "node %s: cannot map %s's segment %" PRIu64 ": no link to it", fab->node, peer,
                    id);
        return false;
    }
    return true;
}

/* What the backend gave for @peer's segment @id (@fd, or -errno) into slot
 * @slot: checked, mapped; NULL with @error (the fd closed). */
static VnFabricWindow *map_finish(VnFabric *fab, uint32_t slot, const char *peer, uint64_t id,
                                  int fd, uint64_t size, uint64_t offset, GError **error)
{
    const char *fault = NULL;
    VnFabricWindow *w;
    bool device = false;
    uint64_t wsize;
    void *host = NULL;

    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-fd),
                    "node %s: cannot map %s's segment %" PRIu64 ": %s", fab->node, peer, id,
                    fd == -ENOENT   ? "it has no such segment"
                    : fd == -EACCES ? "it is not exported to us"
                                    : g_strerror(-fd));
        return NULL;
    }
    wsize = window_size_for(size, fab->limits.xlat_granularity);
    if (size == 0 || wsize == 0 || wsize > fab->limits.max_window_size) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: %s's segment %" PRIu64 " of %" PRIu64 " bytes needs a window "
                    "larger than the %" PRIu64 "-byte limit",
                    fab->node, peer, id, size, fab->limits.max_window_size);
        close(fd);
        return NULL;
    }
    /* Mapping past the end of a file makes every access there a SIGBUS in
     * the mapper, now or once the peer shrank it: sealed memfds, or a
     * device's region, which is not mapped here (see VnFabricWindow). */
    if (offset > UINT64_MAX - size) {
        fault = "ends beyond 2^64";
    } else if ((offset & (fab->limits.window_align - 1)) != 0) {
        fault = "is not aligned to a window";
    }
    if (fault != NULL || vn_peerfd_window(fd, offset, size, &device, &fault) < 0) {
        fab->stats.bad_messages++;
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "node %s: %s's segment %" PRIu64 " of %" PRIu64 " bytes at offset %" PRIu64
                    " refused: its fd %s",
                    fab->node, peer, id, size, offset, fault);
        close(fd);
        return NULL;
    }
    if (!device) {
        host = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    }
    if (host == MAP_FAILED) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "node %s: cannot map %s's segment %" PRIu64 ": %s", fab->node, peer, id,
                    g_strerror(e));
        close(fd);
        return NULL;
    }
    w = g_new0(VnFabricWindow, 1);
    g_strlcpy(w->peer, peer, sizeof(w->peer));
    w->segment = id;
    w->size = size;
    w->window_size = wsize;
    w->fd = fd;
    w->offset = offset;
    w->host = host;
    w->device = device;
    fab->windows[slot] = w;
    fab->windows_in_use++;
    fab->stats.windows_mapped++;
    trace_fabric_window_map(fab->node, slot, peer, id, size, device ? " of a device" : "", wsize);
    return w;
}

typedef struct VnFabricMapping {
    VnFabric *fab;
    uint32_t slot;
    char peer[VN_MAX_NODE_NAME + 1];
    uint64_t id;
    VnFabricMapFn done;
    void *opaque;
} VnFabricMapping;

static void map_done(void *opaque, int fd, uint64_t size, uint64_t offset)
{
    VnFabricMapping *m = opaque;
    VnFabric *fab = m->fab;
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w = NULL;

    if (fab->windows == NULL || fab->backend == NULL) {
        /* Closing: nothing is mapped any more. */
        vn_util_close_fd(&fd);
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_CANCELLED, "node %s: closing", fab->node);
    } else {
        fab->windows[m->slot] = NULL; /* the reservation */
        w = map_finish(fab, m->slot, m->peer, m->id, fd, size, offset, &error);
    }
    m->done(m->opaque, w, error);
    g_free(m);
}

void vn_fabric_window_map_async(VnFabric *fab, const char *peer, uint64_t id, VnFabricMapFn done,
                                void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnFabricMapping *m;
    uint32_t slot;

    if (!map_check(fab, peer, id, &slot, &error)) {
        done(opaque, NULL, error);
        return;
    }
    m = g_new0(VnFabricMapping, 1);
    *m = (VnFabricMapping){ .fab = fab, .slot = slot, .id = id, .done = done, .opaque = opaque };
    g_strlcpy(m->peer, peer, sizeof(m->peer));
    fab->windows[slot] = &reserved;
    fab->ops->map_segment_async(fab->backend, peer, id, fab->request_timeout_ms, map_done, m);
}

static void window_free(VnFabricWindow *w)
{
    if (w->host != NULL) {
        munmap(w->host, w->size);
    }
    vn_util_close_fd(&w->fd);
    g_free(w);
}

void vn_fabric_window_unmap(VnFabric *fab, VnFabricWindow *w)
{
    uint32_t slot;

    if (w == NULL) {
        return;
    }
    for (slot = 0; slot < fab->limits.max_windows && (w == &reserved || fab->windows[slot] != w);
         slot++) {
    }
    if (slot == fab->limits.max_windows) {
        g_warning("node %s: unmap of a window that is not mapped here", fab->node);
        return;
    }
    trace_fabric_window_unmap(fab->node, slot, w->peer, w->segment);
    fab->windows[slot] = NULL;
    fab->windows_in_use--;
    if (fab->ops->unmap_segment != NULL && fab->backend != NULL) {
        fab->ops->unmap_segment(fab->backend, w->peer, w->segment);
    }
    window_free(w);
}

/* Whether @w is one of ours, mapped. */
static bool window_ours(VnFabric *fab, const VnFabricWindow *w)
{
    for (uint32_t slot = 0; w != NULL && w != &reserved && slot < fab->limits.max_windows; slot++) {
        if (fab->windows[slot] == w) {
            return true;
        }
    }
    return false;
}

/* Whether windows @w are slices of one open file at consecutive offsets, @chunk apart. */
static bool windows_one_file(VnFabricWindow *const *w, uint32_t n, uint64_t chunk)
{
    for (uint32_t k = 1; k < n; k++) {
        if (w[k]->offset != w[0]->offset + (uint64_t)k * chunk ||
            vn_peerfd_same_file(w[0]->fd, w[k]->fd) != 1) {
            return false;
        }
    }
    return true;
}

/* Whether windows @w can be joined (@ids: their segments), else -EINVAL with @error. */
static int join_check(VnFabric *fab, VnFabricWindow *const *w, uint32_t n, uint64_t *ids,
                      GError **error)
{
    const char *fault = NULL;

    if (n < 2 || n > VN_FABRIC_MAX_JOIN) {
        fault = "not 2 to 16 windows";
    }
    for (uint32_t k = 0; fault == NULL && k < n; k++) {
        if (!window_ours(fab, w[k])) {
            fault = "a window not mapped here";
        } else if (strcmp(w[k]->peer, w[0]->peer) != 0 || w[k]->device != w[0]->device) {
            fault = "windows onto different peers or kinds of memory";
        } else if (w[k]->size == 0 || w[k]->size > w[0]->size ||
                   (k + 1 < n && w[k]->size != w[0]->size)) {
            fault = "windows of unequal sizes";
        } else {
            ids[k] = w[k]->segment;
        }
    }
    if (fault != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot join windows: %s", fab->node, fault);
        return -EINVAL;
    }
    return 0;
}

/* The joined fd @fd (or -errno) a backend gave for @n windows onto @peer of @total bytes:
 * a peer's (a daemon's, for a worker), checked as a window's; -errno with @error. */
static int join_finish(VnFabric *fab, int fd, uint64_t offset, uint32_t n, const char *peer,
                       uint64_t total, GError **error)
{
    const char *why = NULL;
    bool device;

    if (fd >= 0 && vn_peerfd_window(fd, offset, total, &device, &why) < 0) {
        vn_util_close_fd(&fd);
        fd = -EPROTO;
    }
    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-fd),
                    "node %s: cannot join %u windows onto %s: %s%s%s", fab->node, n, peer,
                    fd == -ENOTSUP ? "they are not one file and the fabric cannot join them"
                                   : g_strerror(-fd),
                    why != NULL ? ": the fd " : "", why != NULL ? why : "");
    }
    return fd;
}

/* Windows @w as one fd without the backend (slices of one file), or -ENOTSUP. */
static int join_here(VnFabricWindow *const *w, uint32_t n, uint64_t *offset)
{
    int fd;

    if (!windows_one_file(w, n, w[0]->size)) {
        return -ENOTSUP;
    }
    fd = fcntl(w[0]->fd, F_DUPFD_CLOEXEC, 0);
    *offset = w[0]->offset;
    return fd < 0 ? -errno : fd;
}

static uint64_t join_total(VnFabricWindow *const *w, uint32_t n)
{
    return (uint64_t)(n - 1) * w[0]->size + w[n - 1]->size;
}

int vn_fabric_windows_join(VnFabric *fab, VnFabricWindow *const *w, uint32_t n, uint64_t *offset,
                           GError **error)
{
    uint64_t ids[VN_FABRIC_MAX_JOIN];
    int fd = join_check(fab, w, n, ids, error);

    if (fd < 0) {
        return fd;
    }
    fd = join_here(w, n, offset);
    if (fd == -ENOTSUP && fab->ops->join_windows_async != NULL) {
        fd = -EOPNOTSUPP;
    } else if (fd == -ENOTSUP && fab->ops->join_windows != NULL && fab->backend != NULL) {
        fd = fab->ops->join_windows(fab->backend, w[0]->peer, ids, n, w[0]->size, w[0]->device,
                                    offset);
    }
    return join_finish(fab, fd, *offset, n, w[0]->peer, join_total(w, n), error);
}

/* A join asked of the backend. */
typedef struct VnFabricJoining {
    VnFabric *fab;
    uint32_t n;
    uint64_t total;
    char peer[VN_MAX_NODE_NAME + 1];
    VnFabricJoinFn done;
    void *opaque;
} VnFabricJoining;

static void join_answered(void *opaque, int status, uint64_t value, int fd)
{
    VnFabricJoining *j = opaque;
    g_autoptr(GError) error = NULL;

    if (status < 0) {
        vn_util_close_fd(&fd);
        fd = status;
    } else if (fd < 0) {
        fd = -EPROTO; /* an answer without the fd */
    }
    fd = join_finish(j->fab, fd, value, j->n, j->peer, j->total, &error);
    j->done(j->opaque, fd, fd >= 0 ? value : 0, error);
    g_free(j);
}

void vn_fabric_windows_join_async(VnFabric *fab, VnFabricWindow *const *w, uint32_t n,
                                  VnFabricJoinFn done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    uint64_t ids[VN_FABRIC_MAX_JOIN], offset = 0;
    VnFabricJoining *j;
    int fd = join_check(fab, w, n, ids, &error);

    if (fd == 0) {
        fd = join_here(w, n, &offset);
    }
    if (fd == -ENOTSUP && fab->ops->join_windows_async != NULL && fab->backend != NULL) {
        j = g_new0(VnFabricJoining, 1);
        *j = (VnFabricJoining){
            .fab = fab, .n = n, .total = join_total(w, n), .done = done, .opaque = opaque
        };
        g_strlcpy(j->peer, w[0]->peer, sizeof(j->peer));
        fab->ops->join_windows_async(fab->backend, w[0]->peer, ids, n, w[0]->size, w[0]->device,
                                     join_answered, j);
        return;
    }
    if (fd == -ENOTSUP && fab->ops->join_windows != NULL && fab->backend != NULL) {
        fd = fab->ops->join_windows(fab->backend, w[0]->peer, ids, n, w[0]->size, w[0]->device,
                                    &offset);
    }
    if (error == NULL) {
        fd = join_finish(fab, fd, offset, n, w[0]->peer, join_total(w, n), &error);
    }
    done(opaque, fd, offset, error);
}

uint32_t vn_fabric_windows_in_use(VnFabric *fab)
{
    return fab->windows_in_use;
}

void vn_fabric_windows_init(VnFabric *fab)
{
    fab->windows = g_new0(VnFabricWindow *, fab->limits.max_windows);
}

static gboolean segment_remove(gpointer key, gpointer value, gpointer data)
{
    vn_fabric_segment_free(value);
    return TRUE;
}

void vn_fabric_windows_close(VnFabric *fab)
{
    if (fab->windows != NULL) {
        for (uint32_t i = 0; i < fab->limits.max_windows; i++) {
            if (fab->windows[i] != NULL && fab->windows[i] != &reserved) {
                window_free(fab->windows[i]);
            }
        }
        g_clear_pointer(&fab->windows, g_free);
    }
    if (fab->segments != NULL) {
        g_hash_table_foreach_remove(fab->segments, segment_remove, NULL);
    }
}
