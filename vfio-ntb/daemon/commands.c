/*
 * vfio-ntbd's control commands (docs/control.md).  Each checks its
 * arguments before it changes anything.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "commands.h"

#include "announce.h"
#include "cluster-borrow.h"
#include "cluster.h"
#include "conf.h"
#include "daemon.h"
#include "devices-lend.h"
#include "devices.h"
#include "ending.h"
#include "events.h"
#include "leases.h"
#include "queries.h"
#include "spawn-procs.h"
#include "state.h"
#include "tracing.h"
#include "unplug.h"
#include "workers.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"
#include "config.h"

#include <gio/gio.h>
#include <string.h>

/* ---- commands ---- */

/* "since": the timestamp of the last event a client saw, in microseconds
 * (seconds * 1000000 + microseconds): what came after it and is still kept
 * is sent first (ntbctl events --follow, back after a restart). */
static void cmd_subscribe(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    JsonNode *since = json_object_get_member(a, "since");

    if (since != NULL &&
        (!JSON_NODE_HOLDS_VALUE(since) || json_node_get_value_type(since) != G_TYPE_INT64 ||
         json_node_get_int(since) < 0)) {
        vn_control_error(r, VN_ERR_PARAM,
                         "subscribe-events: \"since\" must be a time in microseconds");
        return;
    }
    vn_control_subscribe(r, since != NULL ? json_node_get_int(since) : 0);
}

/* Actions answer "changed": false when there was nothing to do, so that a
 * script (or Ansible) can tell. */
/* When @job does not let @op through @dev: @r's DeviceBusy names the job (jobs.h); true. */
static bool refuse_busy(const VnJob *job, VnJobOp op, const char *dev, VnControlReply *r)
{
    g_autoptr(GError) busy = NULL;

    if (!vn_job_refuses(job, op, dev, &busy)) {
        return false;
    }
    vn_control_error(r, VN_ERR_BUSY, "%s", busy->message);
    return true;
}

static void return_changed(VnControlReply *r, bool changed)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "changed");
    json_builder_add_boolean_value(b, changed);
    json_builder_end_object(b);
    vn_control_return(r, json_builder_get_root(b));
}

static void return_lease(VnControlReply *r, const char *device, uint64_t lease, const char *socket,
                         bool changed)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "changed");
    json_builder_add_boolean_value(b, changed);
    json_builder_set_member_name(b, "device");
    json_builder_add_string_value(b, device);
    json_builder_set_member_name(b, "lease");
    json_builder_add_int_value(b, (gint64)lease);
    if (socket != NULL) {
        json_builder_set_member_name(b, "socket");
        json_builder_add_string_value(b, socket);
    }
    json_builder_end_object(b);
    vn_control_return(r, json_builder_get_root(b));
}

static void borrowed_reply(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                           void *opaque)
{
    VnControlReply *r = opaque;

    if (b == NULL) {
        vn_control_error(r, klass, "%s", msg);
        return;
    }
    return_lease(r, b->device, b->lease, NULL, true);
}

/* Is @node/@name one we can borrow?  Answers @r when not. */
static bool borrowable(VnDaemon *d, const char *node, const char *name, VnControlReply *r)
{
    if (strcmp(node, d->conf->node) == 0) {
        vn_control_error(r, VN_ERR_PARAM,
                         "%s/%s is this node's own device: give it to a VM "
                         "directly, there is nothing to borrow",
                         node, name);
        return false;
    }
    return true;
}

static void cmd_borrow(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autofree char *node = NULL, *name = NULL, *dev = NULL;
    VnBorrowed *b;

    if (!vn_control_arg_device(a, r, &node, &name) || !borrowable(d, node, name, r)) {
        return;
    }
    dev = g_strdup_printf("%s/%s", node, name);
    b = vn_devices_borrowed(d, dev);
    if (b != NULL) {
        return_lease(r, b->device, b->lease, NULL, false);
        return;
    }
    vn_cluster_borrow(d, node, name, VN_JOB_OWNER_CONTROL, borrowed_reply, r);
}

static void returned_reply(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                           void *opaque)
{
    if (klass != NULL) {
        vn_control_error(opaque, klass, "%s", msg);
    } else {
        return_changed(opaque, true);
    }
}

/* The "device" argument, a device some node lends: what this node holds of
 * it in @held (NULL: nothing); false once an error answers @r (a typo is
 * DeviceNotFound, not "nothing to do"). */
static bool arg_known_device(VnDaemon *d, JsonObject *a, VnControlReply *r, VnBorrowed **held)
{
    g_autofree char *node = NULL, *name = NULL, *dev = NULL;

    if (!vn_control_arg_device(a, r, &node, &name)) {
        return false;
    }
    dev = g_strdup_printf("%s/%s", node, name);
    *held = vn_devices_borrowed(d, dev);
    if (*held == NULL && !vn_queries_device_known(d, node, name)) {
        vn_control_error(r, VN_ERR_NODEV, "no device %s in the cluster (see `ntbctl list`)", dev);
        return false;
    }
    return true;
}

static void cmd_return(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    VnBorrowed *b;

    if (!arg_known_device(d, a, r, &b)) {
        return;
    }
    if (b == NULL) {
        return_changed(r, false); /* returned already, or never borrowed here */
        return;
    }
    vn_cluster_return(d, b, returned_reply, r);
}

static void cmd_revoke(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autofree char *node = NULL, *name = NULL;
    JsonNode *gn = json_object_get_member(a, "grace-ms");
    uint32_t grace = VN_DAEMON_REVOKE_GRACE_MS;
    VnLocalDevice *ld;

    if (!vn_control_arg_device(a, r, &node, &name)) {
        return;
    }
    if (gn != NULL) {
        if (!JSON_NODE_HOLDS_VALUE(gn) || json_node_get_value_type(gn) != G_TYPE_INT64 ||
            json_node_get_int(gn) < 0 || json_node_get_int(gn) > VN_DAEMON_MAX_GRACE_MS) {
            vn_control_error(r, VN_ERR_PARAM, "\"grace-ms\" must be 0..%d", VN_DAEMON_MAX_GRACE_MS);
            return;
        }
        grace = (uint32_t)json_node_get_int(gn);
    }
    if (strcmp(node, d->conf->node) != 0) {
        vn_control_error(r, VN_ERR_PARAM,
                         "only the lending node revokes: run `ntbctl revoke "
                         "%s/%s` on %s",
                         node, name, node);
        return;
    }
    ld = vn_devices_local(d, name);
    if (ld == NULL) {
        vn_control_error(r, VN_ERR_NODEV, "%s lends no device %s", node, name);
        return;
    }
    vn_cluster_revoke(d, ld, grace, VN_JOB_OWNER_CONTROL, r);
}

typedef struct Attach {
    VnControlReply *r;
    char *domain;
    char *qmp;
    char *qdev_id;
    char *socket; /* NULL: the default name in run-dir */
    bool has_irq_mode;
    VnIrqMode irq_mode;
    bool p2p;
} Attach;

static void attach_free(Attach *at)
{
    g_free(at->socket);
    g_free(at->domain);
    g_free(at->qmp);
    g_free(at->qdev_id);
    g_free(at);
}

/* The worker serves the device, or could not. */
static void attach_started(VnDaemon *d, VnBorrowed *b, const GError *error, void *opaque)
{
    Attach *at = opaque;

    if (error != NULL) {
        if (b != NULL) {
            vn_job_end(&b->job, VN_JOB_ATTACH);
            g_clear_pointer(&b->domain, g_free);
        }
        vn_control_error(at->r, VN_ERR_GENERIC, "%s", error->message);
    } else {
        vn_job_end(&b->job, VN_JOB_ATTACH);
        g_free(b->qmp);
        b->qmp = g_strdup(at->qmp);
        g_free(b->qdev_id);
        b->qdev_id = g_strdup(at->qdev_id);
        vn_state_save_or_report(d);
        vn_events_emit(d, "ATTACHED", b->device, b->lease, NULL, b->domain);
        vn_announce_soon(d); /* the lender shows the domain */
        return_lease(at->r, b->device, b->lease, b->socket, true);
    }
    attach_free(at);
}

/* A repeated attach must ask for what is in place: keeping the old options
 * silently would leave a VM unplugged on revoke through a QMP socket the
 * caller thinks was replaced. */
static bool same_options(const VnBorrowed *b, const Attach *at)
{
    return g_strcmp0(b->qmp, at->qmp) == 0 && g_strcmp0(b->qdev_id, at->qdev_id) == 0 &&
           (!at->has_irq_mode || at->irq_mode == b->irq_mode) && at->p2p == b->p2p;
}

/* The device is borrowed: serve it to the domain (a worker process). */
static void attach_borrowed(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                            void *opaque)
{
    Attach *at = opaque;

    if (b == NULL) {
        vn_control_error(at->r, klass, "%s", msg);
    } else if (refuse_busy(&b->job, VN_JOB_OP_ATTACH, b->device, at->r)) {
        /* refused, naming the job */
    } else if (b->lost) {
        vn_control_error(at->r, VN_ERR_UNREACHABLE,
                         "%s's lender went away and its data path "
                         "with it; detach and return it, then borrow it again",
                         b->device);
    } else if (b->worker_pid > 0 && strcmp(b->domain, at->domain) != 0) {
        vn_control_error(at->r, VN_ERR_BUSY, "%s is attached to %s; detach it first", b->device,
                         b->domain);
    } else if (b->worker_pid > 0 && at->socket != NULL && strcmp(at->socket, b->socket) != 0) {
        vn_control_error(at->r, VN_ERR_BUSY, "%s is attached to %s on %s; detach it first",
                         b->device, b->domain, b->socket);
    } else if (b->worker_pid > 0 && !same_options(b, at)) {
        vn_control_error(at->r, VN_ERR_BUSY,
                         "%s is attached to %s with other options (qmp %s, qdev-id %s, irq-mode "
                         "%s, p2p %s); detach it first to change them",
                         b->device, b->domain, b->qmp ? b->qmp : "none",
                         b->qdev_id ? b->qdev_id : "none", vn_irq_mode_to_string(b->irq_mode),
                         b->p2p ? "yes" : "no");
    } else if (b->worker_pid > 0) {
        return_lease(at->r, b->device, b->lease, b->socket, false);
    } else {
        g_free(b->socket);
        b->socket = at->socket != NULL ? g_strdup(at->socket)
                                       : g_strdup_printf("%s/%s-%s-%s.sock", d->conf->run_dir,
                                                         at->domain, b->lender, b->name);
        if (at->has_irq_mode) {
            b->irq_mode = at->irq_mode;
        }
        b->p2p = at->p2p;
        g_free(b->domain);
        b->domain = g_strdup(at->domain);
        vn_job_start(&b->job, VN_JOB_ATTACH, VN_JOB_OWNER_CONTROL);
        d->workers->start(d, b, attach_started, at); /* answers and frees @at */
        return;
    }
    attach_free(at);
}

/*
 * An attach may name its socket (the libvirt hook takes it from the domain's
 * XML): a file directly in run-dir, so that a domain definition cannot make
 * the daemon create sockets anywhere else.
 */
static bool socket_arg_ok(VnDaemon *d, const char *socket, const VnBorrowed *served)
{
    size_t dl = strlen(d->conf->run_dir);

    if (strlen(socket) > VN_CONF_MAX_SOCKET_PATH || strncmp(socket, d->conf->run_dir, dl) != 0 ||
        socket[dl] != '/') {
        return false;
    }
    /* It must be new, unless it is the one this device is served on already
     * (the hook's reconnect attaches again; attach_borrowed answers it). */
    return vn_name_valid(VN_NAME_SOCKET, socket + dl + 1) &&
           (!g_file_test(socket, G_FILE_TEST_EXISTS) ||
            (served != NULL && served->worker_pid > 0 && g_strcmp0(served->socket, socket) == 0));
}

static void cmd_attach(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autofree char *node = NULL, *name = NULL, *dev = NULL;
    const char *domain = vn_util_json_string(a, "domain");
    const char *qmp = vn_util_json_string(a, "qmp");
    const char *qdev_id = vn_util_json_string(a, "qdev-id");
    const char *socket = vn_util_json_string(a, "socket");
    const char *mode = vn_util_json_string(a, "irq-mode");
    VnIrqMode irq_mode = VN_IRQ_MODE_FD;
    Attach *at;
    VnBorrowed *b;

    if (!vn_control_arg_device(a, r, &node, &name)) {
        return;
    }
    if (domain == NULL || !vn_name_valid(VN_NAME_DOMAIN, domain)) {
        vn_control_error(r, VN_ERR_PARAM, "\"domain\" (the VM's name: %s) is required",
                         vn_name_rule(VN_NAME_DOMAIN));
        return;
    }
    if (json_object_has_member(a, "qmp") && (qmp == NULL || qmp[0] != '/')) {
        vn_control_error(r, VN_ERR_PARAM, "\"qmp\" must be an absolute socket path");
        return;
    }
    if ((qmp != NULL && qdev_id == NULL) ||
        (qdev_id != NULL && !vn_name_valid(VN_NAME_QDEV_ID, qdev_id))) {
        vn_control_error(r, VN_ERR_PARAM,
                         "\"qmp\" needs \"qdev-id\" (the device's id in the "
                         "VM: %s)",
                         vn_name_rule(VN_NAME_QDEV_ID));
        return;
    }
    dev = g_strdup_printf("%s/%s", node, name);
    b = vn_devices_borrowed(d, dev);
    if (json_object_has_member(a, "socket") && (socket == NULL || !socket_arg_ok(d, socket, b))) {
        vn_control_error(r, VN_ERR_PARAM,
                         "\"socket\" must be a new file NAME.sock directly in "
                         "%s (NAME: [A-Za-z0-9_.-])",
                         d->conf->run_dir);
        return;
    }
    if (json_object_has_member(a, "irq-mode") &&
        (mode == NULL || !vn_irq_mode_from_string(mode, &irq_mode))) {
        vn_control_error(r, VN_ERR_PARAM, "\"irq-mode\" is \"fd\" or \"relay\"");
        return;
    }
    if (json_object_has_member(a, "p2p") &&
        (!JSON_NODE_HOLDS_VALUE(json_object_get_member(a, "p2p")) ||
         json_node_get_value_type(json_object_get_member(a, "p2p")) != G_TYPE_BOOLEAN)) {
        vn_control_error(r, VN_ERR_PARAM, "\"p2p\" is true or false");
        return;
    }
    if (!borrowable(d, node, name, r)) {
        return;
    }
    at = g_new0(Attach, 1);
    *at = (Attach){ .r = r,
                    .domain = g_strdup(domain),
                    .qmp = g_strdup(qmp),
                    .qdev_id = g_strdup(qdev_id),
                    .socket = g_strdup(socket),
                    .has_irq_mode = mode != NULL,
                    .irq_mode = irq_mode,
                    .p2p = vn_util_json_bool(a, "p2p") };
    if (b != NULL) {
        attach_borrowed(d, b, NULL, NULL, at);
    } else {
        vn_cluster_borrow(d, node, name, VN_JOB_OWNER_CONTROL, attach_borrowed, at);
    }
}

/* The "device" argument, which must be attached here (its worker runs); NULL
 * once an error is set on @r. */
static VnBorrowed *arg_attached(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autofree char *node = NULL, *name = NULL, *dev = NULL;
    VnBorrowed *b;

    if (!vn_control_arg_device(a, r, &node, &name)) {
        return NULL;
    }
    dev = g_strdup_printf("%s/%s", node, name);
    b = vn_devices_borrowed(d, dev);
    if (b == NULL || b->worker_pid <= 0) {
        vn_control_error(r, VN_ERR_NOTBORROWED, "%s is not attached on %s", dev, d->conf->node);
        return NULL;
    }
    return b;
}

static void cmd_detach(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    VnBorrowed *b;

    if (!arg_known_device(d, a, r, &b)) {
        return;
    }
    if (b == NULL || b->worker_pid <= 0) {
        return_changed(r, false); /* detached already */
        return;
    }
    vn_devices_detach(d, b);
    /* At once: a restart must not find the stopped worker to adopt. */
    vn_state_save_or_report(d);
    return_changed(r, true);
}

/* Ask the VM to release the device through the device-request interrupt; does
 * not wait.  "requested": false when its QEMU takes no device requests (stock
 * QEMU): the caller unplugs it through QMP then (libvirt owns the monitor). */
static void unplug_asked(VnDaemon *d, const char *device, uint64_t lease, bool asked, bool stopping,
                         void *opaque)
{
    g_autoptr(JsonBuilder) jb = json_builder_new();

    if (stopping) {
        vn_control_error(opaque, VN_ERR_GENERIC, "the daemon is stopping");
        return;
    }
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "requested");
    json_builder_add_boolean_value(jb, asked);
    json_builder_end_object(jb);
    vn_control_return(opaque, json_builder_get_root(jb));
}

static void cmd_unplug(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    VnBorrowed *b = arg_attached(d, a, r);

    if (b != NULL && refuse_busy(&b->job, VN_JOB_OP_UNPLUG, b->device, r)) {
        return;
    }
    if (b != NULL && !vn_unplug_start(d, b, false, unplug_asked, r)) {
        vn_control_error(r, VN_ERR_BUSY,
                         "%d VMs are being asked to let go already; "
                         "ask again in a moment",
                         VN_UNPLUG_MAX);
    }
}

static void cmd_lend(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    const char *name = vn_util_json_string(a, "name");
    const char *socket = vn_util_json_string(a, "socket");
    const char *pci = vn_util_json_string(a, "pci");
    JsonNode *an = json_object_get_member(a, "allow");
    JsonNode *mn = json_object_get_member(a, "managed");
    g_autoptr(GPtrArray) allow = g_ptr_array_new();
    g_autoptr(GError) error = NULL;
    VnLocalDevice *ld;
    VnLendConf *lc;

    if (name == NULL || (socket == NULL && pci == NULL) || an == NULL) {
        vn_control_error(r, VN_ERR_PARAM,
                         "lend needs \"name\", \"socket\" (the device "
                         "server's) or \"pci\" (a function of this host), and \"allow\" "
                         "(node names, or [\"*\"])");
        return;
    }
    if (!JSON_NODE_HOLDS_ARRAY(an) || json_array_get_length(json_node_get_array(an)) > 256) {
        vn_control_error(r, VN_ERR_PARAM, "\"allow\" must be an array of node names");
        return;
    }
    for (guint i = 0; i < json_array_get_length(json_node_get_array(an)); i++) {
        JsonNode *e = json_array_get_element(json_node_get_array(an), i);

        if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_STRING) {
            vn_control_error(r, VN_ERR_PARAM, "\"allow\" must be an array of node names");
            return;
        }
        g_ptr_array_add(allow, (gpointer)json_node_get_string(e));
    }
    g_ptr_array_add(allow, NULL);
    if (vn_devices_local(d, name) != NULL) {
        vn_control_error(r, VN_ERR_BUSY, "%s/%s is lendable already", d->conf->node, name);
        return;
    }
    /* Its last worker would share the new one's port. */
    if (vn_ending_busy(d, name)) {
        vn_control_error(r, VN_ERR_BUSY,
                         "the last lender worker of %s/%s is still stopping "
                         "(at most %d s); lend it again then",
                         d->conf->node, name, (VN_SPAWN_STOP_TIMEOUT_MS + 999) / 1000);
        return;
    }
    if (d->local->len >= VN_CONF_MAX_DEVICES) {
        vn_control_error(r, VN_ERR_PARAM, "this node lends %d devices already",
                         VN_CONF_MAX_DEVICES);
        return;
    }
    if (mn != NULL &&
        (!JSON_NODE_HOLDS_VALUE(mn) || json_node_get_value_type(mn) != G_TYPE_BOOLEAN ||
         (json_node_get_boolean(mn) && pci == NULL))) {
        vn_control_error(r, VN_ERR_PARAM,
                         "\"managed\" is true or false, and true only "
                         "with \"pci\"");
        return;
    }
    lc = vn_conf_lend_new(name, socket, pci, (const char *const *)allow->pdata, &error);
    if (lc == NULL) {
        vn_control_error(r, VN_ERR_PARAM, "lend: %s", error->message);
        return;
    }
    lc->managed = mn != NULL && json_node_get_boolean(mn);
    g_ptr_array_add(d->conf->lends, lc);
    ld = vn_devices_lend(d, lc, &error);
    if (ld == NULL) {
        g_ptr_array_remove(d->conf->lends, lc);
        vn_control_error(r, VN_ERR_GENERIC, "%s", error->message);
        return;
    }
    if (!d->workers->lend_start(d, ld, &error)) {
        vn_devices_unlend(d, ld);
        vn_control_error(r, VN_ERR_GENERIC, "%s", error->message);
        return;
    }
    vn_state_save_or_report(d);
    vn_announce(d);
    return_changed(r, true);
}

static void cmd_unlend(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    const char *name = vn_util_json_string(a, "name");
    VnLocalDevice *ld = name ? vn_devices_local(d, name) : NULL;
    g_autofree char *dev = NULL;

    if (name == NULL) {
        vn_control_error(r, VN_ERR_PARAM, "unlend needs \"name\"");
        return;
    }
    if (ld == NULL) {
        vn_control_error(r, VN_ERR_NODEV, "%s lends no device %.64s", d->conf->node, name);
        return;
    }
    dev = g_strdup_printf("%s/%s", d->conf->node, name);
    if (refuse_busy(&ld->job, VN_JOB_OP_UNLEND, dev, r)) {
        return;
    }
    if (vn_lease_lent(ld->lease)) {
        vn_control_error(r, VN_ERR_BUSY,
                         "%s/%s is lent to %s (lease %" G_GUINT64_FORMAT "); revoke it first",
                         d->conf->node, name, ld->lease->holder, ld->lease->id);
        return;
    }
    vn_devices_unlend(d, ld);
    vn_state_save_or_report(d);
    vn_announce(d);
    return_changed(r, true);
}

/* reload: the config file read again, as SIGHUP does, answered once it is
 * applied (or refused: then nothing changed), so that `systemctl reload`
 * (vfio-ntbd --reload) fails when the daemon refuses the file and returns
 * only when what it changed has been done. */
static void cmd_reload(VnDaemon *d, JsonObject *a, VnControlReply *r)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *summary = NULL;
    g_autoptr(JsonBuilder) b = NULL;

    if (d->reload == NULL) {
        vn_control_error(r, VN_ERR_GENERIC, "this daemon was started without a config file");
        return;
    }
    if (!d->reload(d->reload_data, &summary, &error)) {
        vn_control_error(r, VN_ERR_PARAM, "reload refused, nothing changed: %s", error->message);
        return;
    }
    b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "summary");
    json_builder_add_string_value(b, summary);
    json_builder_end_object(b);
    vn_control_return(r, json_builder_get_root(b));
}

typedef struct Command {
    const char *name;
    VnCommandFn fn;
    const char *const args[8];
} Command;

static const Command commands[] = {
    { "query-version", vn_queries_version, { NULL } },
    { "query-nodes", vn_queries_nodes, { NULL } },
    { "query-devices", vn_queries_devices, { NULL } },
    { "query-device", vn_queries_device, { "device", NULL } },
    { "query-stats", vn_queries_stats, { "device", NULL } },
    { "borrow", cmd_borrow, { "device", NULL } },
    { "return", cmd_return, { "device", NULL } },
    { "revoke", cmd_revoke, { "device", "grace-ms", NULL } },
    { "attach",
      cmd_attach,
      { "device", "domain", "qmp", "qdev-id", "socket", "irq-mode", "p2p", NULL } },
    { "detach", cmd_detach, { "device", NULL } },
    { "unplug", cmd_unplug, { "device", NULL } },
    { "lend", cmd_lend, { "name", "socket", "pci", "managed", "allow", NULL } },
    { "unlend", cmd_unlend, { "name", NULL } },
    { "reload", cmd_reload, { NULL } },
    { "subscribe-events", cmd_subscribe, { "since", NULL } },
    { "trace", vn_daemon_cmd_trace, { "patterns", NULL } },
    { "query-trace", vn_daemon_cmd_query_trace, { NULL } },
};

VnCommandFn vn_commands_lookup(const char *name, const char *const **allowed)
{
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++) {
        if (strcmp(commands[i].name, name) == 0) {
            *allowed = commands[i].args;
            return commands[i].fn;
        }
    }
    return NULL;
}
