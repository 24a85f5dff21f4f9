/*
 * The `host` fabric backend (see host.h): a worker speaks through its
 * daemon's port.  One connection; records of a VnHostHdr and maybe a frame;
 * ops that need an answer are asked and answered from the loop when their REPLY
 * comes (host-ask.c): nothing waits, but open for its first greeting.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "host-int.h"
#include "frame.h"

#include "common/name.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* How often a worker tries its daemon's port while the daemon restarts. */
#define VN_HOST_RETRY_MS 100
/* A daemon that takes nothing for this long is gone. */
#define VN_HOST_SEND_TIMEOUT_S 5

/* The stream to the daemon is lost (it took nothing for too long, or would have too much
 * waiting): the reader sees the connection end and reconnects. */
static void on_out_failed(void *opaque, int err)
{
    VnHost *h = opaque;

    g_info("port %s: cannot reach the daemon: %s", h->path, vn_record_out_why(err));
    if (h->fd >= 0) {
        shutdown(h->fd, SHUT_RDWR);
    }
}

/* ---- receiving -------------------------------------------------------- */

static void host_away(VnHost *h);
static bool host_greeted(VnHost *h, const VnHostHdr *rep, const uint8_t *frame, size_t len);
static bool host_p2p(VnHost *h, const VnHostHdr *hdr, const uint8_t *frame, size_t len);

/* Handle one record from the daemon; false when the connection must go. */
static bool host_record(VnHost *h, VnRecord *rec)
{
    g_autofree char *why = NULL;
    const uint8_t *frame;
    size_t frame_len;
    VnHostHdr hdr;

    why = vn_host_record_check(rec->buf, rec->len, rec->nfds, rec->overflow, false, &hdr, &frame,
                               &frame_len);
    if (why != NULL) {
        g_autofree char *what = g_strdup_printf("port %s: %s", h->path, why);

        vn_util_close_fds(rec->fds, rec->nfds);
        vn_fabric_backend_rejected(h->fab, what);
        return false;
    }
    if (hdr.op == VN_HOST_REPLY && hdr.seq != 0 && hdr.seq == h->hello_seq) {
        /* Handled before anything after it is read: what the daemon says next (frames it
         * held for us) finds us greeted, our claims said. */
        vn_util_close_fds(rec->fds, rec->nfds);
        h->hello_seq = 0;
        return host_greeted(h, &hdr, frame, frame_len);
    }
    switch (hdr.op) {
    case VN_HOST_REPLY:
        if (hdr.seq == 0) {
            return true; /* to an op sent without waiting */
        }
        {
            VnHostAsk *ask = NULL;

            if (g_hash_table_steal_extended(h->asked, &hdr.seq, NULL, (gpointer *)&ask)) {
                ask->rep = hdr;
                vn_host_answer(ask, -hdr.status, rec->nfds == 1 ? rec->fds[0] : -1);
                return true;
            }
            vn_util_close_fds(rec->fds, rec->nfds);
            vn_fabric_backend_rejected(h->fab, "a REPLY to no op of ours");
            return false;
        }
    case VN_HOST_LINK:
        if (hdr.arg) {
            g_hash_table_add(h->up, g_strdup(hdr.peer));
        } else {
            g_hash_table_remove(h->up, hdr.peer);
        }
        vn_fabric_backend_link(h->fab, hdr.peer, hdr.arg != 0);
        return true;
    case VN_HOST_P2P_TARGET:
    case VN_HOST_P2P_GONE:
        return host_p2p(h, &hdr, frame, frame_len);
    default: /* VN_HOST_RECV */
        if (!g_hash_table_contains(h->up, hdr.peer)) {
            vn_fabric_backend_rejected(h->fab, "a frame from a peer whose link is down");
            return true;
        }
        vn_fabric_backend_received(h->fab, hdr.peer, frame, frame_len);
        return true;
    }
}

/* A peer-to-peer target found or gone (host.h): the daemon's word, checked for its form; a
 * malformed one drops the daemon's connection, as any protocol error. */
static bool host_p2p(VnHost *h, const VnHostHdr *hdr, const uint8_t *frame, size_t len)
{
    VnHostP2pTarget t;

    if (hdr->arg2 == 0 || hdr->arg + (hdr->arg2 - 1) < hdr->arg) {
        vn_fabric_backend_rejected(h->fab, "a peer-to-peer target of an empty or wrapping range");
        return false;
    }
    if (hdr->op == VN_HOST_P2P_GONE) {
        if (h->p2p_fn != NULL) {
            h->p2p_fn(h->p2p_opaque, hdr->arg, hdr->arg2, NULL, NULL);
        }
        return true;
    }
    if (len != sizeof(t)) {
        vn_fabric_backend_rejected(h->fab, "a peer-to-peer target of the wrong size");
        return false;
    }
    memcpy(&t, frame, sizeof(t));
    if (t.nr_segments == 0 || t.nr_segments > VN_HOST_BAR_SEGMENTS || t.chunk == 0 ||
        t.offset >= t.chunk) {
        vn_fabric_backend_rejected(h->fab, "a peer-to-peer target that makes no sense");
        return false;
    }
    if (h->p2p_fn != NULL) {
        h->p2p_fn(h->p2p_opaque, hdr->arg, hdr->arg2, hdr->peer, &t);
    }
    return true;
}

/* Read what the port holds; false once the daemon is gone. */
static bool host_service(VnHost *h)
{
    for (int i = 0; i < 64 && h->fd >= 0; i++) {
        VnRecord rec;
        g_autofree uint8_t *buf = NULL;
        int ret = vn_record_step(&h->rx, h->fd, VN_HOST_MAX_RECORD, &rec);

        if (ret == 0) {
            return true;
        }
        if (ret < 0) {
            g_info("port %s: the daemon is gone (%s)", h->path, g_strerror(-ret));
            host_away(h);
            return false;
        }
        buf = rec.buf;
        if (!host_record(h, &rec)) {
            host_away(h);
            return false;
        }
    }
    return h->fd >= 0;
}

static gboolean on_port(int fd, GIOCondition cond, gpointer data)
{
    host_service(data);
    return G_SOURCE_CONTINUE;
}

/* ---- the connection and its restarts ---------------------------------- */

static int host_dial(const char *path)
{
    int fd = vn_record_dial(path, VN_HOST_SEND_TIMEOUT_S);

    if (fd >= 0 && !g_unix_set_fd_nonblocking(fd, TRUE, NULL)) {
        int e = errno;

        close(fd);
        return -e;
    }
    return fd;
}

/* What the daemon before this one set up for us is ours again (a daemon that took its
 * node's NTB sessions over holds it for us; fabric.h, vn_fabric_adopt). */
static void claim_held(VnHost *h)
{
    GHashTable *tables[] = { h->fab->segments, h->fab->routes };
    GHashTableIter it;
    gpointer value;

    for (unsigned k = 0; k < G_N_ELEMENTS(tables); k++) {
        if (tables[k] == NULL) {
            continue;
        }
        g_hash_table_iter_init(&it, tables[k]);
        while (g_hash_table_iter_next(&it, NULL, &value) && h->fd >= 0) {
            VnFabricSegment *seg = value;

            vn_host_send_record(h, VN_HOST_CLAIM, 0, seg->peer, seg->id,
                                k == 0 ? VN_FABRIC_HELD_SEGMENT : VN_FABRIC_HELD_ROUTE, NULL, 0,
                                -1);
        }
    }
    for (uint32_t i = 0; h->fab->windows != NULL && i < h->fab->limits.max_windows && h->fd >= 0;
         i++) {
        VnFabricWindow *w = h->fab->windows[i];

        if (vn_fabric_window_slot_used(w)) {
            vn_host_send_record(h, VN_HOST_CLAIM, 0, w->peer, w->segment, VN_FABRIC_HELD_WINDOW,
                                NULL, 0, -1);
        }
    }
}

/* What was said while the daemon was away: dropped (@h's links went down, or it closes). */
static void held_clear(VnHost *h)
{
    for (VnHostHeld *held; (held = g_queue_pop_head(&h->held)) != NULL;) {
        vn_util_close_fd(&held->fd);
        g_free(held->buf);
        g_free(held);
    }
    h->held_bytes = 0;
}

/* ... or sent now that it greeted us, in order; an ask's only if it is still asked (one that
 * timed out meanwhile was told so, and its answer would be to nothing). */
static void held_flush(VnHost *h)
{
    for (VnHostHeld *held; (held = g_queue_pop_head(&h->held)) != NULL;) {
        if (h->out != NULL && (held->seq == 0 || g_hash_table_contains(h->asked, &held->seq))) {
            vn_record_out_send(h->out, held->buf, held->len, VN_HOST_MAX_RECORD, held->fd);
        }
        vn_util_close_fd(&held->fd);
        g_free(held->buf);
        g_free(held);
    }
    h->held_bytes = 0;
}

/* A DOORBELLS_CLAIM's answer: the bits stay ours here either way (the daemon's port gave
 * them to someone else meanwhile only if it lost them: it says so, and so do we). */
static void doorbells_claimed(void *opaque, int status, const VnHostHdr *rep, int fd)
{
    vn_util_close_fd(&fd);
    if (status < 0 && status != -ECANCELED) {
        g_warning("doorbells %" PRIu64 "+%" PRIu64 " are not ours again: %s", rep->arg, rep->arg2,
                  g_strerror(-status));
    }
}

/* The daemon's answer to our HELLO: the host's limits (from the first daemon), then our
 * doorbell bits, what it holds for us, our links and our device server again (after a
 * restart), all said before anything else of ours.  False when it did not greet us. */
static bool host_greeted(VnHost *h, const VnHostHdr *rep, const uint8_t *frame, size_t len)
{
    g_autofree gpointer *peers = NULL;
    guint npeers = 0;
    VnFabricLimits limits;

    if (rep->status != 0) {
        g_info("port %s: the daemon did not greet us: %s", h->path, g_strerror(rep->status));
        return false;
    }
    /* Our secret, once we have one: the port takes a reconnection by nothing else. */
    if (len == VN_HOST_SECRET_LEN) {
        memcpy(h->secret, frame, VN_HOST_SECRET_LEN);
        h->has_secret = true;
    }
    /* The host's limits and capabilities are the daemon's node's, as the
     * first daemon we met had them: our window slots are sized by then. */
    if (!h->greeted) {
        unsigned window_log2 =
            (unsigned)(rep->arg >> VN_HOST_HELLO_WINDOW_SHIFT) & VN_HOST_HELLO_WINDOW_MASK;

        vn_fabric_limits_default(&limits);
        limits.max_windows = (uint32_t)MIN(rep->arg2, 256);
        /* What a borrower asks its lender to cut BARs to; the daemon's own
         * maps still check it. */
        if (window_log2 >= 12 && window_log2 <= 62) {
            limits.max_window_size = UINT64_C(1) << window_log2;
        }
        /* The daemon keeps the host's budgets: not counted twice here. */
        limits.doorbells = VN_FABRIC_MAX_DOORBELLS;
        limits.max_segments = VN_FABRIC_MAX_SEGMENTS;
        vn_fabric_backend_set_limits(h->fab, &limits);
        vn_fabric_backend_set_caps(h->fab, (uint32_t)rep->arg & 0xffffffffu);
        vn_fabric_backend_set_max_asked(h->fab, VN_HOST_MAX_RELAYED);
        h->greeted = true;
    }
    h->ready = true;
    for (uint32_t first = 0; first < VN_FABRIC_MAX_DOORBELLS; first++) {
        uint32_t count = 0;

        while (first + count < VN_FABRIC_MAX_DOORBELLS &&
               (h->doorbells & (UINT64_C(1) << (first + count)))) {
            count++;
        }
        if (count > 0) {
            vn_host_ask(h, VN_HOST_DOORBELLS_CLAIM, NULL, first, count, NULL, 0, -1,
                        doorbells_claimed, NULL);
        }
        first += count;
    }
    claim_held(h);
    /* A link still up (the daemon was back in time) is asked for with no
     * answer: a LINK follows each change.  One reported down (it was not)
     * is asked for as a connect is, and comes up with the answer. */
    peers = g_hash_table_get_keys_as_array(h->wanted, &npeers);
    for (guint i = 0; i < npeers; i++) {
        const char *peer = peers[i];

        if (g_hash_table_contains(h->up, peer)) {
            vn_host_send_record(h, VN_HOST_CONNECT, 0, peer, 0, 0, NULL, 0, -1);
            continue;
        }
        vn_host_connect_ask(h, peer);
    }
    if (h->server_said) {
        vn_host_send_record(h, VN_HOST_DEVICE_SERVER, 0, NULL, h->server_up ? 1 : 0, h->server_gen,
                            NULL, 0, -1);
    }
    /* Then what we said meanwhile (after the claims it may depend on), and last what the
     * greeting's own callback says (the newest kept state). */
    held_flush(h);
    if (h->retry != NULL) {
        g_info("port %s: the daemon is back after %" G_GINT64_FORMAT " ms", h->path,
               (g_get_monotonic_time() - h->away_since_us) / 1000);
        g_source_destroy(h->retry);
        g_clear_pointer(&h->retry, g_source_unref);
    }
    h->away_since_us = 0;
    h->links_dropped = false;
    if (h->greeted_fn != NULL) {
        h->greeted_fn(h->greeted_opaque);
    }
    return true;
}

/* Take @fd as the connection to the daemon and say HELLO (with our secret, once we have
 * one); its answer is host_greeted's.  False when it cannot even be said. */
static bool host_attach_fd(VnHost *h, int fd)
{
    h->fd = fd;
    h->ready = false;
    memset(&h->rx, 0, sizeof(h->rx));
    h->out = vn_record_out_new(fd, h->ctx, VN_HOST_MAX_QUEUED, VN_HOST_SEND_TIMEOUT_S * 1000,
                               on_out_failed, h);
    h->src = vn_util_fd_source_new(fd, G_IO_IN | G_IO_HUP | G_IO_ERR);
    g_source_set_callback(h->src, G_SOURCE_FUNC(on_port), h, NULL);
    g_source_attach(h->src, h->ctx);
    h->hello_seq = ++h->seq;
    h->hello_sent_us = g_get_monotonic_time();
    return vn_host_send_record(h, VN_HOST_HELLO, h->hello_seq, NULL, 0, 0,
                               h->has_secret ? h->secret : NULL,
                               h->has_secret ? sizeof(h->secret) : 0, -1) == 0;
}

/* Close the connection to the daemon; the links stay as they were. */
static void host_drop(VnHost *h)
{
    if (h->src != NULL) {
        g_source_destroy(h->src);
        g_clear_pointer(&h->src, g_source_unref);
    }
    vn_record_reader_clear(&h->rx);
    g_clear_pointer(&h->out, vn_record_out_free); /* before its socket goes */
    vn_util_close_fd(&h->fd);
    h->ready = false;
    h->hello_seq = 0;
    /* Their answers went with the connection. */
    vn_host_asked_fail(h, -ENOTCONN);
}

/* Past VN_HOST_RECONNECT_MS: the links are reported down, once. */
static void host_links_down(VnHost *h)
{
    g_warning("port %s: the daemon did not come back in %u ms; every link is down", h->path,
              h->reconnect_ms);
    h->links_dropped = true;
    held_clear(h);
    while (g_hash_table_size(h->up) > 0) {
        GHashTableIter it;
        gpointer key;
        g_autofree char *peer = NULL;

        g_hash_table_iter_init(&it, h->up);
        g_hash_table_iter_next(&it, &key, NULL);
        peer = g_strdup(key);
        g_hash_table_remove(h->up, peer);
        vn_fabric_backend_link(h->fab, peer, false);
    }
}

/* Dial until a daemon greets us.  That never stops: a daemon that starts
 * later adopts this worker (or stops it), however long it took.  The greeting is not
 * waited for: a HELLO not answered in VN_HOST_REPLY_TIMEOUT_MS ends its connection, and
 * the next tick dials again. */
static gboolean on_retry(gpointer data)
{
    VnHost *h = data;
    gint64 now = g_get_monotonic_time();

    if (h->fd >= 0) {
        if (now - h->hello_sent_us >= (gint64)VN_HOST_REPLY_TIMEOUT_MS * 1000) {
            g_info("port %s: no answer to our HELLO in %d ms", h->path, VN_HOST_REPLY_TIMEOUT_MS);
            host_drop(h);
        }
    } else {
        int fd = host_dial(h->path);

        if (fd >= 0 && !host_attach_fd(h, fd)) {
            host_drop(h); /* not even said: try again */
        }
    }
    if (!h->links_dropped && now - h->away_since_us >= (gint64)h->reconnect_ms * 1000) {
        host_links_down(h);
    }
    return G_SOURCE_CONTINUE;
}

/* The daemon went (or broke the protocol): drop the connection, keep the
 * links, try again (the links go down after the bound).  The
 * clock starts at the first of a run of failures and stops at a greeting:
 * each restart of the daemon gets the whole bound. */
static void host_away(VnHost *h)
{
    host_drop(h);
    if (h->away_since_us == 0) {
        h->away_since_us = g_get_monotonic_time();
    }
    if (h->retry == NULL) {
        h->retry = g_timeout_source_new(VN_HOST_RETRY_MS);
        g_source_set_callback(h->retry, on_retry, h, NULL);
        g_source_attach(h->retry, h->ctx);
    }
}

/* At open, before the node's loop runs anything of ours: the HELLO's answer is what open
 * returns with (the host's limits), so it is read here, from this one socket.  What the
 * daemon says before it (a daemon that made our connection may tell us the lease holder's
 * link first) is handled as always: the fabric holds its reports until open returns. */
static bool host_hello_wait(VnHost *h, GError **error)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)VN_HOST_REPLY_TIMEOUT_MS * 1000;

    while (!h->ready && h->fd >= 0) {
        bool queued = h->out != NULL && vn_record_out_queued(h->out) > 0;
        struct pollfd p = { .fd = h->fd, .events = POLLIN | (queued ? POLLOUT : 0) };
        gint64 left = deadline - g_get_monotonic_time();

        if (left <= 0) {
            break;
        }
        if (poll(&p, 1, (int)((left + 999) / 1000)) > 0) {
            if ((p.revents & POLLOUT) && h->out != NULL) {
                vn_record_out_flush(h->out);
            }
            if (p.revents & ~POLLOUT) {
                host_service(h);
            }
        }
    }
    if (!h->ready) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED,
                    "port %s: the daemon did not greet us", h->path);
        return false;
    }
    return true;
}

/* ---- ops -------------------------------------------------------------- */

static void host_close(void *backend)
{
    VnHost *h = backend;

    if (h->retry != NULL) {
        g_source_destroy(h->retry);
        g_source_unref(h->retry);
    }
    if (h->src != NULL) {
        g_source_destroy(h->src);
        g_source_unref(h->src);
    }
    vn_record_reader_clear(&h->rx);
    g_clear_pointer(&h->out, vn_record_out_free);
    vn_util_close_fd(&h->fd);
    /* What was asked is told it is cancelled, now: the fabric ends its waiters as it closes. */
    vn_host_asks_close(h);
    held_clear(h);
    g_hash_table_unref(h->wanted);
    g_hash_table_unref(h->up);
    g_main_context_unref(h->ctx);
    g_free(h->path);
    g_free(h);
}

/* "reconnect-ms", the bound before a gone daemon's links are reported down:
 * tests shorten it; nothing longer than an hour makes sense. */
#define VN_HOST_MAX_RECONNECT_MS 3600000u

static bool host_params(GHashTable *params, const char **bad, unsigned *reconnect_ms, int *conn,
                        GError **error)
{
    const char *path = g_hash_table_lookup(params, "port");
    const char *fd_param = g_hash_table_lookup(params, "fd");
    guint64 fd = 0;
    const char *bound = g_hash_table_lookup(params, "reconnect-ms");
    GHashTableIter it;
    gpointer key;
    guint64 ms = VN_HOST_RECONNECT_MS;

    g_hash_table_iter_init(&it, params);
    while (g_hash_table_iter_next(&it, &key, NULL)) {
        if (strcmp(key, "port") != 0 && strcmp(key, "reconnect-ms") != 0 &&
            strcmp(key, "fd") != 0) {
            *bad = key;
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "host fabric: unknown parameter \"%.40s\" (known: port, fd, "
                        "reconnect-ms)",
                        (char *)key);
            return false;
        }
    }
    if (path == NULL || path[0] != '/') {
        *bad = path != NULL ? "port" : NULL;
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "host fabric: \"port\" must be the daemon's port, an absolute path");
        return false;
    }
    if (bound != NULL && (!g_ascii_string_to_unsigned(bound, 10, VN_HOST_RETRY_MS,
                                                      VN_HOST_MAX_RECONNECT_MS, &ms, NULL))) {
        *bad = "reconnect-ms";
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "host fabric: \"reconnect-ms\" must be %u to %u", (unsigned)VN_HOST_RETRY_MS,
                    VN_HOST_MAX_RECONNECT_MS);
        return false;
    }
    if (fd_param != NULL && !g_ascii_string_to_unsigned(fd_param, 10, 3, G_MAXINT, &fd, NULL)) {
        *bad = "fd";
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "host fabric: \"fd\" must be the number of an inherited socket (3 or more)");
        return false;
    }
    *reconnect_ms = (unsigned)ms;
    *conn = fd_param != NULL ? (int)fd : -1;
    return true;
}

static bool host_check_params(GHashTable *params, const char **bad, GError **error)
{
    unsigned reconnect_ms;
    int conn;

    return host_params(params, bad, &reconnect_ms, &conn, error);
}

static void *host_open(VnFabric *fab, const char *node, GHashTable *params, GError **error)
{
    const char *path = g_hash_table_lookup(params, "port");
    const char *bad = NULL;
    unsigned reconnect_ms;
    VnHost *h;
    int fd;

    if (!host_params(params, &bad, &reconnect_ms, &fd, error)) {
        return NULL;
    }
    /* The connection the daemon made for us (its port takes no other before it gave us a
     * secret), else the socket. */
    if (fd >= 0) {
        struct stat st;

        if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) ||
            !g_unix_set_fd_nonblocking(fd, TRUE, NULL)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "host fabric: fd %d is not the daemon's connection", fd);
            return NULL;
        }
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    } else {
        fd = host_dial(path);
    }
    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-fd),
                    "host fabric: cannot reach the daemon's port %s: %s", path, g_strerror(-fd));
        return NULL;
    }
    h = g_new0(VnHost, 1);
    h->fab = fab;
    h->ctx = g_main_context_ref(vn_fabric_backend_context(fab));
    h->path = g_strdup(path);
    h->reconnect_ms = reconnect_ms;
    h->wanted = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    h->asked = g_hash_table_new(g_int64_hash, g_int64_equal);
    g_queue_init(&h->answered);
    g_queue_init(&h->held);
    h->up = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    if (!host_attach_fd(h, fd) || !host_hello_wait(h, error)) {
        if (error != NULL && *error == NULL) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED,
                        "port %s: the daemon went before it greeted us", path);
        }
        host_close(h);
        return NULL;
    }
    g_info("port %s: node %s speaks through its daemon", path, node);
    return h;
}

static int host_connect(void *backend, const char *peer)
{
    VnHost *h = backend;

    if (g_hash_table_contains(h->up, peer)) {
        return 0;
    }
    if (!g_hash_table_contains(h->wanted, peer)) {
        if (g_hash_table_size(h->wanted) >= 8) {
            return -EMFILE; /* a worker talks to its lender, not the world */
        }
        g_hash_table_add(h->wanted, g_strdup(peer));
    }
    /* Asked, not waited for: the daemon answers once its link to @peer is up, and ours is
     * reported up then (vn_fabric_connect_async's callers wait for that). */
    vn_host_connect_ask(h, peer);
    return -EINPROGRESS;
}

static int host_send(void *backend, const char *peer, const void *buf, size_t len)
{
    VnHost *h = backend;

    if (!g_hash_table_contains(h->up, peer)) {
        return -ENOTCONN;
    }
    return vn_host_send_record(h, VN_HOST_SEND, 0, peer, 0, 0, buf, len, -1);
}

/* A worker does not end its host's links: it forgets the peer until the
 * daemon reports it again. */
static void host_disconnect(void *backend, const char *peer)
{
    VnHost *h = backend;

    if (g_hash_table_remove(h->up, peer)) {
        vn_fabric_backend_link(h->fab, peer, false);
    }
}

/* An op asked for the fabric: whom to tell, and the doorbell bits it asked for. */
typedef struct VnHostAsked {
    VnHost *h;
    uint32_t bits; /* a DOORBELLS_ALLOC's count; 0 for anything else */
    VnFabricBackendDone done;
    void *opaque;
} VnHostAsked;

static void asked_answered(void *opaque, int status, const VnHostHdr *rep, int fd)
{
    VnHostAsked *a = opaque;

    /* Bits the daemon gave are ours to claim again after its restart (checked against the
     * register by the fabric; a daemon that answers past it gave us nothing). */
    if (status == 0 && a->bits > 0 && rep->arg < VN_FABRIC_MAX_DOORBELLS &&
        a->bits <= VN_FABRIC_MAX_DOORBELLS - rep->arg) {
        for (uint32_t i = 0; i < a->bits; i++) {
            a->h->doorbells |= UINT64_C(1) << (rep->arg + i);
        }
    }
    a->done(a->opaque, status, status == 0 ? rep->arg : 0, fd);
    g_free(a);
}

static void host_asked(VnHost *h, uint32_t op, const char *peer, uint64_t arg, uint64_t arg2,
                       const void *data, size_t len, int fd, uint32_t bits,
                       VnFabricBackendDone done, void *opaque)
{
    VnHostAsked *a = g_new0(VnHostAsked, 1);

    *a = (VnHostAsked){ .h = h, .bits = bits, .done = done, .opaque = opaque };
    vn_host_ask(h, op, peer, arg, arg2, data, len, fd, asked_answered, a);
}

static void host_export_async(void *backend, int fd, uint64_t offset, uint64_t size,
                              const char *peer, VnFabricBackendDone done, void *opaque)
{
    host_asked(backend, size > 0 ? VN_HOST_EXPORT_SEGMENT : VN_HOST_EXPORT_ROUTE, peer, size,
               offset, NULL, 0, fd, 0, done, opaque);
}

static void host_unexport(void *backend, bool route, uint64_t id)
{
    vn_host_send_record(backend, route ? VN_HOST_UNEXPORT_ROUTE : VN_HOST_UNEXPORT_SEGMENT, 0, NULL,
                        id, 0, NULL, 0, -1);
}

/* Confirmed: the daemon answers once its backend withheld (or gave back) the segment. */
static void host_withhold_async(void *backend, uint64_t id, bool withhold, VnFabricBackendDone done,
                                void *opaque)
{
    host_asked(backend, VN_HOST_WITHHOLD_SEGMENT, NULL, id, withhold ? 1 : 0, NULL, 0, -1, 0, done,
               opaque);
}

/* The daemon's backend joins the windows it mapped for us (its port checks they are ours). */
static void host_join_windows_async(void *backend, const char *peer, const uint64_t *ids,
                                    uint32_t n, uint64_t chunk, bool device,
                                    VnFabricBackendDone done, void *opaque)
{
    host_asked(backend, VN_HOST_JOIN_WINDOWS, peer, chunk, device ? 1 : 0, ids, n * sizeof(ids[0]),
               -1, 0, done, opaque);
}

static void host_unmap_segment(void *backend, const char *peer, uint64_t id)
{
    vn_host_send_record(backend, VN_HOST_UNMAP, 0, peer, id, 0, NULL, 0, -1);
}

static void host_doorbells_alloc_async(void *backend, uint32_t count, VnFabricBackendDone done,
                                       void *opaque)
{
    host_asked(backend, VN_HOST_DOORBELLS_ALLOC, NULL, count, 0, NULL, 0, -1, count, done, opaque);
}

static void host_doorbells_free(void *backend, uint32_t first, uint32_t count)
{
    VnHost *h = backend;

    for (uint32_t i = 0; i < count; i++) {
        h->doorbells &= ~(UINT64_C(1) << (first + i));
    }
    vn_host_send_record(h, VN_HOST_DOORBELLS_FREE, 0, NULL, first, count, NULL, 0, -1);
}

const VnFabricOps vn_host_ops = {
    .name = "host",
    /* What the host's node can do; narrowed at HELLO to the daemon's. */
    .caps = VN_FABRIC_CAP_DIRECT_ROUTES,
    .check_params = host_check_params,
    .open = host_open,
    .close = host_close,
    .connect = host_connect,
    .send = host_send,
    .disconnect = host_disconnect,
    .map_segment_async = vn_host_map_segment_async,
    .open_route_async = vn_host_open_route_async,
    .export_async = host_export_async,
    .unexport = host_unexport,
    .withhold_async = host_withhold_async,
    .unmap_segment = host_unmap_segment,
    .join_windows_async = host_join_windows_async,
    .doorbells_alloc_async = host_doorbells_alloc_async,
    .doorbells_free = host_doorbells_free,
};
