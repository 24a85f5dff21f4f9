/*
 * Segments and memory windows (see fabric.h).
 *
 * The exporter keeps a dup of each segment's fd and the one peer allowed to
 * map it, and answers MAP requests.  The mapper spends one of its scarce
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

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <json-glib/json-glib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void segment_free(VnFabricSegment *seg)
{
    vn_util_close_fd(&seg->fd);
    g_free(seg->peer);
    g_free(seg);
}

uint64_t vn_fabric_segment_export(VnFabric *fab, int fd, uint64_t size, const char *peer,
                                  GError **error)
{
    VnFabricSegment *seg;
    const char *why;
    int copy;

    if (!vn_name_valid(VN_NAME_NODE, peer)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot export a segment to \"%s\": not a node name", fab->node,
                    peer != NULL ? peer : "(null)");
        return 0;
    }
    if (size == 0 || size > VN_FABRIC_MAX_SEGMENT_SIZE) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: a segment of %" PRIu64 " bytes cannot be exported", fab->node,
                    size);
        return 0;
    }
    if (g_hash_table_size(fab->segments) >= VN_FABRIC_MAX_SEGMENTS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: already %u segments exported", fab->node, VN_FABRIC_MAX_SEGMENTS);
        return 0;
    }
    /* Only what the mapper will accept (see fabric.h: sealed memfds). */
    if (vn_peerfd_memory(fd, 0, size, &why) < 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: cannot export %" PRIu64 " bytes of fd %d: it %s", fab->node,
                    size, fd, why);
        return 0;
    }
    copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "node %s: cannot keep fd %d: %s", fab->node, fd, g_strerror(e));
        return 0;
    }
    seg = g_new0(VnFabricSegment, 1);
    /* Ids are never reused, so a stale id names nothing rather than the
     * wrong memory. */
    seg->id = ++fab->last_segment;
    seg->fd = copy;
    seg->size = size;
    seg->peer = g_strdup(peer);
    g_hash_table_insert(fab->segments, &seg->id, seg);
    VN_TRACE("node %s: segment %" PRIu64 " (%" PRIu64 " bytes) exported to %s", fab->node,
             seg->id, size, peer);
    return seg->id;
}

void vn_fabric_segment_unexport(VnFabric *fab, uint64_t id)
{
    VnFabricSegment *seg = g_hash_table_lookup(fab->segments, &id);

    if (seg == NULL) {
        return;
    }
    g_hash_table_remove(fab->segments, &id);
    VN_TRACE("node %s: segment %" PRIu64 " withdrawn from %s", fab->node, id, seg->peer);
    segment_free(seg);
}

void vn_fabric_map_received(VnFabric *fab, const char *peer, const VnFabricFrame *f,
                            int *fds, unsigned nfds)
{
    g_autofree char *why = NULL;
    VnFabricSegment *seg;
    uint64_t id, size;
    int ret;

    if (f->hdr.data_len != sizeof(id) || f->json != NULL || nfds != 0) {
        vn_fabric_bad_frame(fab, peer, f, -EINVAL, fds, nfds, "MAP request");
        return;
    }
    fab->stats.msgs_received++;
    memcpy(&id, f->data, sizeof(id));
    id = GUINT64_FROM_LE(id);
    seg = g_hash_table_lookup(fab->segments, &id);
    if (seg == NULL || strcmp(seg->peer, peer) != 0) {
        ret = seg == NULL ? -ENOENT : -EACCES;
        why = seg == NULL ? g_strdup_printf("no segment %" PRIu64, id)
                          : g_strdup_printf("segment %" PRIu64 " is not exported to %s", id,
                                            peer);
        g_info("node %s: %s refused to map: %s", fab->node, peer, why);
        vn_fabric_send_error(fab, peer, f->hdr.id, f->hdr.type, ret, why);
        return;
    }
    size = GUINT64_TO_LE(seg->size);
    ret = vn_fabric_send_frame(fab, peer, VN_FABRIC_FLAG_REPLY, f->hdr.type, f->hdr.id, 0, NULL,
                               &size, sizeof(size), &seg->fd, 1);
    VN_TRACE("node %s: segment %" PRIu64 " given to %s: %d", fab->node, id, peer, ret);
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

char *vn_fabric_error_message(const VnFabricMsg *reply)
{
    g_autoptr(JsonObject) o = NULL;

    if (reply == NULL || reply->json == NULL) {
        return NULL;
    }
    o = vn_json_parse_object(reply->json, -1, VN_FABRIC_MAX_PAYLOAD, NULL);
    return g_strdup(vn_util_json_string(o, "error"));
}

VnFabricWindow *vn_fabric_window_map(VnFabric *fab, const char *peer, uint64_t id,
                                     GError **error)
{
    g_autoptr(VnFabricMsg) reply = NULL;
    uint64_t id_le = GUINT64_TO_LE(id);
    uint64_t size, wsize;
    const char *fault;
    VnFabricWindow *w;
    uint32_t slot;
    void *host;
    int ret;

    if (!vn_name_valid(VN_NAME_NODE, peer) || id == 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "node %s: no segment %" PRIu64 " of \"%s\" to map", fab->node, id,
                    peer != NULL ? peer : "(null)");
        return NULL;
    }
    for (slot = 0; slot < fab->limits.max_windows && fab->windows[slot] != NULL; slot++) {
    }
    if (slot == fab->limits.max_windows) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: no memory window free for %s's segment %" PRIu64
                    " (all %u in use)", fab->node, peer, id, fab->limits.max_windows);
        return NULL;
    }
    ret = vn_fabric_request_sync_any(fab, peer, VN_FABRIC_TYPE_MAP, NULL, &id_le,
                                     sizeof(id_le), NULL, 0, &reply);
    if (ret < 0) {
        g_autofree char *why = vn_fabric_error_message(reply);

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret),
                    "node %s: cannot map %s's segment %" PRIu64 ": %s", fab->node, peer, id,
                    why != NULL ? why : g_strerror(-ret));
        return NULL;
    }
    if (reply->data_len != sizeof(size) || reply->nfds != 1 || reply->fds[0] < 0) {
        fab->stats.bad_messages++;
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "node %s: %s answered MAP of segment %" PRIu64 " with a malformed reply",
                    fab->node, peer, id);
        return NULL;
    }
    memcpy(&size, reply->data, sizeof(size));
    size = GUINT64_FROM_LE(size);
    wsize = window_size_for(size, fab->limits.xlat_granularity);
    if (size == 0 || wsize == 0 || wsize > fab->limits.max_window_size) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "node %s: %s's segment %" PRIu64 " of %" PRIu64 " bytes needs a window "
                    "larger than the %" PRIu64 "-byte limit", fab->node, peer, id, size,
                    fab->limits.max_window_size);
        return NULL;
    }
    /* Mapping past the end of a file makes every access there a SIGBUS in
     * the mapper, now or once the peer shrank it: sealed memfds only. */
    if (vn_peerfd_memory(reply->fds[0], 0, size, &fault) < 0) {
        fab->stats.bad_messages++;
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "node %s: %s's segment %" PRIu64 " of %" PRIu64 " bytes refused: its fd %s",
                    fab->node, peer, id, size, fault);
        return NULL;
    }
    host = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fds[0], 0);
    if (host == MAP_FAILED) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "node %s: cannot map %s's segment %" PRIu64 ": %s", fab->node, peer, id,
                    g_strerror(e));
        return NULL;
    }
    w = g_new0(VnFabricWindow, 1);
    g_strlcpy(w->peer, peer, sizeof(w->peer));
    w->segment = id;
    w->size = size;
    w->window_size = wsize;
    w->fd = reply->fds[0];
    reply->fds[0] = -1;
    w->host = host;
    fab->windows[slot] = w;
    fab->windows_in_use++;
    fab->stats.windows_mapped++;
    VN_TRACE("node %s: window %u maps %s's segment %" PRIu64 " (%" PRIu64 " bytes, window %"
             PRIu64 ")", fab->node, slot, peer, id, size, wsize);
    return w;
}

static void window_free(VnFabricWindow *w)
{
    munmap(w->host, w->size);
    vn_util_close_fd(&w->fd);
    g_free(w);
}

void vn_fabric_window_unmap(VnFabric *fab, VnFabricWindow *w)
{
    uint32_t slot;

    if (w == NULL) {
        return;
    }
    for (slot = 0; slot < fab->limits.max_windows && fab->windows[slot] != w; slot++) {
    }
    if (slot == fab->limits.max_windows) {
        g_warning("node %s: unmap of a window that is not mapped here", fab->node);
        return;
    }
    VN_TRACE("node %s: window %u unmapped (%s's segment %" PRIu64 ")", fab->node, slot,
             w->peer, w->segment);
    fab->windows[slot] = NULL;
    fab->windows_in_use--;
    window_free(w);
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
    segment_free(value);
    return TRUE;
}

void vn_fabric_windows_close(VnFabric *fab)
{
    if (fab->windows != NULL) {
        for (uint32_t i = 0; i < fab->limits.max_windows; i++) {
            if (fab->windows[i] != NULL) {
                window_free(fab->windows[i]);
            }
        }
        g_clear_pointer(&fab->windows, g_free);
    }
    if (fab->segments != NULL) {
        g_hash_table_foreach_remove(fab->segments, segment_remove, NULL);
    }
}
