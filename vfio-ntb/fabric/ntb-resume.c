/*
 * A session that outlives its daemon on the `ntb` backend (ntb.h): what a daemon set up on
 * its ports (the translations behind the peer's windows, the doorbells routed to VMs, the
 * triggers that ring the peer's, the link) is kept by the port past the daemon's end
 * ("keep-ms"), and the next daemon on that port takes the session over where it was,
 * rather than starting a new one, which would end every route and window of the link on
 * both sides and leave the VMs' devices unreachable.
 *
 * What the port keeps for us (its stash, which the peer cannot reach): the session (both
 * epochs, the peer, its features) and the link's tables (windows exported and mapped,
 * routes both ways), saved at each change.  What our own buffer keeps: how far we read the
 * peer's ring, written before each record is handled, so that a record is handled at most
 * once (one we were handling when we died is lost; its asker's wait times out).  How far we
 * wrote into the peer's is in its ring's head.
 *
 * On taking over, what the port holds that the tables do not name is dropped (a change the
 * daemon made but had not saved when it died), the session is open again, and the peer is
 * told (RESUMED): it drops a frame of ours it was reassembling and its answers still owed,
 * and tells its fabric the link went down and came up, as a restarted peer's link does on
 * other fabrics.  Anything else (no stash, another configuration's, a peer that started a
 * new session meanwhile or cannot resume one) is dropped whole, and a new session starts.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntb-int.h"

#include "common/name.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>

#define VN_NTB_STASH_MAGIC 0x564e5354u /* "VNST" */
#define VN_NTB_STASH_VERSION 1u

/* The SHA-256 of @l's link key, or zeros without one. */
static void key_digest(VnNtbLink *l, uint8_t out[32])
{
    g_autoptr(GChecksum) sum = NULL;
    gsize len = 32;

    memset(out, 0, 32);
    if (l->key == NULL) {
        return;
    }
    sum = g_checksum_new(G_CHECKSUM_SHA256);
    g_checksum_update(sum, l->key, (gssize)l->key_len);
    g_checksum_get_digest(sum, out, &len);
}

/* What the port keeps for the daemon after us. */
typedef struct VnNtbStash {
    uint32_t magic, version;
    char node[VN_MAX_NODE_NAME + 1];
    char peer[VN_MAX_NODE_NAME + 1];
    uint16_t epoch, peer_epoch, tag, reserved;
    uint32_t peer_features;
    uint32_t windows, doorbells; /* the port's, checked again */
    uint64_t ring, ring_out, map_seq;
    uint64_t exported[VN_NTBPORT_MAX_WINDOWS], mapped[VN_NTBPORT_MAX_WINDOWS];
    uint8_t withheld[VN_NTBPORT_MAX_WINDOWS];
    uint64_t route_in[VN_NTBPORT_MAX_DOORBELLS], route_out[VN_NTBPORT_MAX_DOORBELLS];
    /* The link key's SHA-256 (zeros: none): a session proven with one key is not taken
     * over by a node that does not hold it. */
    uint8_t key_digest[32];
} VnNtbStash;
G_STATIC_ASSERT(sizeof(VnNtbStash) <= VN_NTBPORT_MAX_STASH);

/* Answers the peer may still owe us from before: their numbers are skipped. */
#define VN_NTB_RESUME_SEQ_SKIP (UINT64_C(1) << 20)

static VnNtbResumeWords *resume_words(VnNtbLink *l)
{
    return (VnNtbResumeWords *)(l->in + VN_NTB_RESUME_OFFSET);
}

static bool can_keep(VnNtbLink *l)
{
    return l->keep_ms > 0 && l->port->ops->keep != NULL;
}

void vn_ntb_stash_save(VnNtbLink *l)
{
    VnNtbStash st = { 0 };
    int ret;

    if (!can_keep(l)) {
        return;
    }
    if (l->state != VN_NTB_LINK_OPEN || !l->reported) {
        ret = l->port->ops->stash_set(l->port, NULL, 0); /* nothing to take over */
    } else {
        st.magic = VN_NTB_STASH_MAGIC;
        st.version = VN_NTB_STASH_VERSION;
        g_strlcpy(st.node, l->ntb->node, sizeof(st.node));
        g_strlcpy(st.peer, l->peer, sizeof(st.peer));
        st.epoch = l->epoch;
        st.peer_epoch = l->peer_epoch;
        st.tag = l->tag;
        st.peer_features = l->peer_features;
        st.windows = l->port->info.windows;
        st.doorbells = l->port->info.doorbells;
        st.ring = l->ntb->ring;
        st.ring_out = l->ring_out;
        st.map_seq = l->map_seq;
        memcpy(st.exported, l->exported, sizeof(st.exported));
        memcpy(st.mapped, l->mapped, sizeof(st.mapped));
        for (unsigned w = 0; w < VN_NTBPORT_MAX_WINDOWS; w++) {
            st.withheld[w] = l->withheld[w];
        }
        memcpy(st.route_in, l->route_in, sizeof(st.route_in));
        memcpy(st.route_out, l->route_out, sizeof(st.route_out));
        key_digest(l, st.key_digest);
        ret = l->port->ops->stash_set(l->port, &st, sizeof(st));
    }
    if (ret < 0 && !l->stash_failed) {
        g_warning("node %s: ntb port %s: cannot keep the session's state in the port: %s (a "
                  "restart of this daemon would end the link's routes and windows)",
                  l->ntb->node, l->port->spec, g_strerror(-ret));
    }
    l->stash_failed = ret < 0;
}

void vn_ntb_note_rx(VnNtbLink *l, bool in_frame)
{
    VnNtbResumeWords *w = resume_words(l);

    __atomic_store_n(&w->rx_cons, (uint64_t)l->tag << 48 | (l->rx_cons & VN_NTB_COUNT_MASK),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&w->in_frame, in_frame ? 1 : 0, __ATOMIC_RELAXED);
}

void vn_ntb_keep_at_open(VnNtbLink *l)
{
    int ret;

    if (!can_keep(l)) {
        return;
    }
    ret = l->port->ops->keep(l->port, l->keep_ms);
    if (ret < 0) {
        g_warning("node %s: ntb port %s: cannot ask the port to keep the session past a "
                  "restart: %s",
                  l->ntb->node, l->port->spec, g_strerror(-ret));
    }
}

bool vn_ntb_keep_at_close(VnNtbLink *l)
{
    if (!can_keep(l)) {
        return false;
    }
    if (l->state != VN_NTB_LINK_OPEN || !l->reported || l->stash_failed) {
        l->port->ops->keep(l->port, 0); /* nothing worth keeping: all of it goes */
        return false;
    }
    vn_ntb_stash_save(l);
    g_info("node %s: ntb port %s: the session with %s is kept for the next daemon (%u ms)",
           l->ntb->node, l->port->spec, l->peer, l->keep_ms);
    return true;
}

/* ---- taking over ----------------------------------------------------------------- */

/* Why the stash @st (@n bytes) cannot be taken over by @l, or NULL. */
static const char *stash_refused(VnNtbLink *l, const VnNtbStash *st, int n)
{
    VnNtbPort *p = l->port;
    uint8_t digest[32];
    uint32_t hello = 0;

    if (n != (int)sizeof(*st) || st->magic != VN_NTB_STASH_MAGIC ||
        st->version != VN_NTB_STASH_VERSION) {
        return "no session was kept";
    }
    if (memchr(st->node, '\0', sizeof(st->node)) == NULL || strcmp(st->node, l->ntb->node) != 0 ||
        st->ring != l->ntb->ring || st->windows != p->info.windows ||
        st->doorbells != p->info.doorbells) {
        return "it was kept by another configuration";
    }
    if (memchr(st->peer, '\0', sizeof(st->peer)) == NULL ||
        !vn_name_valid(VN_NAME_NODE, st->peer) ||
        (l->expected[0] != '\0' && strcmp(st->peer, l->expected) != 0)) {
        return "it was with another peer";
    }
    key_digest(l, digest);
    if (memcmp(digest, st->key_digest, sizeof(digest)) != 0) {
        return "it was proven with another link key";
    }
    if (!(st->peer_features & VN_NTB_FEATURE_RESUME)) {
        return "the peer cannot resume a session";
    }
    if (st->tag != vn_ntb_tag(st->epoch, st->peer_epoch) || st->ring_out == 0 ||
        st->ring_out > VN_NTB_MAX_RING || st->map_seq > UINT64_MAX / 2) {
        return "it is malformed";
    }
    for (unsigned k = 0; k < VN_NTBPORT_MAX_WINDOWS; k++) {
        if ((k == 0 || k >= p->info.windows) && (st->exported[k] || st->mapped[k])) {
            return "it is malformed";
        }
    }
    for (unsigned k = 0; k < VN_NTBPORT_MAX_DOORBELLS; k++) {
        if ((k < VN_NTB_DB_FIRST_ROUTE || k >= p->info.doorbells) &&
            (st->route_in[k] || st->route_out[k])) {
            return "it is malformed";
        }
    }
    if (!p->ops->link_up(p)) {
        return "the link is down (the peer is gone)";
    }
    if (p->ops->spad_read(p, VN_NTB_SPAD_HELLO, &hello) < 0 ||
        hello != ((uint32_t)VN_NTB_SPAD_MAGIC << 16 | st->peer_epoch)) {
        return "the peer started another session since";
    }
    return NULL;
}

/* The port holds only what the tables name: a change made but not saved before the last
 * daemon died is undone. */
static void port_reconcile(VnNtbLink *l)
{
    VnNtbPort *p = l->port;

    for (uint32_t w = 1; w < p->info.windows; w++) {
        if (l->exported[w] == 0 || l->withheld[w]) {
            p->ops->in_clear(p, w); /* -ENOENT: there was none */
        }
    }
    for (uint32_t bit = 0; bit < MIN(p->info.doorbells, VN_NTBPORT_MAX_DOORBELLS); bit++) {
        if (l->route_in[bit] == 0) {
            p->ops->doorbell_route(p, bit, -1); /* ours again: the backend's or a free bit */
        }
        if (l->route_out[bit] == 0) {
            p->ops->peer_doorbell_drop(p, bit);
        }
    }
}

/* Where both rings stood; false when a word is not this session's. */
static bool rings_restore(VnNtbLink *l)
{
    VnNtbResumeWords *w = resume_words(l);
    uint64_t rx = __atomic_load_n(&w->rx_cons, __ATOMIC_RELAXED);
    uint64_t tx = __atomic_load_n(&((VnNtbRingHdr *)l->out)->prod, __ATOMIC_ACQUIRE);

    if ((uint16_t)(rx >> 48) != l->tag || (uint16_t)(tx >> 48) != l->tag) {
        return false;
    }
    l->rx_cons = rx & VN_NTB_COUNT_MASK;
    l->tx_prod = tx & VN_NTB_COUNT_MASK;
    l->rx_told = UINT64_MAX; /* told again at the first read */
    l->skip_frame = __atomic_load_n(&w->in_frame, __ATOMIC_RELAXED) != 0;
    return true;
}

static void take_tables(VnNtbLink *l, const VnNtbStash *st)
{
    g_strlcpy(l->peer, st->peer, sizeof(l->peer));
    l->epoch = st->epoch;
    l->peer_epoch = st->peer_epoch;
    l->tag = st->tag;
    l->peer_features = st->peer_features;
    l->map_seq = st->map_seq + VN_NTB_RESUME_SEQ_SKIP;
    memcpy(l->exported, st->exported, sizeof(l->exported));
    memcpy(l->mapped, st->mapped, sizeof(l->mapped));
    for (unsigned w = 0; w < VN_NTBPORT_MAX_WINDOWS; w++) {
        l->withheld[w] = st->withheld[w] != 0;
    }
    memcpy(l->route_in, st->route_in, sizeof(l->route_in));
    memcpy(l->route_out, st->route_out, sizeof(l->route_out));
    memcpy(l->orphan_window, l->exported, sizeof(l->orphan_window));
    memcpy(l->orphan_route, l->route_in, sizeof(l->orphan_route));
    memcpy(l->orphan_mapped, l->mapped, sizeof(l->orphan_mapped));
}

static unsigned count_set(const uint64_t *v, unsigned n)
{
    unsigned c = 0;

    for (unsigned i = 0; i < n; i++) {
        c += v[i] != 0;
    }
    return c;
}

bool vn_ntb_resume(VnNtbLink *l)
{
    VnNtbPort *p = l->port;
    VnNtbStash st;
    const char *why;
    uint64_t resumed = 0;
    int n, ret;

    if (!p->took_over || p->ops->stash_get == NULL) {
        return false;
    }
    n = p->ops->stash_get(p, &st, sizeof(st));
    why = stash_refused(l, &st, n);
    if (why == NULL && p->ops->in_take(p, 0, VN_NTB_RING_DATA + l->ntb->ring, &l->in) < 0) {
        why = "our ring is gone";
    }
    if (why == NULL && (vn_ntb_peer_ring_map(l, VN_NTB_RING_DATA + st.ring_out) < 0 ||
                        l->ring_out != st.ring_out)) {
        why = "the peer's ring cannot be mapped as it was";
    }
    if (why == NULL) {
        take_tables(l, &st);
        if (!rings_restore(l)) {
            why = "the rings are not that session's";
        }
    }
    if (why != NULL) {
        g_message("node %s: ntb port %s: not taking over the session kept by the last daemon: "
                  "%s; starting a new one",
                  l->ntb->node, p->spec, why);
        vn_ntb_session_forget(l);
        l->in = NULL; /* the port's: the reset unmaps it */
        ret = p->ops->reset(p);
        if (ret < 0) {
            g_warning("node %s: ntb port %s: cannot drop what the last daemon kept: %s",
                      l->ntb->node, p->spec, g_strerror(-ret));
        }
        return false;
    }
    port_reconcile(l);
    l->state = VN_NTB_LINK_OPEN;
    l->port_up = p->ops->link_up(p);
    vn_ntb_link_up(l);
    vn_ntb_queue(l, VN_NTB_REC_RESUMED, 0, &resumed, sizeof(resumed));
    vn_ntb_flush(l);
    vn_ntb_stash_save(l);
    g_message("node %s: ntb port %s: took over the session with %s kept by the last daemon "
              "(%u windows exported, %u mapped, %u routes in, %u out)",
              l->ntb->node, p->spec, l->peer, count_set(l->exported, VN_NTBPORT_MAX_WINDOWS),
              count_set(l->mapped, VN_NTBPORT_MAX_WINDOWS),
              count_set(l->route_in, VN_NTBPORT_MAX_DOORBELLS),
              count_set(l->route_out, VN_NTBPORT_MAX_DOORBELLS));
    return true;
}

/* ---- what the workers still hold ------------------------------------------------------ */

bool vn_ntb_adopt(void *backend, VnFabricHeld kind, uint64_t id, const char *peer)
{
    VnNtbLink *l = vn_ntb_link_of(backend, peer);
    uint64_t *orphans = l == NULL                       ? NULL
                        : kind == VN_FABRIC_HELD_ROUTE  ? l->orphan_route
                        : kind == VN_FABRIC_HELD_WINDOW ? l->orphan_mapped
                                                        : l->orphan_window;
    unsigned n = kind == VN_FABRIC_HELD_ROUTE ? VN_NTBPORT_MAX_DOORBELLS : VN_NTBPORT_MAX_WINDOWS;
    bool found = false;

    for (unsigned k = 0; orphans != NULL && id != 0 && k < n; k++) {
        if (orphans[k] == id) {
            orphans[k] = 0;
            found = true;
        }
    }
    return found;
}

void vn_ntb_adopt_end(void *backend)
{
    VnNtb *ntb = backend;

    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];
        unsigned windows = 0, routes = 0, mapped = 0;

        /* Our windows onto the peer's segments that nobody adopted: given back to it. */
        for (uint32_t w = 1; w < VN_NTBPORT_MAX_WINDOWS; w++) {
            if (l->orphan_mapped[w] != 0 && l->mapped[w] == l->orphan_mapped[w]) {
                vn_ntb_unmap_segment(ntb, l->peer, l->mapped[w]);
                mapped++;
            }
        }
        /* Still there, and still that export: nobody adopted it. */
        for (uint32_t w = 1; w < VN_NTBPORT_MAX_WINDOWS; w++) {
            if (l->orphan_window[w] != 0 && l->exported[w] == l->orphan_window[w]) {
                if (!l->withheld[w]) {
                    l->port->ops->in_clear(l->port, w);
                }
                l->exported[w] = 0;
                l->withheld[w] = false;
                windows++;
            }
        }
        for (uint32_t bit = 0; bit < VN_NTBPORT_MAX_DOORBELLS; bit++) {
            if (l->orphan_route[bit] != 0 && l->route_in[bit] == l->orphan_route[bit]) {
                VnNtbMap gone = { .seq = bit, .id = l->route_in[bit] };

                l->port->ops->doorbell_route(l->port, bit, -1);
                l->route_in[bit] = 0;
                if (l->state == VN_NTB_LINK_OPEN) {
                    vn_ntb_queue(l, VN_NTB_REC_UNROUTE, 0, &gone, sizeof(gone));
                }
                routes++;
            }
        }
        memset(l->orphan_window, 0, sizeof(l->orphan_window));
        memset(l->orphan_route, 0, sizeof(l->orphan_route));
        memset(l->orphan_mapped, 0, sizeof(l->orphan_mapped));
        if (windows + routes + mapped > 0) {
            g_message("node %s: ntb port %s: withdrew %u windows and %u routes to %s, and gave "
                      "back %u windows onto its segments, that the last daemon's workers no "
                      "longer hold",
                      ntb->node, l->port->spec, windows, routes, l->peer, mapped);
            vn_ntb_flush(l);
            vn_ntb_stash_save(l);
        }
    }
}

/* ---- the peer's side --------------------------------------------------------------- */

void vn_ntb_on_resumed(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    char peer[VN_MAX_NODE_NAME + 1];

    if (len != sizeof(uint64_t) || !l->reported) {
        vn_ntb_session_broken(l, "a bad RESUMED");
        return;
    }
    g_message("node %s: ntb port %s: %s's daemon restarted and took our session over", l->ntb->node,
              l->port->spec, l->peer);
    /* A frame of its last daemon's, cut short, and answers it will never give. */
    g_byte_array_set_size(l->reasm, 0);
    vn_ntb_maps_end(l->ntb, l, -ECONNRESET);
    /* Our fabric sees it as on any other: the link went down, and came up again. */
    g_strlcpy(peer, l->peer, sizeof(peer));
    vn_ntb_link_lost(l, "its daemon restarted");
    g_strlcpy(l->peer, peer, sizeof(l->peer));
    vn_ntb_link_up(l);
}
