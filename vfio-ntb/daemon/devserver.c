/*
 * Device servers that die and come back (devserver.h), both halves.
 *
 * Lender: a lent device's worker says whether its device server answers (port.h; it
 * fences the lease's DMA itself when the server goes).  The daemon logs each change,
 * emits DEVICE_SERVER_LOST or DEVICE_SERVER_BACK, counts the returns (the generation)
 * and announces both to the holder.
 *
 * Borrower: the lender's announcement says the same of a device we hold.  We emit the
 * same events for it, and when the generation grows -- a lost server came back -- the
 * device our VM has is gone with the old server's state: the VM is given the new one as a
 * new device (vn_unplug_replug: device_del, then device_add at the same place), so the
 * guest's driver probes it with no operator action.  Without a QMP socket the operator
 * is told to detach and attach it.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "devserver.h"

#include "announce.h"
#include "conf.h"
#include "events.h"
#include "leases.h"
#include "state.h"
#include "unplug.h"

#include <string.h>

/* The device @ld's holder had is gone (@why): until another answers, it has none. */
static void server_down(VnLocalDevice *ld, const char *why)
{
    VnDaemon *d = ld->d;
    g_autofree char *device = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);
    bool lent = vn_lease_lent(ld->lease);
    const char *holder = lent ? ld->lease->holder : NULL;

    ld->server = VN_SERVER_DOWN;
    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, device, holder, lent ? ld->lease->id : 0,
           "node %s: %s%s%s%s", d->conf->node, why, lent ? "; its holder " : "", lent ? holder : "",
           lent ? " has no device until another answers" : "");
    vn_events_emit(d, "DEVICE_SERVER_LOST", device, lent ? ld->lease->id : 0, holder,
                   ld->holder_domain);
    vn_announce_soon(d);
}

void vn_devserver_changed(void *opaque, bool up, uint32_t gen)
{
    VnLocalDevice *ld = opaque;
    VnDaemon *d = ld->d;
    g_autofree char *device = g_strdup_printf("%s/%s", d->conf->node, ld->conf->name);
    g_autofree char *why = NULL;
    bool lent = vn_lease_lent(ld->lease);
    const char *holder = lent ? ld->lease->holder : NULL;

    /* An adopted worker's server that came back while no daemon listened. */
    bool missed = up && ld->server == VN_SERVER_UNKNOWN && gen > ld->worker_server_gen;

    if (gen != ld->worker_server_gen) {
        ld->worker_server_gen = gen;
        vn_state_save_or_report(d);
    }
    if (up && ld->server != VN_SERVER_DOWN && !missed) {
        ld->server = VN_SERVER_UP; /* as it was, or first heard */
        return;
    }
    if (!up) {
        if (ld->server != VN_SERVER_DOWN) {
            why = g_strdup_printf("the device server of %s (%s) is lost", ld->conf->name,
                                  vn_conf_lend_where(ld->conf));
            server_down(ld, why);
        }
        return;
    }
    ld->server = VN_SERVER_UP;
    ld->server_gen++;
    vn_state_save_or_report(d); /* a restart must not announce a lower one */
    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, device, holder, lent ? ld->lease->id : 0,
           "node %s: %s answers again (return %u; %u in its worker's life)%s%s", d->conf->node,
           ld->conf->name, ld->server_gen, gen, lent ? "; it is presented anew to " : "",
           lent ? holder : "");
    vn_events_emit(d, "DEVICE_SERVER_BACK", device, lent ? ld->lease->id : 0, holder,
                   ld->holder_domain);
    vn_announce_soon(d);
}

void vn_devserver_worker_gone(VnLocalDevice *ld)
{
    g_autofree char *why = g_strdup_printf(
        "the lender worker of %s is gone, and the device's state with it", ld->conf->name);

    server_down(ld, why);
}

/* The lender presents @b anew: the VM gets the new device in place of the dead one. */
static void present_anew(VnDaemon *d, VnBorrowed *b)
{
    if (b->worker_pid <= 0) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %s has a new device server; no VM has it now", d->conf->node, b->device);
        return;
    }
    if (b->qmp == NULL) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %s has a new device server and the device %s has is gone: detach and "
               "attach it to give the VM the new one (attach with --qmp does that by itself)",
               d->conf->node, b->device, b->domain != NULL ? b->domain : "its VM");
        return;
    }
    if (vn_unplug_replugging(d, b->device)) {
        /* Flapping, or a lender that counts fast: one replug at a time per device. */
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %s is being presented anew already", d->conf->node, b->device);
        return;
    }
    if (!vn_unplug_replug(d, b)) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %s has a new device server, but %d VMs are being asked about "
               "devices already: detach and attach it to give %s the new one",
               d->conf->node, b->device, VN_UNPLUG_MAX, b->domain);
        vn_events_emit(d, "DEVICE_REPLUG_FAILED", b->device, b->lease, NULL, b->domain);
    }
}

void vn_devserver_announced(VnDaemon *d, const char *lender, const VnPeersAnnounce *a)
{
    for (guint i = 0; i < d->borrowed->len; i++) {
        VnBorrowed *b = d->borrowed->pdata[i];
        const VnPeersDevice *pd = NULL;

        if (strcmp(b->lender, lender) != 0) {
            continue;
        }
        for (unsigned j = 0; j < a->n_devices; j++) {
            if (strcmp(a->devices[j].name, b->name) == 0 && a->devices[j].lent &&
                strcmp(a->devices[j].borrower, d->conf->node) == 0 &&
                a->devices[j].lease == b->lease) {
                pd = &a->devices[j];
            }
        }
        if (pd == NULL) {
            continue; /* not (or no longer) ours: reconcile_held() judges that */
        }
        if (pd->server_down && !b->server_down) {
            b->server_down = true;
            vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, lender, b->lease,
                   "node %s: %s says the device server of %s is lost%s%s", d->conf->node, lender,
                   b->device, b->domain != NULL ? "; the device is dead in " : "",
                   b->domain != NULL ? b->domain : "");
            vn_events_emit(d, "DEVICE_SERVER_LOST", b->device, b->lease, lender, b->domain);
        }
        /* A lender that restarted counts from 0 again: a lower number is taken as is. */
        if (!b->server_gen_known || pd->server_gen < b->server_gen) {
            b->server_gen_known = true;
            b->server_gen = pd->server_gen;
            b->server_down = pd->server_down;
            vn_state_save_or_report(d);
            continue;
        }
        if (pd->server_down || pd->server_gen == b->server_gen) {
            continue;
        }
        b->server_gen = pd->server_gen;
        b->server_down = false;
        vn_state_save_or_report(d);
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, lender, b->lease,
               "node %s: %s says a new device server of %s answers", d->conf->node, lender,
               b->device);
        vn_events_emit(d, "DEVICE_SERVER_BACK", b->device, b->lease, lender, b->domain);
        present_anew(d, b);
    }
}
