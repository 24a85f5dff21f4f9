/*
 * Daemon to daemon: who is there, what they lend, and leases.
 *
 * Every node announces its lendable devices (state, borrower, lease) and
 * the leases it holds to every linked peer every VN_DAEMON_ANNOUNCE_EVERY
 * beats and on each change; peers are found through the fabric
 * (vn_fabric_discover) every VN_DAEMON_HEARTBEAT_MS.  A lease is granted by
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

#include "daemon-int.h"
#include "common/json.h"
#include "common/name.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <stdarg.h>
#include <string.h>

/* ---- helpers ---- */

/* A peer's message as an object (owned), or NULL. */
static JsonObject *parse(const char *json)
{
    return vn_json_parse_object(json, -1, VN_FABRIC_MAX_PAYLOAD, NULL);
}

static bool uint_member(JsonObject *o, const char *name, uint64_t *out)
{
    JsonNode *n = json_object_get_member(o, name);

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
        json_node_get_int(n) < 0) {
        return false;
    }
    *out = (uint64_t)json_node_get_int(n);
    return true;
}

static void emit(VnDaemon *d, const char *event, const char *device, uint64_t lease,
                 const char *node)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    if (device != NULL) {
        json_builder_set_member_name(b, "device");
        json_builder_add_string_value(b, device);
    }
    if (lease != 0) {
        json_builder_set_member_name(b, "lease");
        json_builder_add_int_value(b, (gint64)lease);
    }
    if (node != NULL) {
        json_builder_set_member_name(b, "node");
        json_builder_add_string_value(b, node);
    }
    json_builder_end_object(b);
    vn_control_event(d->control, event, json_builder_get_root(b));
}

static void save(VnDaemon *d)
{
    vn_state_save_or_report(d);
}

/* ---- announcements ---- */

static char *announcement(VnDaemon *d)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, d->conf->node);
    json_builder_set_member_name(b, "devices");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        bool lent = vn_lease_lent(ld->lease);

        json_builder_begin_object(b);
        json_builder_set_member_name(b, "name");
        json_builder_add_string_value(b, ld->conf->name);
        json_builder_set_member_name(b, "state");
        json_builder_add_string_value(b, lent ? "lent" : "available");
        json_builder_set_member_name(b, "borrower");
        if (lent) {
            json_builder_add_string_value(b, ld->lease->holder);
        } else {
            json_builder_add_null_value(b);
        }
        json_builder_set_member_name(b, "lease");
        if (lent) {
            json_builder_add_int_value(b, (gint64)ld->lease->id);
        } else {
            json_builder_add_null_value(b);
        }
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    /* The leases we hold, so each lender can drop one we no longer claim
     * (returned while it was down, or lost in our restart). */
    json_builder_set_member_name(b, "holds");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *bw = d->borrowed->pdata[i];

        json_builder_begin_object(b);
        json_builder_set_member_name(b, "lender");
        json_builder_add_string_value(b, bw->lender);
        json_builder_set_member_name(b, "name");
        json_builder_add_string_value(b, bw->name);
        json_builder_set_member_name(b, "lease");
        json_builder_add_int_value(b, (gint64)bw->lease);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return json_to_string(root, FALSE);
}

/* An announcement being judged (claims()). */
typedef struct Claims {
    VnDaemon *d;
    JsonObject *o;
} Claims;

/* Does a peer's announcement claim lease @lease on our device @name?  Its
 * holds list was bounded by announcement_valid(). */
static bool claims(void *opaque, const char *name, uint64_t lease)
{
    Claims *c = opaque;
    VnDaemon *d = c->d;
    JsonNode *hn = json_object_get_member(c->o, "holds");
    JsonArray *a;

    if (hn == NULL || !JSON_NODE_HOLDS_ARRAY(hn)) {
        return false;
    }
    a = json_node_get_array(hn);
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonNode *e = json_array_get_element(a, i);
        const char *lender, *n;
        uint64_t l;

        if (!JSON_NODE_HOLDS_OBJECT(e)) {
            continue;
        }
        lender = vn_util_json_string(json_node_get_object(e), "lender");
        n = vn_util_json_string(json_node_get_object(e), "name");
        if (lender != NULL && n != NULL && strcmp(lender, d->conf->node) == 0 &&
            strcmp(n, name) == 0 && uint_member(json_node_get_object(e), "lease", &l) &&
            l == lease) {
            return true;
        }
    }
    return false;
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
    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, (gpointer *)&n)) {
        if (n->link_up && n->devices != NULL) {
            vn_fabric_event(d->fab, n->name, VN_CLUSTER_ANNOUNCE, json, NULL, 0, NULL, 0);
        }
    }
    g_free(d->announced);
    d->announced = json;        /* takes ownership */
}

void vn_cluster_announce(VnDaemon *d)
{
    broadcast(d, announcement(d));
}

void vn_cluster_announce_changed(VnDaemon *d)
{
    g_autofree char *json = announcement(d);

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
    vn_cluster_announce_changed(d);
    return G_SOURCE_REMOVE;
}

void vn_cluster_announce_soon(VnDaemon *d)
{
    if (d->announce_timer == 0) {
        d->announce_timer = g_timeout_add(VN_DAEMON_ANNOUNCE_DELAY_MS, on_announce_due, d);
    }
}

static void announce_to(VnDaemon *d, const char *peer)
{
    g_autofree char *json = announcement(d);

    vn_fabric_event(d->fab, peer, VN_CLUSTER_ANNOUNCE, json, NULL, 0, NULL, 0);
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
            g_info("node %s: forgetting %s (link down %" G_GINT64_FORMAT " s)", d->conf->node,
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
    nodes_forget(d, (gint64)VN_DAEMON_FORGET_NODE_MS * 1000, false);
    /* Changes are announced when they happen; the periodic one only heals
     * what a lost message left behind, so it need not be every beat: with n
     * daemons each one costs n - 1 messages. */
    if (++d->beats % VN_DAEMON_ANNOUNCE_EVERY == 0) {
        vn_cluster_announce(d);
    }
    return G_SOURCE_CONTINUE;
}

void vn_cluster_start(VnDaemon *d)
{
    d->started_us = g_get_monotonic_time();
    on_heartbeat(d);
    d->heartbeat = g_timeout_add(VN_DAEMON_HEARTBEAT_MS, on_heartbeat, d);
}

/* An announcement's devices are kept as sent, after checking their shape:
 * a node reports its own devices only, with bounded names and counts.  Its
 * holds are bounded too: a node holds at most VN_CONF_MAX_DEVICES leases
 * (vn_cluster_borrow), and a longer list is not read in part -- a lease past
 * the part read would look given up. */
static bool announcement_valid(JsonObject *o, const char *peer)
{
    const char *node = vn_util_json_string(o, "node");
    JsonNode *devs = json_object_get_member(o, "devices");
    JsonNode *holds = json_object_get_member(o, "holds");
    JsonArray *a;

    if (node == NULL || strcmp(node, peer) != 0 || devs == NULL || !JSON_NODE_HOLDS_ARRAY(devs)) {
        return false;
    }
    if (holds != NULL && (!JSON_NODE_HOLDS_ARRAY(holds) ||
                          json_array_get_length(json_node_get_array(holds)) >
                          VN_CONF_MAX_DEVICES)) {
        return false;
    }
    a = json_node_get_array(devs);
    if (json_array_get_length(a) > VN_CONF_MAX_DEVICES) {
        return false;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonNode *e = json_array_get_element(a, i);
        const char *name, *state;

        if (!JSON_NODE_HOLDS_OBJECT(e) ||
            !(name = vn_util_json_string(json_node_get_object(e), "name")) ||
            !vn_name_valid(VN_NAME_DEVICE, name) ||
            !(state = vn_util_json_string(json_node_get_object(e), "state")) ||
            (strcmp(state, "lent") != 0 && strcmp(state, "available") != 0)) {
            return false;
        }
    }
    return true;
}

/* Borrower side: a lease the lender no longer shows as ours is gone
 * (expired or revoked while we were away). */
static void reconcile_held(VnDaemon *d, const char *lender, JsonNode *devices)
{
    JsonArray *a = json_node_get_array(devices);

    for (guint i = d->borrowed->len; i > 0; i--) {
        VnBorrowed *b = d->borrowed->pdata[i - 1];
        bool held = false;

        /* Only a lease in doubt is judged (see VnBorrowed.unconfirmed). */
        if (strcmp(b->lender, lender) != 0 || !b->unconfirmed) {
            continue;
        }
        for (guint j = 0; j < json_array_get_length(a); j++) {
            JsonObject *e = json_array_get_object_element(a, j);
            const char *borrower = vn_util_json_string(e, "borrower");
            uint64_t lease = 0;

            if (strcmp(vn_util_json_string(e, "name"), b->name) == 0 && borrower != NULL &&
                strcmp(borrower, d->conf->node) == 0 && uint_member(e, "lease", &lease) &&
                lease == b->lease) {
                held = true;
            }
        }
        if (held) {
            b->unconfirmed = false;
            /* An attached device's worker lost its data path for good (QEMU
             * cannot reconnect): it stays lost until detached. */
            if (b->lost && b->worker_pid <= 0) {
                b->lost = false;
                g_message("node %s: %s is back and still lends us %s", d->conf->node, lender,
                          b->device);
            }
        } else {
            g_message("node %s: %s no longer lends us %s (lease %" G_GUINT64_FORMAT ")",
                      d->conf->node, lender, b->device, b->lease);
            emit(d, "LEASE_EXPIRED", b->device, b->lease, NULL);
            vn_daemon_detach(d, b);
            g_ptr_array_remove_index(d->borrowed, i - 1);
            save(d);
        }
    }
}

void vn_cluster_event(VnDaemon *d, VnFabricMsg *msg)
{
    g_autoptr(JsonObject) o = parse(msg->json);
    VnRemoteNode *n;

    if (o == NULL) {
        g_info("node %s: unreadable event %u from %s", d->conf->node, msg->type, msg->peer);
        return;
    }
    if (msg->type == VN_CLUSTER_ANNOUNCE) {
        Claims c = { .d = d, .o = o };

        if (!announcement_valid(o, msg->peer)) {
            g_info("node %s: bad announcement from %s ignored", d->conf->node, msg->peer);
            return;
        }
        if ((n = node_announced(d, msg->peer)) == NULL) {
            g_info("node %s: announcement from %s ignored: %u hosts are up already",
                   d->conf->node, msg->peer, VN_FABRIC_MAX_PEERS);
            return;
        }
        if (n->devices != NULL) {
            json_node_unref(n->devices);
        }
        n->devices = json_node_copy(json_object_get_member(o, "devices"));
        n->link_up = true;
        vn_leases_announced(d->leases, msg->peer, claims, &c, g_get_monotonic_time());
        reconcile_held(d, msg->peer, json_object_get_member(o, "devices"));
    } else if (msg->type == VN_CLUSTER_REVOKE) {
        g_autofree char *device = NULL;
        const char *name = vn_util_json_string(o, "device");
        uint64_t lease = 0;
        VnBorrowed *b;

        if (!vn_name_valid(VN_NAME_DEVICE, name) ||
            !uint_member(o, "lease", &lease)) {
            return;
        }
        device = g_strdup_printf("%s/%s", msg->peer, name);
        b = vn_daemon_borrowed(d, device);
        if (b == NULL || b->lease != lease) {
            return;   /* not ours: a confused or malicious peer */
        }
        g_message("node %s: %s revokes %s (lease %" G_GUINT64_FORMAT "); giving it back",
                  d->conf->node, msg->peer, device, lease);
        emit(d, "LEASE_REVOKED", device, lease, NULL);
        /* A cooperative borrower: take it out of the VM (the guest's driver
         * releases it cleanly), detach and return, within the grace period. */
        {
            uint64_t grace = 0;

            uint_member(o, "grace_ms", &grace);
            vn_daemon_release(d, b, (unsigned)MIN(grace / 2, VN_DAEMON_MAX_RELEASE_MS));
        }
    }
}

/* ---- leases, lender side ---- */

/* A lease ended: fence, answer a revoke waiting for it, tell everyone. */
static void lease_ended(VnDaemon *d, VnLocalDevice *ld, const VnLeaseChange *ch)
{
    g_autofree char *device = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);

    g_message("node %s: lease %" G_GUINT64_FORMAT " on %s held by %s ends (%s)",
              d->conf->node, ch->old_id, device, ch->old_holder, vn_lease_end_to_string(ch->end));
    /* The lender fences on its own when the borrower's link goes; for a
     * return or a revoke, tell it the borrower is gone now. */
    vn_lender_peer_down(ld->lender, ch->old_holder);
    if (ld->worker != NULL) {
        vn_lender_peer_down(ld->lender, ld->worker);
    }
    g_clear_pointer(&ld->worker, g_free);
    if (ld->revoke_timer != 0) {
        g_source_remove(ld->revoke_timer);
        ld->revoke_timer = 0;
    }
    if (ld->revoke_reply != NULL) {
        g_autoptr(JsonBuilder) b = json_builder_new();

        json_builder_begin_object(b);
        json_builder_set_member_name(b, "forced");
        json_builder_add_boolean_value(b, ch->end == VN_LEASE_END_REVOKED);
        json_builder_end_object(b);
        vn_control_return(ld->revoke_reply, json_builder_get_root(b));
        ld->revoke_reply = NULL;
    }
    emit(d, ch->end == VN_LEASE_END_RETURNED ? "LEASE_RETURNED" : "LEASE_EXPIRED", device,
         ch->old_id, NULL);
    /* At once: a third party about to take the device (a reassign) must see
     * it free; a grant not yet announced makes this a no-op. */
    vn_cluster_announce_changed(d);
}

void vn_cluster_on_lease(void *opaque, const VnLeaseChange *ch)
{
    VnDaemon *d = opaque;
    VnLocalDevice *ld = ch->lease->opaque;

    switch (ch->lease->state) {
    case VN_LEASE_FREE:
        lease_ended(d, ld, ch);
        break;
    case VN_LEASE_GRANTED:
        g_message("node %s: lent %s to %s (lease %" G_GUINT64_FORMAT ")", d->conf->node,
                  ld->conf->name, ch->lease->holder, ch->lease->id);
        vn_cluster_announce_soon(d);
        break;
    case VN_LEASE_ORPHANED:
        g_message("node %s: %s's link went down; lease %" G_GUINT64_FORMAT " on %s "
                  "expires in %u ms unless it comes back", d->conf->node, ch->lease->holder,
                  ch->lease->id, ld->conf->name, d->conf->lease_timeout_ms);
        break;
    case VN_LEASE_HELD:
        if (ch->from == VN_LEASE_ORPHANED || ch->from == VN_LEASE_RESTORED) {
            g_message("node %s: %s claims lease %" G_GUINT64_FORMAT " on %s again",
                      d->conf->node, ch->lease->holder, ch->lease->id, ld->conf->name);
        }
        break;
    default:
        break;
    }
}

static void reply_err(VnDaemon *d, uint64_t token, int err, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static void reply_err(VnDaemon *d, uint64_t token, int err, const char *fmt, ...)
{
    g_autofree char *msg = NULL;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    vn_fabric_reply_error(d->fab, token, err, msg);
}

void vn_cluster_request(VnDaemon *d, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(JsonObject) o = parse(msg->json);
    const char *name = o ? vn_util_json_string(o, "device") : NULL;
    VnLocalDevice *ld = name ? vn_daemon_local(d, name) : NULL;
    g_autofree char *json = NULL;
    uint64_t lease = 0;

    if (name == NULL) {
        reply_err(d, token, EINVAL, "a request needs \"device\"");
        return;
    }
    if (ld == NULL) {
        reply_err(d, token, ENODEV, "%s lends no device \"%.64s\"", d->conf->node, name);
        return;
    }
    switch (msg->type) {
    case VN_CLUSTER_BORROW:
        if (!vn_lend_conf_allows(ld->conf, msg->peer)) {
            g_autofree char *acl = g_strjoinv(";", ld->conf->allow);

            reply_err(d, token, EACCES, "%s/%s may not be borrowed by %s (its access list: %s)",
                      d->conf->node, name, msg->peer, acl);
            return;
        }
        if (!vn_leases_grant(d->leases, ld->lease, msg->peer, g_get_monotonic_time())) {
            reply_err(d, token, EBUSY, "%s/%s is lent to %s (lease %" G_GUINT64_FORMAT
                      "); use `ntbctl revoke %s/%s` on %s", d->conf->node, name,
                      ld->lease->holder, ld->lease->id, d->conf->node, name, d->conf->node);
            return;
        }
        json = g_strdup_printf("{\"lease\":%" G_GUINT64_FORMAT "}", ld->lease->id);
        vn_fabric_reply(d->fab, token, json, NULL, 0, NULL, 0);
        return;
    case VN_CLUSTER_RETURN:
        if (!uint_member(o, "lease", &lease) ||
            !vn_leases_return(d->leases, ld->lease, msg->peer, lease)) {
            reply_err(d, token, EPERM, "%s/%s: lease %" G_GUINT64_FORMAT " is not %s's",
                      d->conf->node, name, lease, msg->peer);
            return;
        }
        vn_fabric_reply(d->fab, token, NULL, NULL, 0, NULL, 0);
        return;
    case VN_CLUSTER_AUTHORIZE: {
        const char *worker = vn_util_json_string(o, "worker");

        if (!uint_member(o, "lease", &lease) || !vn_lease_lent(ld->lease) ||
            strcmp(ld->lease->holder, msg->peer) != 0 || ld->lease->id != lease) {
            reply_err(d, token, EPERM, "%s/%s: lease %" G_GUINT64_FORMAT " is not %s's",
                      d->conf->node, name, lease, msg->peer);
            return;
        }
        if (worker == NULL || !vn_name_valid(VN_NAME_NODE, worker)) {
            reply_err(d, token, EINVAL, "AUTHORIZE needs \"worker\": a node name");
            return;
        }
        /* One worker per lease: a new one replaces (and fences) the old. */
        if (ld->worker != NULL && strcmp(ld->worker, worker) != 0) {
            vn_lender_peer_down(ld->lender, ld->worker);
        }
        g_free(ld->worker);
        ld->worker = g_strdup(worker);
        save(d);
        vn_fabric_reply(d->fab, token, NULL, NULL, 0, NULL, 0);
        return;
    }
    default:
        reply_err(d, token, ENOTSUP, "unknown request %u", msg->type);
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

void vn_cluster_revoke(VnDaemon *d, VnLocalDevice *ld, uint32_t grace_ms, VnControlReply *r)
{
    g_autofree char *json = NULL;
    Revoke *rv;

    if (!vn_lease_lent(ld->lease)) {
        vn_control_error(r, VN_ERR_NOTBORROWED, "%s/%s is not lent", d->conf->node,
                         ld->conf->name);
        return;
    }
    if (!vn_leases_revoke(d->leases, ld->lease, g_get_monotonic_time())) {
        vn_control_error(r, VN_ERR_BUSY, "%s/%s is being revoked already", d->conf->node,
                         ld->conf->name);
        return;
    }
    ld->revoke_reply = r;
    json = g_strdup_printf("{\"device\":\"%s\",\"lease\":%" G_GUINT64_FORMAT
                           ",\"grace_ms\":%u}", ld->conf->name, ld->lease->id, grace_ms);
    g_message("node %s: revoking %s from %s (lease %" G_GUINT64_FORMAT ", grace %u ms)",
              d->conf->node, ld->conf->name, ld->lease->holder, ld->lease->id, grace_ms);
    vn_fabric_event(d->fab, ld->lease->holder, VN_CLUSTER_REVOKE, json, NULL, 0, NULL, 0);
    rv = g_new0(Revoke, 1);
    rv->d = d;
    rv->ld = ld;
    ld->revoke_timer = g_timeout_add_full(G_PRIORITY_DEFAULT, grace_ms, on_grace_over, rv,
                                          g_free);
}

/* ---- leases, borrower side ---- */

/*
 * Borrow and return are asynchronous: a daemon waiting on another daemon
 * must still answer it, or two daemons borrowing from each other at once
 * would each hold the other's request until both time out.
 */
typedef struct Pending {
    VnDaemon *d;
    char *lender;
    char *name;
    uint64_t lease;             /* return: the lease given back */
    VnClusterDone done;
    void *opaque;
} Pending;

static void pending_free(Pending *p)
{
    g_free(p->lender);
    g_free(p->name);
    g_free(p);
}

static const char *klass_of(int err)
{
    switch (-err) {
    case EACCES:
        return VN_ERR_ACCESS;
    case EBUSY:
        return VN_ERR_BUSY;
    case ENODEV:
        return VN_ERR_NODEV;
    case ECONNRESET:
    case ENOTCONN:
    case ETIMEDOUT:
        return VN_ERR_UNREACHABLE;
    default:
        return VN_ERR_GENERIC;
    }
}

static void finish(Pending *p, VnBorrowed *b, const char *klass, const char *msg)
{
    if (p->done != NULL) {
        p->done(p->d, b, klass, msg, p->opaque);
    }
    pending_free(p);
}

static void on_borrow_reply(void *opaque, VnFabricMsg *reply, int err)
{
    Pending *p = opaque;
    VnDaemon *d = p->d;
    g_autofree char *device = g_strdup_printf("%s/%s", p->lender, p->name);
    g_autoptr(JsonObject) o = NULL;
    VnBorrowed *b;
    uint64_t lease;

    if (err < 0) {
        g_autofree char *why = vn_fabric_error_message(reply);

        finish(p, NULL, klass_of(err), why != NULL ? why : g_strerror(-err));
        return;
    }
    o = parse(reply->json);
    if (o == NULL || !uint_member(o, "lease", &lease) || lease == 0) {
        finish(p, NULL, VN_ERR_GENERIC, "the lender answered BORROW with no lease");
        return;
    }
    if (d->borrowed == NULL) {
        finish(p, NULL, VN_ERR_GENERIC, "the daemon is stopping");
        return;
    }
    b = vn_daemon_borrowed(d, device);
    if (b == NULL) {
        b = g_new0(VnBorrowed, 1);
        b->device = g_steal_pointer(&device);
        b->lender = g_strdup(p->lender);
        b->name = g_strdup(p->name);
        g_ptr_array_add(d->borrowed, b);
    }
    b->lease = lease;
    save(d);
    /* Our holds changed: the lender judges its grant by our claim of it. */
    vn_cluster_announce_soon(d);
    finish(p, b, NULL, NULL);
}

void vn_cluster_borrow(VnDaemon *d, const char *lender, const char *name, VnClusterDone done,
                       void *opaque)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *json = g_strdup_printf("{\"device\":\"%s\"}", name);
    Pending *p = g_new0(Pending, 1);
    int ret;

    *p = (Pending){ .d = d, .lender = g_strdup(lender), .name = g_strdup(name), .done = done,
                    .opaque = opaque };
    /* Our announcements list every lease held, and a lender reads at most
     * this many (announcement_valid()). */
    if (d->borrowed->len >= VN_CONF_MAX_DEVICES) {
        g_autofree char *why = g_strdup_printf("%s holds %u devices, the most one node may",
                                               d->conf->node, VN_CONF_MAX_DEVICES);

        finish(p, NULL, VN_ERR_BUSY, why);
        return;
    }
    if (!vn_fabric_connect(d->fab, lender, &error)) {
        finish(p, NULL, VN_ERR_UNREACHABLE, error->message);
        return;
    }
    ret = vn_fabric_request(d->fab, lender, VN_CLUSTER_BORROW, json, NULL, 0, NULL, 0,
                            on_borrow_reply, p);
    if (ret < 0) {
        finish(p, NULL, klass_of(ret), g_strerror(-ret));
    }
}

static void on_return_reply(void *opaque, VnFabricMsg *reply, int err)
{
    Pending *p = opaque;
    g_autofree char *why = err < 0 ? vn_fabric_error_message(reply) : NULL;
    g_autofree char *msg = NULL;

    if (err < 0) {
        msg = g_strdup_printf("returned here, but %s did not acknowledge lease %"
                              G_GUINT64_FORMAT ": %s", p->lender, p->lease,
                              why != NULL ? why : g_strerror(-err));
        g_message("node %s: %s", p->d->conf->node, msg);
    }
    finish(p, NULL, err < 0 ? VN_ERR_GENERIC : NULL, msg);
}

void vn_cluster_return(VnDaemon *d, VnBorrowed *b, VnClusterDone done, void *opaque)
{
    g_autofree char *json = g_strdup_printf("{\"device\":\"%s\",\"lease\":%" G_GUINT64_FORMAT "}",
                                            b->name, b->lease);
    Pending *p = g_new0(Pending, 1);
    /* A lender that went away and came back (b->lost stays set while the
     * worker lives) must hear of it too, or it keeps the lease. */
    bool reachable = vn_fabric_link_up(d->fab, b->lender);
    int ret = 0;

    *p = (Pending){ .d = d, .lender = g_strdup(b->lender), .name = g_strdup(b->name),
                    .lease = b->lease, .done = done, .opaque = opaque };
    vn_daemon_detach(d, b);
    /* Whatever the lender says, the device is not ours any more. */
    g_message("node %s: returned %s (lease %" G_GUINT64_FORMAT ")", d->conf->node, b->device,
              b->lease);
    g_ptr_array_remove(d->borrowed, b);
    save(d);
    /* Should the RETURN not get there, our next announcement, without the
     * lease, ends it at the lender all the same. */
    vn_cluster_announce_soon(d);
    if (reachable) {
        ret = vn_fabric_request(d->fab, p->lender, VN_CLUSTER_RETURN, json, NULL, 0, NULL, 0,
                                on_return_reply, p);
    }
    if (!reachable || ret < 0) {
        on_return_reply(p, NULL, reachable ? ret : 0);
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
    }
    emit(d, up ? "LINK_UP" : "LINK_DOWN", NULL, 0, peer);
    if (up) {
        announce_to(d, peer);
        return;
    }
    /* Lender side: a borrower's daemon went away.  Its VM's device is
     * fenced now (the lender did that on the link going down); the lease
     * waits lease-timeout-ms for the daemon to come back and claim it. */
    vn_leases_link_down(d->leases, peer, g_get_monotonic_time());
    /* Borrower side: a lender died; its devices are lost. */
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];

        if (strcmp(b->lender, peer) == 0 && !b->lost) {
            b->lost = true;   /* its worker sees the same link go and acts */
            b->unconfirmed = true;
            vn_daemon_unplug(d, b);   /* a dead device is better out of the VM */
            emit(d, "DEVICE_LOST", b->device, b->lease, peer);
        }
    }
}
