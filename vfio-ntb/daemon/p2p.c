/*
 * Peer-to-peer targets, the daemon's part (see p2p.h).
 *
 * The borrower's side is a small matcher: the facts (BARs placed, offers) are the workers',
 * the targets derived from them ours, made again whenever a fact changes.  Making a target
 * asks two lenders, without waiting; each offer carries a generation, so that an answer
 * about a target that changed meanwhile is dropped (what it made stays harmless: a share
 * and an allowance bounded per device, withdrawn with the device's lease).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "p2p.h"
#include "leases.h"
#include "peers.h"
#include "port.h"

#include "common/log.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <json-glib/json-glib.h>
#include <string.h>

typedef enum OfferState {
    OFFER_FREE,   /* no BAR there (that we know of) */
    OFFER_ASKING, /* a target being made */
    OFFER_TOLD,   /* the worker was told its target */
} OfferState;

typedef struct Offer {
    uint64_t iova, size;
    OfferState state;
    uint64_t gen;
    /* Its target: which device's which BAR, where, and what the worker was told. */
    char device[VN_MAX_NODE_NAME + VN_MAX_DEVICE_NAME + 2];
    VnHostBar bar;
    char peer[VN_MAX_NODE_NAME + 1];
    VnHostP2pTarget t;
} Offer;

struct VnP2pDev {
    VnHostBar bars[VN_HOST_MAX_BARS];
    unsigned nbars;
    GArray *offers; /* Offer */
    uint64_t gen;
};

void vn_p2p_dev_free(VnP2pDev *p)
{
    if (p != NULL) {
        g_array_unref(p->offers);
        g_free(p);
    }
}

static VnP2pDev *dev_of(VnBorrowed *b)
{
    if (b->p2p_dev == NULL) {
        b->p2p_dev = g_new0(VnP2pDev, 1);
        b->p2p_dev->offers = g_array_new(FALSE, FALSE, sizeof(Offer));
    }
    return b->p2p_dev;
}

/* ---- the borrower's side: matching -------------------------------------- */

/* The device this node holds as @device ("host/name"), or NULL (devices.c has the same; a
 * call there would make devices.c and this file call each other). */
static VnBorrowed *held(VnDaemon *d, const char *device)
{
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];

        if (strcmp(b->device, device) == 0) {
            return b;
        }
    }
    return NULL;
}

/* The BAR of another device of @x's VM that holds [@iova, +@size), and its device. */
static const VnHostBar *bar_holding(VnDaemon *d, VnBorrowed *x, uint64_t iova, uint64_t size,
                                    VnBorrowed **owner)
{
    if (x->domain == NULL || !x->p2p || x->lost) {
        return NULL; /* no VM named, not composed, or its lender gone: nothing to compose */
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *y = d->borrowed->pdata[i];

        /* A lost lender's device is reached no more: its memory may be another's by now
         * (on an NTB its windows are dead already; on shm the holder's unmap ends them). */
        if (y == x || y->p2p_dev == NULL || !y->p2p || y->lost || y->domain == NULL ||
            strcmp(y->domain, x->domain) != 0) {
            continue;
        }
        for (unsigned k = 0; k < y->p2p_dev->nbars; k++) {
            const VnHostBar *bar = &y->p2p_dev->bars[k];

            if (iova >= bar->gpa && size <= bar->size && iova - bar->gpa <= bar->size - size) {
                *owner = y;
                return bar;
            }
        }
    }
    return NULL;
}

/* The offer's target went: its worker unmaps it. */
static void offer_drop(VnBorrowed *x, Offer *o)
{
    if (o->state == OFFER_TOLD && x->port != NULL) {
        vn_port_p2p_target(x->port, o->iova, o->size, NULL, NULL);
    }
    o->state = OFFER_FREE;
    o->gen++;
    o->device[0] = '\0';
}

/* What a target in flight needs when its answers come. */
typedef struct Making {
    VnDaemon *d;
    char offerer[VN_MAX_NODE_NAME + VN_MAX_DEVICE_NAME + 2]; /* x->device */
    uint64_t iova, size, gen;
} Making;

/* @m's offer, if it is still the one the answers are about. */
static Offer *making_offer(Making *m, VnBorrowed **x)
{
    *x = held(m->d, m->offerer);
    if (*x == NULL || (*x)->p2p_dev == NULL) {
        return NULL;
    }
    for (guint i = 0; i < (*x)->p2p_dev->offers->len; i++) {
        Offer *o = &g_array_index((*x)->p2p_dev->offers, Offer, i);

        if (o->iova == m->iova && o->size == m->size) {
            return o->gen == m->gen && o->state == OFFER_ASKING ? o : NULL;
        }
    }
    return NULL;
}

static void making_failed(Making *m, Offer *o, VnBorrowed *x, const char *step, int err,
                          const VnFabricMsg *reply)
{
    g_autofree char *why = reply != NULL ? vn_fabric_error_message(reply) : NULL;

    vn_log(G_LOG_LEVEL_INFO, m->d->conf->node, x->device, x->lender, x->lease,
           "node %s: %s cannot reach %s's BAR%u directly: %s: %s", m->d->conf->node, x->device,
           o->device, o->bar.region, step, why != NULL ? why : g_strerror(-err));
    o->state = OFFER_FREE; /* tried again when something changes */
}

static void on_allowed(void *opaque, VnFabricMsg *reply, int err)
{
    Making *m = opaque;
    VnBorrowed *x;
    Offer *o = making_offer(m, &x);

    if (o != NULL && err < 0) {
        making_failed(m, o, x, "its lender did not allow it", err, reply);
    } else if (o != NULL && x->port != NULL) {
        o->state = OFFER_TOLD;
        vn_port_p2p_target(x->port, o->iova, o->size, o->peer, &o->t);
        vn_log(G_LOG_LEVEL_MESSAGE, m->d->conf->node, x->device, x->lender, x->lease,
               "node %s: %s reaches %s's BAR%u directly: [0x%" PRIx64 ", +0x%" PRIx64
               ") is %s's, shared with %s",
               m->d->conf->node, x->device, o->device, o->bar.region, o->iova, o->size, o->peer,
               x->lender);
    }
    g_free(m);
}

static void on_shared(void *opaque, VnFabricMsg *reply, int err)
{
    Making *m = opaque;
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;
    VnPeersRequest rq = { 0 };
    VnBorrowed *x;
    Offer *o = making_offer(m, &x);

    if (o == NULL) {
        g_free(m);
        return;
    }
    if (err == 0 && !vn_peers_segments_from_json(reply != NULL ? reply->json : NULL, o->t.segments,
                                                 o->t.nr_segments, &error)) {
        err = -EPROTO;
    }
    if (err < 0) {
        making_failed(m, o, x, "the BAR's lender did not share it", err,
                      error == NULL ? reply : NULL);
        g_free(m);
        return;
    }
    g_strlcpy(rq.device, x->name, sizeof(rq.device));
    rq.lease = x->lease;
    g_strlcpy(rq.node, o->peer, sizeof(rq.node));
    rq.nr_segments = o->t.nr_segments;
    memcpy(rq.segments, o->t.segments, sizeof(rq.segments));
    json = vn_peers_request_to_json(VN_PEERS_P2P_ALLOW, &rq);
    err = vn_fabric_request(m->d->fab, x->lender, VN_PEERS_P2P_ALLOW, json, NULL, 0, on_allowed, m);
    if (err < 0) {
        making_failed(m, o, x, "cannot ask its lender", err, NULL);
        g_free(m);
    }
}

/* Make @o (@x's offer) a target in @y's @bar: its segments shared with @x's lender. */
static void offer_make(VnDaemon *d, VnBorrowed *x, Offer *o, VnBorrowed *y, const VnHostBar *bar)
{
    uint64_t off = o->iova - bar->gpa;
    uint32_t first = (uint32_t)(off / bar->chunk),
             last = (uint32_t)((off + o->size - 1) / bar->chunk);
    g_autofree char *json = NULL;
    VnPeersRequest rq = { 0 };
    Making *m;
    int err;

    o->state = OFFER_ASKING;
    o->gen++;
    g_strlcpy(o->device, y->device, sizeof(o->device));
    o->bar = *bar;
    g_strlcpy(o->peer, y->lender, sizeof(o->peer));
    o->t = (VnHostP2pTarget){ .offset = off - (uint64_t)first * bar->chunk,
                              .chunk = bar->chunk,
                              .nr_segments = last - first + 1 };
    g_strlcpy(rq.device, y->name, sizeof(rq.device));
    rq.lease = y->lease;
    g_strlcpy(rq.node, x->lender, sizeof(rq.node));
    rq.nr_segments = o->t.nr_segments;
    memcpy(rq.segments, bar->segments + first, rq.nr_segments * sizeof(rq.segments[0]));
    json = vn_peers_request_to_json(VN_PEERS_P2P_SHARE, &rq);
    m = g_new0(Making, 1);
    *m = (Making){ .d = d, .iova = o->iova, .size = o->size, .gen = o->gen };
    g_strlcpy(m->offerer, x->device, sizeof(m->offerer));
    err = vn_fabric_request(d->fab, y->lender, VN_PEERS_P2P_SHARE, json, NULL, 0, on_shared, m);
    if (err < 0) {
        making_failed(m, o, x, "cannot ask the BAR's lender", err, NULL);
        g_free(m);
    }
}

/* Whether @o's target is @y's @bar already (made or being made). */
static bool offer_is(const Offer *o, const VnBorrowed *y, const VnHostBar *bar)
{
    return o->state != OFFER_FREE && strcmp(o->device, y->device) == 0 &&
           o->bar.region == bar->region && o->bar.gpa == bar->gpa && o->bar.size == bar->size &&
           o->bar.nr_segments == bar->nr_segments &&
           memcmp(o->bar.segments, bar->segments, sizeof(bar->segments)) == 0;
}

/* Every offer against every BAR: targets made, kept or dropped. */
static void rematch(VnDaemon *d)
{
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *x = d->borrowed->pdata[i];

        for (guint k = 0; x->p2p_dev != NULL && k < x->p2p_dev->offers->len; k++) {
            Offer *o = &g_array_index(x->p2p_dev->offers, Offer, k);
            VnBorrowed *y = NULL;
            const VnHostBar *bar = bar_holding(d, x, o->iova, o->size, &y);

            if (bar != NULL && offer_is(o, y, bar)) {
                continue;
            }
            if (o->state != OFFER_FREE) {
                offer_drop(x, o);
            }
            if (bar != NULL && x->lender != NULL && y->lender != NULL) {
                offer_make(d, x, o, y, bar);
            }
        }
    }
}

void vn_p2p_changed(VnDaemon *d)
{
    rematch(d);
}

typedef struct Watch {
    VnDaemon *d;
    char device[VN_MAX_NODE_NAME + VN_MAX_DEVICE_NAME + 2];
} Watch;

/* What @b's worker said (port.h: VnPortP2pFn). */
static void on_p2p(void *opaque, uint32_t op, uint64_t iova, uint64_t size, const VnHostBar *bars,
                   unsigned n)
{
    Watch *w = opaque;
    VnBorrowed *b = held(w->d, w->device);
    VnP2pDev *p;

    if (b == NULL) {
        return;
    }
    p = dev_of(b);
    if (op == VN_HOST_P2P_PLACE) {
        memcpy(p->bars, bars, n * sizeof(bars[0]));
        p->nbars = n;
    } else if (op == VN_HOST_P2P_OFFER) {
        for (guint i = 0; i < p->offers->len; i++) {
            const Offer *o = &g_array_index(p->offers, Offer, i);

            if (o->iova == iova && o->size == size) {
                return; /* said again (after our restart) */
            }
        }
        if (p->offers->len >= VN_P2P_MAX_OFFERS) {
            g_info("node %s: %s: more than %u ranges mapped without memory; 0x%" PRIx64
                   " is not looked at",
                   w->d->conf->node, b->device, VN_P2P_MAX_OFFERS, iova);
            return;
        }
        g_array_append_val(p->offers, ((Offer){ .iova = iova, .size = size }));
    } else {
        /* Withdrawn: the offers inside go; their worker unmaps their targets itself. */
        for (guint i = p->offers->len; i-- > 0;) {
            Offer *o = &g_array_index(p->offers, Offer, i);

            if (o->iova >= iova && o->iova - iova < size && o->size <= size - (o->iova - iova)) {
                g_array_remove_index_fast(p->offers, i);
            }
        }
    }
    rematch(w->d);
}

void vn_p2p_watch(VnDaemon *d, VnBorrowed *b)
{
    Watch *w = g_new0(Watch, 1);

    w->d = d;
    g_strlcpy(w->device, b->device, sizeof(w->device));
    /* The port keeps no opaque to free: one per port, freed with the device's. */
    g_clear_pointer(&b->p2p_watch, g_free);
    b->p2p_watch = w;
    vn_port_on_p2p(b->port, on_p2p, w);
}

char *vn_p2p_targets_json(VnBorrowed *b)
{
    g_autoptr(JsonBuilder) jb = json_builder_new();
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_array(jb);
    for (guint i = 0; b->p2p_dev != NULL && i < b->p2p_dev->offers->len; i++) {
        const Offer *o = &g_array_index(b->p2p_dev->offers, Offer, i);

        if (o->state != OFFER_TOLD) {
            continue;
        }
        json_builder_begin_object(jb);
        json_builder_set_member_name(jb, "iova");
        json_builder_add_int_value(jb, (gint64)o->iova);
        json_builder_set_member_name(jb, "size");
        json_builder_add_int_value(jb, (gint64)o->size);
        json_builder_set_member_name(jb, "device");
        json_builder_add_string_value(jb, o->device);
        json_builder_set_member_name(jb, "region");
        json_builder_add_int_value(jb, o->bar.region);
        json_builder_end_object(jb);
    }
    json_builder_end_array(jb);
    root = json_builder_get_root(jb);
    return json_to_string(root, FALSE);
}

/* ---- the lender's side --------------------------------------------------- */

void vn_p2p_request(VnDaemon *d, VnLocalDevice *ld, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;
    uint64_t shares[VN_PEERS_MAX_SEGMENTS];
    VnPeersRequest rq;
    const char *what = vn_peers_type_to_string(msg->type);

    if (!vn_peers_request_from_json(msg->type, msg->json, &rq, &error)) {
        vn_fabric_reply_errorf(d->fab, token, EINVAL, "%s", error->message);
        return;
    }
    /* The holder's word only, about its own lease. */
    if (ld->lease->holder == NULL || strcmp(ld->lease->holder, msg->peer) != 0 ||
        ld->lease->id != rq.lease || ld->port == NULL) {
        vn_fabric_reply_errorf(d->fab, token, EPERM, "%s: %s/%s: lease %" PRIu64 " is not %s's",
                               what, d->conf->node, rq.device, rq.lease, msg->peer);
        return;
    }
    if (msg->type == VN_PEERS_P2P_ALLOW) {
        for (uint32_t k = 0; k < rq.nr_segments; k++) {
            if (!vn_port_p2p_allow(ld->port, rq.node, rq.segments[k])) {
                vn_fabric_reply_errorf(d->fab, token, ENOSPC,
                                       "%s: %s/%s may map at most %u other nodes' segments", what,
                                       d->conf->node, rq.device, VN_PORT_MAX_P2P);
                return;
            }
        }
        vn_fabric_reply(d->fab, token, "{}", NULL, 0);
        return;
    }
    /* A share reaches the device from another host: one this device may be lent to. */
    if (strcmp(rq.node, d->conf->node) != 0 && !vn_lend_conf_allows(ld->conf, rq.node)) {
        vn_fabric_reply_errorf(d->fab, token, EACCES,
                               "%s: %s/%s may not be reached by %s (its access list)", what,
                               d->conf->node, rq.device, rq.node);
        return;
    }
    for (uint32_t k = 0; k < rq.nr_segments; k++) {
        const char *to = vn_fabric_segment_peer(d->fab, rq.segments[k]);

        if (to == NULL || strcmp(to, msg->peer) != 0 ||
            !vn_port_exported(ld->port, rq.segments[k])) {
            vn_fabric_reply_errorf(d->fab, token, EACCES,
                                   "%s: segment %" PRIu64 " is not %s/%s's exported to %s", what,
                                   rq.segments[k], d->conf->node, rq.device, msg->peer);
            return;
        }
        shares[k] = vn_fabric_segment_share(d->fab, rq.segments[k], rq.node, &error);
        if (shares[k] == 0) {
            vn_fabric_reply_errorf(d->fab, token, ENOSPC, "%s: %s", what, error->message);
            return;
        }
    }
    g_info("node %s: %s/%s: %u segments of its BAR shared with %s for %s", d->conf->node,
           d->conf->node, rq.device, rq.nr_segments, rq.node, msg->peer);
    json = vn_peers_segments_to_json(shares, rq.nr_segments);
    vn_fabric_reply(d->fab, token, json, NULL, 0);
}
