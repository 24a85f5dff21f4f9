/*
 * vfio-ntbd's persisted state: the leases this node granted and holds, the
 * workers it started, and the next lease id, in STATE-DIR/state.json (a
 * node without a state-dir keeps it in RUN-DIR: its workers outlive a
 * restart, if not a reboot, and must be found again).  Written whole and
 * renamed into place (vn_util_write_replace), so a crash leaves the old or
 * the new file, never half of one.  Read back at start by state-load.c.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "state.h"

#include "conf.h"
#include "devices.h"
#include "port.h"

#include "common/util.h"

#include <gio/gio.h>
#include <string.h>
#include <sys/types.h>

/* What a worker that outlives us proves itself with to the daemon after us (port.h): the
 * state file is as private as the daemon's own memory (0600, the daemon's directory). */
static void add_secret(JsonBuilder *b, VnPort *port)
{
    g_autofree char *secret = port != NULL ? vn_port_secret_hex(port) : NULL;

    if (secret != NULL) {
        json_builder_set_member_name(b, "port_secret");
        json_builder_add_string_value(b, secret);
    }
}

/* run-dir always has a value (conf.c: /run/vfio-ntb by default). */
static const char *state_dir(VnDaemon *d)
{
    return d->conf->state_dir != NULL ? d->conf->state_dir : d->conf->run_dir;
}

char *vn_state_path(VnDaemon *d)
{
    return g_build_filename(state_dir(d), "state.json", NULL);
}

/* How a device is reached, and who may borrow it: enough to lend it again
 * from the state file alone. */
static void add_lend_conf(JsonBuilder *b, const VnLendConf *lc)
{
    json_builder_set_member_name(b, lc->pci != NULL ? "pci" : "socket");
    json_builder_add_string_value(b, vn_conf_lend_where(lc));
    if (lc->managed) {
        json_builder_set_member_name(b, "managed");
        json_builder_add_boolean_value(b, TRUE);
    }
    json_builder_set_member_name(b, "allow");
    json_builder_begin_array(b);
    for (char **a = lc->allow; *a != NULL; a++) {
        json_builder_add_string_value(b, *a);
    }
    json_builder_end_array(b);
}

bool vn_state_save(VnDaemon *d, GError **error)
{
    g_autofree char *path = vn_state_path(d);
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *text = NULL;
    GHashTableIter it;
    gpointer key, value;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, d->conf->node);
    json_builder_set_member_name(b, "next_lease");
    json_builder_add_int_value(b, (gint64)vn_leases_last_id(d->leases));
    /* Devices lent with `lend` (the config file's come from the config). */
    json_builder_set_member_name(b, "lendable");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->local->len; i++) {
        VnLendConf *lc = ((VnLocalDevice *)d->local->pdata[i])->conf;

        if (!lc->runtime) {
            continue;
        }
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "name");
        json_builder_add_string_value(b, lc->name);
        add_lend_conf(b, lc);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "lent");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (!vn_lease_lent(ld->lease)) {
            continue;
        }
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "name");
        json_builder_add_string_value(b, ld->conf->name);
        json_builder_set_member_name(b, "borrower");
        json_builder_add_string_value(b, ld->lease->holder);
        json_builder_set_member_name(b, "lease");
        json_builder_add_int_value(b, (gint64)ld->lease->id);
        /* The holder's VM was given the device anew this many times (devserver.c). */
        json_builder_set_member_name(b, "server_generation");
        json_builder_add_int_value(b, ld->server_gen);
        if (ld->revoke_deadline != 0) {
            /* A revoke waiting out its grace: a restart resumes it, due at the same time. */
            json_builder_set_member_name(b, "revoke_deadline_us");
            json_builder_add_int_value(b, ld->revoke_deadline);
        }
        /* A restart whose config no longer has it still finds it. */
        add_lend_conf(b, ld->conf);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    /* Lender workers serve on through our restart; their paths follow
     * from their devices' names. */
    json_builder_set_member_name(b, "lender_workers");
    json_builder_begin_array(b);
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (ld->worker_pid > 0) {
            json_builder_begin_object(b);
            json_builder_set_member_name(b, "name");
            json_builder_add_string_value(b, ld->conf->name);
            json_builder_set_member_name(b, "pid");
            json_builder_add_int_value(b, ld->worker_pid);
            json_builder_set_member_name(b, "server_generation");
            json_builder_add_int_value(b, ld->worker_server_gen);
            add_secret(b, ld->port);
            json_builder_end_object(b);
        }
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "borrowed");
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
        json_builder_set_member_name(b, "irq_mode");
        json_builder_add_string_value(b, vn_irq_mode_to_string(bw->irq_mode));
        if (bw->p2p) {
            json_builder_set_member_name(b, "p2p");
            json_builder_add_boolean_value(b, TRUE);
        }
        if (bw->server_gen_known) {
            json_builder_set_member_name(b, "server_generation");
            json_builder_add_int_value(b, bw->server_gen);
        }
        if (bw->worker_pid > 0) {
            json_builder_set_member_name(b, "worker");
            json_builder_begin_object(b);
            json_builder_set_member_name(b, "pid");
            json_builder_add_int_value(b, bw->worker_pid);
            json_builder_set_member_name(b, "name");
            json_builder_add_string_value(b, bw->worker_name);
            json_builder_set_member_name(b, "socket");
            json_builder_add_string_value(b, bw->socket);
            json_builder_set_member_name(b, "domain");
            json_builder_add_string_value(b, bw->domain ? bw->domain : "");
            json_builder_set_member_name(b, "channel");
            json_builder_add_string_value(b, bw->channel_path);
            json_builder_set_member_name(b, "port");
            json_builder_add_string_value(b, bw->port_path);
            add_secret(b, bw->port);
            /* The VM's QMP socket and the device's id there: a revoke after our
             * restart still unplugs the device, and a repeated attach with the
             * same options still matches. */
            if (bw->qmp != NULL && bw->qdev_id != NULL) {
                json_builder_set_member_name(b, "qmp");
                json_builder_add_string_value(b, bw->qmp);
                json_builder_set_member_name(b, "qdev_id");
                json_builder_add_string_value(b, bw->qdev_id);
            }
            json_builder_end_object(b);
        }
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    /* What the operator asks after a restart: which device was lost, when,
     * and from which VM. */
    json_builder_set_member_name(b, "losses");
    json_builder_begin_object(b);
    g_hash_table_iter_init(&it, d->losses);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        json_builder_set_member_name(b, key);
        json_builder_add_string_value(b, value);
    }
    json_builder_end_object(b);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    text = json_to_string(root, TRUE);
    if (g_mkdir_with_parents(state_dir(d), 0700) < 0 ||
        /* Atomic (rename) but not fsync'd: a lease change costs no disk
         * flush on the attach path, and a power cut that loses the last
         * change is healed by the peers' announcements (leases in doubt).
         * (g_file_set_contents_full with CONSISTENT did fsync: 4 ms and up
         * of a blocked main loop per lease change on ext4, tens of ms when
         * many daemons flush at once.) */
        !vn_util_write_replace(path, text, 0600, error)) {
        if (error != NULL && *error == NULL) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "state dir %s: cannot create",
                        state_dir(d));
        }
        g_prefix_error(error, "saving state: ");
        return false;
    }
    return true;
}

void vn_state_save_or_report(VnDaemon *d)
{
    g_autoptr(GError) error = NULL;

    if (!vn_state_save(d, &error)) {
        d->save_errors++;
        /* Warned once per run of failures; the heartbeat tries again. */
        vn_log(d->unsaved ? G_LOG_LEVEL_INFO : G_LOG_LEVEL_WARNING, d->conf->node, NULL, NULL, 0,
               "node %s: %s; a restart now would forget what changed since the last save",
               d->conf->node, error->message);
        d->unsaved = true;
        return;
    }
    if (d->unsaved) {
        d->unsaved = false;
        g_message("node %s: the state is saved again (%s)", d->conf->node, state_dir(d));
    }
}

void vn_state_on_lease(void *opaque, const VnLeaseChange *ch)
{
    VnDaemon *d = opaque;

    /* The file records holders, ids and revokes (their deadlines), not states: a claim
     * changes nothing in it.  Restores come from the file itself. */
    if (ch->from == VN_LEASE_FREE
            ? ch->lease->state != VN_LEASE_RESTORED
            : ch->lease->state == VN_LEASE_FREE || ch->lease->state == VN_LEASE_REVOKING) {
        vn_state_save_or_report(d);
    }
}
