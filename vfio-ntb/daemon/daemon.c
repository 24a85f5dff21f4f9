/*
 * The daemon core: a VnDaemon owns the fabric node, the lent devices and
 * their leases, the borrowed devices, the control socket and the timers, and
 * routes fabric events to its parts (cluster.c, leases.c, the lenders).
 * vfio-ntbd.c is main() around it; the unit tests run daemons in-process.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "daemon.h"

#include "cluster-borrow.h"
#include "cluster.h"
#include "commands.h"
#include "control.h"
#include "devices-lend.h"
#include "devices.h"
#include "ending.h"
#include "events.h"
#include "metrics.h"
#include "port.h"
#include "spawn.h"
#include "state-load.h"
#include "state.h"
#include "stats.h"
#include "unplug.h"
#include "workers.h"

#include "common/name.h"
#include "common/util.h"
#include "config.h"
#include "fabric/host.h"

#include <errno.h>
#include <glib-unix.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Static borrows retry this often until their lender is up. */
#define VN_DAEMON_BORROW_RETRY_MS 200
#define VN_DAEMON_BORROW_WARN_EVERY 25

/* ---- fabric events ---- */

static void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    VnDaemon *d = opaque;
    char name[VN_MAX_DEVICE_NAME + 1];
    g_autoptr(GError) error = NULL;
    VnLocalDevice *ld;

    if (msg->type >= VN_PEERS_ANNOUNCE) {
        vn_cluster_request(d, msg, token);
        return;
    }
    if (!vn_proto_device_name(msg->json, name, &error)) {
        vn_fabric_reply_error(d->fab, token, EINVAL, error->message);
        return;
    }
    ld = vn_devices_local(d, name);
    if (ld == NULL) {
        g_autofree char *why =
            g_strdup_printf("node %s lends no device \"%s\"", d->conf->node, name);

        vn_fabric_reply_error(d->fab, token, ENODEV, why);
        return;
    }
    /* Only the lease holder's node (whichever of its workers speaks)
     * reaches the device. */
    if (!vn_lease_lent(ld->lease) || strcmp(ld->lease->holder, msg->peer) != 0) {
        g_autofree char *why = g_strdup_printf("%s/%s: %s holds no lease on it; borrow it "
                                               "first",
                                               d->conf->node, name, msg->peer);

        vn_fabric_reply_error(d->fab, token, EACCES, why);
        return;
    }
    /* Its worker answers; queued at the port while it (re)starts. */
    if (ld->port == NULL || !vn_port_request(ld->port, msg, token)) {
        vn_fabric_reply_error(d->fab, token, EAGAIN, "the device's lender worker is not up");
    }
}

static void on_event(void *opaque, VnFabricMsg *msg)
{
    vn_cluster_event(opaque, msg);
}

static void on_link(void *opaque, const char *peer, bool up)
{
    VnDaemon *d = opaque;

    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, NULL, peer, 0, "node %s: link to %s %s",
           d->conf->node, peer, up ? "up" : "down");
    /* A device lent to @peer stays as it is until its lease ends (see
     * leases.h: an orphaned lease waits lease-timeout for its holder); one
     * borrowed from @peer until the lender is given up for lost
     * (cluster.c).  Workers hear of it then, not of the flap. */
    vn_cluster_link(d, peer, up);
}

/* The doorbell bits of this host are its workers'. */
static void on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    VnDaemon *d = opaque;

    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];

        if (b->port != NULL && vn_port_doorbell(b->port, peer, bit)) {
            return;
        }
    }
    vn_log(G_LOG_LEVEL_INFO, d->conf->node, NULL, peer, 0,
           "node %s: doorbell %u from %s is no worker's", d->conf->node, bit, peer);
}

static void on_paths_lost(void *opaque, const char *peer)
{
    vn_cluster_paths_lost(opaque, peer);
}

static const VnFabricHandlers handlers = {
    .on_link = on_link,
    .on_request = on_request,
    .on_event = on_event,
    .on_doorbell = on_doorbell,
    .on_paths_lost = on_paths_lost,
};

/* ---- borrows named in the config file ---- */

struct VnDaemonStatic {
    VnDaemon *d;
    guint src;
    unsigned tries;
    unsigned pending; /* borrows in flight */
};

static void static_started(VnDaemon *d, VnBorrowed *b, const GError *error, void *opaque)
{
    VnDaemonStatic *st = d->statics;

    if (b != NULL) {
        vn_job_end(&b->job, VN_JOB_ATTACH);
    }
    if (error == NULL) {
        vn_state_save_or_report(d);
        return;
    }
    if (b != NULL) {
        g_clear_pointer(&b->domain, g_free);
    }
    if (st == NULL || st->tries % VN_DAEMON_BORROW_WARN_EVERY == 0) {
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b != NULL ? b->device : NULL, NULL, 0,
               "node %s: serving %s: %s (retrying)", d->conf->node,
               b != NULL ? b->device : "a borrowed device", error->message);
    }
}

static void static_attach(VnDaemon *d, VnBorrowed *b, VnBorrowConf *bc, unsigned tries)
{
    if (b->starting) {
        return; /* its start has not called back yet */
    }
    b->irq_mode = bc->irq_mode;
    g_free(b->socket);
    b->socket = g_strdup(bc->socket);
    g_free(b->domain);
    b->domain = g_strdup(bc->domain);
    b->p2p = bc->p2p;
    vn_job_start(&b->job, VN_JOB_ATTACH, VN_JOB_OWNER_CONFIG);
    d->workers->start(d, b, static_started, NULL);
}

typedef struct StaticBorrow {
    VnDaemonStatic *st;
    VnBorrowConf *bc;
} StaticBorrow;

static void static_borrowed(VnDaemon *d, VnBorrowed *b, const char *klass, const char *msg,
                            void *opaque)
{
    StaticBorrow *sb = opaque;

    sb->st->pending--;
    if (b == NULL) {
        if (sb->st->tries % VN_DAEMON_BORROW_WARN_EVERY == 0) {
            vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, NULL, sb->bc->lender, 0,
                   "node %s: borrow %s/%s: %s (retrying)", d->conf->node, sb->bc->lender,
                   sb->bc->device, msg);
        }
    } else if (d->borrowed != NULL) {
        static_attach(d, b, sb->bc, sb->st->tries);
    }
    g_free(sb);
}

/* Borrow and serve what the config names; true once everything is served. */
static bool static_borrows(VnDaemonStatic *st)
{
    VnDaemon *d = st->d;
    bool all = true;

    for (guint i = 0; i < d->conf->borrows->len; i++) {
        VnBorrowConf *bc = d->conf->borrows->pdata[i];
        g_autofree char *dev = g_strdup_printf("%s/%s", bc->lender, bc->device);
        VnBorrowed *b = vn_devices_borrowed(d, dev);

        if (b != NULL && b->worker_pid > 0) {
            continue;
        }
        all = false;
        if (b != NULL) {
            static_attach(d, b, bc, st->tries);
        } else if (st->pending == 0) {
            StaticBorrow *sb = g_new0(StaticBorrow, 1);

            *sb = (StaticBorrow){ .st = st, .bc = bc };
            st->pending++;
            vn_cluster_borrow(d, bc->lender, bc->device, VN_JOB_OWNER_CONFIG, static_borrowed, sb);
        }
    }
    return all;
}

static gboolean on_static_retry(gpointer data)
{
    VnDaemonStatic *st = data;

    st->tries++;
    if (static_borrows(st)) {
        st->src = 0;
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

/* ---- counters to a file (SIGUSR1) ---- */

static void stats_file_ready(VnDaemon *d, JsonNode *root, void *opaque)
{
    g_autoptr(JsonNode) owned = root;
    g_autoptr(GError) error = NULL;
    g_autoptr(GDateTime) now = g_date_time_new_now_utc();
    g_autofree char *stamp = g_date_time_format_iso8601(now);
    g_autofree char *text = NULL;

    /* When these counters were read: a file left by a daemon that stopped
     * long ago looks like any other. */
    json_object_set_string_member(json_node_get_object(root), "timestamp", stamp);
    text = json_to_string(root, TRUE);
    if (!vn_util_write_snapshot(d->conf->stats_file, text, &error)) {
        g_warning("node %s: stats file: %s", d->conf->node, error->message);
    }
}

void vn_daemon_write_stats(VnDaemon *d)
{
    if (d->conf->stats_file != NULL && !vn_stats_gather(d, NULL, stats_file_ready, NULL)) {
        g_message("node %s: stats file not written: %d counter queries are under way",
                  d->conf->node, VN_STATS_MAX_GATHERS);
    }
}

static void remote_free(gpointer p)
{
    VnRemoteNode *n = p;

    if (n->ann != NULL) {
        g_free(n->ann);
    }
    g_free(n->name);
    g_free(n);
}

static gboolean on_adopt_end(gpointer data)
{
    VnDaemon *d = data;

    d->adopt_timer = 0;
    vn_fabric_adopt_end(d->fab);
    return G_SOURCE_REMOVE;
}

/* Workers of our predecessor's that we adopted (they serve on). */
static unsigned adopted_workers(VnDaemon *d)
{
    unsigned n = 0;

    for (guint i = 0; i < d->local->len; i++) {
        n += ((VnLocalDevice *)d->local->pdata[i])->worker_pid > 0;
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        n += ((VnBorrowed *)d->borrowed->pdata[i])->worker_pid > 0;
    }
    return n;
}

static bool daemon_start(VnDaemon *d, GError **error)
{
    unsigned adopted;

    /* Before anything else: a second daemon on a live one's control socket
     * must not join the fabric under its name, nor take the socket over. */
    if (!vn_control_path_free(d->conf->control_socket, error)) {
        return false;
    }
    d->local = g_ptr_array_new_with_free_func(vn_devices_local_free);
    d->borrowed = g_ptr_array_new_with_free_func((GDestroyNotify)vn_devices_borrowed_free);
    d->endings = vn_endings_new();
    d->gathers = vn_stats_gathers_new();
    d->unplugs = vn_unplugs_new();
    d->borrowing = g_ptr_array_new();
    d->nodes = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, remote_free);
    d->losses = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    d->leases = vn_leases_new(d->conf->lease_timeout_ms);
    /* Listeners before anything can change a lease: the cluster's (fence,
     * answer revokes, announce, events), then the store. */
    vn_leases_listen(d->leases, vn_cluster_on_lease, d);
    vn_leases_listen(d->leases, vn_state_on_lease, d);
    vn_leases_listen(d->leases, vn_devices_on_lease, d);
    d->fab = vn_fabric_open(d->conf->fabric, d->conf->node, d->conf->fabric_params, &handlers, d,
                            NULL, error);
    if (d->fab == NULL) {
        return false;
    }
    /* A physical function with sriov-vfs is lent as its VFs, which join
     * the list behind the config's own sections. */
    for (guint i = 0, n = d->conf->lends->len; i < n; i++) {
        VnLendConf *lc = d->conf->lends->pdata[i];

        if (lc->sriov_vfs > 0 ? !vn_devices_lend_vfs(d, lc, error)
                              : vn_devices_lend(d, lc, error) == NULL) {
            return false;
        }
    }
    if (!vn_state_load(d, error)) {
        return false;
    }
    adopted = adopted_workers(d);
    if (d->workers->stop_strays != NULL) {
        d->workers->stop_strays(d);
    }
    /* Every lent device's backend runs in its worker: the adopted ones
     * serve on, the others start now. */
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];
        g_autoptr(GError) local = NULL;

        if (ld->worker_pid == 0 && !d->workers->lend_start(d, ld, &local)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "lending %s: %s", ld->conf->name,
                        local->message);
            return false;
        }
    }
    vn_state_save_or_report(d);
    /* What our predecessor exported for its workers and the fabric kept for us is theirs
     * again as they reconnect and claim it; once they all could, the rest is withdrawn (at
     * once when no worker of its runs on: a daemon with no state, or all of them gone). */
    if (adopted == 0) {
        vn_fabric_adopt_end(d->fab);
    } else {
        d->adopt_timer = g_timeout_add(VN_HOST_RECONNECT_MS, on_adopt_end, d);
    }
    d->control = vn_control_new(d, d->conf->control_socket, vn_commands_lookup, error);
    if (d->control == NULL) {
        return false;
    }
    /* Said in the log as the state file was read; an event now that there
     * is a control socket to carry it (and keep it for late subscribers). */
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (ld->conf->leaving && vn_lease_lent(ld->lease)) {
            vn_events_emit(d, "DEVICE_KEPT", ld->conf->name, ld->lease->id, ld->lease->holder,
                           NULL);
        }
    }
    return true;
}

static void daemon_stop(VnDaemon *d)
{
    vn_metrics_stop(d); /* its last file, while the devices are there to list */
    if (d->adopt_timer != 0) {
        g_source_remove(d->adopt_timer);
    }
    if (d->heartbeat != 0) {
        g_source_remove(d->heartbeat);
    }
    if (d->announce_timer != 0) {
        g_source_remove(d->announce_timer);
    }
    g_clear_pointer(&d->announced, g_free);
    /* Every worker serves on and reconnects to our successor's port: what it exported and
     * mapped stays as it is (on an NTB adapter, kept for the next daemon), not withdrawn as
     * at a worker's end. */
    for (guint i = 0; d->borrowed != NULL && i < d->borrowed->len; i++) {
        vn_port_leave(g_steal_pointer(&((VnBorrowed *)d->borrowed->pdata[i])->port));
    }
    for (guint i = 0; d->local != NULL && i < d->local->len; i++) {
        vn_port_leave(g_steal_pointer(&((VnLocalDevice *)d->local->pdata[i])->port));
    }
    /* Borrower workers keep serving their VMs; a restarted daemon adopts
     * them (`ntbctl detach` stops one). */
    g_clear_pointer(&d->borrowed, g_ptr_array_unref);
    g_clear_pointer(&d->endings, vn_endings_free);
    g_clear_pointer(&d->spare, vn_spare_free); /* it exits */
    vn_stats_gathers_free(d);
    vn_unplugs_free(d);
    g_clear_pointer(&d->control, vn_control_free);
    g_clear_pointer(&d->local, g_ptr_array_unref);
    g_clear_pointer(&d->leases, vn_leases_free);
    g_clear_pointer(&d->fab, vn_fabric_close); /* answers the borrows under way */
    g_clear_pointer(&d->borrowing, g_ptr_array_unref);
    g_clear_pointer(&d->nodes, g_hash_table_unref);
    g_clear_pointer(&d->losses, g_hash_table_unref);
}

/* The first directory above and at @dir (an absolute path) that @uid/@gid may not pass
 * through, or NULL. */
static char *reachable(const char *dir, uid_t uid, gid_t gid)
{
    g_autofree char *path = g_strdup(dir);

    for (;;) {
        struct stat st;
        char *slash;

        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
            !(st.st_uid == uid   ? st.st_mode & S_IXUSR
              : st.st_gid == gid ? st.st_mode & S_IXGRP
                                 : st.st_mode & S_IXOTH)) {
            return g_steal_pointer(&path);
        }
        slash = strrchr(path, '/');
        if (slash == NULL || slash == path) {
            return NULL;
        }
        *slash = '\0';
    }
}

/* The unit's drop-ins for hardware (systemd/dropins/, installed by make install and the
 * package). */
#define VN_UNIT_DROPINDIR VN_PREFIX "/share/vfio-ntb/systemd"

/* What the config lends through VFIO needs /dev/vfio and, managed, a writable /sys: under
 * the shipped unit's hardening both are hidden unless its drop-ins are installed.  Said
 * at start, not at the first attach. */
static void warn_hidden_hardware(VnDaemon *d)
{
    bool vfio = false, sysfs = false;

    for (guint i = 0; i < d->conf->lends->len; i++) {
        const VnLendConf *l = d->conf->lends->pdata[i];

        vfio |= l->pci != NULL;
        sysfs |= l->managed || l->sriov_vfs > 0;
    }
    if (vfio && access("/dev/vfio/vfio", R_OK | W_OK) < 0) {
        g_warning("node %s: it lends PCI functions through VFIO, but /dev/vfio/vfio cannot be "
                  "opened (%s): under systemd, install the unit's drop-in %s/vfio.conf",
                  d->conf->node, g_strerror(errno), VN_UNIT_DROPINDIR);
    }
    if (sysfs && access("/sys/bus/pci/drivers_probe", W_OK) < 0) {
        g_warning("node %s: it binds functions to vfio-pci itself (managed, sriov-vfs), but "
                  "/sys/bus/pci cannot be written (%s): under systemd, install the unit's "
                  "drop-in %s/managed.conf",
                  d->conf->node, g_strerror(errno), VN_UNIT_DROPINDIR);
    }
}

VnDaemon *vn_daemon_new(VnConfig *conf, const VnWorkerOps *workers, GError **error)
{
    VnDaemon *d = g_new0(VnDaemon, 1);

    d->conf = conf;
    d->workers = workers != NULL ? workers : &vn_spawn_ops;
    if (!vn_worker_ops_valid(d->workers, error)) {
        vn_daemon_free(d);
        return NULL;
    }
    d->loop = g_main_loop_new(NULL, FALSE);
    if (!daemon_start(d, error)) {
        vn_daemon_free(d);
        return NULL;
    }
    vn_cluster_start(d);
    d->statics = g_new0(VnDaemonStatic, 1);
    d->statics->d = d;
    if (d->conf->borrows->len > 0) {
        d->statics->src = g_timeout_add(VN_DAEMON_BORROW_RETRY_MS, on_static_retry, d->statics);
    }
    vn_metrics_start(d);
    g_message("node %s: up on fabric %s, control socket %s", d->conf->node, d->conf->fabric,
              d->conf->control_socket);
    warn_hidden_hardware(d);
    if (d->conf->worker_user != NULL) {
        g_autofree char *shut =
            reachable(d->conf->run_dir, d->conf->worker_uid, d->conf->worker_gid);

        g_message("node %s: borrower workers serve as %s (uid %u), in their sandbox", d->conf->node,
                  d->conf->worker_user, (unsigned)d->conf->worker_uid);
        if (shut != NULL) {
            g_warning("node %s: user %s cannot pass through %s on the way to run-dir %s: its "
                      "workers cannot dial their ports again after this daemon restarts",
                      d->conf->node, d->conf->worker_user, shut, d->conf->run_dir);
        }
    } else if (geteuid() == 0) {
        g_warning("node %s: borrower workers serve as root (in their seccomp sandbox): no user "
                  "%s on this host; create it, or name another with [node] worker-user",
                  d->conf->node, VN_CONF_WORKER_USER);
    }
    return d;
}

void vn_daemon_run(VnDaemon *d)
{
    g_main_loop_run(d->loop);
}

void vn_daemon_quit(VnDaemon *d)
{
    g_message("node %s: stopping", d->conf->node);
    g_main_loop_quit(d->loop);
}

void vn_daemon_free(VnDaemon *d)
{
    if (d == NULL) {
        return;
    }
    if (d->statics != NULL && d->statics->src != 0) {
        g_source_remove(d->statics->src);
    }
    g_clear_pointer(&d->statics, g_free);
    daemon_stop(d);
    g_clear_pointer(&d->loop, g_main_loop_unref);
    vn_conf_free(d->conf);
    g_free(d);
}
