/*
 * Workers on their way out (ending.h).
 *
 * Stopping a worker takes time the daemon's loop must not spend waiting: a
 * borrower's QEMU finalizes an unplugged device a little after the guest
 * let go, and only then closes the worker's socket; a lender worker fences
 * its device on SIGTERM, through a device server that may be slow.  The
 * device forgets its worker at once and an ending owns it from then on:
 * it waits (asking the worker without blocking) for QEMU to let go, sends
 * SIGTERM, watches the process go, and kills it when it takes too long.
 * Its port stays open in the loop meanwhile, so what the worker says on
 * its way out (a DETACH, its unmaps) still reaches the lender, and the
 * answers reach the worker.  A new worker for the same device waits for
 * the old one to be gone (vn_ending_busy()): two would share a port path
 * and a lease.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "ending.h"

#include "devices.h"
#include "spawn-procs.h"

#include "lending/pcibind.h"
#include "common/wctl.h"

#include <gio/gio.h>
#include <glib-unix.h>
#include <signal.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* How often an ending looks at its deadlines (its worker's exit it hears of
 * at once). */
#define VN_ENDING_POLL_MS 5
/* After SIGKILL: a process stuck in the kernel is left, not waited for. */
#define VN_ENDING_KILL_WAIT_MS 5000

typedef enum EndingPhase {
    ENDING_CLIENT, /* waiting for QEMU to let go */
    ENDING_TERM,   /* SIGTERM sent */
    ENDING_KILL,   /* SIGKILL sent */
} EndingPhase;

struct VnEnding {
    VnDaemon *d;
    char *what;
    GPid pid;
    VnPort *port;
    char *channel_path;
    char *socket_path; /* QEMU's (a borrower worker's), or NULL */
    EndingPhase phase;
    gint64 phase_end_us; /* monotonic: the phase's deadline */
    unsigned term_wait_ms;
    VnWctlCall *call; /* "stats", while waiting for QEMU */
    bool child;       /* ours to reap (else adopted after a restart) */
    int pidfd;        /* the process, not whatever gets its pid later */
    guint exit_watch; /* on @pidfd: it exited */
    guint timer;
    char *kept_path;           /* managed: what the worker keeps of its function, or NULL */
    char *kept_bdf;            /* that function */
    GCancellable *giving_back; /* while it is given back, in a thread */
};

static void release_port(VnEnding *e)
{
    if (e->port != NULL) {
        /* What it said last goes out now. */
        vn_port_drain(e->port);
        vn_port_free_unlinked(e->port);
        e->port = NULL;
    }
}

static void ending_free(gpointer p)
{
    VnEnding *e = p;

    if (e->timer != 0) {
        g_source_remove(e->timer);
    }
    if (e->exit_watch != 0) {
        g_source_remove(e->exit_watch);
    }
    if (e->pidfd >= 0) {
        close(e->pidfd);
    }
    if (e->giving_back != NULL) {
        g_cancellable_cancel(e->giving_back); /* its answer is not for us any more */
        g_object_unref(e->giving_back);
    }
    vn_wctl_call_cancel(e->call);
    release_port(e);
    /* The worker's files: one that served as the worker user could not remove them from our
     * directory. */
    if (e->channel_path != NULL) {
        unlink(e->channel_path);
    }
    if (e->socket_path != NULL) {
        unlink(e->socket_path);
    }
    g_free(e->channel_path);
    g_free(e->socket_path);
    g_free(e->kept_path);
    g_free(e->kept_bdf);
    g_free(e->what);
    g_free(e);
}

/* Through the pidfd: a pid reused after the worker went is someone else. */
static void send_signal(VnEnding *e, int sig)
{
    if (e->pidfd >= 0) {
        pidfd_send_signal(e->pidfd, sig, NULL, 0);
    }
}

/* A thread's: sysfs writes wait on the drivers (pcibind.h). */
static void give_back_thread(GTask *task, gpointer source, gpointer data, GCancellable *cancel)
{
    char **kept = data; /* the bdf and the file: copies, the ending may go meanwhile */
    GError *error = NULL;

    if (!vn_pcibind_give_back("/sys", kept[1], kept[0], &error)) {
        g_task_return_error(task, error);
        return;
    }
    g_task_return_boolean(task, TRUE);
}

static void on_given_back(GObject *source, GAsyncResult *res, gpointer data)
{
    g_autoptr(GError) error = NULL;
    GCancellable *cancel = g_task_get_cancellable(G_TASK(res));
    VnEnding *e = data;

    if (g_cancellable_is_cancelled(cancel)) {
        return; /* the ending is gone (the daemon stops): @e with it */
    }
    if (!g_task_propagate_boolean(G_TASK(res), &error)) {
        vn_log(G_LOG_LEVEL_WARNING, e->d->conf->node, e->what, NULL, 0,
               "node %s: %s stays with vfio-pci: %s", e->d->conf->node, e->kept_bdf,
               error->message);
    }
    g_ptr_array_remove(e->d->endings, e);
}

static void gone(VnEnding *e)
{
    GTask *task;
    char **kept;

    vn_log(G_LOG_LEVEL_INFO, e->d->conf->node, e->what, NULL, 0,
           "node %s: the worker for %s (pid %d) is gone", e->d->conf->node, e->what, e->pid);
    if (e->child) {
        waitpid(e->pid, NULL, WNOHANG);
    }
    if (e->kept_path == NULL || !g_file_test(e->kept_path, G_FILE_TEST_EXISTS)) {
        g_ptr_array_remove(e->d->endings, e);
        return;
    }
    /* Managed, and the worker could not give its function back (it served as the worker
     * user): ours, once nothing of ours holds the function's VFIO device (the port's BAR
     * segments), or vfio-pci's unbind would wait for them.  The ending stays meanwhile, so
     * a new worker for the device waits (vn_ending_busy). */
    release_port(e);
    if (e->timer != 0) {
        g_source_remove(e->timer); /* nothing left to signal */
        e->timer = 0;
    }
    if (e->exit_watch != 0) {
        g_source_remove(e->exit_watch);
        e->exit_watch = 0;
    }
    e->giving_back = g_cancellable_new();
    task = g_task_new(NULL, e->giving_back, on_given_back, e);
    kept = g_new0(char *, 3);
    kept[0] = g_strdup(e->kept_bdf);
    kept[1] = g_strdup(e->kept_path);
    g_task_set_task_data(task, kept, (GDestroyNotify)g_strfreev);
    g_task_run_in_thread(task, give_back_thread);
    g_object_unref(task);
}

static gboolean on_gone_already(gpointer data)
{
    VnEnding *e = data;

    e->timer = 0;
    gone(e);
    return G_SOURCE_REMOVE;
}

static gboolean on_worker_exit(int fd, GIOCondition cond, gpointer data)
{
    VnEnding *e = data;

    e->exit_watch = 0;
    gone(e);
    return G_SOURCE_REMOVE;
}

static void terminate(VnEnding *e)
{
    g_clear_pointer(&e->call, vn_wctl_call_cancel);
    send_signal(e, SIGTERM);
    e->phase = ENDING_TERM;
    e->phase_end_us = g_get_monotonic_time() + (gint64)e->term_wait_ms * 1000;
}

static void on_client_answer(char *answer, const GError *error, void *opaque)
{
    VnEnding *e = opaque;
    g_autofree char *text = answer;

    e->call = NULL;
    if (text == NULL) {
        g_info("worker for %s: %s", e->what, error->message);
        return; /* busy: asked again on the next look */
    }
    if (vn_spawn_client_of(text) == VN_CLIENT_GONE) {
        terminate(e); /* QEMU let go: at once */
    }
}

/* Is QEMU still connected?  No one listening on the channel serves a QEMU
 * either; a full backlog is a busy worker. */
static void ask_client(VnEnding *e)
{
    g_autoptr(GError) error = NULL;

    if (e->channel_path == NULL) {
        terminate(e);
        return;
    }
    e->call = vn_wctl_call_async(e->channel_path, "stats", VN_SPAWN_STATS_TIMEOUT_MS,
                                 VN_SPAWN_MAX_STATS, on_client_answer, e, &error);
    if (e->call == NULL) {
        g_info("worker for %s: %s", e->what, error->message);
        if (!g_error_matches(error, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK)) {
            terminate(e);
        }
    }
}

static gboolean on_look(gpointer data)
{
    VnEnding *e = data;
    VnDaemon *d = e->d;
    bool late = g_get_monotonic_time() >= e->phase_end_us;

    switch (e->phase) {
    case ENDING_CLIENT:
        if (late) {
            terminate(e);
        } else if (e->call == NULL) {
            ask_client(e);
        }
        break;
    case ENDING_TERM:
        if (late) {
            vn_log(G_LOG_LEVEL_WARNING, d->conf->node, e->what, NULL, 0,
                   "node %s: worker for %s (pid %d) ignored SIGTERM; killing it", d->conf->node,
                   e->what, e->pid);
            send_signal(e, SIGKILL);
            e->phase = ENDING_KILL;
            e->phase_end_us = g_get_monotonic_time() + VN_ENDING_KILL_WAIT_MS * 1000;
        }
        break;
    case ENDING_KILL:
        if (late) {
            vn_log(G_LOG_LEVEL_WARNING, d->conf->node, e->what, NULL, 0,
                   "node %s: worker for %s (pid %d) survives SIGKILL; leaving it", d->conf->node,
                   e->what, e->pid);
            e->timer = 0;
            g_ptr_array_remove(d->endings, e);
            return G_SOURCE_REMOVE;
        }
        break;
    }
    return G_SOURCE_CONTINUE;
}

VnEnding *vn_ending_start(VnDaemon *d, const char *what, GPid pid, bool child, VnPort *port,
                          char *channel_path, char *socket_path, unsigned client_wait_ms,
                          unsigned term_wait_ms)
{
    VnEnding *e = g_new0(VnEnding, 1);

    *e = (VnEnding){ .d = d,
                     .what = g_strdup(what),
                     .pid = pid,
                     .port = port,
                     .channel_path = channel_path,
                     .socket_path = socket_path,
                     .term_wait_ms = term_wait_ms,
                     .pidfd = -1 };
    e->child = child;
    g_ptr_array_add(d->endings, e);
    e->pidfd = pid > 0 ? pidfd_open(pid, 0) : -1;
    if (e->pidfd < 0) {
        /* ESRCH: gone already (or no worker at all): from the loop, after our caller's
         * vn_ending_give_back(). */
        e->timer = g_idle_add(on_gone_already, e);
        return e;
    }
    /* Readable once it exits: at once, for our children and adopted ones. */
    e->exit_watch = g_unix_fd_add(e->pidfd, G_IO_IN, on_worker_exit, e);
    e->timer = g_timeout_add(VN_ENDING_POLL_MS, on_look, e);
    if (client_wait_ms > 0) {
        e->phase = ENDING_CLIENT;
        e->phase_end_us = g_get_monotonic_time() + (gint64)client_wait_ms * 1000;
        ask_client(e);
    } else {
        terminate(e);
    }
    return e;
}

void vn_ending_give_back(VnEnding *e, const char *bdf, const char *kept_path)
{
    g_free(e->kept_bdf);
    g_free(e->kept_path);
    e->kept_bdf = g_strdup(bdf);
    e->kept_path = g_strdup(kept_path);
}

bool vn_ending_busy(VnDaemon *d, const char *what)
{
    for (guint i = 0; i < d->endings->len; i++) {
        if (strcmp(((VnEnding *)d->endings->pdata[i])->what, what) == 0) {
            return true;
        }
    }
    return false;
}

GPtrArray *vn_endings_new(void)
{
    return g_ptr_array_new_with_free_func(ending_free);
}

void vn_endings_free(GPtrArray *endings)
{
    if (endings == NULL) {
        return;
    }
    /* The daemon stops: no one will watch them, so none is left waiting
     * for its QEMU without having been told to go. */
    for (guint i = 0; i < endings->len; i++) {
        VnEnding *e = endings->pdata[i];

        if (e->phase == ENDING_CLIENT) {
            send_signal(e, SIGTERM);
        }
    }
    g_ptr_array_unref(endings);
}
