/*
 * vfio-ntbd's persisted state read back at start (state.c writes it): the
 * devices lent at run time and those a lease keeps lent, the leases (in
 * doubt until their holders claim them again), the revokes under way, the
 * workers to adopt, the losses.  Each entry is checked before it is used:
 * one that does not pass is skipped; a file that is no state file is
 * refused whole.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "state-load.h"

#include "cluster.h"
#include "conf.h"
#include "devices-lend.h"
#include "devices.h"
#include "leases.h"
#include "state.h"
#include "workers.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"

#include <gio/gio.h>
#include <string.h>

/* A state file is small; a large one is not ours. */
#define VN_STATE_MAX_SIZE (1024 * 1024)

static bool get_lease(JsonObject *o, uint64_t *lease)
{
    JsonNode *n = json_object_get_member(o, "lease");

    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
        json_node_get_int(n) <= 0) {
        return false;
    }
    *lease = (uint64_t)json_node_get_int(n);
    return true;
}

/* The daemon talks to what the state file names: only a socket directly in
 * its own run directory. */
static bool in_run_dir(VnDaemon *d, const char *path)
{
    g_autofree char *dir = g_path_get_dirname(path);
    g_autofree char *base = g_path_get_basename(path);

    return d->conf->run_dir != NULL && strcmp(dir, d->conf->run_dir) == 0 &&
           vn_name_valid(VN_NAME_SOCKET, base);
}

/* A device server's generation (devserver.c) as saved: a number that fits, or left as is. */
static void get_generation(JsonObject *o, uint32_t *gen, bool *known)
{
    uint64_t v;

    if (vn_util_json_counter(o, "server_generation", false, &v) && v <= G_MAXUINT32) {
        *gen = (uint32_t)v;
        if (known != NULL) {
            *known = true;
        }
    }
}

/* A worker that served this device before our restart: adopt it if it is
 * still the process we started. */
static void restore_worker(VnDaemon *d, VnBorrowed *b, JsonNode *wn)
{
    JsonObject *w;
    JsonNode *pid;
    const char *name, *socket, *domain, *stats, *port, *qmp, *qdev_id;

    if (wn == NULL || !JSON_NODE_HOLDS_OBJECT(wn)) {
        return;
    }
    w = json_node_get_object(wn);
    pid = json_object_get_member(w, "pid");
    name = vn_util_json_string(w, "name");
    port = vn_util_json_string(w, "port");
    socket = vn_util_json_string(w, "socket");
    domain = vn_util_json_string(w, "domain");
    stats = vn_util_json_string(w, "channel");
    qmp = vn_util_json_string(w, "qmp");
    qdev_id = vn_util_json_string(w, "qdev_id");
    if (pid == NULL || !JSON_NODE_HOLDS_VALUE(pid) ||
        json_node_get_value_type(pid) != G_TYPE_INT64 || json_node_get_int(pid) <= 1 ||
        json_node_get_int(pid) > G_MAXINT || name == NULL || !vn_name_valid(VN_NAME_NODE, name) ||
        socket == NULL || socket[0] != '/' || !vn_name_valid(VN_NAME_DOMAIN, domain) ||
        stats == NULL || !in_run_dir(d, stats) || port == NULL || !in_run_dir(d, port)) {
        return;
    }
    b->worker_pid = (GPid)json_node_get_int(pid);
    b->worker_name = g_strdup(name);
    b->port_path = g_strdup(port);
    b->socket = g_strdup(socket);
    b->domain = g_strdup(domain);
    b->channel_path = g_strdup(stats);
    if (qmp != NULL && qmp[0] == '/' && strlen(qmp) <= VN_CONF_MAX_SOCKET_PATH && qdev_id != NULL &&
        vn_name_valid(VN_NAME_QDEV_ID, qdev_id)) {
        b->qmp = g_strdup(qmp);
        b->qdev_id = g_strdup(qdev_id);
    }
    if (!d->workers->adopt(d, b, vn_util_json_string(w, "port_secret"))) {
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker that served %s is gone", d->conf->node, b->device);
        g_clear_pointer(&b->domain, g_free);
    }
}

/* Lend a device again from what the state file says of it: one lent at run
 * time (@runtime), or one the config had until this start (kept for its
 * lease).  NULL, said in the log, when it cannot be. */
static VnLocalDevice *lend_again(VnDaemon *d, JsonObject *e, bool runtime)
{
    g_autoptr(GPtrArray) allow = g_ptr_array_new();
    g_autoptr(GError) local = NULL;
    const char *name = vn_util_json_string(e, "name");
    const char *socket = vn_util_json_string(e, "socket");
    const char *pci = vn_util_json_string(e, "pci");
    JsonNode *an = json_object_get_member(e, "allow");
    VnLocalDevice *ld;
    VnLendConf *lc;

    if (name == NULL || (socket == NULL && pci == NULL) || vn_devices_local(d, name) != NULL ||
        an == NULL || !JSON_NODE_HOLDS_ARRAY(an) || d->local->len >= VN_CONF_MAX_DEVICES) {
        return NULL;
    }
    /* One more than a list may have: vn_conf_lend_new() refuses it whole. */
    for (guint j = 0; j < json_array_get_length(json_node_get_array(an)) && j <= VN_CONF_MAX_ALLOW;
         j++) {
        JsonNode *x = json_array_get_element(json_node_get_array(an), j);

        if (JSON_NODE_HOLDS_VALUE(x) && json_node_get_value_type(x) == G_TYPE_STRING) {
            g_ptr_array_add(allow, (gpointer)json_node_get_string(x));
        }
    }
    g_ptr_array_add(allow, NULL);
    lc = vn_conf_lend_new(name, socket, pci, (const char *const *)allow->pdata, &local);
    if (lc == NULL) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, name, NULL, 0,
               "node %s: state file: %s not lent again: %s", d->conf->node, name, local->message);
        return NULL;
    }
    lc->managed = pci != NULL && vn_util_json_bool(e, "managed");
    lc->runtime = runtime;
    lc->leaving = !runtime;
    g_ptr_array_add(d->conf->lends, lc);
    ld = vn_devices_lend(d, lc, &local);
    if (ld == NULL) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, name, NULL, 0,
               "node %s: state file: %s not lent again: %s", d->conf->node, name, local->message);
        g_ptr_array_remove(d->conf->lends, lc);
    }
    return ld;
}

bool vn_state_load(VnDaemon *d, GError **error)
{
    g_autofree char *path = vn_state_path(d);
    g_autofree char *text = NULL;
    g_autoptr(JsonObject) o = NULL;
    g_autoptr(GError) why = NULL;
    JsonNode *n;
    gsize len;

    if (!g_file_test(path, G_FILE_TEST_EXISTS)) {
        return true;
    }
    if (!g_file_get_contents(path, &text, &len, error)) {
        return false;
    }
    o = vn_json_parse_object(text, (gssize)len, VN_STATE_MAX_SIZE, &why);
    if (o == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: not a vfio-ntbd state file (%s); move it away to start afresh", path,
                    why->message);
        return false;
    }
    n = json_object_get_member(o, "next_lease");
    if (n != NULL && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_INT64 &&
        json_node_get_int(n) > 0) {
        vn_leases_set_last_id(d->leases, (uint64_t)json_node_get_int(n));
    }
    n = json_object_get_member(o, "lendable");
    for (guint i = 0;
         n && JSON_NODE_HOLDS_ARRAY(n) && i < json_array_get_length(json_node_get_array(n)); i++) {
        JsonNode *e = json_array_get_element(json_node_get_array(n), i);

        if (JSON_NODE_HOLDS_OBJECT(e)) {
            lend_again(d, json_node_get_object(e), true);
        }
    }
    n = json_object_get_member(o, "lent");
    for (guint i = 0;
         n && JSON_NODE_HOLDS_ARRAY(n) && i < json_array_get_length(json_node_get_array(n)); i++) {
        JsonNode *e = json_array_get_element(json_node_get_array(n), i);
        const char *name, *borrower;
        VnLocalDevice *ld;
        uint64_t lease, deadline;

        if (!JSON_NODE_HOLDS_OBJECT(e) ||
            !(name = vn_util_json_string(json_node_get_object(e), "name")) ||
            !(borrower = vn_util_json_string(json_node_get_object(e), "borrower")) ||
            !vn_name_valid(VN_NAME_NODE, borrower) || !get_lease(json_node_get_object(e), &lease)) {
            continue;
        }
        /* Gone from the config while lent: lent on, as a reload leaves it,
         * until the lease ends (devices.c then unlends it). */
        ld = vn_devices_local(d, name);
        if (ld == NULL && (ld = lend_again(d, json_node_get_object(e), false)) != NULL) {
            vn_log(
                G_LOG_LEVEL_WARNING, d->conf->node, name, borrower, lease,
                "node %s: %s is no longer in the config, but %s holds it (lease %" G_GUINT64_FORMAT
                "): it stays lent until the lease ends (revoke it to end it now), then is "
                "unlent",
                d->conf->node, name, borrower, lease);
        }
        if (ld == NULL) {
            continue; /* not lendable again: its lease is void */
        }
        /* In doubt until its borrower's daemon claims it again. */
        if (!vn_leases_restore(d->leases, ld->lease, borrower, lease, g_get_monotonic_time())) {
            continue; /* listed twice */
        }
        get_generation(json_node_get_object(e), &ld->server_gen, NULL);
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, name, borrower, lease,
               "node %s: lease %" G_GUINT64_FORMAT " on %s held by %s restored", d->conf->node,
               lease, name, borrower);
        if (vn_util_json_counter(json_node_get_object(e), "revoke_deadline_us", false, &deadline) &&
            deadline > 0 && deadline <= G_MAXINT64) {
            /* Never later than a grace can be from now (the file may be old or wrong). */
            vn_cluster_revoke_resume(
                d, ld,
                MIN((gint64)deadline, g_get_real_time() + (gint64)VN_DAEMON_MAX_GRACE_MS * 1000));
        }
    }
    n = json_object_get_member(o, "lender_workers");
    for (guint i = 0;
         n && JSON_NODE_HOLDS_ARRAY(n) && i < json_array_get_length(json_node_get_array(n)); i++) {
        JsonNode *e = json_array_get_element(json_node_get_array(n), i);
        JsonObject *w = JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL;
        JsonNode *pid = w != NULL ? json_object_get_member(w, "pid") : NULL;
        const char *name = w != NULL ? vn_util_json_string(w, "name") : NULL;
        VnLocalDevice *ld = name != NULL ? vn_devices_local(d, name) : NULL;

        if (ld == NULL || ld->worker_pid > 0 || pid == NULL || !JSON_NODE_HOLDS_VALUE(pid) ||
            json_node_get_value_type(pid) != G_TYPE_INT64 || json_node_get_int(pid) <= 1 ||
            json_node_get_int(pid) > G_MAXINT) {
            continue;
        }
        ld->worker_pid = (GPid)json_node_get_int(pid);
        get_generation(w, &ld->worker_server_gen, NULL);
        if (!d->workers->lend_adopt(d, ld, vn_util_json_string(w, "port_secret"))) {
            vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, name, NULL, 0,
                   "node %s: the lender worker of %s is gone", d->conf->node, name);
        }
    }
    n = json_object_get_member(o, "losses");
    if (n != NULL && JSON_NODE_HOLDS_OBJECT(n)) {
        g_autoptr(GList) names = json_object_get_members(json_node_get_object(n));

        for (GList *l = names; l != NULL; l = l->next) {
            const char *line = vn_util_json_string(json_node_get_object(n), l->data);

            if (line != NULL && strlen(l->data) <= VN_MAX_NODE_NAME + 1 + VN_MAX_DEVICE_NAME &&
                strlen(line) <= VN_DEVICES_MAX_LOSS_LINE &&
                g_hash_table_size(d->losses) < VN_DEVICES_MAX_LOSSES) {
                g_hash_table_insert(d->losses, g_strdup(l->data), g_strdup(line));
            }
        }
    }
    n = json_object_get_member(o, "borrowed");
    for (guint i = 0;
         n && JSON_NODE_HOLDS_ARRAY(n) && i < json_array_get_length(json_node_get_array(n)); i++) {
        JsonNode *e = json_array_get_element(json_node_get_array(n), i);
        const char *lender, *name;
        VnBorrowed *b;
        uint64_t lease;

        if (!JSON_NODE_HOLDS_OBJECT(e) ||
            !(lender = vn_util_json_string(json_node_get_object(e), "lender")) ||
            !(name = vn_util_json_string(json_node_get_object(e), "name")) ||
            !vn_name_valid(VN_NAME_NODE, lender) || !vn_name_valid(VN_NAME_DEVICE, name) ||
            !get_lease(json_node_get_object(e), &lease)) {
            continue;
        }
        b = g_new0(VnBorrowed, 1);
        b->lender = g_strdup(lender);
        b->name = g_strdup(name);
        b->device = g_strdup_printf("%s/%s", lender, name);
        b->lease = lease;
        b->unconfirmed = true;
        vn_irq_mode_from_string(vn_util_json_string(json_node_get_object(e), "irq_mode"),
                                &b->irq_mode);
        get_generation(json_node_get_object(e), &b->server_gen, &b->server_gen_known);
        b->p2p = vn_util_json_bool(json_node_get_object(e), "p2p");
        g_ptr_array_add(d->borrowed, b);
        restore_worker(d, b, json_object_get_member(json_node_get_object(e), "worker"));
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, lender, lease,
               "node %s: holds %s (lease %" G_GUINT64_FORMAT ")", d->conf->node, b->device, lease);
    }
    return true;
}
