/*
 * The `shm` fabric backend (see shm.h): node sockets in a fabric directory,
 * length-prefixed records, link up/down from the sockets themselves, and
 * one-shot fetch connections that pass a segment's memfd or a route's
 * eventfd (SCM_RIGHTS) from the exporting backend to the mapping one.
 *
 * Receiving never blocks (MSG_DONTWAIT, one record's state per connection),
 * so a peer that sends half a record stalls nothing; nor does sending on a link
 * (VnRecordOut): what the peer's socket does not take waits, at most
 * VN_SHM_MAX_QUEUED bytes, and a peer that takes nothing for VN_SHM_SEND_TIMEOUT_S,
 * or would make more wait, loses its link.  Nor does a dial: a peer whose backlog is full
 * (stopped, or not accepting) refuses it at once, and it is tried again at the next
 * heartbeat.  Nor does a HELLO, a FETCH or its answer, each the first record on a socket
 * of its own, which a fresh socket's buffer takes whole.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "shm.h"
#include "frame.h"
#include "record.h"

#include "common/fdset.h"
#include "common/fdpass.h"
#include "common/name.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

G_STATIC_ASSERT(sizeof(VnShmHello) == 40);
G_STATIC_ASSERT(sizeof(VnShmFetch) == 56);
G_STATIC_ASSERT(sizeof(VnShmFetchReply) == 24);

typedef struct VnShm VnShm;

/* One socket to a peer.  Refcounted: a record handed up may lead (through
 * its handler) to this very connection being dropped, while its reader is still on the stack. */
typedef struct VnShmConn {
    int ref;
    VnShm *shm;
    int fd;                          /* -1 once dropped */
    VnFdSetWatch *watch;             /* in shm->links */
    GSource *hello_timer;            /* until named (accepted connections) */
    char peer[VN_MAX_NODE_NAME + 1]; /* "" until named */
    bool outgoing;                   /* we opened it */
    bool draining;                   /* lost a tie: read to EOF, never send */
    VnRecordReader rx;               /* the record being received */
    VnRecordOut *out;                /* the link's records on their way, once one was sent */
} VnShmConn;

struct VnShm {
    VnFabric *fab;
    GMainContext *ctx;
    VnFdSet *links; /* every connection's fd: a wake-up polls one fd, not one per peer */
    char *node;
    char *path; /* our socket */
    bool bound; /* the socket file is ours to unlink */
    int listen_fd;
    GSource *listen_src;
    GPtrArray *conns;           /* every VnShmConn, one ref each */
    GHashTable *active;         /* peer -> VnShmConn carrying its link */
    uint64_t crossing_delay_ns; /* busy-wait before each send (shm.h) */
    bool closing;
    GPtrArray *fetches; /* VnShmFetching *, maps answered on the loop */
};

static void conn_unref(gpointer data)
{
    VnShmConn *c = data;

    if (--c->ref > 0) {
        return;
    }
    vn_record_reader_clear(&c->rx);
    g_free(c);
}

static void conn_drop(VnShmConn *c, const char *why)
{
    VnShm *shm = c->shm;
    bool was_active;

    if (c->fd < 0) {
        return;
    }
    c->ref++;
    g_clear_pointer(&c->watch, vn_fdset_remove);
    g_clear_pointer(&c->hello_timer, g_source_destroy);
    g_clear_pointer(&c->out, vn_record_out_free); /* before its fd goes */
    vn_util_close_fd(&c->fd);
    was_active = c->peer[0] != '\0' && g_hash_table_lookup(shm->active, c->peer) == c;
    if (was_active) {
        g_hash_table_remove(shm->active, c->peer);
    }
    g_ptr_array_remove_fast(shm->conns, c);
    if (c->peer[0] != '\0') {
        g_info("socket %s: connection with %s closed (%s)", shm->path, c->peer, why);
    }
    /* Link down last, with our tables consistent: its handler may connect
     * again at once. */
    if (was_active && !shm->closing) {
        vn_fabric_backend_link(shm->fab, c->peer, false);
    }
    conn_unref(c);
}

/* The first record on a connection (a HELLO, a FETCH, its answer): small, never waited for. */
static int send_record(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    G_STATIC_ASSERT(sizeof(VnShmFetch) <= VN_RECORD_MAX_FRESH);
    return vn_record_send_fresh(fd, buf, len, fds, nfds);
}

/*
 * Of two live connections with one peer (each node opened one), both ends
 * must keep the same one: the one opened by the node whose name sorts
 * first.
 */
static VnShmConn *tie_break(VnShm *shm, VnShmConn *old, VnShmConn *c)
{
    if (strcmp(shm->node, c->peer) < 0) {
        return old->outgoing ? old : c;
    }
    return old->outgoing ? c : old;
}

static int conn_service(VnShmConn *c, int max_records);

/* @c (accepted) has just been named: make it the link, unless a live one
 * exists. */
static void conn_named(VnShmConn *c)
{
    VnShm *shm = c->shm;
    VnShmConn *old = g_hash_table_lookup(shm->active, c->peer);
    VnShmConn *keep, *drain;

    if (old != NULL) {
        /* A restarted peer's old connection may not have been read to its
         * EOF yet: read what it holds first (that may end it). */
        conn_service(old, VN_SHM_RECORDS_PER_WAKEUP);
        old = g_hash_table_lookup(shm->active, c->peer);
    }
    if (old == NULL && g_hash_table_size(shm->active) >= VN_FABRIC_MAX_PEERS) {
        conn_drop(c, "too many peers");
        return;
    }
    if (old == NULL) {
        g_hash_table_replace(shm->active, c->peer, c);
        g_info("socket %s: %s connected", shm->path, c->peer);
        vn_fabric_backend_link(shm->fab, c->peer, true);
        return;
    }
    if (!old->outgoing) {
        /* Both opened by the peer while the first is alive: an impostor or
         * a confused peer; the established link stays. */
        g_info("socket %s: a second connection from %s refused", shm->path, c->peer);
        conn_drop(c, "a second connection");
        return;
    }
    keep = tie_break(shm, old, c);
    drain = keep == c ? old : c;
    g_info("socket %s: two connections with %s; keeping the one %s opened", shm->path, c->peer,
           keep->outgoing ? shm->node : c->peer);
    g_hash_table_replace(shm->active, keep->peer, keep);
    drain->draining = true;
    /* Only the side that opened the loser ends it, once it knows it lost;
     * an EOF from us could reach the peer while that connection is still
     * its link.  Frames already sent on it are read before the EOF. */
    if (drain->outgoing) {
        shutdown(drain->fd, SHUT_WR);
    }
}

/*
 * Answer a FETCH from @node and close the connection.  The fd goes only to
 * a node whose link is up, for what the fabric says was exported to it.
 */
static void conn_fetch(VnShmConn *c, const VnShmFetch *f, const char *node)
{
    VnShm *shm = c->shm;
    VnShmFetchReply rep = { .magic = VN_SHM_FETCH_MAGIC };
    int fd, ret;

    if (!g_hash_table_contains(shm->active, node)) {
        fd = -ENOTCONN;
    } else if (f->kind == VN_SHM_FETCH_SEGMENT) {
        fd = vn_fabric_backend_segment(shm->fab, node, f->id, &rep.size, &rep.offset, NULL);
    } else {
        fd = vn_fabric_backend_route(shm->fab, node, f->id);
    }
    rep.status = fd < 0 ? -fd : 0;
    ret = send_record(c->fd, &rep, sizeof(rep), fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
    if (ret < 0) {
        g_info("socket %s: cannot answer %s's fetch: %s", shm->path, node, g_strerror(-ret));
    }
    conn_drop(c, "fetch answered");
}

/* The first record of an accepted connection; false to drop it. */
static bool conn_hello(VnShmConn *c, const VnRecord *rec)
{
    VnShm *shm = c->shm;
    char node[VN_MAX_NODE_NAME + 1];
    VnShmFetch fetch;
    g_autofree char *why =
        vn_shm_hello_check(rec->buf, rec->len, rec->nfds, rec->overflow, shm->node, node, &fetch);

    if (why != NULL) {
        g_autofree char *what = g_strdup_printf("socket %s: %s", shm->path, why);

        vn_fabric_backend_rejected(shm->fab, what);
        return false;
    }
    g_clear_pointer(&c->hello_timer, g_source_destroy);
    if (fetch.hello.magic == VN_SHM_FETCH_MAGIC) {
        conn_fetch(c, &fetch, node);
        return true;
    }
    g_strlcpy(c->peer, node, sizeof(c->peer));
    conn_named(c);
    return true;
}

/* Read toward one record; 1 when one was handled, 0 when the socket has no
 * more for now, -errno when the connection must go. */
static int conn_step(VnShmConn *c)
{
    VnShm *shm = c->shm;
    VnRecord rec;
    g_autofree uint8_t *buf = NULL;
    int ret = vn_record_step(
        &c->rx, c->fd,
        vn_shm_record_max(c->peer[0] == '\0' ? VN_SHM_RECORD_FIRST : VN_SHM_RECORD_FRAME), &rec);

    if (ret == -EMSGSIZE) {
        /* The stream cannot be trusted past a length like this. */
        g_autofree char *what =
            g_strdup_printf("socket %s: a record of %u bytes from %s", shm->path, c->rx.need,
                            c->peer[0] != '\0' ? c->peer : "an unnamed connection");

        vn_fabric_backend_rejected(shm->fab, what);
        return -EPROTO;
    }
    if (ret <= 0) {
        return ret;
    }
    /* The reader is ready for the next record already: the handler may
     * read this connection again. */
    buf = rec.buf;
    if (c->peer[0] == '\0') {
        vn_util_close_fds(rec.fds, rec.nfds);
        return conn_hello(c, &rec) ? 1 : -EPROTO;
    }
    if (!g_hash_table_contains(shm->active, c->peer)) {
        /* A drained connection outliving its peer's link: nobody to tell. */
        vn_util_close_fds(rec.fds, rec.nfds);
        return 1;
    }
    if (rec.nfds > 0 || rec.overflow) {
        /* Frames carry bytes only: whoever sends fds is not one of us. */
        g_autofree char *what =
            g_strdup_printf("socket %s: a frame with fds from %s", shm->path, c->peer);

        vn_util_close_fds(rec.fds, rec.nfds);
        vn_fabric_backend_rejected(shm->fab, what);
        return -EPROTO;
    }
    vn_fabric_backend_received(shm->fab, c->peer, buf, rec.len);
    return 1;
}

/* Read what @c holds (up to @max_records); 0, or -errno once it is gone. */
static int conn_service(VnShmConn *c, int max_records)
{
    int ret = 0;

    c->ref++;
    for (int i = 0; i < max_records && c->fd >= 0; i++) {
        ret = conn_step(c);
        if (ret <= 0) {
            break;
        }
    }
    if (c->fd < 0) {
        ret = -ECONNRESET; /* dropped by whoever we called */
    } else if (ret < 0) {
        conn_drop(c, ret == -ECONNRESET ? "closed by the peer" : g_strerror(-ret));
    } else {
        ret = 0;
    }
    conn_unref(c);
    return ret;
}

static void on_conn(int fd, GIOCondition cond, void *data)
{
    conn_service(data, VN_SHM_RECORDS_PER_WAKEUP);
}

static gboolean on_hello_timeout(gpointer data)
{
    VnShmConn *c = data;

    g_info("socket %s: a connection said no HELLO in %d ms", c->shm->path, VN_SHM_HELLO_TIMEOUT_MS);
    conn_drop(c, "no HELLO");
    return G_SOURCE_REMOVE;
}

static VnShmConn *conn_new(VnShm *shm, int fd, bool outgoing, const char *peer)
{
    VnShmConn *c = g_new0(VnShmConn, 1);

    c->ref = 1;
    c->shm = shm;
    c->fd = fd;
    c->outgoing = outgoing;
    c->watch = vn_fdset_add(shm->links, fd, G_IO_IN, on_conn, c);
    if (c->watch == NULL) {
        /* Only at the kernel's memory limit (epoll takes every socket) */
        g_warning("socket %s: cannot watch a connection: %s", shm->path, g_strerror(errno));
        close(fd);
        g_free(c);
        return NULL;
    }
    if (peer != NULL) {
        g_strlcpy(c->peer, peer, sizeof(c->peer));
    } else {
        c->hello_timer = g_timeout_source_new(VN_SHM_HELLO_TIMEOUT_MS);
        g_source_set_callback(c->hello_timer, on_hello_timeout, c, NULL);
        g_source_attach(c->hello_timer, shm->ctx);
        g_source_unref(c->hello_timer);
    }
    g_ptr_array_add(shm->conns, c);
    return c;
}

/* Accepted connections whose HELLO has not come yet. */
static unsigned unnamed(VnShm *shm)
{
    unsigned n = 0;

    for (guint i = 0; i < shm->conns->len; i++) {
        n += ((VnShmConn *)shm->conns->pdata[i])->peer[0] == '\0';
    }
    return n;
}

static gboolean on_accept(int fd, GIOCondition cond, gpointer data)
{
    VnShm *shm = data;
    VnShmConn *c;

    for (int i = 0; i < VN_SHM_MAX_UNNAMED; i++) {
        struct ucred cred;
        socklen_t clen = sizeof(cred);
        int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

        if (cfd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
                g_warning("socket %s: accept failed: %s", shm->path, g_strerror(errno));
            }
            break;
        }
        /* The directory is 0700 already; this also stops root-owned
         * mistakes: only our user (or root) may be a node. */
        if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
            (cred.uid != geteuid() && cred.uid != 0)) {
            g_info("socket %s: connection from another user refused", shm->path);
            close(cfd);
            continue;
        }
        if (unnamed(shm) >= VN_SHM_MAX_UNNAMED ||
            shm->conns->len >= VN_FABRIC_MAX_PEERS + VN_SHM_MAX_UNNAMED) {
            g_info("socket %s: connection refused: too many", shm->path);
            close(cfd);
            continue;
        }
        /* Its HELLO is sent with the connect, so it is mostly here already: named now, a
         * connection does not count against the unnamed ones while the loop does other
         * things (a host joining a large cluster is dialled by every node at once). */
        c = conn_new(shm, cfd, false, NULL);
        if (c != NULL) {
            conn_service(c, 1);
        }
    }
    return G_SOURCE_CONTINUE;
}

/* ---- ops -------------------------------------------------------------- */

/* @peer's socket: beside ours. */
static char *peer_path(VnShm *shm, const char *peer)
{
    g_autofree char *dir = g_path_get_dirname(shm->path);

    return g_strdup_printf("%s/%s.sock", dir, peer);
}

static int dial_nonblock(VnShm *shm, const char *peer)
{
    g_autofree char *path = peer_path(shm, peer);

    /* Non-blocking: -EAGAIN at once when its backlog is full (a peer that does not
     * accept), where a blocking connect waits. */
    return vn_util_dial_unix(path);
}

static int shm_connect(void *backend, const char *peer)
{
    VnShm *shm = backend;
    VnShmHello hello = { .magic = VN_SHM_HELLO_MAGIC, .version = VN_SHM_HELLO_VERSION };
    VnShmConn *c;
    int fd, ret;

    if (g_hash_table_contains(shm->active, peer)) {
        return 0;
    }
    if (g_hash_table_size(shm->active) >= VN_FABRIC_MAX_PEERS ||
        shm->conns->len >= VN_FABRIC_MAX_PEERS + VN_SHM_MAX_UNNAMED) {
        return -EMFILE;
    }
    fd = dial_nonblock(shm, peer);
    if (fd < 0) {
        return fd;
    }
    g_strlcpy(hello.node, shm->node, sizeof(hello.node));
    /* A new socket's buffer takes the HELLO whole; what it does not take fails the dial. */
    ret = send_record(fd, &hello, sizeof(hello), NULL, 0);
    if (ret < 0) {
        close(fd);
        return ret;
    }
    c = conn_new(shm, fd, true, peer);
    if (c == NULL) {
        return -ENOMEM;
    }
    g_hash_table_replace(shm->active, c->peer, c);
    g_info("socket %s: connected to %s", shm->path, peer);
    vn_fabric_backend_link(shm->fab, peer, true);
    return 0;
}

/*
 * The modelled NTB crossing (shm.h, "crossing-delay-ns"): the sender spins
 * for the delay, as a CPU stalls on a posted write or a doorbell register
 * until the fabric has taken it.  A spin, not a sleep: timer slack would
 * turn 400 ns into 50 us.  The delay is a lower bound (preemption only adds).
 */
static void crossing_delay(const VnShm *shm)
{
    uint64_t until;

    if (shm->crossing_delay_ns == 0) {
        return;
    }
    until = vn_util_now_ns() + shm->crossing_delay_ns;
    while (vn_util_now_ns() < until) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* A link's records went nowhere (@err): the socket is shut down, and its reader reports the
 * link down from the loop. */
static void on_out_failed(void *opaque, int err)
{
    VnShmConn *c = opaque;

    if (err == -ENOBUFS) {
        g_info("socket %s: %s would have more than %u bytes waiting for it; dropping the link",
               c->shm->path, c->peer, (unsigned)VN_SHM_MAX_QUEUED);
    } else if (err == -ETIMEDOUT) {
        g_info("socket %s: %s took nothing we sent for %d s; dropping the link", c->shm->path,
               c->peer, VN_SHM_SEND_TIMEOUT_S);
    } else {
        g_info("socket %s: send to %s failed: %s; dropping the link", c->shm->path, c->peer,
               g_strerror(-err));
    }
    if (c->fd >= 0) {
        shutdown(c->fd, SHUT_RDWR);
    }
}

static int shm_send(void *backend, const char *peer, const void *buf, size_t len)
{
    VnShm *shm = backend;
    VnShmConn *c = g_hash_table_lookup(shm->active, peer);

    if (c == NULL || c->fd < 0) {
        return -ENOTCONN;
    }
    crossing_delay(shm);
    if (c->out == NULL) {
        c->out = vn_record_out_new(c->fd, shm->ctx, VN_SHM_MAX_QUEUED, VN_SHM_SEND_TIMEOUT_S * 1000,
                                   on_out_failed, c);
    }
    /* Never waits: a link whose peer stops reading is dropped (on_out_failed). */
    return vn_record_out_send(c->out, buf, len, VN_FABRIC_MAX_FRAME, -1);
}

/* Open a FETCH connection to @peer for @kind @id: the socket (non-blocking,
 * the request sent), or -errno.  Never waiting: a peer that stops accepting
 * (its backlog full) is refused at once, where a blocking connect would hold
 * the caller's loop for VN_SHM_SEND_TIMEOUT_S. */
static int fetch_send(VnShm *shm, const char *peer, VnShmFetchKind kind, uint64_t id)
{
    VnShmFetch f = {
        .hello = { .magic = VN_SHM_FETCH_MAGIC, .version = VN_SHM_HELLO_VERSION },
        .kind = kind,
        .id = id,
    };
    int fd, ret;

    if (!g_hash_table_contains(shm->active, peer)) {
        return -ENOTCONN;
    }
    fd = dial_nonblock(shm, peer);
    if (fd < 0) {
        return fd;
    }
    g_strlcpy(f.hello.node, shm->node, sizeof(f.hello.node));
    crossing_delay(shm);
    /* A new connection's buffer takes this small record whole. */
    ret = send_record(fd, &f, sizeof(f), NULL, 0);
    if (ret < 0) {
        close(fd);
        return ret;
    }
    return fd;
}

/* The answer (@ret as vn_record_step() left it, @rec): the fd it brought,
 * with the reply in @rep, or -errno. */
static int fetch_result(VnShm *shm, int ret, VnRecord *rec, VnShmFetchReply *rep)
{
    if (ret < 0) {
        return ret == -ECONNRESET ? -EPROTO : ret;
    }
    memset(rep, 0, sizeof(*rep));
    if (rec->len == sizeof(*rep)) {
        memcpy(rep, rec->buf, sizeof(*rep));
    }
    g_clear_pointer(&rec->buf, g_free);
    if (rep->magic != VN_SHM_FETCH_MAGIC || rep->status < 0 || rep->status > VN_FABRIC_MAX_ERRNO ||
        rec->overflow || rec->nfds != (rep->status == 0 ? 1u : 0u)) {
        vn_util_close_fds(rec->fds, rec->nfds);
        vn_fabric_backend_rejected(shm->fab, "a malformed answer to a fetch");
        return -EPROTO;
    }
    return rep->status == 0 ? rec->fds[0] : -rep->status;
}

/* A segment map or route open that does not wait: its answer comes on the loop. */
typedef struct VnShmFetching {
    VnShm *shm;
    int fd;
    VnRecordReader rx;
    GSource *src;
    GSource *timer;
    /* One of them: a segment's answer, or a route's. */
    void (*done)(void *opaque, int fd, uint64_t size, uint64_t offset);
    void (*route_done)(void *opaque, int fd);
    void *opaque;
} VnShmFetching;

static void fetching_end(VnShmFetching *op, int ret, VnRecord *rec)
{
    VnShmFetchReply rep = { 0 };
    int fd;

    g_ptr_array_remove_fast(op->shm->fetches, op);
    g_source_destroy(op->src);
    g_source_unref(op->src);
    g_source_destroy(op->timer);
    g_source_unref(op->timer);
    vn_record_reader_clear(&op->rx);
    vn_util_close_fd(&op->fd);
    fd = fetch_result(op->shm, ret, rec, &rep);
    if (op->route_done != NULL) {
        op->route_done(op->opaque, fd);
    } else {
        op->done(op->opaque, fd, rep.size, rep.offset);
    }
    g_free(op);
}

static gboolean on_fetch_ready(int fd, GIOCondition cond, gpointer data)
{
    VnShmFetching *op = data;
    VnRecord rec = { 0 };
    int ret = vn_record_step(&op->rx, op->fd, vn_shm_record_max(VN_SHM_RECORD_FETCH_REPLY), &rec);

    if (ret != 0) {
        fetching_end(op, ret, &rec);
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

static gboolean on_fetch_timeout(gpointer data)
{
    fetching_end(data, -ETIMEDOUT, &(VnRecord){ 0 });
    return G_SOURCE_REMOVE;
}

/* Send a FETCH of @kind @id to @peer and answer @op (its callback set) on the loop; false
 * with *@err when it could not be sent (nothing is left behind). */
static bool fetch_async(VnShm *shm, const char *peer, VnShmFetchKind kind, uint64_t id,
                        int timeout_ms, VnShmFetching *op, int *err)
{
    int fd = fetch_send(shm, peer, kind, id);

    if (fd < 0) {
        *err = fd;
        return false;
    }
    op->shm = shm;
    op->fd = fd;
    op->src = vn_util_fd_source_new(fd, G_IO_IN | G_IO_HUP | G_IO_ERR);
    g_source_set_callback(op->src, G_SOURCE_FUNC(on_fetch_ready), op, NULL);
    g_source_attach(op->src, shm->ctx);
    op->timer = g_timeout_source_new((guint)timeout_ms);
    g_source_set_callback(op->timer, on_fetch_timeout, op, NULL);
    g_source_attach(op->timer, shm->ctx);
    g_ptr_array_add(shm->fetches, op);
    return true;
}

static void shm_map_segment_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                                  void (*done)(void *opaque, int fd, uint64_t size,
                                               uint64_t offset),
                                  void *opaque)
{
    VnShmFetching *op = g_new0(VnShmFetching, 1);
    int err = 0;

    op->done = done;
    op->opaque = opaque;
    if (!fetch_async(backend, peer, VN_SHM_FETCH_SEGMENT, id, timeout_ms, op, &err)) {
        g_free(op);
        done(opaque, err, 0, 0);
    }
}

static void shm_open_route_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                                 void (*done)(void *opaque, int fd), void *opaque)
{
    VnShmFetching *op = g_new0(VnShmFetching, 1);
    int err = 0;

    op->route_done = done;
    op->opaque = opaque;
    if (!fetch_async(backend, peer, VN_SHM_FETCH_ROUTE, id, timeout_ms, op, &err)) {
        g_free(op);
        done(opaque, err);
    }
}

static void shm_close(void *backend)
{
    VnShm *shm = backend;

    shm->closing = true;
    while (shm->fetches->len > 0) {
        fetching_end(shm->fetches->pdata[shm->fetches->len - 1], -ECANCELED, &(VnRecord){ 0 });
    }
    g_ptr_array_unref(shm->fetches);
    if (shm->listen_src != NULL) {
        g_source_destroy(shm->listen_src);
        g_source_unref(shm->listen_src);
    }
    vn_util_close_fd(&shm->listen_fd);
    if (shm->bound) {
        unlink(shm->path);
    }
    while (shm->conns->len > 0) {
        conn_drop(shm->conns->pdata[shm->conns->len - 1], "node closing");
    }
    g_ptr_array_unref(shm->conns);
    g_hash_table_unref(shm->active);
    vn_fdset_free(shm->links);
    g_main_context_unref(shm->ctx);
    g_free(shm->path);
    g_free(shm->node);
    g_free(shm);
}

/* ---- open: parameters, directory, socket ------------------------------ */

/* Bind our socket; a file already there is another node's if it answers,
 * else stale (a node that died) and replaced. */
static bool shm_listen(VnShm *shm, GError **error)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    struct stat st;
    int e;

    strcpy(addr.sun_path, shm->path);
    shm->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (shm->listen_fd < 0) {
        goto fail;
    }
    if (bind(shm->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        int probe;

        if (errno != EADDRINUSE) {
            goto fail;
        }
        if (lstat(shm->path, &st) < 0 || !S_ISSOCK(st.st_mode)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_EXISTS,
                        "shm fabric: %s exists and is not a node socket", shm->path);
            return false;
        }
        probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (probe < 0) {
            goto fail;
        }
        e = connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0 ? 0 : errno;
        close(probe);
        if (e != ECONNREFUSED) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_EXISTS,
                        "shm fabric: node %s is already attached (%s is live)", shm->node,
                        shm->path);
            return false;
        }
        g_info("socket %s: removing the stale socket of a node that is gone", shm->path);
        if (unlink(shm->path) < 0 ||
            bind(shm->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
            goto fail;
        }
    }
    shm->bound = true;
    if (chmod(shm->path, 0600) < 0 || listen(shm->listen_fd, VN_SHM_BACKLOG) < 0) {
        goto fail;
    }
    shm->listen_src = vn_util_fd_source_new(shm->listen_fd, G_IO_IN);
    g_source_set_callback(shm->listen_src, G_SOURCE_FUNC(on_accept), shm, NULL);
    g_source_attach(shm->listen_src, shm->ctx);
    return true;

fail:
    e = errno;
    g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "shm fabric: %s: %s", shm->path,
                g_strerror(e));
    return false;
}

static void *shm_open(VnFabric *fab, const char *node, GHashTable *params, GError **error)
{
    struct sockaddr_un addr;
    VnFabricLimits limits;
    uint64_t delay_ns = 0;
    const char *dir;
    VnShm *shm;

    if (!vn_shm_params_parse(params, &limits, &delay_ns, NULL, error)) {
        return NULL;
    }
    dir = g_hash_table_lookup(params, "dir");
    if (dir == NULL || dir[0] == '\0') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "shm fabric: the \"dir\" parameter is required");
        return NULL;
    }
    if (!vn_shm_dir_ok(dir, error)) {
        return NULL;
    }
    shm = g_new0(VnShm, 1);
    shm->fab = fab;
    shm->ctx = g_main_context_ref(vn_fabric_backend_context(fab));
    shm->links = vn_fdset_new(shm->ctx);
    if (shm->links == NULL) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "shm fabric: epoll: %s",
                    g_strerror(errno));
        g_main_context_unref(shm->ctx);
        g_free(shm);
        return NULL;
    }
    shm->node = g_strdup(node);
    shm->path = g_strdup_printf("%s/%s.sock", dir, node);
    shm->listen_fd = -1;
    shm->crossing_delay_ns = delay_ns;
    shm->conns = g_ptr_array_new_with_free_func(conn_unref);
    shm->fetches = g_ptr_array_new();
    shm->active = g_hash_table_new(g_str_hash, g_str_equal);
    if (strlen(shm->path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_FILENAME_TOO_LONG,
                    "shm fabric: %s: path too long for a socket", shm->path);
        shm_close(shm);
        return NULL;
    }
    if (!shm_listen(shm, error)) {
        shm_close(shm);
        return NULL;
    }
    vn_fabric_backend_set_limits(fab, &limits);
    g_info("socket %s: node %s listening", shm->path, node);
    return shm;
}

/* The nodes are the sockets in the fabric directory. */
static GPtrArray *shm_discover(void *backend)
{
    VnShm *shm = backend;
    GPtrArray *out = g_ptr_array_new_with_free_func(g_free);
    g_autofree char *dir = g_path_get_dirname(shm->path);
    g_autofree char *self = g_path_get_basename(shm->path);
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *e;

    while (d != NULL && (e = g_dir_read_name(d)) != NULL && out->len < VN_FABRIC_MAX_PEERS) {
        g_autofree char *name = NULL;

        if (!g_str_has_suffix(e, ".sock") || strcmp(e, self) == 0) {
            continue;
        }
        name = g_strndup(e, strlen(e) - strlen(".sock"));
        if (vn_name_valid(VN_NAME_NODE, name)) {
            g_ptr_array_add(out, g_steal_pointer(&name));
        }
    }
    return out;
}

/* Shut the socket down: its reader then sees the end of the stream and
 * reports the link down from the main loop. */
static void shm_disconnect(void *backend, const char *peer)
{
    VnShm *shm = backend;
    VnShmConn *c = g_hash_table_lookup(shm->active, peer);

    if (c != NULL && c->fd >= 0) {
        g_info("socket %s: dropping the link to %s", shm->path, peer);
        shutdown(c->fd, SHUT_RDWR);
    }
}

const VnFabricOps vn_shm_ops = {
    .name = "shm",
    /* A route is the VM's eventfd in the device's hands: an MSI write
     * through a window, emulated. */
    .caps = VN_FABRIC_CAP_DIRECT_ROUTES,
    .check_params = vn_shm_params_check,
    .open = shm_open,
    .close = shm_close,
    .connect = shm_connect,
    .send = shm_send,
    .disconnect = shm_disconnect,
    .map_segment_async = shm_map_segment_async,
    .open_route_async = shm_open_route_async,
    .discover = shm_discover,
    /* no ping: the socket's HUP is all the liveness shm has */
};
