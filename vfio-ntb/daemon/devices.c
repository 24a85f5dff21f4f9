/*
 * The daemon's devices: the ones it lends (each with its lender and lease)
 * and the ones it borrows (each with the worker serving it to a VM), looked
 * up by name; detaching one, noting a loss, freeing them.  Below the
 * protocol (cluster.c) and the commands, which call down to here; lending
 * and unlending is devices-lend.c's.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "devices.h"
#include "p2p.h"

#include "announce.h"
#include "control.h"
#include "events.h"
#include "state.h"
#include "workers.h"

#include <string.h>

VnLocalDevice *vn_devices_local(VnDaemon *d, const char *name)
{
    for (guint i = 0; i < d->local->len; i++) {
        VnLocalDevice *ld = d->local->pdata[i];

        if (strcmp(ld->conf->name, name) == 0) {
            return ld;
        }
    }
    return NULL;
}

VnBorrowed *vn_devices_borrowed(VnDaemon *d, const char *device)
{
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];

        if (strcmp(b->device, device) == 0) {
            return b;
        }
    }
    return NULL;
}

void vn_devices_detach(VnDaemon *d, VnBorrowed *b)
{
    if (b->worker_pid <= 0) {
        return;
    }
    /* What its worker says on its way out is nobody's business now (its port may outlive
     * @b, ending.c). */
    if (b->port != NULL) {
        vn_port_on_p2p(b->port, NULL, NULL);
    }
    d->workers->stop(d, b);
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, b->lender, b->lease,
           "node %s: %s detached from %s", d->conf->node, b->device, b->domain);
    vn_events_emit(d, "DETACHED", b->device, b->lease, NULL, b->domain);
    vn_announce_soon(d); /* the lender shows the domain gone */
    g_clear_pointer(&b->domain, g_free);
    g_clear_pointer(&b->qmp, g_free);
    g_clear_pointer(&b->qdev_id, g_free);
    /* Its BARs are nobody's target any more, its offers nobody's. */
    g_clear_pointer(&b->p2p_dev, vn_p2p_dev_free);
    vn_p2p_changed(d);
}

void vn_devices_note_loss(VnDaemon *d, const char *device, uint64_t lease, const char *why)
{
    g_autoptr(GDateTime) now = g_date_time_new_now_utc();
    g_autofree char *when = g_date_time_format_iso8601(now);

    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, device, NULL, lease, "node %s: %s lost: %s",
           d->conf->node, device, why);
    if (!g_hash_table_contains(d->losses, device) &&
        g_hash_table_size(d->losses) >= VN_DEVICES_MAX_LOSSES) {
        GHashTableIter it;

        g_hash_table_iter_init(&it, d->losses);
        if (g_hash_table_iter_next(&it, NULL, NULL)) {
            g_hash_table_iter_remove(&it);
        }
    }
    g_hash_table_insert(d->losses, g_strdup(device), g_strdup_printf("%s: %s", when, why));
    vn_state_save_or_report(d);
}

/* Leaves a running worker alone: it serves a VM and outlives us. */
void vn_devices_borrowed_free(VnBorrowed *b)
{
    if (b->start_cancel != NULL) {
        b->start_cancel(b->start_data); /* answers whoever waits for it */
    }
    if (b->child_watch != 0) {
        g_source_remove(b->child_watch);
    }
    if (b->adopted_watch != 0) {
        if (b->port != NULL) {
            vn_port_on_gone(b->port, NULL, NULL); /* its opaque goes with the watch */
        }
        g_source_remove(b->adopted_watch);
    }
    if (b->release_timer != 0) {
        g_source_remove(b->release_timer);
    }
    if (b->away_timer != 0) {
        g_source_remove(b->away_timer);
    }
    vn_wctl_call_cancel(b->client_call);
    /* A worker that outlives us reconnects to our successor's port. */
    if (b->port != NULL) {
        vn_port_on_p2p(b->port, NULL, NULL);
    }
    vn_port_free(b->port, false);
    vn_p2p_dev_free(b->p2p_dev);
    g_free(b->p2p_watch);
    g_free(b->worker_name);
    g_free(b->channel_path);
    g_free(b->port_path);
    g_free(b->device);
    g_free(b->lender);
    g_free(b->name);
    g_free(b->domain);
    g_free(b->socket);
    g_free(b->qmp);
    g_free(b->qdev_id);
    g_free(b);
}

void vn_devices_local_free(gpointer p)
{
    VnLocalDevice *ld = p;

    if (ld->revoke_timer != 0) {
        g_source_remove(ld->revoke_timer);
    }
    if (ld->revoke_reply != NULL) {
        vn_control_error(ld->revoke_reply, VN_ERR_GENERIC, "the daemon is stopping");
    }
    vn_fence_clear(ld);
    /* The lease stays as it is (d->leases frees it): a stopping daemon keeps
     * its leases in the state file for the next one, and its lender
     * workers serve on, reconnecting to the next one's port. */
    if (ld->child_watch != 0) {
        g_source_remove(ld->child_watch);
    }
    if (ld->respawn_timer != 0) {
        g_source_remove(ld->respawn_timer);
    }
    if (ld->adopted_watch != 0) {
        g_source_remove(ld->adopted_watch);
    }
    vn_port_free(ld->port, false);
    g_free(ld->holder_domain);
    g_free(ld->port_path);
    g_free(ld->channel_path);
    g_free(ld);
}
