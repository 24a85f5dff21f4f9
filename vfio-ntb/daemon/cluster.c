/*
 * Daemon to daemon: who is there, what they lend, and leases.
 *
 * Every node announces its lendable devices (state, borrower, lease) and
 * the leases it holds to every linked peer on each change and when the link
 * comes up, and again now and then (announce.c: often to the hosts it
 * shares a lease with, seldom to the others); peers are found through the
 * fabric (vn_fabric_discover) every VN_DAEMON_HEARTBEAT_MS.  A lease is granted by
 * the lending node alone, one request at a time from its main loop, so of
 * concurrent BORROWs exactly one wins.  The lease itself is leases.c's state
 * machine: it ends when the borrower returns it, stops claiming it, or does
 * not come back in time, or when the lender revokes it; this file's
 * listener (vn_cluster_on_lease) then fences the device, answers the revoke,
 * announces and emits the event.
 *
 * Peers are untrusted: every field of their messages is checked, and a node
 * can only return or hold a lease that is its own.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "cluster.h"
#include "p2p.h"

#include "announce.h"
#include "cluster-borrow.h"
#include "conf.h"
#include "devserver.h"
#include "events.h"
#include "fence.h"
#include "peers.h"
#include "port.h"
#include "state.h"
#include "unplug.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <stdarg.h>
#include <string.h>

/* ---- helpers ---- */

/* "; it @verb in DOMAIN" when @b is attached, else "": where a loss hits. */
static char *in_domain(const VnBorrowed *b, const char *verb)
{
    return b->domain != NULL ? g_strdup_printf("; it %s in %s", verb, b->domain) : g_strdup("");
}

/* ---- announcements received ---- */

/* Lender side: the VM each of our devices @peer holds is served to, as its
 * announcement says (shown by list and in the metrics). */
static void holder_domains(VnDaemon *d, const char *peer, const VnPeersAnnounce *a)
{
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        const char *domain = NULL;

        if (!vn_lease_lent(ld->lease) || strcmp(ld->lease->holder, peer) != 0) {
            continue;
        }
        for (unsigned j = 0; j < a->n_holds; j++) {
            const VnPeersHold *h = &a->holds[j];

            if (h->lease == ld->lease->id && strcmp(h->lender, d->conf->node) == 0 &&
                strcmp(h->name, ld->conf->name) == 0 && h->domain[0] != '\0') {
                domain = h->domain;
            }
        }
        if (g_strcmp0(domain, ld->holder_domain) != 0) {
            g_free(ld->holder_domain);
            ld->holder_domain = g_strdup(domain);
        }
    }
}

/* An announcement being judged (claims()). */
typedef struct Claims {
    VnDaemon *d;
    const VnPeersAnnounce *a;
} Claims;

/* Does a peer's announcement claim lease @lease on our device @name? */
static bool claims(void *opaque, const char *name, uint64_t lease)
{
    Claims *c = opaque;

    return vn_peers_announce_holds(c->a, c->d->conf->node, name, lease);
}

/* Forget hosts whose link has been down longer than @older_than_us, or,
 * with @one, the one down longest (to make room). */
static void nodes_forget(VnDaemon *d, gint64 older_than_us, bool one)
{
    gint64 now = g_get_monotonic_time();
    VnRemoteNode *oldest = NULL;
    GHashTableIter it;
    VnRemoteNode *n;

    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, (gpointer *)&n)) {
        if (n->link_up) {
            continue;
        }
        if (!one && now - n->down_since_us > older_than_us) {
            vn_log(G_LOG_LEVEL_INFO, d->conf->node, NULL, n->name, 0,
                   "node %s: forgetting %s (link down %" G_GINT64_FORMAT " s)", d->conf->node,
                   n->name, (now - n->down_since_us) / G_USEC_PER_SEC);
            g_hash_table_iter_remove(&it);
        } else if (one && (oldest == NULL || n->down_since_us < oldest->down_since_us)) {
            oldest = n;
        }
    }
    if (oldest != NULL) {
        g_hash_table_remove(d->nodes, oldest->name);
    }
}

/* The entry of a host that announced itself (new if need be), or NULL when
 * the table is full of live hosts. */
static VnRemoteNode *node_announced(VnDaemon *d, const char *name)
{
    VnRemoteNode *n = g_hash_table_lookup(d->nodes, name);

    if (n == NULL && g_hash_table_size(d->nodes) >= VN_FABRIC_MAX_PEERS) {
        nodes_forget(d, 0, true);
    }
    if (n == NULL && g_hash_table_size(d->nodes) < VN_FABRIC_MAX_PEERS) {
        n = g_new0(VnRemoteNode, 1);
        n->name = g_strdup(name);
        n->phase = g_str_hash(name) % VN_DAEMON_REFRESH_EVERY;
        g_hash_table_insert(d->nodes, n->name, n);
    }
    return n;
}

static gboolean on_heartbeat(gpointer data)
{
    VnDaemon *d = data;
    g_autoptr(GPtrArray) seen = vn_fabric_discover(d->fab);

    for (guint i = 0; i < seen->len; i++) {
        const char *peer = seen->pdata[i];

        if (!vn_fabric_link_up(d->fab, peer)) {
            /* A socket without a live node behind it fails here; quietly. */
            vn_fabric_connect(d->fab, peer, NULL);
        }
    }
    vn_leases_tick(d->leases, g_get_monotonic_time());
    if (d->unsaved) {
        vn_state_save_or_report(d); /* the disk may have room again */
    }
    nodes_forget(d, (gint64)VN_DAEMON_FORGET_NODE_MS * 1000, false);
    /* Changes are announced when they happen; the periodic ones only heal
     * what a failed send left behind: with n daemons a broadcast costs n - 1
     * messages, each parsed by its receiver. */
    d->beats++;
    vn_announce_beat(d);
    return G_SOURCE_CONTINUE;
}

/* The heartbeat is a whole-second timer (vn_cluster_start()). */
G_STATIC_ASSERT(VN_DAEMON_HEARTBEAT_MS % 1000 == 0 && VN_DAEMON_HEARTBEAT_MS >= 1000);

void vn_cluster_start(VnDaemon *d)
{
    d->started_us = g_get_monotonic_time();
    on_heartbeat(d);
    /* A whole-second timer: GLib fires those of every process on the host at the same
     * instant of the second, so an idle host's daemon and workers wake together, not
     * each at its own time (on an idle machine the wake-up costs more than the beat). */
    d->heartbeat = g_timeout_add_seconds(VN_DAEMON_HEARTBEAT_MS / 1000, on_heartbeat, d);
}

/*
 * Borrower side: a lender we had given up on is back and still lends us @b
 * (its workers served on).  Both hosts must end up saying the same: the
 * lease is held again, or ended.  A device we asked its VM to let go of
 * (device_del through its QMP socket) is on its way out: it is returned, as
 * a revoke returns one.  Any other is served again: its worker hears the
 * lender is back and forwards again (unless a DMA unmap missed the lender
 * meanwhile: then it stays dead, and says so).
 */
static void lender_back(VnDaemon *d, VnBorrowed *b)
{
    b->lost = false;
    vn_p2p_changed(d);
    if (b->worker_pid > 0 && b->qmp != NULL) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %s is back and still lends us %s, which was asked out of %s when it "
               "was lost: returning it",
               d->conf->node, b->lender, b->device, b->domain);
        vn_cluster_release(d, b, VN_DAEMON_MAX_RELEASE_MS);
        return;
    }
    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
           "node %s: %s is back and still lends us %s (lease %" G_GUINT64_FORMAT
           "): it is held again%s",
           d->conf->node, b->lender, b->device, b->lease,
           b->worker_pid > 0 ? ", and served to its VM again" : "");
    if (b->port != NULL) {
        vn_port_set_peer(b->port, b->lender);
    }
    vn_events_emit(d, "DEVICE_RECOVERED", b->device, b->lease, b->lender, b->domain);
}

/* Borrower side: a lease the lender no longer shows as ours is gone
 * (expired or revoked while we were away). */
static void reconcile_held(VnDaemon *d, const char *lender, const VnPeersAnnounce *a)
{
    for (guint i = d->borrowed->len; i > 0; i--) {
        VnBorrowed *b = d->borrowed->pdata[i - 1];
        bool held = false;

        /* Only a lease in doubt is judged (see VnBorrowed.unconfirmed). */
        if (strcmp(b->lender, lender) != 0 || !b->unconfirmed) {
            continue;
        }
        for (unsigned j = 0; j < a->n_devices; j++) {
            const VnPeersDevice *pd = &a->devices[j];

            if (strcmp(pd->name, b->name) == 0 && pd->lent &&
                strcmp(pd->borrower, d->conf->node) == 0 && pd->lease == b->lease) {
                held = true;
            }
        }
        if (held) {
            b->unconfirmed = false;
            if (b->lost) {
                lender_back(d, b);
            }
        } else {
            g_autofree char *in = in_domain(b, "was");
            g_autofree char *why =
                g_strdup_printf("%s no longer lends it to us (lease %" G_GUINT64_FORMAT
                                " ended while we were apart)%s",
                                lender, b->lease, in);

            vn_devices_note_loss(d, b->device, b->lease, why);
            vn_events_emit(d, "LEASE_EXPIRED", b->device, b->lease, NULL, NULL);
            vn_devices_detach(d, b);
            g_ptr_array_remove_index(d->borrowed, i - 1);
            vn_state_save_or_report(d);
        }
    }
}

static void tell_untold_revokes(VnDaemon *d, const char *peer);

static void on_announce(VnDaemon *d, VnFabricMsg *msg)
{
    g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);
    g_autoptr(GError) error = NULL;
    Claims c = { .d = d, .a = a };
    VnRemoteNode *n;
    bool wanted;

    if (!vn_peers_announce_from_json(msg->json, msg->peer, a, &error)) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, NULL, msg->peer, 0,
               "node %s: announcement from %s ignored: %s", d->conf->node, msg->peer,
               error->message);
        return;
    }
    if ((n = node_announced(d, msg->peer)) == NULL) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, NULL, msg->peer, 0,
               "node %s: announcement from %s ignored: %u hosts are up already", d->conf->node,
               msg->peer, (unsigned)VN_FABRIC_MAX_PEERS);
        return;
    }
    wanted = a->answer;
    g_free(n->ann);
    n->ann = g_steal_pointer(&a);
    n->link_up = true;
    n->seen_us = g_get_monotonic_time();
    vn_leases_announced(d->leases, msg->peer, claims, &c, g_get_monotonic_time());
    tell_untold_revokes(d, msg->peer);
    holder_domains(d, msg->peer, n->ann);
    reconcile_held(d, msg->peer, n->ann);
    vn_devserver_announced(d, msg->peer, n->ann);
    if (wanted && n->answered_beat != d->beats + 1) {
        /* Its link flapped where ours may not have.  Ours says no "answer" (the link is up
         * for us now): one announcement each way per flap, and at most one a beat to a
         * peer that keeps asking (the periodic ones cost it as much). */
        n->answered_beat = d->beats + 1;
        vn_announce_to(d, msg->peer);
    }
}

static void on_revoke(VnDaemon *d, VnFabricMsg *msg)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *device = NULL;
    VnPeersRequest rq;
    VnBorrowed *b;

    if (!vn_peers_request_from_json(VN_PEERS_REVOKE, msg->json, &rq, &error)) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, NULL, msg->peer, 0,
               "node %s: REVOKE from %s ignored: %s", d->conf->node, msg->peer, error->message);
        return;
    }
    device = g_strdup_printf("%s/%s", msg->peer, rq.device);
    b = vn_devices_borrowed(d, device);
    if (b == NULL || b->lease != rq.lease) {
        return; /* not ours: a confused or malicious peer */
    }
    if (b->release_timer != 0) {
        /* Told again (its link to us flapped meanwhile): already on its way back. */
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, device, msg->peer, rq.lease,
               "node %s: %s revokes %s again; it is being given back", d->conf->node, msg->peer,
               device);
        return;
    }
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, device, msg->peer, rq.lease,
           "node %s: %s revokes %s (lease %" G_GUINT64_FORMAT "); giving it back", d->conf->node,
           msg->peer, device, rq.lease);
    vn_events_emit(d, "LEASE_REVOKED", device, rq.lease, NULL, NULL);
    /* A cooperative borrower: take it out of the VM (the guest's driver
     * releases it cleanly), detach and return, within the grace period. */
    vn_cluster_release(d, b, MIN(rq.grace_ms / 2, VN_DAEMON_MAX_RELEASE_MS));
}

void vn_cluster_event(VnDaemon *d, VnFabricMsg *msg)
{
    if (msg->type == VN_PEERS_ANNOUNCE) {
        on_announce(d, msg);
    } else if (msg->type == VN_PEERS_REVOKE) {
        on_revoke(d, msg);
    } else {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, NULL, msg->peer, 0,
               "node %s: unknown event 0x%x from %s", d->conf->node, msg->type, msg->peer);
    }
}

/* ---- leases, lender side ---- */

/* A lease ended: fence, answer a revoke waiting for it, tell everyone. */
static void lease_ended(VnDaemon *d, VnLocalDevice *ld, const VnLeaseChange *ch)
{
    g_autofree char *device = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);
    /* Given back is routine; taken away (expired, dropped, revoked) is a
     * guest's device gone: a warning, and so is its fence. */
    bool loss = ch->end != VN_LEASE_END_RETURNED && ch->end != VN_LEASE_END_UNLENT;

    vn_log(loss ? G_LOG_LEVEL_WARNING : G_LOG_LEVEL_MESSAGE, d->conf->node, device, ch->old_holder,
           ch->old_id, "node %s: lease %" G_GUINT64_FORMAT " on %s held by %s ends (%s)",
           d->conf->node, ch->old_id, device, ch->old_holder, vn_lease_end_to_string(ch->end));
    ld->fence.loud = loss;
    g_clear_pointer(&ld->holder_domain, g_free);
    d->leases_lost += loss;
    /* The device is fenced when its lease ends, not when the holder's link
     * goes: a borrower's daemon that restarts (its link flaps) finds its
     * VMs' data paths as they were.  The worker fences on its peer's link
     * going down; the daemon withdraws the paths onto the device itself and
     * lends it again only once the worker says it fenced (or is killed). */
    if (ld->port != NULL) {
        vn_port_set_peer(ld->port, NULL);
        vn_fence_start(d, ld, "lease ended");
    }
    if (ld->revoke_timer != 0) {
        g_source_remove(ld->revoke_timer);
        ld->revoke_timer = 0;
    }
    ld->revoke_deadline = 0;
    ld->revoke_untold = false;
    vn_job_end(&ld->job, VN_JOB_REVOKE);
    if (ld->revoke_reply != NULL) {
        g_autoptr(JsonBuilder) b = json_builder_new();

        json_builder_begin_object(b);
        json_builder_set_member_name(b, "forced");
        json_builder_add_boolean_value(b, ch->end == VN_LEASE_END_REVOKED);
        json_builder_end_object(b);
        vn_control_return(ld->revoke_reply, json_builder_get_root(b));
        ld->revoke_reply = NULL;
    }
    vn_events_emit(d, ch->end == VN_LEASE_END_RETURNED ? "LEASE_RETURNED" : "LEASE_EXPIRED", device,
                   ch->old_id, NULL, NULL);
    /* At once: a third party about to take the device (a reassign) must see
     * it free; a grant not yet announced makes this a no-op. */
    vn_announce_changed(d);
}

/* A lease granted: say so, and announce it soon (coalesced). */
static void lease_granted(VnDaemon *d, VnLocalDevice *ld, const VnLeaseChange *ch)
{
    g_autofree char *device = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);

    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, device, ch->lease->holder, ch->lease->id,
           "node %s: lent %s to %s (lease %" G_GUINT64_FORMAT ")", d->conf->node, ld->conf->name,
           ch->lease->holder, ch->lease->id);
    vn_events_emit(d, "LEASE_GRANTED", device, ch->lease->id, ch->lease->holder, NULL);
    vn_announce_soon(d);
}

void vn_cluster_on_lease(void *opaque, const VnLeaseChange *ch)
{
    VnDaemon *d = opaque;
    VnLocalDevice *ld = ch->lease->opaque;

    /* The lender worker speaks with whoever holds the lease. */
    if (ch->lease->state != VN_LEASE_FREE && ld->port != NULL) {
        vn_port_set_peer(ld->port, ch->lease->holder);
    }
    switch (ch->lease->state) {
    case VN_LEASE_FREE:
        lease_ended(d, ld, ch);
        break;
    case VN_LEASE_GRANTED:
        lease_granted(d, ld, ch);
        break;
    case VN_LEASE_ORPHANED:
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, ld->conf->name, ch->lease->holder, ch->lease->id,
               "node %s: %s's link went down; lease %" G_GUINT64_FORMAT " on %s "
               "expires in %u ms unless it comes back",
               d->conf->node, ch->lease->holder, ch->lease->id, ld->conf->name,
               d->conf->lease_timeout_ms);
        break;
    case VN_LEASE_HELD:
        if (ch->from == VN_LEASE_ORPHANED || ch->from == VN_LEASE_RESTORED) {
            vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, ch->lease->holder,
                   ch->lease->id, "node %s: %s claims lease %" G_GUINT64_FORMAT " on %s again",
                   d->conf->node, ch->lease->holder, ch->lease->id, ld->conf->name);
        }
        break;
    default:
        break;
    }
}

/* A borrow of @ld by @peer, answered with @token: granted, or why not. */
static void borrow(VnDaemon *d, VnLocalDevice *ld, const char *peer, uint64_t token)
{
    g_autofree char *json = NULL;

    if (!vn_leases_grant(d->leases, ld->lease, peer, g_get_monotonic_time())) {
        vn_fabric_reply_errorf(d->fab, token, EBUSY,
                               "%s/%s is lent to %s (lease %" G_GUINT64_FORMAT
                               "); use `ntbctl revoke %s/%s` "
                               "on %s",
                               d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id,
                               d->conf->node, ld->conf->name, d->conf->node);
        return;
    }
    json = vn_peers_lease_to_json(ld->lease->id);
    vn_fabric_reply(d->fab, token, json, NULL, 0);
}

void vn_cluster_request(VnDaemon *d, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;
    const char *name;
    VnPeersRequest rq;
    VnLocalDevice *ld;

    if (msg->type == VN_PEERS_REVOKE || msg->type == VN_PEERS_ANNOUNCE ||
        msg->type >= VN_PEERS_TYPE_LAST) {
        vn_fabric_reply_errorf(d->fab, token, ENOTSUP, "unknown request 0x%x", msg->type);
        return;
    }
    if (!vn_peers_request_from_json(msg->type, msg->json, &rq, &error)) {
        vn_fabric_reply_errorf(d->fab, token, EINVAL, "%s", error->message);
        return;
    }
    name = rq.device;
    ld = vn_devices_local(d, name);
    if (ld == NULL) {
        vn_fabric_reply_errorf(d->fab, token, ENODEV, "%s lends no device \"%s\"", d->conf->node,
                               name);
        return;
    }
    switch (msg->type) {
    case VN_PEERS_P2P_SHARE:
    case VN_PEERS_P2P_ALLOW:
        vn_p2p_request(d, ld, msg, token);
        return;
    case VN_PEERS_BORROW:
        if (!vn_lend_conf_allows(ld->conf, msg->peer)) {
            g_autofree char *acl = g_strjoinv(";", ld->conf->allow);

            vn_fabric_reply_errorf(d->fab, token, EACCES,
                                   "%s/%s may not be borrowed by %s (its access list: %s)",
                                   d->conf->node, name, msg->peer, acl);
            return;
        }
        /* A device being fenced is lent once it is (a moment: see fence.c). */
        if (!ld->fence.active) {
            borrow(d, ld, msg->peer, token);
        } else if (!vn_fence_defer(ld, borrow, msg->peer, token)) {
            vn_fabric_reply_errorf(d->fab, token, EBUSY,
                                   "%s/%s is being fenced, and another borrow waits", d->conf->node,
                                   name);
        }
        return;
    case VN_PEERS_RETURN:
        if (!vn_leases_return(d->leases, ld->lease, msg->peer, rq.lease)) {
            vn_fabric_reply_errorf(d->fab, token, EPERM,
                                   "%s/%s: lease %" G_GUINT64_FORMAT " is not %s's", d->conf->node,
                                   name, rq.lease, msg->peer);
            return;
        }
        vn_fabric_reply(d->fab, token, NULL, NULL, 0);
        return;
    default:
        vn_fabric_reply_errorf(d->fab, token, ENOTSUP, "unknown request 0x%x", msg->type);
    }
}

typedef struct Revoke {
    VnDaemon *d;
    VnLocalDevice *ld;
} Revoke;

static gboolean on_grace_over(gpointer data)
{
    Revoke *rv = data;

    rv->ld->revoke_timer = 0;
    vn_leases_end(rv->d->leases, rv->ld->lease, VN_LEASE_END_REVOKED);
    return G_SOURCE_REMOVE;
}

/* Tell @ld's holder it is being revoked, with @grace_ms left. */
static void tell_revoke(VnDaemon *d, VnLocalDevice *ld, uint32_t grace_ms)
{
    VnPeersRequest rq = { 0 };
    g_autofree char *json = NULL;

    rq.lease = ld->lease->id;
    rq.grace_ms = grace_ms;
    g_strlcpy(rq.device, ld->conf->name, sizeof(rq.device));
    json = vn_peers_request_to_json(VN_PEERS_REVOKE, &rq);
    /* No link to it: told when it announces itself again (tell_untold_revokes()). */
    ld->revoke_untold =
        vn_fabric_event(d->fab, ld->lease->holder, VN_PEERS_REVOKE, json, NULL, 0) < 0;
}

/* The grace period: the lease ends at @deadline (real time, µs), kept in the state file;
 * the device's job is a revoke, for @owner. */
static bool start_revoke(VnDaemon *d, VnLocalDevice *ld, gint64 deadline, const char *owner)
{
    gint64 left_ms = MAX(deadline - g_get_real_time(), 0) / 1000;
    Revoke *rv;

    /* Set before the change: its listener saves the state file. */
    ld->revoke_deadline = deadline;
    if (!vn_leases_revoke(d->leases, ld->lease, g_get_monotonic_time())) {
        ld->revoke_deadline = 0;
        return false;
    }
    vn_job_start(&ld->job, VN_JOB_REVOKE, owner);
    rv = g_new0(Revoke, 1);
    rv->d = d;
    rv->ld = ld;
    ld->revoke_timer = g_timeout_add_full(G_PRIORITY_DEFAULT, (guint)MIN(left_ms, G_MAXUINT),
                                          on_grace_over, rv, g_free);
    /* @rv is the GLib source's now: its destroy notify (g_free) frees it. */
    /* cppcheck-suppress memleak */
    return true;
}

void vn_cluster_revoke(VnDaemon *d, VnLocalDevice *ld, uint32_t grace_ms, const char *owner,
                       VnControlReply *r)
{
    g_autofree char *dev = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);
    g_autoptr(GError) busy = NULL;

    if (vn_job_refuses(&ld->job, VN_JOB_OP_REVOKE, dev, &busy)) {
        vn_control_error(r, VN_ERR_BUSY, "%s; %.1f s of its grace left", busy->message,
                         MAX(ld->revoke_deadline - g_get_real_time(), 0) / 1e6);
        return;
    }
    if (!vn_lease_lent(ld->lease)) {
        vn_control_error(r, VN_ERR_NOTBORROWED, "%s is not lent", dev);
        return;
    }
    if (!start_revoke(d, ld, g_get_real_time() + (gint64)grace_ms * 1000, owner)) {
        vn_control_error(r, VN_ERR_BUSY, "%s/%s cannot be revoked now", d->conf->node,
                         ld->conf->name);
        return;
    }
    ld->revoke_reply = r;
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id,
           "node %s: revoking %s from %s (lease %" G_GUINT64_FORMAT ", grace %u ms)", d->conf->node,
           ld->conf->name, ld->lease->holder, ld->lease->id, grace_ms);
    tell_revoke(d, ld, grace_ms);
}

void vn_cluster_revoke_resume(VnDaemon *d, VnLocalDevice *ld, gint64 deadline)
{
    gint64 left = deadline - g_get_real_time();

    if (!start_revoke(d, ld, deadline, VN_JOB_OWNER_RESTART)) {
        return;
    }
    ld->revoke_untold = true;
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id,
           "node %s: revoking %s from %s goes on after the restart (lease %" G_GUINT64_FORMAT
           ", %.1f s of its grace left)",
           d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id, MAX(left, 0) / 1e6);
}

/* @peer announced itself: a revoke it may not have heard reaches it now -- one resumed after
 * our restart (the one before may have been lost with the old daemon), one sent while its
 * link was down or that went down with it (vn_cluster_link()).  A holder told twice gives
 * the device back once (on_revoke()). */
static void tell_untold_revokes(VnDaemon *d, const char *peer)
{
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (ld->revoke_untold && ld->lease->state == VN_LEASE_REVOKING &&
            g_strcmp0(ld->lease->holder, peer) == 0) {
            tell_revoke(d, ld,
                        (uint32_t)CLAMP((ld->revoke_deadline - g_get_real_time()) / 1000, 0,
                                        VN_DAEMON_MAX_GRACE_MS));
        }
    }
}

void vn_cluster_device_request(void *opaque)
{
    VnLocalDevice *ld = opaque;
    VnDaemon *d = ld->d;

    /* Not at the default level: the worker is a peer, and nothing comes of
     * this but a line. */
    if (!vn_lease_lent(ld->lease)) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, ld->conf->name, NULL, 0,
               "node %s: the host wants %s back (VFIO device request); it is not lent",
               d->conf->node, ld->conf->name);
        return;
    }
    if (ld->revoke_timer != 0) {
        return; /* the kernel asks again every few seconds: one revoke */
    }
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id,
           "node %s: the host wants %s back (VFIO device request: an unbind or a removal "
           "of %s waits); revoking it from %s",
           d->conf->node, ld->conf->name, vn_conf_lend_where(ld->conf), ld->lease->holder);
    vn_cluster_revoke(d, ld, VN_DAEMON_REVOKE_GRACE_MS, VN_JOB_OWNER_KERNEL, NULL);
}

typedef struct Away {
    VnDaemon *d;
    VnBorrowed *b;
} Away;

/* @b's lender is lost (@why): the device with it. */
static void borrowed_lost(VnDaemon *d, VnBorrowed *b, const char *why)
{
    b->lost = true;
    vn_p2p_changed(d); /* the VM's other devices reach it no more */
    vn_devices_note_loss(d, b->device, b->lease, why);
    /* Its worker hears of it now: it answers QEMU that the device is gone. */
    if (b->port != NULL) {
        vn_port_set_peer(b->port, NULL);
    }
    vn_unplug_start(d, b, true, NULL, NULL); /* a dead device is better out of the VM */
    vn_events_emit(d, "DEVICE_LOST", b->device, b->lease, b->lender, NULL);
}

/* The lender did not come back in time: its devices are lost. */
static gboolean on_lender_gone(gpointer data)
{
    Away *aw = data;
    VnBorrowed *b = aw->b;
    g_autofree char *in = in_domain(b, "was");
    g_autofree char *why = g_strdup_printf("its lender %s did not come back in %u ms%s", b->lender,
                                           aw->d->conf->lease_timeout_ms, in);

    b->away_timer = 0;
    borrowed_lost(aw->d, b, why);
    return G_SOURCE_REMOVE;
}

void vn_cluster_paths_lost(VnDaemon *d, const char *peer)
{
    /* Borrowed from @peer: its worker's windows and routes (the VM's RAM, its interrupts) went
     * with the session, and nothing brings them back under a running QEMU. */
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];
        g_autofree char *in = NULL, *why = NULL;

        if (strcmp(b->lender, peer) != 0 || b->lost || b->port == NULL ||
            !vn_port_holds_paths(b->port)) {
            continue;
        }
        in = in_domain(b, "was");
        why = g_strdup_printf("the NTB session with its lender %s ended, and its data path "
                              "with it%s",
                              peer, in);
        if (b->away_timer != 0) {
            g_source_remove(b->away_timer);
            b->away_timer = 0;
        }
        borrowed_lost(d, b, why);
    }
    /* Lent to @peer: its worker's windows onto the holder's RAM and the BAR's window are gone
     * too; the lease ends now (the device is fenced), not when the holder stops claiming it. */
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (vn_lease_lent(ld->lease) && g_strcmp0(ld->lease->holder, peer) == 0 &&
            ld->port != NULL && vn_port_holds_paths(ld->port)) {
            vn_leases_end(d->leases, ld->lease, VN_LEASE_END_PATHS_LOST);
        }
    }
}

void vn_cluster_link(VnDaemon *d, const char *peer, bool up)
{
    /* Only hosts that announced themselves are in the table: the link of
     * a worker (never announced) leaves no trace here. */
    VnRemoteNode *n = g_hash_table_lookup(d->nodes, peer);

    if (n != NULL && !up) {
        n->link_up = false;
        n->down_since_us = g_get_monotonic_time();
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, NULL, peer, 0, "node %s: link to %s down",
               d->conf->node, peer);
    } else if (n != NULL && up && !n->link_up) {
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, NULL, peer, 0,
               "node %s: link to %s up again after %" G_GINT64_FORMAT " ms", d->conf->node, peer,
               (g_get_monotonic_time() - n->down_since_us) / 1000);
    }
    vn_events_emit(d, up ? "LINK_UP" : "LINK_DOWN", NULL, 0, peer, NULL);
    if (up) {
        /* A lender back in time: its announcement keeps or drops what we
         * hold (reconcile_held()); nothing was lost. */
        for (guint i = 0; i < d->borrowed->len; i++) {
            VnBorrowed *b = d->borrowed->pdata[i];

            if (strcmp(b->lender, peer) == 0 && b->away_timer != 0) {
                g_source_remove(b->away_timer);
                b->away_timer = 0;
                vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, peer, b->lease,
                       "node %s: %s is back; %s was not lost", d->conf->node, peer, b->device);
            }
        }
        vn_announce_to(d, peer);
        return;
    }
    /* Lender side: a borrower's daemon went away.  Its VM's device is
     * fenced now (the lender did that on the link going down); the lease
     * waits lease-timeout-ms for the daemon to come back and claim it. */
    vn_leases_link_down(d->leases, peer, g_get_monotonic_time());
    /* A REVOKE on its way may have gone with the link: told again when it is back. */
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (ld->lease->state == VN_LEASE_REVOKING && g_strcmp0(ld->lease->holder, peer) == 0) {
            ld->revoke_untold = true;
        }
    }
    /* Borrower side: a lender's link went.  Its daemon may be restarting
     * (its lender workers keep the devices' data paths): the devices are
     * lost only if it is not back within lease-timeout-ms. */
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];

        if (strcmp(b->lender, peer) == 0 && !b->lost && b->away_timer == 0) {
            Away *aw = g_new0(Away, 1);
            g_autofree char *in = in_domain(b, "is");

            *aw = (Away){ d, b };
            vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, peer, b->lease,
                   "node %s: %s went away; %s is lost unless it is back in %u ms%s", d->conf->node,
                   peer, b->device, d->conf->lease_timeout_ms, in);
            b->unconfirmed = true;
            b->away_timer = g_timeout_add_full(G_PRIORITY_DEFAULT, d->conf->lease_timeout_ms,
                                               on_lender_gone, aw, g_free);
        }
    }
}
