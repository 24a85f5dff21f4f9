/*
 * Lending a device and ending that (devices.c has the tables): its port,
 * its lease, what the port tells (a VFIO device request, a fence done, the
 * device server's changes) wired to the parts that act on it, and a device
 * gone from the config unlent once its lease ends.  Above the protocol
 * (cluster.c), whose revoke a device request starts.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "devices-lend.h"

#include "cluster.h"
#include "conf.h"
#include "devserver.h"
#include "fence.h"
#include "identity.h"
#include "leases.h"
#include "port.h"
#include "spawn-procs.h"
#include "state.h"
#include "workers.h"

#include "lending/pcibind.h"

#include <gio/gio.h>
#include <string.h>

/*
 * Whether a `managed` function may be taken from the host: it exists, no
 * one uses it through its driver, its IOMMU group has no member bound to a
 * host driver.  Reads sysfs and procfs only (bounded), so it may run here.
 */
static bool managed_ok(VnDaemon *d, VnLendConf *lc, GError **error)
{
    g_autofree char *driver = vn_pcibind_driver("/sys", lc->pci, error);
    g_autofree char *users = NULL, *group = NULL;

    if (driver == NULL) {
        g_prefix_error(error, "cannot lend %s: ", lc->name);
        return false;
    }
    if (strcmp(driver, "vfio-pci") != 0 &&
        (users = vn_pcibind_users("/sys", "/proc", lc->pci)) != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_BUSY,
                    "cannot lend %s: this host uses %s (%s): %s", lc->name, lc->pci,
                    driver[0] ? driver : "no driver", users);
        return false;
    }
    group = vn_pcibind_group_conflicts("/sys", lc->pci);
    if (group != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_BUSY,
                    "cannot lend %s: %s's IOMMU group also holds %s, bound to host drivers "
                    "(VFIO needs the whole group: bind them to vfio-pci or unbind them)",
                    lc->name, lc->pci, group);
        return false;
    }
    return true;
}

VnLocalDevice *vn_devices_lend(VnDaemon *d, VnLendConf *lc, GError **error)
{
    VnLocalDevice *ld;

    /* Here, for every way a device comes (config, `lend`, a reload, the
     * state file): announcements and the port table are sized by it. */
    if (d->local->len >= VN_CONF_MAX_DEVICES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "cannot lend %s: %s lends %d devices already", lc->name, d->conf->node,
                    VN_CONF_MAX_DEVICES);
        return NULL;
    }
    if (lc->managed && !managed_ok(d, lc, error)) {
        return NULL;
    }
    ld = g_new0(VnLocalDevice, 1);

    ld->d = d;
    ld->conf = lc;
    /* Before a managed bind: the host's driver still shows its storage. */
    if (lc->pci != NULL) {
        vn_identity_of_pci("/sys", lc->pci, &ld->id);
    }
    /* Its worker's port first: the holder's requests queue there while the
     * worker (re)starts. */
    ld->port_path = g_strdup_printf("%s/lend-%s-port.sock", d->conf->run_dir, lc->name);
    ld->channel_path = g_strdup_printf("%s/lend-%s-channel.sock", d->conf->run_dir, lc->name);
    if (!vn_spawn_run_dir(d, error)) {
        vn_devices_local_free(ld);
        return NULL;
    }
    ld->port = vn_port_new(d->fab, ld->port_path, NULL, lc->name, true, NULL, error);
    if (ld->port == NULL) {
        vn_devices_local_free(ld);
        return NULL;
    }
    vn_port_on_device_request(ld->port, vn_cluster_device_request, ld);
    vn_port_on_fenced(ld->port, vn_fence_confirmed, ld);
    vn_port_on_device_server(ld->port, vn_devserver_changed, ld);
    if (d->conf->worker_user != NULL) {
        /* Its worker serves as the worker user, who cannot reach the device: we dial the
         * server, or open the function's IOMMU group, each time it asks. */
        if (lc->pci != NULL) {
            vn_port_set_dial_vfio(ld->port, lc->pci);
        } else {
            vn_port_set_dial(ld->port, lc->socket);
        }
        if (!vn_spawn_port_for_worker_user(d, ld->port, error)) {
            vn_devices_local_free(ld);
            return NULL;
        }
    }
    ld->lease = vn_leases_add(d->leases, lc->name, ld);
    g_ptr_array_add(d->local, ld);
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, lc->name, NULL, 0, "node %s: lending %s (%s %s)",
           d->conf->node, lc->name, lc->pci != NULL ? "PCI function" : "device server",
           vn_conf_lend_where(lc));
    return ld;
}

bool vn_devices_lend_vfs(VnDaemon *d, VnLendConf *pf, GError **error)
{
    g_autoptr(GPtrArray) vfs = NULL;

    if (d->local->len + pf->sriov_vfs > VN_CONF_MAX_DEVICES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "cannot lend %u virtual functions of %s: a node lends at most %d devices",
                    pf->sriov_vfs, pf->name, VN_CONF_MAX_DEVICES);
        return false;
    }
    vfs = vn_pcibind_sriov_enable("/sys", pf->pci, pf->sriov_vfs, error);
    if (vfs == NULL) {
        g_prefix_error(error, "cannot lend %s: ", pf->name);
        return false;
    }
    for (guint i = 0; i < vfs->len; i++) {
        g_autofree char *name = g_strdup_printf("%s-vf%u", pf->name, i);
        VnLendConf *vc;

        if (vn_devices_local(d, name) != NULL) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_EXISTS,
                        "cannot lend %s's virtual function %u as %s: that name is lent already",
                        pf->name, i, name);
            return false;
        }
        vc = vn_conf_lend_new(name, NULL, vfs->pdata[i], (const char *const *)pf->allow, error);
        if (vc == NULL) {
            return false;
        }
        vc->managed = true; /* each VF goes to vfio-pci, and back after */
        vc->vf = true;
        vc->runtime = false; /* the config makes it again at every start */
        g_ptr_array_add(d->conf->lends, vc);
        if (vn_devices_lend(d, vc, error) == NULL) {
            return false;
        }
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, name, NULL, 0,
               "node %s: %s is %s's virtual function %u (%s)", d->conf->node, name, pf->name, i,
               (char *)vfs->pdata[i]);
    }
    return true;
}

void vn_devices_unlend(VnDaemon *d, VnLocalDevice *ld)
{
    VnLendConf *lc = ld->conf;

    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, lc->name, NULL, 0, "node %s: no longer lending %s",
           d->conf->node, lc->name);
    vn_leases_remove(d->leases, ld->lease); /* ends a lease (fences) first */
    d->workers->lend_stop(d, ld);
    g_clear_pointer(&ld->port, vn_port_free_unlinked);
    g_ptr_array_remove(d->local, ld);       /* frees ld and its lender */
    g_ptr_array_remove(d->conf->lends, lc); /* frees lc */
}

typedef struct Leaving {
    VnDaemon *d;
    char *name;
} Leaving;

static void leaving_free(gpointer data)
{
    Leaving *l = data;

    g_free(l->name);
    g_free(l);
}

static gboolean on_leaving(gpointer data)
{
    Leaving *l = data;
    VnLocalDevice *ld = vn_devices_local(l->d, l->name);

    /* Still gone from the config, and not lent again meanwhile. */
    if (ld != NULL && ld->conf->leaving && !vn_lease_lent(ld->lease)) {
        vn_log(G_LOG_LEVEL_MESSAGE, l->d->conf->node, l->name, NULL, 0,
               "node %s: %s, no longer in the config, is unlent now that its lease ended",
               l->d->conf->node, l->name);
        vn_devices_unlend(l->d, ld);
        vn_state_save_or_report(l->d);
    }
    return G_SOURCE_REMOVE;
}

void vn_devices_on_lease(void *opaque, const VnLeaseChange *ch)
{
    VnDaemon *d = opaque;
    VnLocalDevice *ld = ch->lease->opaque;
    Leaving *l;

    if (ch->lease->state != VN_LEASE_FREE || ch->end == VN_LEASE_END_UNLENT || !ld->conf->leaving) {
        return;
    }
    /* Not from inside the lease table's notification: unlending removes
     * the lease. */
    l = g_new0(Leaving, 1);
    *l = (Leaving){ d, g_strdup(ld->conf->name) };
    g_idle_add_full(G_PRIORITY_DEFAULT, on_leaving, l, leaving_free);
    /* @l is the GLib source's now: its destroy notify frees it. */
    /* cppcheck-suppress memleak */
}
