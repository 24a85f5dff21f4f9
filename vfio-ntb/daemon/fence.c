/*
 * The daemon's fence of a lent device (fence.h): at the end of a lease the
 * device goes back to nobody before anyone else may borrow it, and the daemon sees to it
 * itself rather than trust its worker.  Right away it withdraws what the worker exported
 * through its port (the paths onto the device's BARs: on an NTB the inbound translations,
 * cleared when the call returns), and tells the worker, which fences the device (interrupts
 * and bus mastering off, DMA unmapped, reset: lending/lender.c) and says so.  A worker that
 * does not say so within VN_FENCE_TIMEOUT_MS (stopped, wedged on its device) is killed:
 * its death closes its device and IOMMU container (VFIO then disables and resets the
 * device, and its IOMMU mappings of the holder's memory go), and only then the daemon
 * unmaps the windows onto the holder's memory it kept for it.  A borrow that comes
 * meanwhile waits for the fence (at most the timeout, within the borrower's request
 * timeout) instead of being refused.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "fence.h"

#include "devices.h"
#include "port.h"
#include "workers.h"

#include <errno.h>

G_STATIC_ASSERT(VN_FENCE_TIMEOUT_MS + 500 < VN_FABRIC_REQUEST_TIMEOUT_MS);

/* The fence is over: a borrow that waited for it goes on. */
static void fence_done(VnLocalDevice *ld, const char *how)
{
    VnDaemon *d = ld->d;
    VnFenceResume resume = ld->fence.resume;

    if (!ld->fence.active) {
        return;
    }
    ld->fence.active = false;
    if (ld->fence.timer != 0) {
        g_source_remove(ld->fence.timer);
        ld->fence.timer = 0;
    }
    vn_log(ld->fence.loud ? G_LOG_LEVEL_WARNING : G_LOG_LEVEL_INFO, d->conf->node, ld->conf->name,
           NULL, 0, "node %s: %s fenced (%s)", d->conf->node, ld->conf->name, how);
    ld->fence.loud = false;
    ld->fence.resume = (VnFenceResume){ 0 };
    if (resume.fn != NULL) {
        resume.fn(d, ld, resume.peer, resume.token);
    }
    g_free(resume.peer);
}

/* The worker cannot be trusted to fence (@why): it is killed, and the fence is over when
 * it is gone. */
static void fence_kill(VnLocalDevice *ld, const char *why)
{
    VnDaemon *d = ld->d;

    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, ld->conf->name, NULL, 0,
           "node %s: the lender worker of %s (pid %d) %s; killing it to fence the device",
           d->conf->node, ld->conf->name, ld->worker_pid, why);
    if (!d->workers->lend_kill(d, ld)) {
        vn_port_withdraw(ld->port, true, "its worker was killed");
        fence_done(ld, "its worker killed");
    }
    /* else vn_fence_worker_died() ends it, once the worker is gone. */
}

static gboolean on_fence_timeout(gpointer data)
{
    VnLocalDevice *ld = data;
    g_autofree char *why =
        g_strdup_printf("did not say it fenced within %d ms", VN_FENCE_TIMEOUT_MS);

    ld->fence.timer = 0;
    if (ld->worker_pid <= 0) {
        vn_port_withdraw(ld->port, true, "its worker is gone");
        fence_done(ld, "no worker");
        return G_SOURCE_REMOVE;
    }
    fence_kill(ld, why);
    return G_SOURCE_REMOVE;
}

void vn_fence_start(VnDaemon *d, VnLocalDevice *ld, const char *why)
{
    if (ld->port == NULL) {
        return;
    }
    vn_port_withdraw(ld->port, false, why);
    if (ld->worker_pid <= 0) {
        vn_port_withdraw(ld->port, true, "no worker runs");
        return;
    }
    if (ld->fence.active) {
        return;
    }
    ld->fence.active = true;
    if (!vn_port_connected(ld->port)) {
        /* It cannot hear of the lease's end (it comes back after a restart of ours with
         * what it held): it cannot say it fenced either. */
        fence_kill(ld, "is not connected to its port");
        return;
    }
    ld->fence.timer = g_timeout_add(VN_FENCE_TIMEOUT_MS, on_fence_timeout, ld);
}

void vn_fence_confirmed(void *opaque)
{
    fence_done(opaque, "its worker says so");
}

void vn_fence_worker_died(VnDaemon *d, VnLocalDevice *ld)
{
    if (ld->port != NULL) {
        vn_port_withdraw(ld->port, true, "its worker exited");
    }
    fence_done(ld, "its worker exited");
}

bool vn_fence_defer(VnLocalDevice *ld, VnFenceResumeFn fn, const char *peer, uint64_t token)
{
    if (!ld->fence.active || ld->fence.resume.fn != NULL) {
        return false;
    }
    ld->fence.resume = (VnFenceResume){ .fn = fn, .peer = g_strdup(peer), .token = token };
    return true;
}

void vn_fence_clear(VnLocalDevice *ld)
{
    if (ld->fence.timer != 0) {
        g_source_remove(ld->fence.timer);
        ld->fence.timer = 0;
    }
    if (ld->fence.resume.fn != NULL) {
        vn_fabric_reply_error(ld->d->fab, ld->fence.resume.token, ESHUTDOWN,
                              "the lender's daemon is stopping");
    }
    g_free(ld->fence.resume.peer);
    ld->fence = (VnFence){ 0 };
}
