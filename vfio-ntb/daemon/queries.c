/*
 * vfio-ntbd's query commands (docs/control.md): what the cluster looks like
 * from this node.  None changes anything.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "queries.h"

#include "cluster-borrow.h"
#include "devices.h"
#include "identity.h"
#include "leases.h"
#include "peers.h"
#include "stats.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"
#include "config.h"

#include <string.h>

/* What `ntbctl list` shows of one device besides its lease. */
typedef struct DeviceExtra {
    const char *attached_to; /* the domain it is served to: by this node, or by the
                              * holder of a device we lend (as it announces) */
    gint64 expires_in_ms;    /* its holder is down: the lease ends then; -1 none */
    const VnJob *job;        /* what is being done to it that takes time (jobs.h), or NULL */
} DeviceExtra;

static void add_device(JsonBuilder *b, const char *node, const char *name, const char *state,
                       const char *borrower, uint64_t lease, const VnIdentity *id,
                       const DeviceExtra *x)
{
    g_autofree char *dev = g_strdup_printf("%s/%s", node, name);

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "device");
    json_builder_add_string_value(b, dev);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, node);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, name);
    json_builder_set_member_name(b, "state");
    json_builder_add_string_value(b, state);
    vn_json_add_string_or_null(b, "borrower", borrower);
    json_builder_set_member_name(b, "lease");
    if (lease != 0) {
        json_builder_add_int_value(b, (gint64)lease);
    } else {
        json_builder_add_null_value(b);
    }
    vn_json_add_string_or_null(b, "attached_to", x->attached_to);
    json_builder_set_member_name(b, "expires_in_ms");
    if (x->expires_in_ms >= 0) {
        json_builder_add_int_value(b, x->expires_in_ms);
    } else {
        json_builder_add_null_value(b);
    }
    vn_json_add_string_or_null(b, "job", x->job != NULL ? vn_job_name(x->job) : NULL);
    if (x->job != NULL && x->job->kind != VN_JOB_NONE) {
        json_builder_set_member_name(b, "job_ms");
        json_builder_add_int_value(b, vn_job_ms(x->job));
        json_builder_set_member_name(b, "job_owner");
        json_builder_add_string_value(b, x->job->owner);
    }
    if (id->known) {
        vn_peers_identity_add(b, id);
    }
    json_builder_end_object(b);
}

/* A lease whose holder is away (its link went down, or not back since our
 * restart) ends lease-timeout-ms after that, unless claimed again; one being
 * revoked, when its grace runs out. */
static gint64 expires_in_ms(VnDaemon *d, const VnLocalDevice *ld)
{
    const VnLease *l = ld->lease;
    gint64 left;

    if (l->state == VN_LEASE_REVOKING && ld->revoke_deadline != 0) {
        return MAX(ld->revoke_deadline - g_get_real_time(), 0) / 1000;
    }
    if (l->state != VN_LEASE_ORPHANED && l->state != VN_LEASE_RESTORED) {
        return -1;
    }
    left = l->since_us + (gint64)d->conf->lease_timeout_ms * 1000 - g_get_monotonic_time();
    return MAX(left, 0) / 1000;
}

bool vn_queries_device_known(VnDaemon *d, const char *node, const char *name)
{
    g_autofree char *dev = g_strdup_printf("%s/%s", node, name);
    VnRemoteNode *n;

    if (strcmp(node, d->conf->node) == 0) {
        return vn_devices_local(d, name) != NULL;
    }
    if (vn_devices_borrowed(d, dev) != NULL) {
        return true;
    }
    n = g_hash_table_lookup(d->nodes, node);
    for (unsigned i = 0; n != NULL && n->ann != NULL && i < n->ann->n_devices; i++) {
        if (strcmp(n->ann->devices[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

/* Every device of the cluster as known here: ours, then announced ones.
 * Where an announced device is one we hold, or says we hold it, our own
 * leases win: the lender announces a change a moment after it
 * (VN_DAEMON_ANNOUNCE_DELAY_MS), we learnt it from its reply. */
static void build_devices(VnDaemon *d, JsonBuilder *b, const char *only)
{
    GHashTableIter it;
    VnRemoteNode *n;

    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        g_autofree char *dev = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);

        /* attached_to: on the lender, the VM its holder serves it to. */
        DeviceExtra x = { vn_lease_lent(ld->lease) ? ld->holder_domain : NULL, expires_in_ms(d, ld),
                          &ld->job };

        if (only == NULL || strcmp(only, dev) == 0) {
            add_device(b, d->conf->node, ld->conf->name,
                       vn_lease_lent(ld->lease) ? "lent" : "available", ld->lease->holder,
                       ld->lease->id, &ld->id, &x);
        }
    }
    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, (gpointer *)&n)) {
        for (unsigned i = 0; n->ann != NULL && i < n->ann->n_devices; i++) {
            const VnPeersDevice *pd = &n->ann->devices[i];
            const char *name = pd->name;
            const char *state = pd->lent ? "lent" : "available";
            g_autofree char *dev = g_strdup_printf("%s/%s", n->name, name);
            const char *borrower = pd->lent ? pd->borrower : NULL;
            uint64_t lease = pd->lease;
            VnBorrowed *held = vn_devices_borrowed(d, dev);
            DeviceExtra x = { held != NULL && held->worker_pid > 0 ? held->domain : NULL, -1,
                              held != NULL ? &held->job : vn_cluster_borrowing(d, dev) };

            if (only != NULL && strcmp(only, dev) != 0) {
                continue;
            }
            if (!n->link_up && held != NULL && !held->lost) {
                /* The lender is away, maybe restarting: lost unless it is back in time. */
                gint64 left = n->down_since_us + (gint64)d->conf->lease_timeout_ms * 1000 -
                              g_get_monotonic_time();

                state = "degraded";
                x.expires_in_ms = MAX(left, 0) / 1000;
            } else if (!n->link_up) {
                state = held != NULL ? "lost" : "unreachable";
            } else if (held != NULL) {
                state = held->lost ? "lost" : "lent";
                borrower = d->conf->node;
                lease = held->lease;
            } else if (borrower != NULL && strcmp(borrower, d->conf->node) == 0) {
                state = "available"; /* returned here, not announced yet */
                borrower = NULL;
                lease = 0;
            } else if (pd->denied && !pd->lent) {
                state = "denied"; /* free, but its access list does not name us */
            }
            add_device(b, n->name, name, state, borrower, lease, &pd->id, &x);
        }
    }
}

/* ---- commands ---- */

void vn_queries_version(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "version");
    json_builder_add_string_value(b, VN_VERSION);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, d->conf->node);
    json_builder_set_member_name(b, "run_dir");
    json_builder_add_string_value(b, d->conf->run_dir);
    json_builder_end_object(b);
    vn_control_return(r, json_builder_get_root(b));
}

void vn_queries_nodes(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    GHashTableIter it;
    VnRemoteNode *n;

    json_builder_begin_array(b);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, d->conf->node);
    json_builder_set_member_name(b, "link");
    json_builder_add_string_value(b, "self");
    json_builder_set_member_name(b, "devices");
    json_builder_add_int_value(b, d->local->len);
    json_builder_set_member_name(b, "last_seen_ms");
    json_builder_add_null_value(b);
    json_builder_set_member_name(b, "version");
    json_builder_add_string_value(b, VN_VERSION);
    json_builder_end_object(b);
    g_hash_table_iter_init(&it, d->nodes);
    while (g_hash_table_iter_next(&it, NULL, (gpointer *)&n)) {

        json_builder_begin_object(b);
        json_builder_set_member_name(b, "node");
        json_builder_add_string_value(b, n->name);
        json_builder_set_member_name(b, "link");
        json_builder_add_string_value(b, n->link_up ? "up" : "down");
        json_builder_set_member_name(b, "devices");
        json_builder_add_int_value(b, n->ann->n_devices);
        json_builder_set_member_name(b, "last_seen_ms");
        json_builder_add_int_value(b, (g_get_monotonic_time() - n->seen_us) / 1000);
        vn_json_add_string_or_null(b, "version",
                                   n->ann->version[0] != '\0' ? n->ann->version : NULL);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    vn_control_return(r, json_builder_get_root(b));
}

void vn_queries_devices(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_array(b);
    build_devices(d, b, NULL);
    json_builder_end_array(b);
    vn_control_return(r, json_builder_get_root(b));
}

typedef struct DeviceQuery {
    VnControlReply *r;
    JsonNode *device; /* the answer, but for what its worker says */
} DeviceQuery;

static void device_ready(VnDaemon *d, JsonNode *root, void *opaque)
{
    DeviceQuery *dq = opaque;
    g_autoptr(JsonNode) stats = root;
    JsonObject *o = json_node_get_object(dq->device);
    JsonObject *so = stats != NULL ? json_node_get_object(stats) : NULL;
    JsonArray *lent = so != NULL ? json_object_get_array_member(so, "lent") : NULL;
    JsonNode *first =
        lent != NULL && json_array_get_length(lent) > 0 ? json_array_get_element(lent, 0) : NULL;
    JsonObject *st =
        first != NULL && JSON_NODE_HOLDS_OBJECT(first) ? json_node_get_object(first) : NULL;
    const char *server = st != NULL ? vn_util_json_string(st, "device_server") : NULL;

    json_object_set_string_member(o, "device_server",
                                  server != NULL ? server
                                                 : "unknown (its lender worker does not answer)");
    json_object_set_string_member(o, "last_stall",
                                  st != NULL ? vn_util_json_string(st, "last_stall") : NULL);
    json_object_set_string_member(
        o, "device_server_loss", st != NULL ? vn_util_json_string(st, "device_server_loss") : NULL);
    vn_control_return(dq->r, dq->device);
    g_free(dq);
}

void vn_queries_device(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autofree char *node = NULL, *name = NULL, *dev = NULL;
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) arr = NULL;
    JsonArray *found;
    JsonObject *o;
    VnLocalDevice *ld;
    VnBorrowed *bw;
    DeviceQuery *dq;

    if (!vn_control_arg_device(a, r, &node, &name)) {
        return;
    }
    dev = g_strdup_printf("%s/%s", node, name);
    json_builder_begin_array(b);
    build_devices(d, b, dev);
    json_builder_end_array(b);
    arr = json_builder_get_root(b);
    found = json_node_get_array(arr);
    if (json_array_get_length(found) == 0) {
        vn_control_error(r, VN_ERR_NODEV, "no device %s in the cluster (see `ntbctl list`)", dev);
        return;
    }
    o = json_array_get_object_element(found, 0);
    ld = strcmp(node, d->conf->node) == 0 ? vn_devices_local(d, name) : NULL;
    if (ld != NULL) {
        JsonArray *allow = json_array_new();

        for (char **s = ld->conf->allow; *s != NULL; s++) {
            json_array_add_string_element(allow, *s);
        }
        json_object_set_array_member(o, "allow", allow);
    }
    bw = vn_devices_borrowed(d, dev);
    if (bw != NULL) {
        json_object_set_string_member(o, "attached_to", bw->worker_pid > 0 ? bw->domain : NULL);
        json_object_set_string_member(o, "socket", bw->socket);
        json_object_set_string_member(o, "qdev_id", bw->worker_pid > 0 ? bw->qdev_id : NULL);
        json_object_set_boolean_member(o, "lost", bw->lost);
        json_object_set_boolean_member(o, "device_server_lost", bw->server_down);
        /* Workers that took over a dead one's QEMU since this daemon started. */
        json_object_set_int_member(o, "worker_replacements", (gint64)bw->takeovers);
    }
    if (g_hash_table_contains(d->losses, dev)) {
        json_object_set_string_member(o, "last_loss", g_hash_table_lookup(d->losses, dev));
    }
    if (ld == NULL) {
        vn_control_return(r, json_node_copy(json_array_get_element(found, 0)));
        return;
    }
    /* What its lender worker says of its device server, asked without
     * waiting. */
    dq = g_new0(DeviceQuery, 1);
    dq->r = r;
    dq->device = json_node_copy(json_array_get_element(found, 0));
    if (!vn_stats_gather(d, dev, device_ready, dq)) {
        device_ready(d, NULL, dq);
    }
}

static void stats_ready(VnDaemon *d, JsonNode *root, void *opaque)
{
    vn_control_return(opaque, root);
}

void vn_queries_stats(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    const char *only = vn_util_json_string(a, "device");
    g_autofree char *node = NULL, *name = NULL;

    if (json_object_has_member(a, "device")) {
        if (!vn_control_arg_device(a, r, &node, &name)) {
            return;
        }
        /* Counters live where a device is lent or borrowed: anything else
         * would answer an empty table, and a typo would look like idleness. */
        if (!(strcmp(node, d->conf->node) == 0 ? vn_devices_local(d, name) != NULL
                                               : vn_devices_borrowed(d, only) != NULL)) {
            if (vn_queries_device_known(d, node, name)) {
                vn_control_error(r, VN_ERR_NOTBORROWED,
                                 "%s neither lends nor borrows %s: its counters are on the node "
                                 "that does",
                                 d->conf->node, only);
            } else {
                vn_control_error(r, VN_ERR_NODEV, "no device %s in the cluster (see `ntbctl list`)",
                                 only);
            }
            return;
        }
    }
    if (!vn_stats_gather(d, only, stats_ready, r)) {
        vn_control_error(r, VN_ERR_BUSY, "%d counter queries are under way already",
                         VN_STATS_MAX_GATHERS);
    }
}
