/*
 * A worker's port (see port.h): the daemon relays for a worker that is not
 * a fabric node.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "port.h"

#include "port-conn.h"
#include "port-ops.h"

#include "common/util.h"
#include "fabric/frame.h"
#include "lending/proto.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <inttypes.h>
#include <poll.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

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

/* ---- to the worker ---------------------------------------------------- */

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
    vn_port_to_worker(p, VN_HOST_RECV, 0, 0, p->peer, 0, 0, p->out->data, p->out->len, -1);
}

/* HELLO's arg: our caps and our largest window (host.h). */
static uint64_t hello_arg(VnFabric *fab)
{
    uint64_t w = vn_fabric_limits(fab)->max_window_size;

    return vn_fabric_caps(fab) |
           (w != 0 ? (uint64_t)(63 - __builtin_clzll(w)) << VN_HOST_HELLO_WINDOW_SHIFT : 0);
}

static void on_peer_linked(void *opaque, int err)
{
    VnPort *p = opaque;
    VnHostHdr h = { .seq = p->connect_seq };

    p->connect = NULL;
    vn_port_reply(p, &h,
                  err < 0 || p->peer == NULL || !vn_fabric_link_up(p->fab, p->peer) ? ENOTCONN : 0,
                  0, 0, -1);
}

/* The worker asks for its peer's link: answered when it is up, or did not come (the loop does
 * not wait for it).  A worker asks one at a time; another meanwhile is refused. */
static void port_connect(VnPort *p, const VnHostHdr *h)
{
    if (p->peer == NULL) {
        vn_port_reply(p, h, ENOTCONN, 0, 0, -1);
        return;
    }
    if (p->connect != NULL) {
        vn_port_reply(p, h, EBUSY, 0, 0, -1);
        return;
    }
    p->connect_seq = h->seq;
    p->connect = vn_fabric_connect_async(p->fab, p->peer, on_peer_linked, p);
    if (p->connect == NULL) {
        vn_port_reply(p, h, ENOTCONN, 0, 0, -1);
    }
}

static bool is_peer(VnPort *p, const char *peer)
{
    return p->peer != NULL && peer != NULL && strcmp(peer, p->peer) == 0;
}

/* A map or unmap of another node's segment its holder allowed (vn_port_p2p_allow). */
static bool p2p_allowed(VnPort *p, const VnHostHdr *h)
{
    if (h->op != VN_HOST_MAP && h->op != VN_HOST_UNMAP) {
        return false;
    }
    for (guint i = 0; i < p->p2p_allowed->len; i++) {
        const VnPortHeld *a = &g_array_index(p->p2p_allowed, VnPortHeld, i);

        if (a->id == h->arg && strcmp(a->peer, h->peer) == 0) {
            return true;
        }
    }
    return false;
}

bool vn_port_p2p_allow(VnPort *p, const char *node, uint64_t segment)
{
    VnPortHeld a = { .id = segment };
    VnHostHdr h = { .op = VN_HOST_MAP, .arg = segment };

    if (!p->inbound || segment == 0 || strlen(node) >= sizeof(a.peer)) {
        return false;
    }
    g_strlcpy(h.peer, node, sizeof(h.peer));
    if (p2p_allowed(p, &h)) {
        return true;
    }
    if (p->p2p_allowed->len >= VN_PORT_MAX_P2P) {
        return false;
    }
    g_strlcpy(a.peer, node, sizeof(a.peer));
    g_array_append_val(p->p2p_allowed, a);
    return true;
}

void vn_port_set_peer(VnPort *p, const char *peer)
{
    if (p->peer != NULL && (peer == NULL || strcmp(peer, p->peer) != 0)) {
        /* For the worker, its peer's link went: a borrower loses its lender,
         * a lender fences the device. */
        vn_port_to_worker(p, VN_HOST_LINK, 0, 0, p->peer, 0, 0, NULL, 0, -1);
        vn_port_ins_fail(p, ECONNRESET, "the lease ended");
        g_clear_pointer(&p->peer, g_free);
        g_array_set_size(p->p2p_allowed, 0); /* the holder's word */
    }
    if (peer != NULL && p->peer == NULL) {
        p->peer = g_strdup(peer);
        /* A lender's worker learns its holder; a borrower's, that its
         * lender, given up on, is back. */
        if (p->inbound || vn_fabric_link_up(p->fab, p->peer)) {
            vn_port_to_worker(p, VN_HOST_LINK, 0, 0, p->peer, 1, 0, NULL, 0, -1);
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
            vn_port_to_worker(p, VN_HOST_RECV, 0, 0, p->peer, 0, 0, in->frame->data, in->frame->len,
                              -1);
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
    vn_port_refuse(p, "an answer to no request of its peer's (id %" PRIu64 ")", f->hdr.id);
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
        vn_port_refuse(p, "a malformed frame");
        return;
    }
    kind = f.hdr.flags & VN_FABRIC_FLAG_KIND_MASK;
    if (kind == VN_FABRIC_FLAG_REPLY && p->inbound) {
        in_answered(p, &f);
        return;
    }
    if (p->peer == NULL) {
        vn_port_refuse(p, "a %s with no peer to take it", vn_fabric_kind_to_string(f.hdr.flags));
        return;
    }
    if (kind == VN_FABRIC_FLAG_EVENT && f.hdr.type == VN_FABRIC_TYPE_DOORBELL) {
        if (f.hdr.data_len != sizeof(bit)) {
            vn_port_refuse(p, "a doorbell of %u bytes", f.hdr.data_len);
            return;
        }
        memcpy(&bit, f.data, sizeof(bit));
        vn_fabric_doorbell(p->fab, p->peer, GUINT32_FROM_LE(bit));
        return;
    }
    if (kind == VN_FABRIC_FLAG_REPLY || f.hdr.type >= VN_FABRIC_TYPE_RESERVED ||
        !names_its_device(p, &f)) {
        vn_port_refuse(p, "a %s of type 0x%x that is not about %s",
                       vn_fabric_kind_to_string(f.hdr.flags), f.hdr.type, p->device);
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
        vn_port_refuse(p, "more than %u requests in flight", VN_PORT_MAX_INFLIGHT);
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

/* The worker's process, reconnecting without its secret: no worker of ours (its pid was
 * taken by another), so nobody may connect any more, and the daemon hears its worker is
 * gone. */
static void refuse_impostor(VnPort *p)
{
    g_warning("port %s: refused pid %d: it connected as the worker of %s but does not know "
              "its secret",
              p->path, (int)p->worker, p->device);
    p->refused++;
    p->worker = 0;
    vn_port_conn_close(p);
    if (p->gone != NULL) {
        p->gone(p->gone_opaque);
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
        vn_port_refuse(p, "%s", why);
        vn_port_conn_close(p);
        return;
    }
    fd = rec->nfds == 1 ? rec->fds[0] : -1;
    if (!p->authed) {
        if (h.op != VN_HOST_HELLO || !vn_port_secret_ok(p, frame, frame_len)) {
            vn_util_close_fd(&fd);
            refuse_impostor(p);
            return;
        }
        p->authed = true;
        g_message("port %s: its worker (pid %d) is back", p->path, (int)p->worker);
    }
    if (h.peer[0] != '\0' && !is_peer(p, h.peer) && !p2p_allowed(p, &h)) {
        vn_port_refuse(p, "%s for %s, not its peer %s", vn_host_op_to_string(h.op), h.peer,
                       p->peer != NULL ? p->peer : "(none)");
        if (h.op == VN_HOST_MAP || h.op == VN_HOST_EXPORT_SEGMENT || h.op == VN_HOST_EXPORT_ROUTE ||
            h.op == VN_HOST_OPEN_ROUTE || h.op == VN_HOST_JOIN_WINDOWS) {
            vn_port_reply(p, &h, EACCES, 0, 0, -1);
        }
        vn_util_close_fd(&fd);
        return;
    }
    switch (h.op) {
    case VN_HOST_HELLO:
        /* With the secret it proves itself with when it has to reconnect. */
        vn_port_to_worker(p, VN_HOST_REPLY, h.seq, 0, NULL, hello_arg(p->fab),
                          vn_fabric_limits(p->fab)->max_windows, p->secret,
                          p->has_secret ? sizeof(p->secret) : 0, -1);
        /* A lender's worker learns who holds the device, then gets what
         * came while it was away. */
        if (p->inbound && p->peer != NULL) {
            vn_port_to_worker(p, VN_HOST_LINK, 0, 0, p->peer, 1, 0, NULL, 0, -1);
            ins_flush(p);
        }
        break;
    case VN_HOST_CONNECT:
        port_connect(p, &h);
        break;
    case VN_HOST_SEND:
        relay_frame(p, frame, frame_len);
        break;
    case VN_HOST_MAP:
        vn_port_op_map(p, &h);
        break;
    case VN_HOST_UNMAP:
        vn_port_op_unmap(p, &h);
        break;
    case VN_HOST_EXPORT_SEGMENT:
    case VN_HOST_EXPORT_ROUTE:
        vn_port_op_export(p, &h, fd);
        break;
    case VN_HOST_UNEXPORT_SEGMENT:
    case VN_HOST_UNEXPORT_ROUTE:
        if (vn_port_array_take(p->withdrawn, h.arg)) {
            break; /* the daemon did it already */
        }
        if (!vn_port_array_take(h.op == VN_HOST_UNEXPORT_ROUTE ? p->routes : p->segments, h.arg)) {
            vn_port_refuse(p, "an unexport of %" PRIu64 ", which is not its", h.arg);
        } else if (h.op == VN_HOST_UNEXPORT_ROUTE) {
            vn_fabric_route_unexport(p->fab, h.arg);
        } else {
            vn_fabric_segment_unexport(p->fab, h.arg);
        }
        break;
    case VN_HOST_OPEN_ROUTE:
        vn_port_op_open_route(p, &h);
        break;
    case VN_HOST_WITHHOLD_SEGMENT:
        vn_port_op_withhold(p, &h);
        break;
    case VN_HOST_CLAIM:
        vn_port_op_claim(p, &h);
        break;
    case VN_HOST_JOIN_WINDOWS:
        vn_port_op_join(p, &h, frame, frame_len);
        break;
    case VN_HOST_FENCED:
        if (!p->inbound) {
            vn_port_refuse(p, "a fence from a borrower's worker");
        } else if (p->fenced != NULL) {
            p->fenced(p->fenced_opaque);
        }
        break;
    case VN_HOST_DEVICE_SERVER:
        if (!p->inbound) {
            vn_port_refuse(p, "a device server's state from a borrower's worker");
        } else if (h.arg > 1 || h.arg2 > G_MAXUINT32) {
            vn_port_refuse(p, "a device server state %" PRIu64 ", generation %" PRIu64, h.arg,
                           h.arg2);
        } else if (p->device_server != NULL) {
            p->device_server(p->device_server_opaque, h.arg == 1, (uint32_t)h.arg2);
        }
        break;
    case VN_HOST_KEEP:
    case VN_HOST_FORGET:
        vn_port_op_keep(p, &h, &fd, frame, frame_len);
        break;
    case VN_HOST_DIAL_DEVICE:
        vn_port_op_dial(p, &h);
        break;
    case VN_HOST_P2P_PLACE:
    case VN_HOST_P2P_OFFER:
    case VN_HOST_P2P_WITHDRAW:
        vn_port_op_p2p(p, &h, frame, frame_len);
        break;
    case VN_HOST_DEVICE_REQUEST:
        if (!p->inbound) {
            vn_port_refuse(p, "a device request from a borrower's worker");
        } else if (p->device_request != NULL) {
            p->device_request(p->device_request_opaque);
        }
        break;
    default:
        vn_port_op_doorbells(p, &h);
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
                vn_port_refuse(p, "a broken stream (%s)", g_strerror(-ret));
            }
            vn_port_conn_close(p);
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

static void conn_attach(VnPort *p, int fd, bool authed)
{
    p->fd = fd;
    p->authed = authed;
    p->src = vn_util_fd_source_new(fd, G_IO_IN | G_IO_HUP | G_IO_ERR);
    g_source_set_callback(p->src, G_SOURCE_FUNC(on_worker), p, NULL);
    g_source_attach(p->src, p->ctx);
}

/* A connection to the socket: only the worker's own process, once its connection was lost
 * (it lost it, or it outlived the daemon before us); it proves itself with its secret. */
static gboolean on_accept(int fd, GIOCondition cond, gpointer data)
{
    VnPort *p = data;
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

    if (c < 0) {
        return G_SOURCE_CONTINUE;
    }
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
        cred.pid = 0;
    }
    if (p->fd >= 0 || p->worker <= 0 || cred.pid != p->worker || !p->has_secret) {
        p->refused++;
        g_warning("port %s: refused a connection by pid %d: %s", p->path, (int)cred.pid,
                  p->fd >= 0       ? "its worker is connected"
                  : p->worker <= 0 ? "it has no worker"
                                   : "not its worker's process");
        close(c);
        return G_SOURCE_CONTINUE;
    }
    conn_attach(p, c, false);
    return G_SOURCE_CONTINUE;
}

int vn_port_pair(VnPort *p, GError **error)
{
    int sv[2] = { -1, -1 };

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0 ||
        getrandom(p->secret, sizeof(p->secret), 0) != (ssize_t)sizeof(p->secret)) {
        int e = errno;

        vn_util_close_fds(sv, 2);
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "port %s: %s", p->path,
                    g_strerror(e));
        return -1;
    }
    vn_port_conn_close(p);
    p->has_secret = true;
    p->worker = 0; /* vn_port_set_worker() once it runs */
    conn_attach(p, sv[0], true);
    return sv[1];
}

void vn_port_set_worker(VnPort *p, GPid pid)
{
    p->worker = pid;
}

GPid vn_port_worker(VnPort *p)
{
    return p->worker;
}

char *vn_port_secret_hex(VnPort *p)
{
    GString *s;

    if (!p->has_secret) {
        return NULL;
    }
    s = g_string_sized_new(2 * VN_PORT_SECRET_LEN);
    for (size_t i = 0; i < VN_PORT_SECRET_LEN; i++) {
        g_string_append_printf(s, "%02x", p->secret[i]);
    }
    return g_string_free(s, FALSE);
}

bool vn_port_adopt(VnPort *p, GPid pid, const char *secret_hex)
{
    uint8_t secret[VN_PORT_SECRET_LEN];

    if (pid <= 1 || secret_hex == NULL || strlen(secret_hex) != 2 * VN_PORT_SECRET_LEN) {
        return false;
    }
    for (size_t i = 0; i < VN_PORT_SECRET_LEN; i++) {
        int hi = g_ascii_xdigit_value(secret_hex[2 * i]);
        int lo = g_ascii_xdigit_value(secret_hex[2 * i + 1]);

        if (hi < 0 || lo < 0) {
            return false;
        }
        secret[i] = (uint8_t)(hi << 4 | lo);
    }
    memcpy(p->secret, secret, sizeof(secret));
    p->has_secret = true;
    p->worker = pid;
    return true;
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
        windows = p->windows->len + p->adopted_windows->len;
        for (guint i = 0; i < p->windows->len; i++) {
            vn_fabric_window_unmap(p->fab, p->windows->pdata[i]);
        }
        g_ptr_array_set_size(p->windows, 0);
        vn_port_adopted_unmap(p, 0);
        for (uint32_t b = 0; b < VN_FABRIC_MAX_DOORBELLS; b++) {
            if (p->doorbells & (UINT64_C(1) << b)) {
                vn_fabric_doorbells_free(p->fab, b, 1);
                doorbells++;
            }
        }
        p->doorbells = 0;
        vn_port_ins_fail(p, ECONNRESET, "the device's worker is gone");
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
    p->listen_src = vn_util_fd_source_new(p->listen_fd, G_IO_IN);
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
    p->dialled = -1;
    p->windows = g_ptr_array_new();
    p->keep = inbound ? NULL : vn_keep_new();
    p->maps = g_ptr_array_new();
    p->segments = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    p->routes = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    p->withdrawn = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    p->adopted_windows = g_array_new(FALSE, FALSE, sizeof(VnPortHeld));
    p->p2p_allowed = g_array_new(FALSE, FALSE, sizeof(VnPortHeld));
    p->relays = g_ptr_array_new();
    p->out = g_byte_array_new();
    if (!port_listen(p, error)) {
        vn_port_free(p, false);
        return NULL;
    }
    return p;
}

static void port_free(VnPort *p, bool unlink_it, bool withdraw);

void vn_port_free_unlinked(VnPort *p)
{
    vn_port_free(p, true);
}

void vn_port_free(VnPort *p, bool unlink_it)
{
    port_free(p, unlink_it, true);
}

bool vn_port_holds_paths(const VnPort *p)
{
    return p->segments->len + p->routes->len + p->windows->len + p->adopted_windows->len > 0;
}

void vn_port_leave(VnPort *p)
{
    port_free(p, false, false);
}

static void port_free(VnPort *p, bool unlink_it, bool withdraw)
{
    if (p == NULL) {
        return;
    }
    vn_port_conn_close(p);
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
    if (withdraw) {
        vn_port_withdraw(p, true, "its port closes");
    }
    if (unlink_it && p->p2p != NULL) {
        /* Its worker is gone for good: its BARs and offers with it (port.h). */
        p->p2p(p->p2p_opaque, VN_HOST_P2P_PLACE, 0, 0, NULL, 0);
        p->p2p(p->p2p_opaque, VN_HOST_P2P_WITHDRAW, 0, UINT64_MAX, NULL, 0);
    }
    /* After the withdrawal: QEMU sees its connection end once the device cannot reach it. */
    g_clear_pointer(&p->keep, vn_keep_free);
    g_ptr_array_unref(p->ins);
    g_ptr_array_unref(p->maps);
    g_ptr_array_unref(p->relays);
    g_ptr_array_unref(p->windows);
    g_array_unref(p->segments);
    g_array_unref(p->routes);
    g_array_unref(p->withdrawn);
    g_array_unref(p->adopted_windows);
    g_array_unref(p->p2p_allowed);
    g_byte_array_unref(p->out);
    g_free(p->path);
    g_free(p->peer);
    g_free(p->device);
    g_free(p->dial_path);
    if (p->dialled >= 0) {
        close(p->dialled); /* not shut down: the worker may serve on with it */
    }
    g_free(p);
}
