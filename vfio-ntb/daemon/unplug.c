/*
 * Asking a VM to let go of a borrowed device (unplug.h),
 * without waiting in the daemon's loop: first through the worker, which
 * signals the device-request interrupt when its QEMU registered one; else,
 * when attach named the VM's QMP socket, with device_del, which runs on a
 * thread of GLib's pool (QEMU is a peer: its monitor may take its time, at
 * most 2 s).  The guest releases the device in its own time; the caller
 * watches for that.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "unplug.h"

#include "events.h"
#include "qmp.h"
#include "spawn-procs.h"
#include "workers.h"

#include "common/json.h"
#include "common/util.h"
#include "common/wctl.h"

#include <gio/gio.h>
#include <string.h>

struct VnUnplug {
    VnDaemon *d;
    char *device;
    uint64_t lease;
    char *domain;
    char *qmp; /* NULL: the worker's way only */
    char *qdev_id;
    /* A replug (vn_unplug_replug): the device is added back on @socket at @bus and @addr
     * (as it was) once it is out and its worker was started again. */
    char *socket;
    char *bus, *addr;
    bool adding;
    VnWctlCall *call;     /* the worker's answer, awaited */
    GCancellable *cancel; /* set while device_del runs on its thread */
    bool cancelled;       /* the daemon stopped: only the thread's end frees us */
    bool asking;          /* inside request_unplug, which may answer at once */
    bool over;            /* finished while asking: freed when it returns */
    VnUnplugDone done;
    void *opaque;
};

static void unplug_free(VnUnplug *u)
{
    vn_wctl_call_cancel(u->call);
    g_clear_object(&u->cancel);
    g_free(u->device);
    g_free(u->domain);
    g_free(u->qmp);
    g_free(u->qdev_id);
    g_free(u->socket);
    g_free(u->bus);
    g_free(u->addr);
    g_free(u);
}

static void finish(VnUnplug *u, bool asked)
{
    g_ptr_array_remove_fast(u->d->unplugs, u);
    if (u->done != NULL) {
        u->done(u->d, u->device, u->lease, asked, false, u->opaque);
    }
    if (u->asking) {
        u->over = true;
    } else {
        unplug_free(u);
    }
}

static void device_del_thread(GTask *task, gpointer source, gpointer data, GCancellable *cancel)
{
    VnUnplug *u = data;
    GError *error = NULL;

    bool ok;

    if (u->socket == NULL) {
        ok = vn_qmp_device_del(u->qmp, u->qdev_id, &error);
    } else if (!u->adding) {
        ok = vn_qmp_device_remove(u->qmp, u->qdev_id, VN_UNPLUG_REPLUG_WAIT_MS, &u->bus, &u->addr,
                                  &error);
    } else {
        ok = vn_qmp_device_add(u->qmp, u->qdev_id, u->bus, u->addr, u->socket, &error);
    }
    if (ok) {
        g_task_return_boolean(task, TRUE);
    } else {
        g_task_return_error(task, error);
    }
}

static void device_del(VnUnplug *u);

static void replug_done(VnUnplug *u, const GError *error)
{
    VnBorrowed *b = vn_devices_borrowed(u->d, u->device);

    if (b != NULL && b->lease == u->lease) {
        vn_job_end(&b->job, VN_JOB_REPLUG);
    }
    vn_log(error == NULL ? G_LOG_LEVEL_MESSAGE : G_LOG_LEVEL_WARNING, u->d->conf->node, u->device,
           NULL, u->lease, "node %s: %s %s to %s as a new device (%s)%s%s", u->d->conf->node,
           error == NULL ? "presented" : "could not present", u->device, u->domain, u->qdev_id,
           error == NULL ? "" : ": ", error == NULL ? "" : error->message);
    vn_events_emit(u->d, error == NULL ? "DEVICE_REPLUGGED" : "DEVICE_REPLUG_FAILED", u->device,
                   u->lease, NULL, u->domain);
    finish(u, error == NULL);
}

/* The worker serving the device again, describing the new one. */
static void on_replug_started(VnDaemon *d, VnBorrowed *b, const GError *error, void *opaque)
{
    VnUnplug *u = opaque;

    if (error != NULL) {
        replug_done(u, error);
        return;
    }
    u->adding = true;
    device_del(u); /* the add, on its thread */
}

/* A replug's step is over: the old function is out (then its worker starts again, for
 * the new device), or the new one is in, or one of them failed. */
static void replug_step(VnUnplug *u, const GError *error)
{
    VnBorrowed *b = vn_devices_borrowed(u->d, u->device);

    if (error != NULL || u->adding) {
        replug_done(u, error);
        return;
    }
    if (b == NULL || b->lease != u->lease || b->worker_pid <= 0 || b->starting) {
        g_autoptr(GError) gone =
            g_error_new(G_IO_ERROR, G_IO_ERROR_CANCELLED, "it was detached or returned meanwhile");

        replug_done(u, gone);
        return;
    }
    /* The worker described the old device to QEMU (its BARs, its interrupts): a new
     * one, attached afresh, describes the new. */
    u->d->workers->stop(u->d, b);
    u->d->workers->start(u->d, b, on_replug_started, u);
}

static void on_device_del(GObject *source, GAsyncResult *res, gpointer data)
{
    VnUnplug *u = data;
    g_autoptr(GError) error = NULL;
    bool ok = g_task_propagate_boolean(G_TASK(res), &error);

    if (u->cancelled) {
        unplug_free(u);
        return;
    }
    g_clear_object(&u->cancel); /* the thread is over */
    if (u->socket != NULL) {
        replug_step(u, ok ? NULL : error);
        return;
    }
    if (ok) {
        vn_log(G_LOG_LEVEL_MESSAGE, u->d->conf->node, u->device, NULL, u->lease,
               "node %s: asked %s to unplug %s (%s)", u->d->conf->node, u->domain, u->device,
               u->qdev_id);
    } else {
        vn_log(G_LOG_LEVEL_MESSAGE, u->d->conf->node, u->device, NULL, u->lease,
               "node %s: could not unplug %s (%s) from %s: %s", u->d->conf->node, u->device,
               u->qdev_id, u->domain, error->message);
    }
    finish(u, ok);
}

static void device_del(VnUnplug *u)
{
    g_autoptr(GTask) task = NULL;

    if (u->qmp == NULL || u->qdev_id == NULL) {
        finish(u, false);
        return;
    }
    u->cancel = g_cancellable_new();
    /* Not cancelled by the task: the thread ends by itself, bounded. */
    task = g_task_new(NULL, NULL, on_device_del, u);
    g_task_set_check_cancellable(task, FALSE);
    g_task_set_task_data(task, u, NULL);
    g_task_run_in_thread(task, device_del_thread);
}

static void on_worker_answer(char *answer, const GError *error, void *opaque)
{
    VnUnplug *u = opaque;
    g_autofree char *text = answer;
    g_autoptr(JsonObject) o = vn_json_parse_object(text, -1, VN_SPAWN_MAX_STATS, NULL);

    u->call = NULL;
    if (vn_util_json_bool(o, "requested")) {
        vn_log(G_LOG_LEVEL_MESSAGE, u->d->conf->node, u->device, NULL, u->lease,
               "node %s: asked the VM %s to release %s (device request)", u->d->conf->node,
               u->domain != NULL ? u->domain : "?", u->device);
        finish(u, true);
        return;
    }
    if (error != NULL) {
        vn_log(G_LOG_LEVEL_MESSAGE, u->d->conf->node, u->device, NULL, u->lease,
               "node %s: worker for %s: %s", u->d->conf->node, u->device, error->message);
    }
    device_del(u);
}

bool vn_unplug_start(VnDaemon *d, VnBorrowed *b, bool via_qmp, VnUnplugDone done, void *opaque)
{
    VnUnplug *u;
    VnWctlCall *call;

    if (d->unplugs->len >= VN_UNPLUG_MAX) {
        vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %d VMs are being asked to let go of devices already; %s waits",
               d->conf->node, VN_UNPLUG_MAX, b->device);
        return false;
    }
    u = g_new0(VnUnplug, 1);
    *u = (VnUnplug){ .d = d,
                     .device = g_strdup(b->device),
                     .lease = b->lease,
                     .domain = g_strdup(b->domain),
                     .done = done,
                     .opaque = opaque };
    if (via_qmp) {
        u->qmp = g_strdup(b->qmp);
        u->qdev_id = g_strdup(b->qdev_id);
    }
    g_ptr_array_add(d->unplugs, u);
    if (b->worker_pid <= 0) {
        finish(u, false);
        return true;
    }
    /* The lender lost: the worker saw it too and already asked, if it could. */
    if (b->lost) {
        device_del(u);
        return true;
    }
    u->asking = true;
    call = d->workers->request_unplug(d, b, on_worker_answer, u);
    u->asking = false;
    if (u->over) {
        unplug_free(u);
    } else {
        u->call = call;
    }
    return true;
}

bool vn_unplug_replug(VnDaemon *d, VnBorrowed *b)
{
    VnUnplug *u;

    if (d->unplugs->len >= VN_UNPLUG_MAX || b->qmp == NULL || b->qdev_id == NULL ||
        b->socket == NULL) {
        return false;
    }
    u = g_new0(VnUnplug, 1);
    *u = (VnUnplug){ .d = d,
                     .device = g_strdup(b->device),
                     .lease = b->lease,
                     .domain = g_strdup(b->domain),
                     .qmp = g_strdup(b->qmp),
                     .qdev_id = g_strdup(b->qdev_id),
                     .socket = g_strdup(b->socket) };
    g_ptr_array_add(d->unplugs, u);
    vn_job_start(&b->job, VN_JOB_REPLUG, VN_JOB_OWNER_DEVSERVER);
    device_del(u);
    return true;
}

bool vn_unplug_replugging(VnDaemon *d, const char *device)
{
    for (guint i = 0; i < d->unplugs->len; i++) {
        VnUnplug *u = d->unplugs->pdata[i];

        if (u->socket != NULL && strcmp(u->device, device) == 0) {
            return true;
        }
    }
    return false;
}

GPtrArray *vn_unplugs_new(void)
{
    return g_ptr_array_new();
}

void vn_unplugs_free(VnDaemon *d)
{
    if (d->unplugs == NULL) {
        return;
    }
    while (d->unplugs->len > 0) {
        VnUnplug *u = g_ptr_array_steal_index_fast(d->unplugs, d->unplugs->len - 1);

        if (u->done != NULL) {
            u->done(d, u->device, u->lease, false, true, u->opaque);
        }
        if (u->cancel != NULL) {
            u->cancelled = true; /* its thread's end frees it */
        } else {
            unplug_free(u);
        }
    }
    g_clear_pointer(&d->unplugs, g_ptr_array_unref);
}
