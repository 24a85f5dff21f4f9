/*
 * Daemon to daemon, the borrower's side of a lease (see cluster.c): borrow
 * a device, return it, and release it when its lender revokes it (the VM
 * is asked to let go, within the grace the lender gave).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "cluster-borrow.h"

#include "announce.h"
#include "conf.h"
#include "control.h"
#include "events.h"
#include "peers.h"
#include "state.h"
#include "unplug.h"
#include "workers.h"

#include "common/json.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <string.h>

/* ---- leases, borrower side ---- */

/* A release in progress: which lease of which device, and until when. */
typedef struct Release {
    VnDaemon *d;
    char *device;
    uint64_t lease;
    gint64 start_us;
    gint64 deadline_us;
    unsigned wait_ms;
    bool asked; /* the VM is being asked (vn_unplug_start) */
} Release;

static void release_free(gpointer p)
{
    Release *r = p;

    g_free(r->device);
    g_free(r);
}

static void release_asked(VnDaemon *d, const char *device, uint64_t lease, bool asked,
                          bool stopping, void *opaque);

/* Ask @b's VM to let go; VN_UNPLUG_MAX under way: again on the next poll.
 * Last in its callers: the answer may come at once and free @r. */
static void release_ask(Release *r, VnBorrowed *b)
{
    r->asked = true;
    if (!vn_unplug_start(r->d, b, true, release_asked, NULL)) {
        r->asked = false;
    }
}

static gboolean release_poll(gpointer data)
{
    Release *r = data;
    VnBorrowed *b = vn_devices_borrowed(r->d, r->device);
    bool gone;

    if (b == NULL || b->lease != r->lease) {
        return G_SOURCE_REMOVE; /* returned meanwhile (vn_devices_borrowed_free ends us) */
    }
    /* Asked without waiting: a worker busy with what its QEMU does while it
     * lets go needs this loop to relay its requests. */
    gone = r->d->workers->client_state(r->d, b, r->start_us) == VN_CLIENT_GONE;
    if (!gone && g_get_monotonic_time() < r->deadline_us) {
        if (!r->asked) {
            release_ask(r, b);
        }
        return G_SOURCE_CONTINUE;
    }
    if (gone) {
        vn_log(G_LOG_LEVEL_MESSAGE, r->d->conf->node, b->device, b->lender, b->lease,
               "node %s: the VM released %s", r->d->conf->node, b->device);
    } else {
        vn_log(G_LOG_LEVEL_MESSAGE, r->d->conf->node, b->device, b->lender, b->lease,
               "node %s: the VM did not release %s within %u ms", r->d->conf->node, b->device,
               r->wait_ms);
    }
    b->release_timer = 0; /* this source ends with the return below */
    vn_job_end(&b->job, VN_JOB_RELEASE);
    vn_cluster_return(r->d, b, NULL, NULL);
    return G_SOURCE_REMOVE;
}

/* Nothing could ask the VM to let go: no point waiting for it. */
static void release_asked(VnDaemon *d, const char *device, uint64_t lease, bool asked,
                          bool stopping, void *opaque)
{
    VnBorrowed *b = stopping || asked ? NULL : vn_devices_borrowed(d, device);

    if (b == NULL || b->lease != lease || b->release_timer == 0) {
        return;
    }
    g_source_remove(b->release_timer);
    b->release_timer = 0;
    vn_job_end(&b->job, VN_JOB_RELEASE);
    vn_cluster_return(d, b, NULL, NULL);
}

void vn_cluster_release(VnDaemon *d, VnBorrowed *b, unsigned wait_ms)
{
    Release *r;

    if (b->release_timer != 0) {
        return; /* already on its way out */
    }
    if (wait_ms == 0 || b->worker_pid <= 0) {
        vn_cluster_return(d, b, NULL, NULL);
        return;
    }
    r = g_new0(Release, 1);
    *r = (Release){ .d = d,
                    .device = g_strdup(b->device),
                    .lease = b->lease,
                    .start_us = g_get_monotonic_time(),
                    .deadline_us = g_get_monotonic_time() + (gint64)wait_ms * 1000,
                    .wait_ms = wait_ms };
    b->release_timer = g_timeout_add_full(G_PRIORITY_DEFAULT, VN_DAEMON_RELEASE_POLL_MS,
                                          release_poll, r, release_free);
    vn_job_start(&b->job, VN_JOB_RELEASE, b->lender);
    release_ask(r, b);
}

/*
 * Borrow and return are asynchronous: a daemon waiting on another daemon
 * must still answer it, or two daemons borrowing from each other at once
 * would each hold the other's request until both time out.
 */
typedef struct Pending {
    VnDaemon *d;
    char *lender;
    char *name;
    char *device;             /* borrow: "lender/name", in d->borrowing until answered */
    VnJob job;                /* borrow: its job */
    VnFabricConnect *connect; /* borrow: waiting for the lender's link */
    uint64_t lease;           /* return: the lease given back */
    VnClusterDone done;
    void *opaque;
} Pending;

static void pending_free(Pending *p)
{
    g_free(p->device);
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
    g_autoptr(GError) error = NULL;
    VnBorrowed *b;
    uint64_t lease;

    g_ptr_array_remove_fast(d->borrowing, p);
    if (err < 0) {
        g_autofree char *why = vn_fabric_error_message(reply);

        finish(p, NULL, klass_of(err), why != NULL ? why : g_strerror(-err));
        return;
    }
    if (!vn_peers_lease_from_json(reply->json, &lease, &error)) {
        finish(p, NULL, VN_ERR_GENERIC, error->message);
        return;
    }
    if (d->borrowed == NULL) {
        finish(p, NULL, VN_ERR_GENERIC, "the daemon is stopping");
        return;
    }
    b = vn_devices_borrowed(d, device);
    if (b == NULL) {
        b = g_new0(VnBorrowed, 1);
        b->device = g_steal_pointer(&device);
        b->lender = g_strdup(p->lender);
        b->name = g_strdup(p->name);
        g_ptr_array_add(d->borrowed, b);
    }
    b->lease = lease;
    vn_events_emit(d, "LEASE_GRANTED", b->device, lease, p->lender, NULL);
    vn_state_save_or_report(d);
    /* Our holds changed: the lender judges its grant by our claim of it.
     * To it alone, at once (it may not be in our table yet, if its
     * announcement is still on the way): a hold concerns its lender only,
     * and a broadcast per borrow costs every host a message. */
    vn_announce_to(d, p->lender);
    finish(p, b, NULL, NULL);
}

/* The lender's link is up (or did not come): the borrow is asked. */
static void on_lender_linked(void *opaque, int err)
{
    Pending *p = opaque;
    VnDaemon *d = p->d;
    VnPeersRequest rq = { 0 };
    g_autofree char *json = NULL;
    int ret;

    p->connect = NULL;
    if (err < 0) {
        g_autofree char *why = g_strdup_printf("node %s: cannot connect to %s: %s", d->conf->node,
                                               p->lender, g_strerror(-err));

        g_ptr_array_remove_fast(d->borrowing, p);
        finish(p, NULL, VN_ERR_UNREACHABLE, why);
        return;
    }
    g_strlcpy(rq.device, p->name, sizeof(rq.device));
    json = vn_peers_request_to_json(VN_PEERS_BORROW, &rq);
    ret = vn_fabric_request(d->fab, p->lender, VN_PEERS_BORROW, json, NULL, 0, on_borrow_reply, p);
    if (ret < 0) {
        g_ptr_array_remove_fast(d->borrowing, p);
        finish(p, NULL, klass_of(ret), g_strerror(-ret));
    }
}

static Pending *borrowing(VnDaemon *d, const char *device)
{
    for (guint i = 0; d->borrowing != NULL && i < d->borrowing->len; i++) {
        Pending *p = d->borrowing->pdata[i];

        if (strcmp(p->device, device) == 0) {
            return p;
        }
    }
    return NULL;
}

const VnJob *vn_cluster_borrowing(VnDaemon *d, const char *device)
{
    Pending *p = borrowing(d, device);

    return p != NULL ? &p->job : NULL;
}

void vn_cluster_borrow(VnDaemon *d, const char *lender, const char *name, const char *owner,
                       VnClusterDone done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    Pending *p = g_new0(Pending, 1), *first;

    *p = (Pending){ .d = d,
                    .lender = g_strdup(lender),
                    .name = g_strdup(name),
                    .device = g_strdup_printf("%s/%s", lender, name),
                    .done = done,
                    .opaque = opaque };
    /* One borrow of a device at a time: the lender would refuse a second as lent to us. */
    first = borrowing(d, p->device);
    if (first != NULL && vn_job_refuses(&first->job, VN_JOB_OP_BORROW, p->device, &error)) {
        finish(p, NULL, VN_ERR_BUSY, error->message);
        return;
    }
    /* Our announcements list every lease held, and a lender reads at most
     * this many (announcement_valid()). */
    if (d->borrowed->len >= VN_CONF_MAX_DEVICES) {
        g_autofree char *why = g_strdup_printf("%s holds %u devices, the most one node may",
                                               d->conf->node, (unsigned)VN_CONF_MAX_DEVICES);

        finish(p, NULL, VN_ERR_BUSY, why);
        return;
    }
    /* Listed (and its job started) while its lender's link comes: a second borrow of the
     * device is refused meanwhile. */
    vn_job_start(&p->job, VN_JOB_BORROW, owner);
    g_ptr_array_add(d->borrowing, p);
    p->connect = vn_fabric_connect_async(d->fab, lender, on_lender_linked, p);
    if (p->connect == NULL) {
        g_ptr_array_remove_fast(d->borrowing, p);
        finish(p, NULL, VN_ERR_GENERIC, "the daemon is stopping");
    }
}

static void on_return_reply(void *opaque, VnFabricMsg *reply, int err)
{
    Pending *p = opaque;
    g_autofree char *why = err < 0 ? vn_fabric_error_message(reply) : NULL;
    g_autofree char *msg = NULL;

    if (err < 0) {
        msg = g_strdup_printf("returned here, but %s did not acknowledge lease %" G_GUINT64_FORMAT
                              ": %s",
                              p->lender, p->lease, why != NULL ? why : g_strerror(-err));
        vn_log(G_LOG_LEVEL_MESSAGE, p->d->conf->node, NULL, p->lender, p->lease, "node %s: %s",
               p->d->conf->node, msg);
    }
    finish(p, NULL, err < 0 ? VN_ERR_GENERIC : NULL, msg);
}

void vn_cluster_return(VnDaemon *d, VnBorrowed *b, VnClusterDone done, void *opaque)
{
    VnPeersRequest rq = { .lease = b->lease };
    g_autofree char *json = NULL;
    Pending *p = g_new0(Pending, 1);
    /* A lender that went away and came back (b->lost stays set while the
     * worker lives) must hear of it too, or it keeps the lease. */
    bool reachable = vn_fabric_link_up(d->fab, b->lender);
    int ret = 0;

    *p = (Pending){ .d = d,
                    .lender = g_strdup(b->lender),
                    .name = g_strdup(b->name),
                    .lease = b->lease,
                    .done = done,
                    .opaque = opaque };
    g_strlcpy(rq.device, b->name, sizeof(rq.device)); /* b is freed below */
    vn_devices_detach(d, b);
    /* Whatever the lender says, the device is not ours any more. */
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, b->lender, b->lease,
           "node %s: returned %s (lease %" G_GUINT64_FORMAT ")", d->conf->node, b->device,
           b->lease);
    g_ptr_array_remove(d->borrowed, b);
    vn_state_save_or_report(d);
    /* Should the RETURN not get there, our announcement after it, without
     * the lease, ends it at the lender all the same (messages on one link
     * arrive in order). */
    if (reachable) {
        json = vn_peers_request_to_json(VN_PEERS_RETURN, &rq);
        ret = vn_fabric_request(d->fab, p->lender, VN_PEERS_RETURN, json, NULL, 0, on_return_reply,
                                p);
        vn_announce_to(d, p->lender);
    }
    if (!reachable || ret < 0) {
        on_return_reply(p, NULL, reachable ? ret : 0);
    }
}
