/*
 * This node's announcements to the other daemons (see cluster.c): what it
 * lends (each device's state, borrower and lease) and the leases it holds,
 * to every linked peer on each change (coalesced over
 * VN_DAEMON_ANNOUNCE_DELAY_MS: vn_announce_soon) and when a link comes up,
 * and again now and then (vn_announce_due(): often to the hosts it shares a
 * lease with, seldom to the others).  Only what goes out: what comes in is
 * cluster.c's.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "announce.h"

#include "conf.h"
#include "devices.h"
#include "leases.h"
#include "peers.h"

#include "config.h"

#include <string.h>

/* What we lend and hold; for @peer (NULL: for nobody in particular), each
 * device it may not borrow says so. */
static char *announcement(VnDaemon *d, const char *peer)
{
    g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);
    const VnRemoteNode *n = peer != NULL ? g_hash_table_lookup(d->nodes, peer) : NULL;

    g_strlcpy(a->node, d->conf->node, sizeof(a->node));
    g_strlcpy(a->version, VN_VERSION, sizeof(a->version));
    /* A host we knew whose link went: until it announces again we do not know what it
     * holds, and it may not know that we missed what it said. */
    a->answer = n != NULL && !n->link_up;
    /* Both tables are bounded by VN_CONF_MAX_DEVICES (conf.c, lend,
     * vn_cluster_borrow). */
    for (guint i = 0; i < d->local->len && i < VN_CONF_MAX_DEVICES; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        VnPeersDevice *pd = &a->devices[a->n_devices++];

        g_strlcpy(pd->name, ld->conf->name, sizeof(pd->name));
        pd->id = ld->id;
        pd->lent = vn_lease_lent(ld->lease);
        pd->denied = peer != NULL && !vn_lend_conf_allows(ld->conf, peer);
        pd->server_down = ld->server == VN_SERVER_DOWN;
        pd->server_gen = ld->server_gen;
        if (pd->lent) {
            g_strlcpy(pd->borrower, ld->lease->holder, sizeof(pd->borrower));
            pd->lease = ld->lease->id;
        }
    }
    for (guint i = 0; i < d->borrowed->len && i < VN_CONF_MAX_DEVICES; i++) {
        VnBorrowed *bw = d->borrowed->pdata[i];
        VnPeersHold *h = &a->holds[a->n_holds++];

        g_strlcpy(h->lender, bw->lender, sizeof(h->lender));
        g_strlcpy(h->name, bw->name, sizeof(h->name));
        h->lease = bw->lease;
        if (bw->worker_pid > 0 && bw->domain != NULL) {
            g_strlcpy(h->domain, bw->domain, sizeof(h->domain));
        }
    }
    return vn_peers_announce_to_json(a);
}

/* Our announcement to @n; a send that fails is owed (the next beat sends it). */
static void announce_to_node(VnDaemon *d, VnRemoteNode *n)
{
    g_autofree char *own = announcement(d, n->name);

    n->owed = vn_fabric_event(d->fab, n->name, VN_PEERS_ANNOUNCE, own, NULL, 0) < 0;
}

/* Does @peer hold a device of ours, or we one of its?  (Its announcements and ours keep
 * the lease's two ends agreeing; they are refreshed more often than a third party's.) */
static bool lease_partner(VnDaemon *d, const char *peer)
{
    for (guint i = 0; i < d->local->len; i++) {
        const VnLease *l = ((VnLocalDevice *)d->local->pdata[i])->lease;

        if (l->holder != NULL && strcmp(l->holder, peer) == 0) {
            return true;
        }
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        if (strcmp(((VnBorrowed *)d->borrowed->pdata[i])->lender, peer) == 0) {
            return true;
        }
    }
    return false;
}

bool vn_announce_due(guint beat, guint phase, bool owed, bool partner)
{
    return owed || (beat + phase) % VN_DAEMON_REFRESH_EVERY == 0 ||
           (partner && beat % VN_DAEMON_ANNOUNCE_EVERY == 0);
}

void vn_announce_beat(VnDaemon *d)
{
    GHashTableIter it;
    VnRemoteNode *n;

    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, (gpointer *)&n)) {
        /* lease_partner() only on the beats where it matters */
        if (n->link_up && vn_announce_due(d->beats, n->phase, n->owed,
                                          d->beats % VN_DAEMON_ANNOUNCE_EVERY == 0 &&
                                              lease_partner(d, n->name))) {
            announce_to_node(d, n);
        }
    }
}

/* To the daemons among our peers (the nodes that announced themselves);
 * borrower workers hear it once, when their link comes up. */
static void broadcast(VnDaemon *d, char *json)
{
    GHashTableIter it;
    VnRemoteNode *n;

    /* This one carries whatever a pending coalesced one would have. */
    if (d->announce_timer != 0) {
        g_source_remove(d->announce_timer);
        d->announce_timer = 0;
    }
    /* Each peer's own: which devices it may not borrow (access lists change
     * only with a reload, which announces; @json, for nobody, tells changes). */
    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, (gpointer *)&n)) {
        if (n->link_up) {
            announce_to_node(d, n);
        }
    }
    g_free(d->announced);
    d->announced = json; /* takes ownership */
}

void vn_announce(VnDaemon *d)
{
    broadcast(d, announcement(d, NULL));
}

void vn_announce_changed(VnDaemon *d)
{
    g_autofree char *json = announcement(d, NULL);

    /* Changes that undid each other (a borrow returned before its grant was
     * announced) leave the peers' view right as it is: nothing to send. */
    if (d->announced != NULL && strcmp(json, d->announced) == 0) {
        if (d->announce_timer != 0) {
            g_source_remove(d->announce_timer);
            d->announce_timer = 0;
        }
        return;
    }
    broadcast(d, g_steal_pointer(&json));
}

static gboolean on_announce_due(gpointer data)
{
    VnDaemon *d = data;

    d->announce_timer = 0;
    vn_announce_changed(d);
    return G_SOURCE_REMOVE;
}

void vn_announce_soon(VnDaemon *d)
{
    if (d->announce_timer == 0) {
        d->announce_timer = g_timeout_add(VN_DAEMON_ANNOUNCE_DELAY_MS, on_announce_due, d);
    }
}

void vn_announce_to(VnDaemon *d, const char *peer)
{
    g_autofree char *json = announcement(d, peer);

    vn_fabric_event(d->fab, peer, VN_PEERS_ANNOUNCE, json, NULL, 0);
}
