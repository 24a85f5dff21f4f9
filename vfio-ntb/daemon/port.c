/*
 * A worker's port (see port.h): the daemon relays for a worker that is not
 * a fabric node.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "port.h"

#include "keep.h"
#include "common/util.h"
#include "fabric/frame.h"
#include "fabric/host.h"
#include "fabric/record.h"
#include "lending/proto.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <inttypes.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* A request relayed for the worker, until its answer comes. */
typedef struct VnPortRelay {
    VnPort *port; /* NULL once the port is gone */
    uint64_t id;  /* the worker's frame id */
    uint32_t type;
} VnPortRelay;

/* A request of the peer's, passed to the worker, until it answers. */
typedef struct VnPortIn {
    uint64_t id;       /* the frame id the worker sees */
    uint64_t token;    /* ours, for vn_fabric_reply() */
    GByteArray *frame; /* not sent yet (the worker is away), else NULL */
} VnPortIn;

struct VnPort {
    VnFabric *fab;
    char *path;
    char *peer; /* the one node the worker speaks with, or NULL */
    char *device;
    int listen_fd;
    GSource *listen_src;
    int fd; /* the worker's connection, or -1 */
    GSource *src;
    VnRecordReader rx;
    GPtrArray *windows; /* VnFabricWindow *, mapped for the worker */
    GPtrArray *maps;    /* VnPortMap *, maps under way */
    GArray *segments;   /* uint64_t ids exported for it */
    GArray *routes;
    GArray *withdrawn;  /* uint64_t ids of those the daemon withdrew (vn_port_withdraw) */
    uint64_t doorbells; /* bit i: the worker's */
    GPtrArray *relays;  /* VnPortRelay *, in flight */
    GPtrArray *ins;     /* VnPortIn *, the peer's requests at the worker */
    uint64_t last_in;
    GByteArray *out;
    uint64_t refused;
    GMainContext *ctx;
    bool inbound; /* a lender's worker: it answers the peer's requests */
    VnPortDeviceRequestFn device_request;
    void *device_request_opaque;
    VnPortFencedFn fenced;
    void *fenced_opaque;
    VnPortDeviceServerFn device_server;
    void *device_server_opaque;
    VnPortGoneFn gone;
    void *gone_opaque;
    VnKeep *keep; /* a borrower's worker's fds and state (keep.h); NULL for a lender's */
};

VnKeep *vn_port_keep(VnPort *p)
{
    return p->keep;
}

bool vn_port_connected(VnPort *p)
{
    return p->fd >= 0;
}

void vn_port_on_fenced(VnPort *p, VnPortFencedFn fn, void *opaque)
{
    p->fenced = fn;
    p->fenced_opaque = opaque;
}

void vn_port_on_gone(VnPort *p, VnPortGoneFn fn, void *opaque)
{
    p->gone = fn;
    p->gone_opaque = opaque;
}

void vn_port_on_device_server(VnPort *p, VnPortDeviceServerFn fn, void *opaque)
{
    p->device_server = fn;
    p->device_server_opaque = opaque;
}

void vn_port_on_device_request(VnPort *p, VnPortDeviceRequestFn fn, void *opaque)
{
    p->device_request = fn;
    p->device_request_opaque = opaque;
}

const char *vn_port_path(VnPort *p)
{
    return p->path;
}

uint64_t vn_port_refused(VnPort *p)
{
    return p->refused;
}

static void refuse(VnPort *p, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void refuse(VnPort *p, const char *fmt, ...)
{
    g_autofree char *why = NULL;
    va_list ap;

    va_start(ap, fmt);
    why = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    p->refused++;
    g_info("port %s: refused from the worker of %s/%s: %s", p->path, p->peer, p->device, why);
}

/* ---- to the worker ---------------------------------------------------- */

static void conn_close(VnPort *p)
{
    if (p->src != NULL) {
        g_source_destroy(p->src);
        g_clear_pointer(&p->src, g_source_unref);
    }
    vn_record_reader_clear(&p->rx);
    vn_util_close_fd(&p->fd);
}

static void to_worker(VnPort *p, uint32_t op, uint64_t seq, int status, const char *peer,
                      uint64_t arg, uint64_t arg2, const void *data, size_t len, int fd)
{
    int ret;

    if (p->fd < 0) {
        return;
    }
    ret = vn_host_send(p->fd, op, seq, status, peer, arg, arg2, data, len, fd);
    if (ret < 0) {
        /* A worker that does not read its port for seconds is stuck: it
         * reconnects when it is not. */
        g_info("port %s: cannot reach the worker: %s", p->path, g_strerror(-ret));
        conn_close(p);
    }
}

static void reply(VnPort *p, const VnHostHdr *h, int err, uint64_t arg, uint64_t arg2, int fd)
{
    to_worker(p, VN_HOST_REPLY, h->seq, err < 0 ? -err : err, NULL, arg, arg2, NULL, 0, fd);
}

/* A frame for the worker, as if the peer had sent it to the worker's node. */
static void frame_to_worker(VnPort *p, uint16_t flags, uint32_t type, uint64_t id, int32_t err,
                            const char *json, const void *data, size_t len)
{
    if (p->peer == NULL) {
        return;
    }
    if (vn_fabric_frame_encode(p->out, flags, type, id, err, json, data, len) < 0) {
        /* Our own answer: it fits, or it becomes an error the worker gets. */
        vn_fabric_frame_encode(p->out, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, type, id,
                               EMSGSIZE, NULL, NULL, 0);
    }
    to_worker(p, VN_HOST_RECV, 0, 0, p->peer, 0, 0, p->out->data, p->out->len, -1);
}

/* HELLO's arg: our caps and our largest window (host.h). */
static uint64_t hello_arg(VnFabric *fab)
{
    uint64_t w = vn_fabric_limits(fab)->max_window_size;

    return vn_fabric_caps(fab) |
           (w != 0 ? (uint64_t)(63 - __builtin_clzll(w)) << VN_HOST_HELLO_WINDOW_SHIFT : 0);
}

static bool is_peer(VnPort *p, const char *peer)
{
    return p->peer != NULL && peer != NULL && strcmp(peer, p->peer) == 0;
}

/* The peer's requests the worker has not answered: they fail now. */
static void ins_fail(VnPort *p, int err, const char *why)
{
    for (guint i = 0; i < p->ins->len; i++) {
        VnPortIn *in = p->ins->pdata[i];

        vn_fabric_reply_error(p->fab, in->token, err, why);
        if (in->frame != NULL) {
            g_byte_array_unref(in->frame);
        }
        g_free(in);
    }
    g_ptr_array_set_size(p->ins, 0);
}

void vn_port_set_peer(VnPort *p, const char *peer)
{
    if (p->peer != NULL && (peer == NULL || strcmp(peer, p->peer) != 0)) {
        /* For the worker, its peer's link went: a borrower loses its lender,
         * a lender fences the device. */
        to_worker(p, VN_HOST_LINK, 0, 0, p->peer, 0, 0, NULL, 0, -1);
        ins_fail(p, ECONNRESET, "the lease ended");
        g_clear_pointer(&p->peer, g_free);
    }
    if (peer != NULL && p->peer == NULL) {
        p->peer = g_strdup(peer);
        /* A lender's worker learns its holder; a borrower's, that its
         * lender, given up on, is back. */
        if (p->inbound || vn_fabric_link_up(p->fab, p->peer)) {
            to_worker(p, VN_HOST_LINK, 0, 0, p->peer, 1, 0, NULL, 0, -1);
        }
    }
}

const char *vn_port_peer(VnPort *p)
{
    return p->peer;
}

/* Pass the peer's requests the worker has not seen yet (it was away). */
static void ins_flush(VnPort *p)
{
    for (guint i = 0; i < p->ins->len && p->fd >= 0; i++) {
        VnPortIn *in = p->ins->pdata[i];

        if (in->frame != NULL) {
            to_worker(p, VN_HOST_RECV, 0, 0, p->peer, 0, 0, in->frame->data, in->frame->len, -1);
            g_clear_pointer(&in->frame, g_byte_array_unref);
        }
    }
}

bool vn_port_request(VnPort *p, VnFabricMsg *msg, uint64_t token)
{
    VnPortIn *in;

    if (!p->inbound || !is_peer(p, msg->peer)) {
        return false;
    }
    if (p->ins->len >= VN_PORT_MAX_INFLIGHT) {
        /* The oldest has waited longer than any asker does. */
        VnPortIn *old = g_ptr_array_steal_index(p->ins, 0);

        vn_fabric_reply_error(p->fab, old->token, ETIMEDOUT, "the device's worker is stuck");
        if (old->frame != NULL) {
            g_byte_array_unref(old->frame);
        }
        g_free(old);
    }
    in = g_new0(VnPortIn, 1);
    in->id = ++p->last_in;
    in->token = token;
    in->frame = g_byte_array_new();
    if (vn_fabric_frame_encode(in->frame, VN_FABRIC_FLAG_REQUEST, msg->type, in->id, 0, msg->json,
                               msg->data, msg->data_len) < 0) {
        g_byte_array_unref(in->frame);
        g_free(in);
        return false;
    }
    g_ptr_array_add(p->ins, in);
    ins_flush(p);
    return true;
}

/* The worker's answer to the peer's request @id. */
static void in_answered(VnPort *p, const VnFabricFrame *f)
{
    for (guint i = 0; i < p->ins->len; i++) {
        VnPortIn *in = p->ins->pdata[i];
        g_autofree char *why = NULL;

        if (in->id != f->hdr.id || in->frame != NULL) {
            continue;
        }
        g_ptr_array_remove_index(p->ins, i);
        if (f->hdr.flags & VN_FABRIC_FLAG_ERROR) {
            VnFabricMsg m = { .json = f->json };

            why = vn_fabric_error_message(&m);
            vn_fabric_reply_error(p->fab, in->token, f->hdr.error, why);
        } else {
            vn_fabric_reply(p->fab, in->token, f->json, f->data, f->hdr.data_len);
        }
        g_free(in);
        return;
    }
    refuse(p, "an answer to no request of its peer's (id %" PRIu64 ")", f->hdr.id);
}

bool vn_port_doorbell(VnPort *p, const char *peer, uint32_t bit)
{
    uint32_t le = GUINT32_TO_LE(bit);

    if (bit >= VN_FABRIC_MAX_DOORBELLS || !(p->doorbells & (UINT64_C(1) << bit)) ||
        !is_peer(p, peer)) {
        return false;
    }
    frame_to_worker(p, VN_FABRIC_FLAG_EVENT, VN_FABRIC_TYPE_DOORBELL, 1, 0, NULL, &le, sizeof(le));
    return true;
}

/* ---- relaying the worker's frames ------------------------------------- */

static void on_relayed(void *opaque, VnFabricMsg *msg, int err)
{
    VnPortRelay *r = opaque;
    VnPort *p = r->port;

    if (p != NULL) {
        g_ptr_array_remove_fast(p->relays, r);
        if (err < 0) {
            frame_to_worker(p, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, r->type, r->id, -err,
                            msg != NULL ? msg->json : NULL, NULL, 0);
        } else {
            frame_to_worker(p, VN_FABRIC_FLAG_REPLY, r->type, r->id, 0, msg->json, msg->data,
                            msg->data_len);
        }
    }
    g_free(r);
}

/* Only about the worker's own device (the lender checks the holder; this
 * keeps one worker from speaking for another device of this host). */
static bool names_its_device(VnPort *p, const VnFabricFrame *f)
{
    char name[VN_MAX_DEVICE_NAME + 1];

    return f->json != NULL && vn_proto_device_name(f->json, name, NULL) &&
           strcmp(name, p->device) == 0;
}

static void relay_frame(VnPort *p, const uint8_t *buf, size_t len)
{
    uint16_t kind;
    VnFabricFrame f;
    uint32_t bit;
    int ret;

    if (vn_fabric_frame_decode(buf, len, &f) < 0) {
        refuse(p, "a malformed frame");
        return;
    }
    kind = f.hdr.flags & VN_FABRIC_FLAG_KIND_MASK;
    if (kind == VN_FABRIC_FLAG_REPLY && p->inbound) {
        in_answered(p, &f);
        return;
    }
    if (p->peer == NULL) {
        refuse(p, "a %s with no peer to take it", vn_fabric_kind_to_string(f.hdr.flags));
        return;
    }
    if (kind == VN_FABRIC_FLAG_EVENT && f.hdr.type == VN_FABRIC_TYPE_DOORBELL) {
        if (f.hdr.data_len != sizeof(bit)) {
            refuse(p, "a doorbell of %u bytes", f.hdr.data_len);
            return;
        }
        memcpy(&bit, f.data, sizeof(bit));
        vn_fabric_doorbell(p->fab, p->peer, GUINT32_FROM_LE(bit));
        return;
    }
    if (kind == VN_FABRIC_FLAG_REPLY || f.hdr.type >= VN_FABRIC_TYPE_RESERVED ||
        !names_its_device(p, &f)) {
        refuse(p, "a %s of type 0x%x that is not about %s", vn_fabric_kind_to_string(f.hdr.flags),
               f.hdr.type, p->device);
        if (kind == VN_FABRIC_FLAG_REQUEST) {
            frame_to_worker(p, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, f.hdr.type, f.hdr.id,
                            EACCES, NULL, NULL, 0);
        }
        return;
    }
    if (kind == VN_FABRIC_FLAG_EVENT) {
        vn_fabric_event(p->fab, p->peer, f.hdr.type, f.json, f.data, f.hdr.data_len);
        return;
    }
    if (p->relays->len >= VN_PORT_MAX_INFLIGHT) {
        refuse(p, "more than %u requests in flight", VN_PORT_MAX_INFLIGHT);
        frame_to_worker(p, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, f.hdr.type, f.hdr.id, EBUSY,
                        NULL, NULL, 0);
        return;
    }
    {
        VnPortRelay *r = g_new0(VnPortRelay, 1);

        r->port = p;
        r->id = f.hdr.id;
        r->type = f.hdr.type;
        ret = vn_fabric_request(p->fab, p->peer, f.hdr.type, f.json, f.data, f.hdr.data_len,
                                on_relayed, r);
        if (ret < 0) {
            g_free(r);
            frame_to_worker(p, VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, f.hdr.type, f.hdr.id,
                            -ret, NULL, NULL, 0);
            return;
        }
        g_ptr_array_add(p->relays, r);
    }
}

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

static bool array_take(GArray *a, uint64_t id)
{
    gint i = array_find(a, id);

    if (i >= 0) {
        g_array_remove_index_fast(a, (guint)i);
    }
    return i >= 0;
}

/* A lender's worker withholds its device's BARs (or gives them back): only its own
 * segments, and the answer only once the backend holds it. */
static void op_withhold(VnPort *p, const VnHostHdr *h)
{
    int ret;

    if (h->arg2 > 1 || array_find(p->segments, h->arg) < 0) {
        refuse(p, "a withhold of segment %" PRIu64 ", which is not its", h->arg);
        reply(p, h, EACCES, 0, 0, -1);
        return;
    }
    ret = vn_fabric_segment_withhold(p->fab, h->arg, h->arg2 == 1);
    if (ret < 0) {
        g_warning("port %s: segment %" PRIu64 " could not be %s: %s", p->path, h->arg,
                  h->arg2 == 1 ? "withheld" : "given back", g_strerror(-ret));
    }
    reply(p, h, ret < 0 ? ret : 0, ret < 0 ? 0 : (uint64_t)ret, 0, -1);
}

static void op_export(VnPort *p, const VnHostHdr *h, int fd)
{
    g_autoptr(GError) error = NULL;
    bool route = h->op == VN_HOST_EXPORT_ROUTE;
    GArray *ids = route ? p->routes : p->segments;
    uint64_t id;

    if (fd < 0 || ids->len >= VN_PORT_MAX_EXPORTS) {
        refuse(p, "an export %s", fd < 0 ? "without its fd" : "beyond the bound");
        reply(p, h, fd < 0 ? EINVAL : ENOSPC, 0, 0, -1);
        return;
    }
    id = route ? vn_fabric_route_export(p->fab, fd, p->peer, &error)
               : vn_fabric_segment_export_at(p->fab, fd, h->arg2, h->arg, p->peer, &error);
    if (id == 0) {
        refuse(p, "%s", error->message);
        reply(p, h, EINVAL, 0, 0, -1);
        return;
    }
    g_array_append_val(ids, id);
    reply(p, h, 0, id, 0, -1);
}

/* A map for the worker, until the peer's backend answered. */
typedef struct VnPortMap {
    VnPort *port; /* NULL once the port is gone */
    VnFabric *fab;
    VnHostHdr h;
} VnPortMap;

static VnFabricWindow *worker_window(VnPort *p, uint64_t id);

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
        reply(p, &m->h,
              g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE)            ? ENOSPC
              : g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND)         ? ENOENT
              : g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED) ? EACCES
                                                                                 : EIO,
              0, 0, -1);
    } else {
        g_ptr_array_add(p->windows, w);
        reply(p, &m->h, 0, w->size, w->offset, w->fd);
    }
    g_free(m);
}

static void op_map(VnPort *p, const VnHostHdr *h)
{
    VnFabricWindow *held = worker_window(p, h->arg);
    VnPortMap *m;

    /* A borrower's worker maps each BAR's segment once; a window it holds already was
     * mapped for the worker it replaced, and QEMU's mappings of the BAR are of that
     * window: it is given again, never unmapped under QEMU. */
    if (!p->inbound && held != NULL) {
        reply(p, h, 0, held->size, held->offset, held->fd);
        return;
    }

    if (p->windows->len + p->maps->len >= VN_PORT_MAX_WINDOWS) {
        refuse(p, "more than %u windows", VN_PORT_MAX_WINDOWS);
        reply(p, h, ENOSPC, 0, 0, -1);
        return;
    }
    /* Without waiting: the peer's backend answers on our loop. */
    m = g_new0(VnPortMap, 1);
    m->port = p;
    m->fab = p->fab;
    m->h = *h;
    g_ptr_array_add(p->maps, m);
    vn_fabric_window_map_async(p->fab, p->peer, h->arg, on_mapped, m);
}

static void op_unmap(VnPort *p, const VnHostHdr *h)
{
    for (guint i = 0; i < p->windows->len; i++) {
        VnFabricWindow *w = p->windows->pdata[i];

        if (w->segment == h->arg) {
            g_ptr_array_remove_index_fast(p->windows, i);
            vn_fabric_window_unmap(p->fab, w);
            return;
        }
    }
    refuse(p, "an unmap of segment %" PRIu64 ", which it has no window onto", h->arg);
}

/* The window mapped for the worker onto segment @id, or NULL. */
static VnFabricWindow *worker_window(VnPort *p, uint64_t id)
{
    for (guint i = 0; i < p->windows->len; i++) {
        VnFabricWindow *w = p->windows->pdata[i];

        if (w->segment == id) {
            return w;
        }
    }
    return NULL;
}

/* A borrower's worker joins windows onto one BAR: only windows mapped for it, and the
 * fabric checks they are one memory's. */
static void op_join(VnPort *p, const VnHostHdr *h, const uint8_t *ids, size_t len)
{
    g_autoptr(GError) error = NULL;
    VnFabricWindow *w[VN_FABRIC_MAX_JOIN];
    uint64_t offset = 0;
    size_t n = len / sizeof(uint64_t);
    int fd;

    if (len % sizeof(uint64_t) != 0 || n < 2 || n > VN_FABRIC_MAX_JOIN || h->arg2 > 1) {
        refuse(p, "a join of %zu bytes of ids", len);
        reply(p, h, EINVAL, 0, 0, -1);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        uint64_t id;

        memcpy(&id, ids + k * sizeof(id), sizeof(id));
        w[k] = worker_window(p, id);
        if (w[k] == NULL) {
            refuse(p, "a join of segment %" PRIu64 ", which it has no window onto", id);
            reply(p, h, EACCES, 0, 0, -1);
            return;
        }
    }
    /* What it says of the windows must be what they are. */
    if (w[0]->size != h->arg || w[0]->device != (h->arg2 == 1)) {
        refuse(p, "a join that misdescribes its windows");
        reply(p, h, EINVAL, 0, 0, -1);
        return;
    }
    fd = vn_fabric_windows_join(p->fab, w, (uint32_t)n, &offset, &error);
    if (fd < 0) {
        g_info("port %s: %s", p->path, error->message);
        reply(p, h, fd, 0, 0, -1);
        return;
    }
    reply(p, h, 0, offset, 0, fd);
    close(fd);
}

static uint64_t bits(uint64_t first, uint64_t count)
{
    if (first >= VN_FABRIC_MAX_DOORBELLS || count == 0 || count > VN_FABRIC_MAX_DOORBELLS - first) {
        return 0;
    }
    return (count == 64 ? ~UINT64_C(0) : (UINT64_C(1) << count) - 1) << first;
}

static void op_doorbells(VnPort *p, const VnHostHdr *h)
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
        reply(p, h, first < 0 ? first : 0, first < 0 ? 0 : (uint64_t)first, 0, -1);
        break;
    case VN_HOST_DOORBELLS_CLAIM:
        ret = m == 0 ? -EINVAL
                     : vn_fabric_doorbells_claim(p->fab, (uint32_t)h->arg, (uint32_t)h->arg2);
        if (ret == 0) {
            p->doorbells |= m;
        }
        reply(p, h, ret, 0, 0, -1);
        break;
    default:
        if (m == 0 || (p->doorbells & m) != m) {
            refuse(p, "doorbells %" PRIu64 "+%" PRIu64 " given back, not its", h->arg, h->arg2);
            return;
        }
        p->doorbells &= ~m;
        vn_fabric_doorbells_free(p->fab, (uint32_t)h->arg, (uint32_t)h->arg2);
        break;
    }
}

static void op_open_route(VnPort *p, const VnHostHdr *h)
{
    g_autoptr(GError) error = NULL;
    int fd = vn_fabric_route_open(p->fab, p->peer, h->arg, &error);

    if (fd < 0) {
        g_info("port %s: %s", p->path, error->message);
        reply(p, h, fd, 0, 0, -1);
        return;
    }
    reply(p, h, 0, 0, 0, fd);
    close(fd);
}

/* A borrower's worker keeps what the worker after it needs (keep.h). */
static void op_keep(VnPort *p, const VnHostHdr *h, int *fd, const uint8_t *data, size_t len)
{
    g_autoptr(GError) error = NULL;

    if (p->keep == NULL) {
        refuse(p, "%s from a lender's worker", vn_host_op_to_string(h->op));
        return;
    }
    if (h->op == VN_HOST_FORGET) {
        if (h->arg > h->arg2) {
            refuse(p, "a FORGET of keys %" PRIu64 "..%" PRIu64, h->arg, h->arg2);
            return;
        }
        vn_keep_forget(p->keep, h->arg, h->arg2);
        return;
    }
    if (*fd >= 0) {
        int kept = *fd;

        *fd = -1; /* the store's now, kept or closed */
        if (!vn_keep_fd(p->keep, h->arg, kept, &error)) {
            refuse(p, "%s", error->message);
        }
    } else if (h->arg != 0) {
        refuse(p, "a state kept under key %" PRIu64, h->arg);
    } else if (!vn_keep_state(p->keep, data, len, &error)) {
        refuse(p, "%s", error->message);
    }
}

/* One record from the worker. */
static void worker_record(VnPort *p, VnRecord *rec)
{
    g_autofree char *why = NULL;
    const uint8_t *frame;
    size_t frame_len;
    VnHostHdr h;
    int fd;

    why = vn_host_record_check(rec->buf, rec->len, rec->nfds, rec->overflow, true, &h, &frame,
                               &frame_len);
    if (why != NULL) {
        vn_util_close_fds(rec->fds, rec->nfds);
        refuse(p, "%s", why);
        conn_close(p);
        return;
    }
    fd = rec->nfds == 1 ? rec->fds[0] : -1;
    if (h.peer[0] != '\0' && !is_peer(p, h.peer)) {
        refuse(p, "%s for %s, not its peer %s", vn_host_op_to_string(h.op), h.peer,
               p->peer != NULL ? p->peer : "(none)");
        if (h.op == VN_HOST_MAP || h.op == VN_HOST_EXPORT_SEGMENT || h.op == VN_HOST_EXPORT_ROUTE ||
            h.op == VN_HOST_OPEN_ROUTE || h.op == VN_HOST_JOIN_WINDOWS) {
            reply(p, &h, EACCES, 0, 0, -1);
        }
        vn_util_close_fd(&fd);
        return;
    }
    switch (h.op) {
    case VN_HOST_HELLO:
        reply(p, &h, 0, hello_arg(p->fab), vn_fabric_limits(p->fab)->max_windows, -1);
        /* A lender's worker learns who holds the device, then gets what
         * came while it was away. */
        if (p->inbound && p->peer != NULL) {
            to_worker(p, VN_HOST_LINK, 0, 0, p->peer, 1, 0, NULL, 0, -1);
            ins_flush(p);
        }
        break;
    case VN_HOST_CONNECT:
        vn_fabric_connect(p->fab, p->peer, NULL);
        reply(p, &h, vn_fabric_link_up(p->fab, p->peer) ? 0 : ENOTCONN, 0, 0, -1);
        break;
    case VN_HOST_SEND:
        relay_frame(p, frame, frame_len);
        break;
    case VN_HOST_MAP:
        op_map(p, &h);
        break;
    case VN_HOST_UNMAP:
        op_unmap(p, &h);
        break;
    case VN_HOST_EXPORT_SEGMENT:
    case VN_HOST_EXPORT_ROUTE:
        op_export(p, &h, fd);
        break;
    case VN_HOST_UNEXPORT_SEGMENT:
    case VN_HOST_UNEXPORT_ROUTE:
        if (array_take(p->withdrawn, h.arg)) {
            break; /* the daemon did it already */
        }
        if (!array_take(h.op == VN_HOST_UNEXPORT_ROUTE ? p->routes : p->segments, h.arg)) {
            refuse(p, "an unexport of %" PRIu64 ", which is not its", h.arg);
        } else if (h.op == VN_HOST_UNEXPORT_ROUTE) {
            vn_fabric_route_unexport(p->fab, h.arg);
        } else {
            vn_fabric_segment_unexport(p->fab, h.arg);
        }
        break;
    case VN_HOST_OPEN_ROUTE:
        op_open_route(p, &h);
        break;
    case VN_HOST_WITHHOLD_SEGMENT:
        op_withhold(p, &h);
        break;
    case VN_HOST_JOIN_WINDOWS:
        op_join(p, &h, frame, frame_len);
        break;
    case VN_HOST_FENCED:
        if (!p->inbound) {
            refuse(p, "a fence from a borrower's worker");
        } else if (p->fenced != NULL) {
            p->fenced(p->fenced_opaque);
        }
        break;
    case VN_HOST_DEVICE_SERVER:
        if (!p->inbound) {
            refuse(p, "a device server's state from a borrower's worker");
        } else if (h.arg > 1 || h.arg2 > G_MAXUINT32) {
            refuse(p, "a device server state %" PRIu64 ", generation %" PRIu64, h.arg, h.arg2);
        } else if (p->device_server != NULL) {
            p->device_server(p->device_server_opaque, h.arg == 1, (uint32_t)h.arg2);
        }
        break;
    case VN_HOST_KEEP:
    case VN_HOST_FORGET:
        op_keep(p, &h, &fd, frame, frame_len);
        break;
    case VN_HOST_DEVICE_REQUEST:
        if (!p->inbound) {
            refuse(p, "a device request from a borrower's worker");
        } else if (p->device_request != NULL) {
            p->device_request(p->device_request_opaque);
        }
        break;
    default:
        op_doorbells(p, &h);
        break;
    }
    vn_util_close_fd(&fd);
}

static gboolean on_worker(int fd, GIOCondition cond, gpointer data)
{
    VnPort *p = data;

    /* A bounded batch per wake-up: one chatty worker cannot starve the
     * daemon's loop. */
    for (int i = 0; i < 64 && p->fd >= 0; i++) {
        VnRecord rec;
        g_autofree uint8_t *buf = NULL;
        int ret = vn_record_step(&p->rx, p->fd, VN_HOST_MAX_RECORD, &rec);

        if (ret == 0) {
            break;
        }
        if (ret < 0) {
            if (ret != -ECONNRESET) {
                refuse(p, "a broken stream (%s)", g_strerror(-ret));
            }
            conn_close(p);
            if (p->gone != NULL) {
                p->gone(p->gone_opaque);
            }
            break;
        }
        buf = rec.buf;
        worker_record(p, &rec);
    }
    return G_SOURCE_CONTINUE;
}

void vn_port_drain(VnPort *p)
{
    /* Bounded: a worker that exited has sent all it will. */
    for (int i = 0; i < 16 && p->fd >= 0; i++) {
        on_worker(p->fd, G_IO_IN, p);
    }
}

static gboolean on_accept(int fd, GIOCondition cond, gpointer data)
{
    VnPort *p = data;
    struct timeval tv = { .tv_sec = 2 };
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

    if (c < 0) {
        return G_SOURCE_CONTINUE;
    }
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        close(c);
        return G_SOURCE_CONTINUE;
    }
    /* The worker again (it reconnected): its new connection replaces the
     * old; what it holds stays. */
    conn_close(p);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    p->fd = c;
    p->src = g_unix_fd_source_new(c, G_IO_IN | G_IO_HUP | G_IO_ERR);
    g_source_set_callback(p->src, G_SOURCE_FUNC(on_worker), p, NULL);
    g_source_attach(p->src, p->ctx);
    return G_SOURCE_CONTINUE;
}

/* ---- the daemon's fence ---------------------------------------------------- */

/* Withdraw every id of @ids (segments or routes) and remember it as withdrawn; how many. */
static guint withdraw_ids(VnPort *p, GArray *ids, bool route)
{
    guint n = ids->len;

    for (guint i = 0; i < n; i++) {
        uint64_t id = g_array_index(ids, uint64_t, i);

        if (route) {
            vn_fabric_route_unexport(p->fab, id);
        } else {
            vn_fabric_segment_unexport(p->fab, id);
        }
        /* Bounded: a worker's ids are, and its own unexports take them out again. */
        if (p->withdrawn->len < VN_PORT_MAX_WITHDRAWN) {
            g_array_append_val(p->withdrawn, id);
        }
    }
    g_array_set_size(ids, 0);
    return n;
}

void vn_port_withdraw(VnPort *p, bool everything, const char *why)
{
    guint segments = withdraw_ids(p, p->segments, false);
    guint routes = withdraw_ids(p, p->routes, true);
    guint windows = 0, doorbells = 0;

    if (everything) {
        for (guint i = 0; i < p->maps->len; i++) {
            ((VnPortMap *)p->maps->pdata[i])->port = NULL; /* freed when answered */
        }
        g_ptr_array_set_size(p->maps, 0);
        windows = p->windows->len;
        for (guint i = 0; i < p->windows->len; i++) {
            vn_fabric_window_unmap(p->fab, p->windows->pdata[i]);
        }
        g_ptr_array_set_size(p->windows, 0);
        for (uint32_t b = 0; b < VN_FABRIC_MAX_DOORBELLS; b++) {
            if (p->doorbells & (UINT64_C(1) << b)) {
                vn_fabric_doorbells_free(p->fab, b, 1);
                doorbells++;
            }
        }
        p->doorbells = 0;
        ins_fail(p, ECONNRESET, "the device's worker is gone");
        g_array_set_size(p->withdrawn, 0); /* no worker to unexport them */
    }
    if (segments + routes + windows + doorbells > 0) {
        g_info("port %s: %s: withdrew %u segments, %u routes, %u windows, %u doorbells of its "
               "worker's",
               p->path, why, segments, routes, windows, doorbells);
    }
}

/* ---- life ------------------------------------------------------------- */

static bool port_listen(VnPort *p, GError **error)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int e;

    if (strlen(p->path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_FILENAME_TOO_LONG,
                    "port %s: too long for a socket", p->path);
        return false;
    }
    strcpy(addr.sun_path, p->path);
    p->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    /* A socket left by the daemon before us (adopting its worker): no one
     * listens on it any more. */
    unlink(p->path);
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        chmod(p->path, 0600) < 0 || listen(p->listen_fd, 4) < 0) {
        e = errno;
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "port %s: %s", p->path,
                    g_strerror(e));
        return false;
    }
    p->listen_src = g_unix_fd_source_new(p->listen_fd, G_IO_IN);
    g_source_set_callback(p->listen_src, G_SOURCE_FUNC(on_accept), p, NULL);
    g_source_attach(p->listen_src, p->ctx);
    return true;
}

VnPort *vn_port_new(VnFabric *fab, const char *path, const char *peer, const char *device,
                    bool inbound, GMainContext *ctx, GError **error)
{
    VnPort *p = g_new0(VnPort, 1);

    p->ctx = ctx;
    p->inbound = inbound;
    p->ins = g_ptr_array_new();

    p->fab = fab;
    p->path = g_strdup(path);
    p->peer = g_strdup(peer);
    p->device = g_strdup(device);
    p->listen_fd = -1;
    p->fd = -1;
    p->windows = g_ptr_array_new();
    p->keep = inbound ? NULL : vn_keep_new();
    p->maps = g_ptr_array_new();
    p->segments = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    p->routes = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    p->withdrawn = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    p->relays = g_ptr_array_new();
    p->out = g_byte_array_new();
    if (!port_listen(p, error)) {
        vn_port_free(p, false);
        return NULL;
    }
    return p;
}

void vn_port_free_unlinked(VnPort *p)
{
    vn_port_free(p, true);
}

void vn_port_free(VnPort *p, bool unlink_it)
{
    if (p == NULL) {
        return;
    }
    conn_close(p);
    if (p->listen_src != NULL) {
        g_source_destroy(p->listen_src);
        g_source_unref(p->listen_src);
    }
    if (p->listen_fd >= 0 && unlink_it) {
        unlink(p->path);
    }
    vn_util_close_fd(&p->listen_fd);
    for (guint i = 0; i < p->relays->len; i++) {
        ((VnPortRelay *)p->relays->pdata[i])->port = NULL; /* freed when answered */
    }
    vn_port_withdraw(p, true, "its port closes");
    /* After the withdrawal: QEMU sees its connection end once the device cannot reach it. */
    g_clear_pointer(&p->keep, vn_keep_free);
    g_ptr_array_unref(p->ins);
    g_ptr_array_unref(p->maps);
    g_ptr_array_unref(p->relays);
    g_ptr_array_unref(p->windows);
    g_array_unref(p->segments);
    g_array_unref(p->routes);
    g_array_unref(p->withdrawn);
    g_byte_array_unref(p->out);
    g_free(p->path);
    g_free(p->peer);
    g_free(p->device);
    g_free(p);
}
