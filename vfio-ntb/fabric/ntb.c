/*
 * The `ntb` fabric backend (ntb.h): sessions, rings and windows over NTB
 * ports.  One VnNtbLink per port; its peer is known once the session is (a
 * port spec's "=NODE") or once the peer's HELLO came.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntb-int.h"

#include "common/name.h"
#include "common/peerfd.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

static void link_service(VnNtbLink *l, unsigned events);

/* The port's fds, in the order of the VN_NTB_EV_* bits. */
static void link_fds(VnNtbLink *l, int fds[VN_NTB_LINK_FDS])
{
    VnNtbPort *p = l->port;

    fds[0] = p->ops->link_fd(p);
    fds[1] = p->ops->doorbell_fd(p, VN_NTB_DB_MSG);
    fds[2] = p->ops->doorbell_fd(p, VN_NTB_DB_SPACE);
    fds[3] = p->ops->doorbell_fd(p, VN_NTB_DB_CTRL);
}

static bool peer_known(const VnNtbLink *l)
{
    return l->peer[0] != '\0';
}

static void source_drop(GSource **src)
{
    if (*src != NULL) {
        g_source_destroy(*src);
        g_clear_pointer(src, g_source_unref);
    }
}

/* ---- telling the fabric ------------------------------------------------- */

void vn_ntb_report_downs(VnNtb *ntb)
{
    char *peer;

    source_drop(&ntb->report);
    while ((peer = g_queue_pop_head(&ntb->downs)) != NULL) {
        vn_fabric_backend_link(ntb->fab, peer, false);
        ntb->reports++;
        g_free(peer);
    }
    while ((peer = g_queue_pop_head(&ntb->lost)) != NULL) {
        vn_fabric_backend_paths_lost(ntb->fab, peer);
        g_free(peer);
    }
}

static gboolean report_downs(gpointer data)
{
    vn_ntb_report_downs(data);
    return G_SOURCE_REMOVE;
}

/* The session with l->peer is over: told from the loop, never from inside
 * the call that ended it (ops->disconnect's rule). */
void vn_ntb_link_lost(VnNtbLink *l, const char *why)
{
    VnNtb *ntb = l->ntb;

    if (l->reported) {
        g_info("node %s: ntb port %s: link to %s down: %s", ntb->node, l->port->spec, l->peer, why);
        g_queue_push_tail(&ntb->downs, g_strdup(l->peer));
        if (ntb->report == NULL) {
            ntb->report = g_idle_source_new();
            g_source_set_callback(ntb->report, report_downs, ntb, NULL);
            g_source_attach(ntb->report, ntb->ctx);
        }
    }
    l->reported = false;
    g_strlcpy(l->peer, l->expected, sizeof(l->peer));
    vn_ntb_stash_save(l); /* no session to take over */
}

void vn_ntb_link_up(VnNtbLink *l)
{
    if (!l->reported) {
        /* A down of this peer's last session first, in order. */
        vn_ntb_report_downs(l->ntb);
        l->reported = true;
        l->broken_run = 0;
        l->ntb->reports++;
        g_info("node %s: ntb port %s: link to %s up", l->ntb->node, l->port->spec, l->peer);
        vn_fabric_backend_link(l->ntb->fab, l->peer, true);
        vn_ntb_stash_save(l);
    }
}

/* ---- the session -------------------------------------------------------- */

static void link_restart(VnNtbLink *l, const char *why);

static bool any_set(const uint64_t *v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (v[i] != 0) {
            return true;
        }
    }
    return false;
}

/* The session is over, and what crossed it with it: told after the link's down, when there
 * was anything (a window, a route). */
static void paths_lost(VnNtbLink *l)
{
    if (l->reported && (any_set(l->exported, VN_NTBPORT_MAX_WINDOWS) ||
                        any_set(l->mapped, VN_NTBPORT_MAX_WINDOWS) ||
                        any_set(l->route_in, VN_NTBPORT_MAX_DOORBELLS) ||
                        any_set(l->route_out, VN_NTBPORT_MAX_DOORBELLS))) {
        g_queue_push_tail(&l->ntb->lost, g_strdup(l->peer));
    }
}

static void session_clear(VnNtbLink *l)
{
    for (uint32_t w = 1; w < l->port->info.windows; w++) {
        if (l->exported[w] != 0 && !l->withheld[w]) {
            l->port->ops->in_clear(l->port, w);
        }
    }
    vn_ntb_routes_clear(l);
    vn_ntb_session_forget(l);
    vn_ntb_maps_end(l->ntb, l, -ECONNRESET);
}

void vn_ntb_session_forget(VnNtbLink *l)
{
    memset(l->exported, 0, sizeof(l->exported));
    memset(l->withheld, 0, sizeof(l->withheld));
    memset(l->mapped, 0, sizeof(l->mapped));
    memset(l->route_in, 0, sizeof(l->route_in));
    memset(l->route_out, 0, sizeof(l->route_out));
    l->peer_features = 0;
    l->skip_frame = false;
    if (l->out != NULL) {
        munmap(l->out, VN_NTB_RING_DATA + l->ring_out);
        l->out = NULL;
    }
    source_drop(&l->retry);
    g_byte_array_set_size(l->txq, 0);
    g_byte_array_set_size(l->reasm, 0);
    l->rx_cons = l->tx_prod = l->rx_told = 0;
    l->peer_epoch = l->tag = 0;
    l->stalled_since = 0;
    l->hello_seen = l->challenged = false;
    memset(l->peer_nonce, 0, sizeof(l->peer_nonce));
}

/* The port's link went down (or we end our side): nothing of the session
 * stays, the buffer goes. */
static void link_down(VnNtbLink *l, const char *why)
{
    source_drop(&l->reannounce);
    paths_lost(l);
    vn_ntb_link_lost(l, why);
    session_clear(l);
    if (l->in != NULL) {
        l->port->ops->in_clear(l->port, 0); /* unmaps it too */
        l->in = NULL;
    }
    l->state = VN_NTB_LINK_DOWN;
}

/* A buffer, a new epoch, announced: when the port's link is up, or at
 * open where the port can (the emulation; Linux's NTB API sets inbound
 * windows only while the link is up), quietly then. */
static void link_announce(VnNtbLink *l, bool quiet)
{
    VnNtbPort *p = l->port;
    uint64_t bytes = VN_NTB_RING_DATA + l->ntb->ring;
    uint16_t old = l->epoch;
    int ret;

    ret = p->ops->in_alloc(p, 0, bytes, &l->in);
    if (ret < 0) {
        l->in = NULL;
        if (!quiet) {
            g_warning("node %s: ntb port %s: no buffer for the message ring: %s", l->ntb->node,
                      p->spec, g_strerror(-ret));
        }
        return;
    }
    memset(l->in, 0, VN_NTB_RING_DATA);
    do {
        l->epoch = (uint16_t)g_random_int_range(1, 0x10000);
    } while (l->epoch == old);
    l->state = VN_NTB_LINK_WAITING;
    if (p->ops->peer_spad_write(p, VN_NTB_SPAD_PAGES, (uint32_t)(bytes / 4096)) < 0 ||
        p->ops->peer_spad_write(p, VN_NTB_SPAD_HELLO,
                                (uint32_t)VN_NTB_SPAD_MAGIC << 16 | l->epoch) < 0 ||
        p->ops->peer_doorbell(p, UINT64_C(1) << VN_NTB_DB_CTRL) < 0) {
        g_warning("node %s: ntb port %s: cannot announce our ring to the peer", l->ntb->node,
                  p->spec);
    }
}

int vn_ntb_peer_ring_map(VnNtbLink *l, uint64_t bytes)
{
    VnNtbPort *p = l->port;
    uint64_t offset = 0, size = 0;
    void *m;
    int fd, e;

    fd = p->ops->out_fd(p, 0, true, &offset, &size);
    if (fd < 0) {
        return -EAGAIN;
    }
    l->ring_out = vn_ntb_ring_of(MIN(bytes, size));
    if (l->ring_out == 0 || bytes > size) {
        g_warning("node %s: ntb port %s: the peer's ring of %" PRIu64 " bytes does not fit "
                  "window 0 (%" PRIu64 " bytes)",
                  l->ntb->node, p->spec, bytes, size);
        close(fd);
        return -EMSGSIZE;
    }
    m = mmap(NULL, VN_NTB_RING_DATA + l->ring_out, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             (off_t)offset);
    e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        g_warning("node %s: ntb port %s: cannot map window 0: %s", l->ntb->node, p->spec,
                  g_strerror(e));
        return -e;
    }
    l->out = m;
    return 0;
}

/* A new epoch in our scratchpads: the peer (re)started its side. */
static void session_start(VnNtbLink *l, uint16_t epoch, uint64_t bytes)
{
    VnNtbPort *p = l->port;
    VnNtbHello hello = { .version = VN_NTB_VERSION,
                         .features = (p->info.doorbell_routes ? VN_NTB_FEATURE_ROUTES : 0) |
                                     VN_NTB_FEATURE_RESUME };
    int ret;

    paths_lost(l);
    vn_ntb_link_lost(l, "the peer started a new session");
    session_clear(l);
    l->state = VN_NTB_LINK_WAITING;
    /* What was mapped of the last session's ring reaches nothing now. */
    if (p->ops->out_revoke != NULL) {
        p->ops->out_revoke(p, 0);
    }
    ret = vn_ntb_peer_ring_map(l, bytes);
    if (ret == -EAGAIN) {
        return; /* not there yet: its CTRL doorbell comes again */
    }
    if (ret < 0) {
        l->peer_epoch = epoch; /* said once: not again until it announces anew */
        return;
    }
    l->peer_epoch = epoch;
    l->tag = vn_ntb_tag(l->epoch, epoch);
    l->state = VN_NTB_LINK_OPEN;
    g_strlcpy(hello.node, l->ntb->node, sizeof(hello.node));
    vn_ntb_queue(l, VN_NTB_REC_HELLO, 0, &hello, sizeof(hello));
    if (l->key != NULL) {
        VnNtbChallenge c;

        /* A nonce nobody can predict: what the peer's PROOF must be made of. */
        if (getrandom(l->nonce, sizeof(l->nonce), 0) != (ssize_t)sizeof(l->nonce)) {
            g_warning("node %s: ntb port %s: no random bytes for the link's challenge: %s",
                      l->ntb->node, p->spec, g_strerror(errno));
            link_restart(l, "no random bytes for the challenge");
            return;
        }
        memcpy(c.nonce, l->nonce, sizeof(c.nonce));
        vn_ntb_queue(l, VN_NTB_REC_CHALLENGE, 0, &c, sizeof(c));
    }
    vn_ntb_flush(l);
    /* The link is up once the peer's HELLO of this session comes (on_hello), not before:
     * a peer that restarts may still be in a session with our last epoch, which it ends
     * when our announcement reaches it, and a request sent meanwhile would be lost. */
}

/* Read the peer's announcement; start a session when it is new.  Whether
 * one started. */
static bool check_peer(VnNtbLink *l)
{
    uint32_t hello = 0, pages = 0;

    if (l->state == VN_NTB_LINK_DOWN ||
        l->port->ops->spad_read(l->port, VN_NTB_SPAD_HELLO, &hello) < 0 ||
        l->port->ops->spad_read(l->port, VN_NTB_SPAD_PAGES, &pages) < 0) {
        return false;
    }
    if (hello >> 16 != VN_NTB_SPAD_MAGIC || (hello & 0xffff) == 0 ||
        (uint16_t)(hello & 0xffff) == l->peer_epoch) {
        return false;
    }
    session_start(l, (uint16_t)(hello & 0xffff), (uint64_t)pages * 4096);
    return l->state == VN_NTB_LINK_OPEN;
}

static gboolean on_reannounce(gpointer data)
{
    VnNtbLink *l = data;

    g_clear_pointer(&l->reannounce, g_source_unref);
    if (l->port_up && l->state == VN_NTB_LINK_DOWN) {
        link_announce(l, false);
    }
    return G_SOURCE_REMOVE;
}

/* Our side starts over: a new buffer and epoch, so that the peer sees a
 * new session (its link down, then up again when it wants it). */
static void link_restart(VnNtbLink *l, const char *why)
{
    link_down(l, why);
    if (!l->port_up) {
        return;
    }
    /* A peer whose sessions keep breaking (a wrong key, a wrong name, garbage: a second
     * break with no link up between) gets a new one at most every VN_NTB_BROKEN_RETRY_MS,
     * not as fast as it can ask. */
    if (l->broken_run > 1) {
        l->reannounce = g_timeout_source_new(VN_NTB_BROKEN_RETRY_MS);
        g_source_set_callback(l->reannounce, on_reannounce, l, NULL);
        g_source_attach(l->reannounce, l->ntb->ctx);
        return;
    }
    link_announce(l, false);
}

/* The peer broke the protocol: the session ends, and a new one starts
 * clean (no index of this one can be trusted). */
void vn_ntb_session_broken(VnNtbLink *l, const char *why)
{
    g_autofree char *what =
        g_strdup_printf("ntb port %s: %s: %s", l->port->spec, peer_known(l) ? l->peer : "?", why);

    vn_fabric_backend_rejected(l->ntb->fab, what);
    l->broken_run++;
    link_restart(l, why);
}

/* ---- sending ------------------------------------------------------------ */

static uint64_t tagged(VnNtbLink *l, uint64_t count)
{
    return (uint64_t)l->tag << 48 | (count & VN_NTB_COUNT_MASK);
}

/* A word of the peer's for this session, or 0. */
static bool word_of_session(VnNtbLink *l, const uint64_t *word, uint64_t *count)
{
    uint64_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);

    *count = v & VN_NTB_COUNT_MASK;
    return (uint16_t)(v >> 48) == l->tag;
}

/* Tell the peer how much of our ring it may fill again (one posted write,
 * only when that changed): at the end of each read, and before anything
 * that waits on the peer, which may be waiting for this. */
static void publish_cons(VnNtbLink *l)
{
    if (l->state == VN_NTB_LINK_OPEN && l->rx_cons != l->rx_told) {
        __atomic_store_n(&((VnNtbRingHdr *)l->out)->cons, tagged(l, l->rx_cons), __ATOMIC_RELEASE);
        l->rx_told = l->rx_cons;
    }
}

int vn_ntb_queue(VnNtbLink *l, uint16_t kind, uint16_t flags, const void *payload, uint32_t len)
{
    VnNtbRec rec = { .len = len, .kind = kind, .flags = flags };
    static const uint8_t zeros[8];

    if (l->txq->len + sizeof(rec) + len + 8 > VN_NTB_MAX_QUEUED) {
        return -ENOBUFS;
    }
    g_byte_array_append(l->txq, (const guint8 *)&rec, sizeof(rec));
    g_byte_array_append(l->txq, payload, len);
    g_byte_array_append(l->txq, zeros, (-len) & 7);
    return 0;
}

static gboolean on_retry(gpointer data)
{
    VnNtbLink *l = data;

    g_clear_pointer(&l->retry, g_source_unref);
    vn_ntb_flush(l);
    return G_SOURCE_REMOVE;
}

/* Move whole records from the queue into the peer's ring. */
void vn_ntb_flush(VnNtbLink *l)
{
    VnNtbRingHdr *theirs = (VnNtbRingHdr *)l->out;
    VnNtbRingHdr *ours = (VnNtbRingHdr *)l->in;
    uint64_t cons = 0, done = 0;

    if (l->state != VN_NTB_LINK_OPEN || l->txq->len == 0) {
        return;
    }
    if (!word_of_session(l, &ours->cons, &cons)) {
        cons = 0;
    }
    while (done < l->txq->len) {
        VnNtbRec rec;
        uint64_t size, used = (l->tx_prod - cons) & VN_NTB_COUNT_MASK;

        memcpy(&rec, l->txq->data + done, sizeof(rec));
        size = sizeof(rec) + (((uint64_t)rec.len + 7) & ~UINT64_C(7));
        if (used > l->ring_out || size > l->ring_out - used) {
            break;
        }
        vn_ntb_ring_put(l->out + VN_NTB_RING_DATA, l->ring_out, l->tx_prod, l->txq->data + done,
                        size);
        l->tx_prod += size;
        done += size;
    }
    if (done > 0) {
        __atomic_store_n(&theirs->prod, tagged(l, l->tx_prod), __ATOMIC_RELEASE);
        l->port->ops->peer_doorbell(l->port, UINT64_C(1) << VN_NTB_DB_MSG);
        g_byte_array_remove_range(l->txq, 0, (guint)done);
        l->stalled_since = 0;
    }
    if (l->txq->len > 0) {
        gint64 now = g_get_monotonic_time();

        if (l->stalled_since == 0) {
            l->stalled_since = now;
        } else if (now - l->stalled_since > (gint64)VN_NTB_SEND_TIMEOUT_MS * 1000) {
            vn_ntb_session_broken(l, "it took nothing from its ring for too long");
            return;
        }
        if (l->retry == NULL) {
            l->retry = g_timeout_source_new(2);
            g_source_set_callback(l->retry, on_retry, l, NULL);
            g_source_attach(l->retry, l->ntb->ctx);
        }
    }
}

VnNtbLink *vn_ntb_link_of(VnNtb *ntb, const char *peer)
{
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        if (l->reported && strcmp(l->peer, peer) == 0) {
            return l;
        }
    }
    return NULL;
}

/*
 * Room in the queue for @need bytes, without waiting (a send never holds its loop): what the
 * peer's ring does not take now waits in the queue and goes as the peer frees room (its SPACE
 * doorbell, from the loop), up to VN_NTB_MAX_QUEUED.  A peer that leaves more than that unread
 * loses its session, as one that takes nothing for VN_NTB_SEND_TIMEOUT_MS does (flush).
 */
static int queue_room(VnNtbLink *l, size_t need)
{
    if (l->txq->len + need > VN_NTB_MAX_QUEUED) {
        publish_cons(l);
        vn_ntb_flush(l);
    }
    if (l->state != VN_NTB_LINK_OPEN) {
        return -ECONNRESET;
    }
    if (l->txq->len + need > VN_NTB_MAX_QUEUED) {
        vn_ntb_session_broken(l, "it leaves too much unread in its ring");
        return -ECONNRESET;
    }
    return 0;
}

static int ntb_send(void *backend, const char *peer, const void *buf, size_t len)
{
    VnNtbLink *l = vn_ntb_link_of(backend, peer);
    const uint8_t *p = buf;
    uint32_t max;
    int ret;

    if (l == NULL || l->state != VN_NTB_LINK_OPEN) {
        return -ENOTCONN;
    }
    if (len == 0 || len > VN_FABRIC_MAX_FRAME) {
        return -EMSGSIZE;
    }
    max = vn_ntb_rec_max(l->ring_out);
    /* The whole frame's records, so that a frame is never cut. */
    ret = queue_room(l, len + (len / max + 1) * (sizeof(VnNtbRec) + 8));
    while (ret == 0 && len > 0) {
        uint32_t piece = (uint32_t)MIN(len, (size_t)max);

        ret = vn_ntb_queue(l, VN_NTB_REC_FRAME, piece < len ? VN_NTB_REC_MORE : 0, p, piece);
        p += piece;
        len -= piece;
    }
    if (ret < 0) {
        return -ECONNRESET;
    }
    vn_ntb_flush(l);
    return 0;
}

/* ---- receiving ---------------------------------------------------------- */

static void on_hello(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbHello h;

    if (len != sizeof(h)) {
        vn_ntb_session_broken(l, "a HELLO of the wrong size");
        return;
    }
    memcpy(&h, payload, sizeof(h));
    if (h.version != VN_NTB_VERSION || memchr(h.node, '\0', sizeof(h.node)) == NULL ||
        !vn_name_valid(VN_NAME_NODE, h.node) || strcmp(h.node, l->ntb->node) == 0) {
        vn_ntb_session_broken(l, "a HELLO that names no node we accept");
        return;
    }
    if (peer_known(l) && strcmp(h.node, l->peer) != 0) {
        vn_ntb_session_broken(l, "it names itself otherwise than the port's configuration");
        return;
    }
    if (!peer_known(l)) {
        VnNtbLink *other = vn_ntb_link_of(l->ntb, h.node);

        if (other != NULL && other != l) {
            vn_ntb_session_broken(l, "that node is up on another port");
            return;
        }
        g_strlcpy(l->peer, h.node, sizeof(l->peer));
    }
    l->peer_features = h.features;
    if (l->key != NULL) {
        l->hello_seen = true; /* up once it proves the key (on_proof) */
        return;
    }
    vn_ntb_link_up(l);
}

/* The peer's nonce: our PROOF answers it. */
static void on_challenge(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbProof proof;

    if (l->key == NULL) {
        vn_ntb_session_broken(l, "a CHALLENGE, but this link has no key ([fabric] key-file)");
        return;
    }
    if (len != sizeof(VnNtbChallenge) || !l->hello_seen || l->challenged) {
        vn_ntb_session_broken(l, "a CHALLENGE out of place or of the wrong size");
        return;
    }
    memcpy(l->peer_nonce, payload, sizeof(l->peer_nonce));
    l->challenged = true;
    vn_ntb_auth_proof(l->key, l->key_len, l->ntb->node, l->peer, l->epoch, l->peer_epoch, l->nonce,
                      l->peer_nonce, proof.mac);
    vn_ntb_queue(l, VN_NTB_REC_PROOF, 0, &proof, sizeof(proof));
    vn_ntb_flush(l);
}

/* The peer's PROOF, made of this session's epochs and nonces: the link is up if it holds
 * the key. */
static void on_proof(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    uint8_t want[VN_NTB_AUTH_PROOF_LEN];
    bool right;

    if (l->key == NULL || len != sizeof(VnNtbProof) || !l->challenged || l->reported) {
        vn_ntb_session_broken(l, "a PROOF out of place or of the wrong size");
        return;
    }
    vn_ntb_auth_proof(l->key, l->key_len, l->peer, l->ntb->node, l->peer_epoch, l->epoch,
                      l->peer_nonce, l->nonce, want);
    right = vn_util_equal_secret(payload, want, sizeof(want));
    memset(want, 0, sizeof(want));
    if (!right) {
        /* Said once per run of refusals: each costs the peer a session (link_restart). */
        if (l->broken_run == 0) {
            g_warning("node %s: ntb port %s: refused the host that says it is %s: it does not "
                      "hold the link's key ([fabric] key-file)",
                      l->ntb->node, l->port->spec, l->peer);
        }
        vn_ntb_session_broken(l, "it does not hold the link's key");
        return;
    }
    vn_ntb_link_up(l);
}

static void on_frame(VnNtbLink *l, const VnNtbRec *rec, const uint8_t *payload)
{
    g_autoptr(GByteArray) whole = NULL;

    if (!l->reported) {
        vn_ntb_session_broken(l, l->key != NULL ? "a frame before its PROOF"
                                                : "a frame before its HELLO");
        return;
    }
    if (l->skip_frame) {
        /* The rest of a frame the last daemon was reading when it ended. */
        l->skip_frame = (rec->flags & VN_NTB_REC_MORE) != 0;
        return;
    }
    if ((rec->flags & VN_NTB_REC_MORE) || l->reasm->len > 0) {
        if (l->reasm->len + rec->len > VN_FABRIC_MAX_FRAME) {
            vn_ntb_session_broken(l, "a frame longer than the fabric's largest");
            return;
        }
        g_byte_array_append(l->reasm, payload, rec->len);
        if (rec->flags & VN_NTB_REC_MORE) {
            return;
        }
        /* Ours alone while a handler runs (it may end the session, and the buffer). */
        whole = g_steal_pointer(&l->reasm);
        l->reasm = g_byte_array_new();
    }
    l->frames_in++;
    vn_fabric_backend_received(l->ntb->fab, l->peer, whole != NULL ? whole->data : payload,
                               whole != NULL ? whole->len : rec->len);
}

/*
 * Records the peer put into our ring, at most @budget.  Never re-entered: no
 * fabric call waits (a handler's maps, routes and requests are answered from
 * the loop), and ntb_connect() reads no ring from inside a handler.
 */
static void receive(VnNtbLink *l, int budget)
{
    uint8_t *payload = l->payload;
    uint64_t consumed = 0, prod;

    g_return_if_fail(!l->ntb->receiving);
    l->ntb->receiving = true;
    while (budget-- > 0 && l->state == VN_NTB_LINK_OPEN) {
        uint64_t avail;
        VnNtbRec rec = { 0 };
        int64_t size;

        if (!word_of_session(l, &((VnNtbRingHdr *)l->in)->prod, &prod)) {
            /* Nothing yet, or a word of the peer's new session, whose CTRL
             * doorbell may not have been served: read its announcement. */
            if (((VnNtbRingHdr *)l->in)->prod == 0 || !check_peer(l)) {
                break;
            }
            continue;
        }
        avail = (prod - l->rx_cons) & VN_NTB_COUNT_MASK;
        if (avail == 0) {
            break;
        }
        size = avail > l->ntb->ring ? -EBADMSG
                                    : vn_ntb_ring_take(l->in + VN_NTB_RING_DATA, l->ntb->ring,
                                                       l->rx_cons, avail, &rec, payload);
        if (size < 0) {
            g_autofree char *why =
                g_strdup_printf("a malformed record at %" PRIu64 " of its ring (%" PRIu64
                                " bytes written after it; length %u, kind %u)",
                                l->rx_cons, avail, rec.len, rec.kind);

            vn_ntb_session_broken(l, why);
            break;
        }
        l->rx_cons += (uint64_t)size;
        consumed += (uint64_t)size;
        vn_ntb_note_rx(l, rec.kind == VN_NTB_REC_FRAME && (rec.flags & VN_NTB_REC_MORE));
        switch (rec.kind) {
        case VN_NTB_REC_HELLO:
            on_hello(l, payload, rec.len);
            break;
        case VN_NTB_REC_FRAME:
            on_frame(l, &rec, payload);
            break;
        case VN_NTB_REC_MAP:
            vn_ntb_on_map(l, payload, rec.len);
            break;
        case VN_NTB_REC_MAPPED:
            vn_ntb_on_mapped(l, payload, rec.len);
            break;
        case VN_NTB_REC_CHALLENGE:
            on_challenge(l, payload, rec.len);
            break;
        case VN_NTB_REC_PROOF:
            on_proof(l, payload, rec.len);
            break;
        case VN_NTB_REC_ROUTE:
            vn_ntb_on_route(l, payload, rec.len);
            break;
        case VN_NTB_REC_ROUTED:
            vn_ntb_on_routed(l, payload, rec.len);
            break;
        case VN_NTB_REC_UNROUTE:
            vn_ntb_on_unroute(l, payload, rec.len);
            break;
        case VN_NTB_REC_RESUMED:
            vn_ntb_on_resumed(l, payload, rec.len);
            break;
        default:
            vn_ntb_on_unmap(l, payload, rec.len);
            break;
        }
    }
    l->ntb->receiving = false;
    if (l->state != VN_NTB_LINK_OPEN) {
        return;
    }
    publish_cons(l);
    if (consumed > l->ntb->ring / 2) {
        l->port->ops->peer_doorbell(l->port, UINT64_C(1) << VN_NTB_DB_SPACE);
    }
    /* Out of budget with records left: ring our own bell, so that the loop comes back here
     * after the others had their turn (the peer's rang once for all of them). */
    if (budget < 0 && word_of_session(l, &((VnNtbRingHdr *)l->in)->prod, &prod) &&
        prod != (l->rx_cons & VN_NTB_COUNT_MASK)) {
        vn_peerfd_signal(l->port->ops->doorbell_fd(l->port, VN_NTB_DB_MSG));
    }
}

/* What the port's fds in @events (VN_NTB_EV_*) say: a link change, the
 * peer's announcement, records in our ring, room in its.  Only those: on
 * an adapter each costs a call into the module, and most wake-ups are one
 * MSG. */
static void link_service(VnNtbLink *l, unsigned events)
{
    int fds[VN_NTB_LINK_FDS];
    bool started = false;

    link_fds(l, fds);
    for (unsigned k = 0; k < VN_NTB_LINK_FDS; k++) {
        if (events & (1u << k)) {
            vn_peerfd_drain(fds[k]);
        }
    }
    if (events & VN_NTB_EV_LINK) {
        bool up = l->port->ops->link_up(l->port);

        if (up != l->port_up) {
            l->port_up = up;
            if (!up) {
                link_down(l, "the port's link went down");
            }
        }
        if (up && l->state == VN_NTB_LINK_DOWN) {
            link_announce(l, false);
        }
    }
    if (events & (VN_NTB_EV_LINK | VN_NTB_EV_CTRL)) {
        started = check_peer(l);
    }
    /* A new session's first records may be in already. */
    if ((events & VN_NTB_EV_MSG) || started) {
        receive(l, VN_NTB_RECORDS_PER_WAKEUP);
    }
    vn_ntb_flush(l);
}

static gboolean on_port_fd(gint fd, GIOCondition cond, gpointer data)
{
    VnNtbLink *l = data;
    int fds[VN_NTB_LINK_FDS];

    link_fds(l, fds);
    for (unsigned k = 0; k < VN_NTB_LINK_FDS; k++) {
        if (fds[k] == fd) {
            link_service(l, 1u << k);
        }
    }
    return G_SOURCE_CONTINUE;
}

/* ---- links -------------------------------------------------------------- */

/* A port that may lead to @peer: cabled to it, or not named yet. */
static bool may_reach(VnNtb *ntb, const char *peer)
{
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        if (l->port_up && (strcmp(l->expected, peer) == 0 || !peer_known(l))) {
            return true;
        }
    }
    return false;
}

static int ntb_connect(void *backend, const char *peer)
{
    VnNtb *ntb = backend;

    /* From a handler, while a ring is being read: what is known now (reading the rings here
     * would read one inside itself). */
    if (ntb->receiving) {
        return vn_ntb_link_of(ntb, peer) != NULL ? 0 : -EHOSTUNREACH;
    }
    /* Links come up by themselves, from the loop; what the ports hold now is read first.  A
     * session on its way (the peer's announcement, its HELLO) is not waited for here: its
     * link comes up later, and vn_fabric_connect_async's callers wait for that. */
    for (guint i = 0; i < ntb->links->len; i++) {
        link_service(ntb->links->pdata[i], VN_NTB_EV_ALL);
    }
    if (vn_ntb_link_of(ntb, peer) != NULL) {
        return 0;
    }
    return may_reach(ntb, peer) ? -EINPROGRESS : -EHOSTUNREACH;
}

static void ntb_disconnect(void *backend, const char *peer)
{
    VnNtbLink *l = vn_ntb_link_of(backend, peer);

    if (l != NULL) {
        g_info("node %s: ntb port %s: dropping the link to %s", l->ntb->node, l->port->spec, peer);
        link_restart(l, "dropped");
    }
}

static GPtrArray *ntb_discover(void *backend)
{
    VnNtb *ntb = backend;
    GPtrArray *out = g_ptr_array_new_with_free_func(g_free);

    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        if (l->reported) {
            g_ptr_array_add(out, g_strdup(l->peer));
        }
    }
    return out;
}

static void link_free(VnNtbLink *l)
{
    for (unsigned k = 0; k < G_N_ELEMENTS(l->sources); k++) {
        source_drop(&l->sources[k]);
    }
    vn_ntb_maps_end(l->ntb, l, -ECANCELED);
    if (vn_ntb_keep_at_close(l)) {
        /* The port keeps it all for the next daemon: nothing is undone. */
        if (l->out != NULL) {
            munmap(l->out, VN_NTB_RING_DATA + l->ring_out);
        }
        source_drop(&l->retry);
        source_drop(&l->reannounce);
    } else {
        l->reported = false; /* nothing is told from close */
        link_down(l, "closing");
    }
    vn_ntbport_close(l->port);
    g_byte_array_unref(l->txq);
    g_byte_array_unref(l->reasm);
    g_free(l->payload);
    g_free(l);
}

static void ntb_close(void *backend)
{
    VnNtb *ntb = backend;

    vn_ntb_maps_end(ntb, NULL, -ECANCELED);
    g_ptr_array_unref(ntb->links);
    vn_ntb_keys_free(ntb->keys);
    source_drop(&ntb->report);
    g_queue_clear_full(&ntb->downs, g_free);
    g_queue_clear_full(&ntb->lost, g_free);
    g_main_context_unref(ntb->ctx);
    g_free(ntb->node);
    g_free(ntb);
}

static bool link_add(VnNtb *ntb, const char *entry, GError **error)
{
    g_auto(GStrv) kv = g_strsplit(entry, "=", 2);
    VnNtbPort *p;
    VnNtbLink *l;
    int fds[VN_NTB_LINK_FDS];

    if (kv[1] != NULL && !vn_name_valid(VN_NAME_NODE, kv[1])) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "ntb fabric: port %s: \"%s\" is not a node name", kv[0], kv[1]);
        return false;
    }
    p = vn_ntbport_open(kv[0], error);
    if (p == NULL) {
        return false;
    }
    l = g_new0(VnNtbLink, 1);
    l->ntb = ntb;
    l->port = p;
    l->txq = g_byte_array_new();
    l->reasm = g_byte_array_new();
    l->payload = g_malloc(vn_ntb_rec_max(ntb->ring));
    g_strlcpy(l->expected, kv[1] != NULL ? kv[1] : "", sizeof(l->expected));
    g_strlcpy(l->peer, l->expected, sizeof(l->peer));
    l->key = vn_ntb_keys_get(ntb->keys, l->expected, &l->key_len); /* checked: there */
    l->keep_ms = ntb->keep_ms > 0 ? (uint32_t)ntb->keep_ms : 0;
    vn_ntb_keep_at_open(l);
    g_ptr_array_add(ntb->links, l);
    link_fds(l, fds);
    for (unsigned k = 0; k < VN_NTB_LINK_FDS; k++) {
        l->sources[k] = vn_util_fd_source_new(fds[k], G_IO_IN);
        g_source_set_callback(l->sources[k], G_SOURCE_FUNC(on_port_fd), l, NULL);
        g_source_attach(l->sources[k], ntb->ctx);
    }
    return true;
}

/* What ntb_open() checks before it opens a port: known keys, the ring's
 * size, and each port's spec and node name. */
static bool ntb_check_params(GHashTable *params, const char **bad, GError **error)
{
    static const char *const known[] = { "ports", "ring-size", "key-file", "keep-ms", NULL };
    const char *keep = g_hash_table_lookup(params, "keep-ms");
    const char *ports = g_hash_table_lookup(params, "ports");
    const char *ring = g_hash_table_lookup(params, "ring-size");
    const char *key_file = g_hash_table_lookup(params, "key-file");
    g_autoptr(VnNtbKeys) keys = NULL;
    g_auto(GStrv) entries = NULL;
    GHashTableIter it;
    gpointer key;
    guint64 v = VN_NTB_DEFAULT_RING;
    size_t n;

    g_hash_table_iter_init(&it, params);
    while (g_hash_table_iter_next(&it, &key, NULL)) {
        if (!g_strv_contains(known, key)) {
            *bad = key;
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "ntb fabric: unknown parameter \"%s\" (known: ports, ring-size, key-file, "
                        "keep-ms)",
                        (char *)key);
            return false;
        }
    }
    *bad = "ring-size";
    if (ring != NULL &&
        !g_ascii_string_to_unsigned(ring, 10, VN_NTB_MIN_RING, VN_NTB_MAX_RING, &v, error)) {
        g_prefix_error(error, "ntb fabric: ring-size: ");
        return false;
    }
    if ((v & (v - 1)) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "ntb fabric: ring-size: %s is not a power of two", ring);
        return false;
    }
    *bad = "keep-ms";
    if (keep != NULL && !g_ascii_string_to_unsigned(keep, 10, 0, VN_NTB_MAX_KEEP_MS, NULL, error)) {
        g_prefix_error(error, "ntb fabric: keep-ms: ");
        return false;
    }
    *bad = "key-file";
    if (key_file != NULL && (keys = vn_ntb_keys_load(key_file, error)) == NULL) {
        g_prefix_error(error, "ntb fabric: ");
        return false;
    }
    *bad = ports != NULL ? "ports" : NULL;
    entries = g_strsplit(ports != NULL ? ports : "", ",", -1);
    if (ports == NULL || ports[0] == '\0' || g_strv_length(entries) > VN_NTB_MAX_PORTS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "ntb fabric: \"ports\" must list 1 to %u ports", VN_NTB_MAX_PORTS);
        return false;
    }
    for (guint i = 0; entries[i] != NULL; i++) {
        g_auto(GStrv) kv = g_strsplit(g_strstrip(entries[i]), "=", 2);

        if (kv[1] != NULL && !vn_name_valid(VN_NAME_NODE, kv[1])) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "ntb fabric: port %s: \"%s\" is not a node name", kv[0], kv[1]);
            return false;
        }
        if (!vn_ntbport_spec_ok(kv[0], error)) {
            return false;
        }
        if (keys != NULL && (kv[1] == NULL || vn_ntb_keys_get(keys, kv[1], &n) == NULL)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "ntb fabric: port %s: with a key-file every port names its node "
                        "(PORT=NODE) and the file holds that node's key",
                        kv[0]);
            return false;
        }
    }
    return true;
}

static void *ntb_open(VnFabric *fab, const char *node, GHashTable *params, GError **error)
{
    const char *ports = g_hash_table_lookup(params, "ports");
    const char *ring = g_hash_table_lookup(params, "ring-size");
    g_auto(GStrv) entries = NULL;
    VnFabricLimits limits;
    guint64 v = VN_NTB_DEFAULT_RING;
    uint64_t out_size = UINT64_MAX;
    uint32_t windows = 0;
    bool routes = true;
    const char *bad;
    VnNtb *ntb;

    if (!ntb_check_params(params, &bad, error)) {
        return NULL;
    }
    if (ring != NULL) {
        v = g_ascii_strtoull(ring, NULL, 10); /* checked above */
    }
    entries = g_strsplit(ports, ",", -1);
    ntb = g_new0(VnNtb, 1);
    ntb->fab = fab;
    ntb->node = g_strdup(node);
    ntb->ctx = g_main_context_ref(vn_fabric_backend_context(fab));
    ntb->ring = v;
    ntb->keep_ms = g_hash_table_contains(params, "keep-ms")
                       ? (int64_t)g_ascii_strtoull(g_hash_table_lookup(params, "keep-ms"), NULL, 10)
                       : 0; /* checked above */
    ntb->links = g_ptr_array_new_with_free_func((GDestroyNotify)link_free);
    if (g_hash_table_contains(params, "key-file") &&
        (ntb->keys = vn_ntb_keys_load(g_hash_table_lookup(params, "key-file"), error)) == NULL) {
        g_prefix_error(error, "ntb fabric: ");
        ntb_close(ntb);
        return NULL;
    }
    g_queue_init(&ntb->downs);
    g_queue_init(&ntb->lost);
    g_queue_init(&ntb->maps);
    for (guint i = 0; entries[i] != NULL; i++) {
        if (!link_add(ntb, g_strstrip(entries[i]), error)) {
            ntb_close(ntb);
            return NULL;
        }
    }
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbPort *p = ((VnNtbLink *)ntb->links->pdata[i])->port;

        windows += p->info.windows - 1;
        out_size = MIN(out_size, p->info.out_size);
    }
    vn_fabric_limits_default(&limits);
    limits.max_windows = windows;
    /* The largest power of two every port's windows hold. */
    limits.max_window_size = MIN(out_size, VN_NTB_MAX_WINDOW_SIZE);
    while (limits.max_window_size & (limits.max_window_size - 1)) {
        limits.max_window_size &= limits.max_window_size - 1;
    }
    if (limits.max_window_size < limits.xlat_granularity) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "ntb fabric: windows of %" PRIu64 " bytes are too small", out_size);
        ntb_close(ntb);
        return NULL;
    }
    vn_fabric_backend_set_limits(fab, &limits);
    /* Interrupt routes where every port rings doorbells in the kernel (ntb-route.c). */
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbPort *p = ((VnNtbLink *)ntb->links->pdata[i])->port;

        routes &= p->info.doorbell_routes && p->info.doorbells > VN_NTB_DB_FIRST_ROUTE;
    }
    vn_fabric_backend_set_caps(fab, routes ? VN_FABRIC_CAP_DIRECT_ROUTES : 0);
    /* Sessions start now where they can (reports made while opening are
     * deferred by the fabric). */
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        if (!vn_ntb_resume(l)) {
            link_announce(l, true);
        }
        link_service(l, VN_NTB_EV_ALL);
    }
    return ntb;
}

const VnFabricOps vn_ntb_ops = {
    .name = "ntb",
    .caps = VN_FABRIC_CAP_DIRECT_ROUTES, /* or none: ntb_open */
    .check_params = ntb_check_params,
    .open = ntb_open,
    .close = ntb_close,
    .connect = ntb_connect,
    .send = ntb_send,
    .disconnect = ntb_disconnect,
    .map_segment_async = vn_ntb_map_segment_async,
    .unmap_segment = vn_ntb_unmap_segment,
    .unexport = vn_ntb_unexport,
    .withhold = vn_ntb_withhold,
    .join_windows = vn_ntb_join,
    .open_route_async = vn_ntb_open_route_async,
    .adopt = vn_ntb_adopt,
    .adopt_end = vn_ntb_adopt_end,
    .discover = ntb_discover,
};
