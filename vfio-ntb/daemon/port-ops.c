/*
 * A worker's port (see port.h): what the worker maps, exports, keeps and rings through it,
 * and the daemon's fence, which takes it back.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "port-ops.h"
#include "port.h"

#include "common/util.h"
#include "lending/backend.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the worker's other ops ------------------------------------------- */

/* Where @id is in @a, or -1. */
static gint array_find(GArray *a, uint64_t id)
{
    for (guint i = 0; i < a->len; i++) {
        if (g_array_index(a, uint64_t, i) == id) {
            return (gint)i;
        }
    }
    return -1;
}

bool vn_port_array_take(GArray *a, uint64_t id)
{
    gint i = array_find(a, id);

    if (i >= 0) {
        g_array_remove_index_fast(a, (guint)i);
    }
    return i >= 0;
}

/* A lender's worker withholds its device's BARs (or gives them back): only its own
 * segments, and the answer only once the backend holds it. */
void vn_port_op_withhold(VnPort *p, const VnHostHdr *h)
{
    int ret;

    if (h->arg2 > 1 || array_find(p->segments, h->arg) < 0) {
        vn_port_refuse(p, "a withhold of segment %" PRIu64 ", which is not its", h->arg);
        vn_port_reply(p, h, EACCES, 0, 0, -1);
        return;
    }
    ret = vn_fabric_segment_withhold(p->fab, h->arg, h->arg2 == 1);
    if (ret < 0) {
        g_warning("port %s: segment %" PRIu64 " could not be %s: %s", p->path, h->arg,
                  h->arg2 == 1 ? "withheld" : "given back", g_strerror(-ret));
    }
    vn_port_reply(p, h, ret < 0 ? ret : 0, ret < 0 ? 0 : (uint64_t)ret, 0, -1);
}

void vn_port_op_export(VnPort *p, const VnHostHdr *h, int fd)
{
    g_autoptr(GError) error = NULL;
    bool route = h->op == VN_HOST_EXPORT_ROUTE;
    GArray *ids = route ? p->routes : p->segments;
    uint64_t id;

    if (fd < 0 || ids->len >= VN_PORT_MAX_EXPORTS) {
        vn_port_refuse(p, "an export %s", fd < 0 ? "without its fd" : "beyond the bound");
        vn_port_reply(p, h, fd < 0 ? EINVAL : ENOSPC, 0, 0, -1);
        return;
    }
    id = route ? vn_fabric_route_export(p->fab, fd, p->peer, &error)
               : vn_fabric_segment_export_at(p->fab, fd, h->arg2, h->arg, p->peer, &error);
    if (id == 0) {
        vn_port_refuse(p, "%s", error->message);
        vn_port_reply(p, h, EINVAL, 0, 0, -1);
        return;
    }
    g_array_append_val(ids, id);
    vn_port_reply(p, h, 0, id, 0, -1);
}

/* After our restart: an export the worker says it holds from before (the last daemon's,
 * for its peer).  Ours to withdraw again once the fabric adopts it: nobody claimed that id
 * yet, and the backend still holds it for that peer (an NTB's session taken over); what
 * nobody claims is withdrawn by the fabric later (vn_fabric_adopt_end). */
void vn_port_op_claim(VnPort *p, const VnHostHdr *h)
{
    static const char *const what[] = { "segment", "route", "window onto segment" };
    GArray *ids = h->arg2 == VN_FABRIC_HELD_ROUTE    ? p->routes
                  : h->arg2 == VN_FABRIC_HELD_WINDOW ? p->adopted_windows
                                                     : p->segments;
    VnPortHeld held = { .id = h->arg };

    if (h->arg2 >= VN_FABRIC_HELD_LAST || ids->len >= VN_PORT_MAX_EXPORTS ||
        (p->peer != NULL && strcmp(h->peer, p->peer) != 0)) {
        vn_port_refuse(p, "a claim of %" PRIu64 " (%" PRIu64 ") of %s", h->arg, h->arg2, h->peer);
        return;
    }
    if (!vn_fabric_adopt(p->fab, (VnFabricHeld)h->arg2, h->arg, h->peer)) {
        g_info("port %s: its worker's %s %" PRIu64 " of %s, from before our start, is not "
               "there to adopt",
               p->path, what[h->arg2], h->arg, h->peer);
        return;
    }
    if (h->arg2 == VN_FABRIC_HELD_WINDOW) {
        g_strlcpy(held.peer, h->peer, sizeof(held.peer));
        g_array_append_val(ids, held);
    } else {
        g_array_append_val(ids, h->arg);
    }
}

void vn_port_adopted_unmap(VnPort *p, uint64_t id)
{
    for (guint i = 0; i < p->adopted_windows->len; i++) {
        VnPortHeld held = g_array_index(p->adopted_windows, VnPortHeld, i);

        if (id == 0 || held.id == id) {
            g_array_remove_index_fast(p->adopted_windows, i--);
            vn_fabric_adopted_unmap(p->fab, held.peer, held.id);
        }
    }
}

static VnFabricWindow *worker_window(VnPort *p, const char *peer, uint64_t id);

/* An op of the worker's (a map, a route open) under way, in p->maps until answered. */
static VnPortMap *port_map_new(VnPort *p, const VnHostHdr *h)
{
    VnPortMap *m = g_new0(VnPortMap, 1);

    m->port = p;
    m->fab = p->fab;
    m->h = *h;
    g_ptr_array_add(p->maps, m);
    return m;
}

static void on_mapped(void *opaque, VnFabricWindow *w, const GError *error)
{
    VnPortMap *m = opaque;
    VnPort *p = m->port;

    if (p == NULL) {
        if (w != NULL) {
            vn_fabric_window_unmap(m->fab, w); /* nobody to give it to */
        }
        g_free(m);
        return;
    }
    g_ptr_array_remove_fast(p->maps, m);
    if (w == NULL) {
        g_info("port %s: %s", p->path, error->message);
        vn_port_reply(p, &m->h,
                      g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE)            ? ENOSPC
                      : g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND)         ? ENOENT
                      : g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED) ? EACCES
                                                                                         : EIO,
                      0, 0, -1);
    } else {
        g_ptr_array_add(p->windows, w);
        vn_port_reply(p, &m->h, 0, w->size, w->offset, w->fd);
    }
    g_free(m);
}

void vn_port_op_map(VnPort *p, const VnHostHdr *h)
{
    VnFabricWindow *held = worker_window(p, h->peer, h->arg);

    /* A borrower's worker maps each BAR's segment once; a window it holds already was
     * mapped for the worker it replaced, and QEMU's mappings of the BAR are of that
     * window: it is given again, never unmapped under QEMU. */
    if (!p->inbound && held != NULL) {
        vn_port_reply(p, h, 0, held->size, held->offset, held->fd);
        return;
    }

    if (p->windows->len + p->maps->len >= VN_PORT_MAX_WINDOWS) {
        vn_port_refuse(p, "more than %u windows", VN_PORT_MAX_WINDOWS);
        vn_port_reply(p, h, ENOSPC, 0, 0, -1);
        return;
    }
    /* Without waiting: the peer's backend answers on our loop.  The peer, or another node
     * whose segment the holder allowed (port.c checked which). */
    vn_fabric_window_map_async(p->fab, h->peer, h->arg, on_mapped, port_map_new(p, h));
}

void vn_port_op_unmap(VnPort *p, const VnHostHdr *h)
{
    for (guint i = 0; i < p->windows->len; i++) {
        VnFabricWindow *w = p->windows->pdata[i];

        if (w->segment == h->arg && strcmp(w->peer, h->peer) == 0) {
            g_ptr_array_remove_index_fast(p->windows, i);
            vn_fabric_window_unmap(p->fab, w);
            return;
        }
    }
    for (guint i = 0; h->arg != 0 && i < p->adopted_windows->len; i++) {
        if (g_array_index(p->adopted_windows, VnPortHeld, i).id == h->arg) {
            vn_port_adopted_unmap(p, h->arg);
            return;
        }
    }
    vn_port_refuse(p, "an unmap of segment %" PRIu64 ", which it has no window onto", h->arg);
}

/* The window mapped for the worker onto @peer's segment @id, or NULL. */
static VnFabricWindow *worker_window(VnPort *p, const char *peer, uint64_t id)
{
    for (guint i = 0; i < p->windows->len; i++) {
        VnFabricWindow *w = p->windows->pdata[i];

        if (w->segment == id && strcmp(w->peer, peer) == 0) {
            return w;
        }
    }
    return NULL;
}

/* A borrower's worker joins windows onto one BAR: only windows mapped for it, and the
 * fabric checks they are one memory's. */
void vn_port_op_join(VnPort *p, const VnHostHdr *h, const uint8_t *ids, size_t len)
{
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w[VN_FABRIC_MAX_JOIN];
    uint64_t offset = 0;
    size_t n = len / sizeof(uint64_t);
    int fd;

    if (len % sizeof(uint64_t) != 0 || n < 2 || n > VN_FABRIC_MAX_JOIN || h->arg2 > 1) {
        vn_port_refuse(p, "a join of %zu bytes of ids", len);
        vn_port_reply(p, h, EINVAL, 0, 0, -1);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        uint64_t id;

        memcpy(&id, ids + k * sizeof(id), sizeof(id));
        w[k] = worker_window(p, h->peer, id);
        if (w[k] == NULL) {
            vn_port_refuse(p, "a join of segment %" PRIu64 ", which it has no window onto", id);
            vn_port_reply(p, h, EACCES, 0, 0, -1);
            return;
        }
    }
    /* What it says of the windows must be what they are. */
    if (w[0]->size != h->arg || w[0]->device != (h->arg2 == 1)) {
        vn_port_refuse(p, "a join that misdescribes its windows");
        vn_port_reply(p, h, EINVAL, 0, 0, -1);
        return;
    }
    fd = vn_fabric_windows_join(p->fab, w, (uint32_t)n, &offset, &error);
    if (fd < 0) {
        g_info("port %s: %s", p->path, error->message);
        vn_port_reply(p, h, fd, 0, 0, -1);
        return;
    }
    vn_port_reply(p, h, 0, offset, 0, fd);
    close(fd);
}

static uint64_t bits(uint64_t first, uint64_t count)
{
    if (first >= VN_FABRIC_MAX_DOORBELLS || count == 0 || count > VN_FABRIC_MAX_DOORBELLS - first) {
        return 0;
    }
    return (count == 64 ? ~UINT64_C(0) : (UINT64_C(1) << count) - 1) << first;
}

void vn_port_op_doorbells(VnPort *p, const VnHostHdr *h)
{
    g_autoptr(GError) error = NULL;
    uint64_t m = bits(h->arg, h->arg2);
    int first, ret;

    switch (h->op) {
    case VN_HOST_DOORBELLS_ALLOC:
        first = h->arg <= VN_FABRIC_MAX_DOORBELLS
                    ? vn_fabric_doorbells_alloc(p->fab, (uint32_t)h->arg, &error)
                    : -EINVAL;
        if (first >= 0) {
            p->doorbells |= bits((uint64_t)first, h->arg);
        }
        vn_port_reply(p, h, first < 0 ? first : 0, first < 0 ? 0 : (uint64_t)first, 0, -1);
        break;
    case VN_HOST_DOORBELLS_CLAIM:
        ret = m == 0 ? -EINVAL
                     : vn_fabric_doorbells_claim(p->fab, (uint32_t)h->arg, (uint32_t)h->arg2);
        if (ret == 0) {
            p->doorbells |= m;
        }
        vn_port_reply(p, h, ret, 0, 0, -1);
        break;
    default:
        if (m == 0 || (p->doorbells & m) != m) {
            vn_port_refuse(p, "doorbells %" PRIu64 "+%" PRIu64 " given back, not its", h->arg,
                           h->arg2);
            return;
        }
        p->doorbells &= ~m;
        vn_fabric_doorbells_free(p->fab, (uint32_t)h->arg, (uint32_t)h->arg2);
        break;
    }
}

static void on_route_opened(void *opaque, int fd, const GError *error)
{
    VnPortMap *m = opaque;
    VnPort *p = m->port;

    if (p == NULL) {
        vn_util_close_fd(&fd); /* its worker is gone */
        g_free(m);
        return;
    }
    g_ptr_array_remove_fast(p->maps, m);
    if (fd < 0) {
        g_info("port %s: %s", p->path, error->message);
        vn_port_reply(p, &m->h, fd, 0, 0, -1);
    } else {
        vn_port_reply(p, &m->h, 0, 0, 0, fd);
        close(fd);
    }
    g_free(m);
}

void vn_port_op_open_route(VnPort *p, const VnHostHdr *h)
{
    if (p->maps->len >= VN_PORT_MAX_WINDOWS) {
        vn_port_refuse(p, "more than %u maps and route opens under way", VN_PORT_MAX_WINDOWS);
        vn_port_reply(p, h, EBUSY, 0, 0, -1);
        return;
    }
    /* Without waiting: a holder that never answers must not hold this daemon's loop (its
     * control socket, its heartbeats, its other workers); the answer comes on the loop. */
    vn_fabric_route_open_async(p->fab, p->peer, h->arg, on_route_opened, port_map_new(p, h));
}

/* A borrower's worker keeps what the worker after it needs (keep.h). */
void vn_port_op_keep(VnPort *p, const VnHostHdr *h, int *fd, const uint8_t *data, size_t len)
{
    g_autoptr(GError) error = NULL;

    if (p->keep == NULL) {
        vn_port_refuse(p, "%s from a lender's worker", vn_host_op_to_string(h->op));
        return;
    }
    if (h->op == VN_HOST_FORGET) {
        if (h->arg > h->arg2) {
            vn_port_refuse(p, "a FORGET of keys %" PRIu64 "..%" PRIu64, h->arg, h->arg2);
            return;
        }
        vn_keep_forget(p->keep, h->arg, h->arg2);
        return;
    }
    if (*fd >= 0) {
        int kept = *fd;

        *fd = -1; /* the store's now, kept or closed */
        if (!vn_keep_fd(p->keep, h->arg, kept, &error)) {
            vn_port_refuse(p, "%s", error->message);
        }
    } else if (h->arg != 0) {
        vn_port_refuse(p, "a state kept under key %" PRIu64, h->arg);
    } else if (!vn_keep_state(p->keep, data, len, &error)) {
        vn_port_refuse(p, "%s", error->message);
    }
}

void vn_port_set_dial(VnPort *p, const char *socket_path)
{
    g_free(p->dial_path);
    p->dial_path = g_strdup(socket_path);
    p->dial_vfio = false;
}

void vn_port_set_dial_vfio(VnPort *p, const char *bdf)
{
    vn_port_set_dial(p, bdf);
    p->dial_vfio = true;
}

/* The IOMMU group of the function the worker lends, opened for it: VFIO lets one open file
 * of a group exist (EBUSY while the worker holds one), so no worker gets two. */
static void dial_vfio(VnPort *p, const VnHostHdr *h)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *path = NULL;
    int n = vn_backend_vfio_group(p->dial_path, &error), fd;

    if (n < 0) {
        /* Not logged: the worker asks as often as it likes, and says it itself. */
        vn_port_reply(p, h, ENODEV, 0, 0, -1);
        return;
    }
    path = g_strdup_printf("/dev/vfio/%d", n);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        vn_port_reply(p, h, errno, 0, 0, -1);
        return;
    }
    vn_port_reply(p, h, 0, 0, 0, fd);
    close(fd);
}

/* The last connection dialled for the worker, shut down (for both ends) and closed. */
static void end_dialled(VnPort *p)
{
    if (p->dialled >= 0) {
        shutdown(p->dialled, SHUT_RDWR);
        close(p->dialled);
        p->dialled = -1;
    }
}

void vn_port_op_dial(VnPort *p, const VnHostHdr *h)
{
    gint64 now = g_get_monotonic_time();
    int fd;

    if (!p->inbound || p->dial_path == NULL) {
        vn_port_refuse(p, "a dial of a device server it has none of");
        vn_port_reply(p, h, EACCES, 0, 0, -1);
        return;
    }
    if (p->dial_vfio) {
        dial_vfio(p, h);
        return;
    }
    if (p->dial_at != 0 && now - p->dial_at < (gint64)VN_PORT_DIAL_MIN_MS * 1000) {
        /* Too often (each is a connection to the server): the last dial's answer, which
         * says more than EAGAIN when the server was not there a moment ago. */
        vn_port_reply(p, h, p->dial_errno != 0 ? p->dial_errno : EAGAIN, 0, 0, -1);
        return;
    }
    p->dial_at = now;
    /* Never waiting: a stopped server with a full backlog answers EAGAIN, it does not hold
     * the daemon's loop. */
    fd = vn_util_dial_unix(p->dial_path);
    p->dial_errno = fd < 0 ? -fd : 0;
    if (fd < 0) {
        vn_port_reply(p, h, -fd, 0, 0, -1);
        return;
    }
    vn_port_reply(p, h, 0, 0, 0, fd);
    /* The worker dials only when it holds no connection (lost, or given back after a
     * lease): the one before ends here, for it and for the server, whatever the worker
     * did with its copy.  Each dial supersedes the last, so no worker piles them up. */
    end_dialled(p);
    p->dialled = fd;
}

/* ---- peer-to-peer targets (docs/p2p.md) ------------------------------- */

bool vn_port_exported(VnPort *p, uint64_t id)
{
    return array_find(p->segments, id) >= 0;
}

void vn_port_on_p2p(VnPort *p, VnPortP2pFn fn, void *opaque)
{
    p->p2p = fn;
    p->p2p_opaque = opaque;
}

void vn_port_p2p_target(VnPort *p, uint64_t iova, uint64_t size, const char *peer,
                        const VnHostP2pTarget *t)
{
    if (t != NULL) {
        vn_port_to_worker(p, VN_HOST_P2P_TARGET, 0, 0, peer, iova, size, t, sizeof(*t), -1);
    } else {
        vn_port_to_worker(p, VN_HOST_P2P_GONE, 0, 0, NULL, iova, size, NULL, 0, -1);
    }
}

/* Whether @bar is a BAR's form: a range, and segments of @chunk that make it (every one
 * full but the last, which is not empty). */
static bool bar_well_formed(const VnHostBar *bar)
{
    uint32_t n = bar->nr_segments;

    if (bar->size == 0 || bar->gpa + (bar->size - 1) < bar->gpa || n == 0 ||
        n > VN_HOST_BAR_SEGMENTS || bar->region > VN_HOST_BAR_MAX_REGION) {
        return false;
    }
    if (bar->chunk < bar->size / n + (bar->size % n != 0) ||
        (n > 1 && bar->chunk > (bar->size - 1) / (n - 1))) {
        return false;
    }
    for (uint32_t k = 0; k < n; k++) {
        if (bar->segments[k] == 0) {
            return false;
        }
    }
    return true;
}

void vn_port_op_p2p(VnPort *p, const VnHostHdr *h, const uint8_t *data, size_t len)
{
    VnHostBar bars[VN_HOST_MAX_BARS];
    unsigned n = (unsigned)(len / sizeof(bars[0]));

    if (p->inbound) {
        vn_port_refuse(p, "%s from a lender's worker", vn_host_op_to_string(h->op));
        return;
    }
    if (h->op != VN_HOST_P2P_PLACE) {
        if (h->arg2 == 0 || h->arg + (h->arg2 - 1) < h->arg || len > 0) {
            vn_port_refuse(p, "%s of an empty or wrapping range", vn_host_op_to_string(h->op));
            return;
        }
        if (p->p2p != NULL) {
            p->p2p(p->p2p_opaque, h->op, h->arg, h->arg2, NULL, 0);
        }
        return;
    }
    if (len % sizeof(bars[0]) != 0 || n > VN_HOST_MAX_BARS) {
        vn_port_refuse(p, "a P2P_PLACE of %zu bytes", len);
        return;
    }
    memcpy(bars, data, len);
    for (unsigned i = 0; i < n; i++) {
        if (!bar_well_formed(&bars[i])) {
            vn_port_refuse(p, "a P2P_PLACE whose BAR %u makes no sense", i);
            return;
        }
    }
    if (p->p2p != NULL) {
        p->p2p(p->p2p_opaque, h->op, 0, 0, bars, n);
    }
}
