/*
 * Memory windows (see fabric.h) onto peers' segments (segment.c).
 *
 * The mapper's backend gives it a local fd and offset; the mapper spends one of its scarce
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
    /* Our own node's segment needs no link (local_map), nor does a worker's map, which its
     * daemon makes for it: it knows the one peer it speaks with, the daemon every node and
     * which of their segments (peer-to-peer targets) the worker may map. */
    if (fab->backend == NULL || (strcmp(peer, fab->node) != 0 && fab->ops->export_async == NULL &&
                                 vn_fabric_peer(fab, peer) == NULL)) {
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

/* One of our own segments, shared with ourselves (a peer-to-peer target on this host:
 * docs/p2p.md), for one of our workers: its memory as it is, no window taken; NULL with
 * @error. */
static VnFabricWindow *local_map(VnFabric *fab, uint64_t id, GError **error)
{
    int err = 0;
    VnFabricSegment *seg = vn_fabric_exported(fab, fab->segments, "segment", fab->node, id, &err);
    VnFabricWindow *w;
    void *host = NULL;
    int fd;

    if (seg == NULL || seg->fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(seg == NULL ? -err : ESTALE),
                    "node %s: cannot map our own segment %" PRIu64 ": %s", fab->node, id,
                    seg == NULL ? "it is not shared with us" : "its memory is not here");
        return NULL;
    }
    fd = fcntl(seg->fd, F_DUPFD_CLOEXEC, 0);
    if (fd >= 0 && !seg->device) {
        host = mmap(NULL, seg->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)seg->offset);
    }
    if (fd < 0 || host == MAP_FAILED) {
        int e = errno;

        vn_util_close_fd(&fd);
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "node %s: cannot map our own segment %" PRIu64 ": %s", fab->node, id,
                    g_strerror(e));
        return NULL;
    }
    w = g_new0(VnFabricWindow, 1);
    g_strlcpy(w->peer, fab->node, sizeof(w->peer));
    w->segment = id;
    w->size = seg->size;
    w->window_size = seg->size;
    w->fd = fd;
    w->offset = seg->offset;
    w->host = host;
    w->device = seg->device;
    w->local = true;
    trace_fabric_window_map(fab->node, UINT32_MAX, fab->node, id, w->size,
                            w->device ? " of a device" : "", 0);
    return w;
}

void vn_fabric_window_map_async(VnFabric *fab, const char *peer, uint64_t id, VnFabricMapFn done,
                                void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnFabricMapping *m;
    uint32_t slot;

    if (peer != NULL && strcmp(peer, fab->node) == 0 && fab->ops->export_async == NULL) {
        VnFabricWindow *w = local_map(fab, id, &error);

        done(opaque, w, error);
        return;
    }
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
    if (w->local) {
        trace_fabric_window_unmap(fab->node, UINT32_MAX, w->peer, w->segment);
        window_free(w);
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
    vn_fabric_segments_close(fab);
}
