/*
 * Lender workers: each lent device's backend (lending/lender.h) runs in a
 * vfio-ntb-lender process, so that the daemon's loop never waits on a
 * device and a restart of vfio-ntbd leaves every borrower's data path
 * running: the device server keeps its one client, DMA mappings and
 * interrupt routes.  The daemon starts one when it lends a device, ends it
 * (fencing the device) when it stops lending it, starts it again when it
 * exits, and after a restart adopts the one its state file names.  The
 * worker speaks through its port (port.h): the lease holder's requests go
 * to it there, and the end of a lease reaches it as its holder's link
 * going down.  These are the lend_* members of vn_spawn_ops.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "lenders.h"

#include "conf.h"
#include "devserver.h"
#include "ending.h"
#include "fence.h"
#include "leases.h"
#include "port.h"
#include "spawn-procs.h"
#include "state.h"
#include "stopworkers.h"

#include "common/wctl.h"

#include <errno.h>
#include <gio/gio.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A worker that exited is started again after this. */
#define VN_LENDERS_RESPAWN_MS 1000
/* How often an adopted worker (not our child) is looked for. */
#define VN_LENDERS_ADOPTED_CHECK_MS 1000

typedef struct LendWatch {
    VnDaemon *d;
    VnLocalDevice *ld;
} LendWatch;

static gboolean on_respawn(gpointer data)
{
    LendWatch *lw = data;
    g_autoptr(GError) error = NULL;

    lw->ld->respawn_timer = 0;
    if (!vn_lenders_start(lw->d, lw->ld, &error)) {
        vn_log(G_LOG_LEVEL_WARNING, lw->d->conf->node, lw->ld->conf->name, NULL, 0,
               "node %s: %s: %s", lw->d->conf->node, lw->ld->conf->name, error->message);
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_REMOVE;
}

/* A new worker for @ld in VN_LENDERS_RESPAWN_MS. */
static void respawn_later(VnDaemon *d, VnLocalDevice *ld)
{
    LendWatch *again = g_new0(LendWatch, 1);

    *again = (LendWatch){ d, ld };
    ld->respawn_timer =
        g_timeout_add_full(G_PRIORITY_DEFAULT, VN_LENDERS_RESPAWN_MS, on_respawn, again, g_free);
    /* @again is the GLib source's now: its destroy notify (g_free) frees it. */
    /* cppcheck-suppress memleak */
}

/*
 * @ld's worker is gone (@how).  Its device server saw its client go (and quiesced the
 * device), VFIO released its device; what the daemon kept for it goes now (the fence), and
 * the next worker starts from nothing.  So the device the holder had is gone too: the
 * holder is told as of a lost device server, and the next worker's device is presented to
 * its VM anew (devserver.c).  The holder's requests meanwhile wait in the port, and the
 * next worker refuses them until the holder attaches again.
 */
static void worker_gone(VnDaemon *d, VnLocalDevice *ld, GPid pid, const char *how)
{
    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, ld->conf->name, NULL, 0,
           "node %s: the lender worker of %s (pid %d) %s; starting another in %d ms", d->conf->node,
           ld->conf->name, pid, how, VN_LENDERS_RESPAWN_MS);
    vn_fence_worker_died(d, ld);
    if (vn_lease_lent(ld->lease)) {
        vn_devserver_worker_gone(ld);
    }
    respawn_later(d, ld);
}

static void on_worker_exit(GPid pid, gint status, gpointer data)
{
    LendWatch *lw = data;
    VnLocalDevice *ld = lw->ld;
    g_autofree char *how = NULL;

    g_spawn_close_pid(pid);
    if (ld->worker_pid != pid) {
        return;
    }
    ld->worker_pid = 0;
    ld->child_watch = 0;
    how = WIFSIGNALED(status) ? g_strdup_printf("was killed (signal %d)", WTERMSIG(status))
                              : g_strdup_printf("exited (status %d)", WEXITSTATUS(status));
    worker_gone(lw->d, ld, pid, how);
}

/* A child's exit is heard from its watch; a worker adopted after a restart is not ours to
 * reap: its port closing says it may have died, and its pidfd that it @exited (one that
 * died before it reconnected to our port; without pidfds, a look every
 * VN_LENDERS_ADOPTED_CHECK_MS at whether it is there). */
static bool adopted_died(VnLocalDevice *ld, const char *how, bool exited)
{
    GPid pid = ld->worker_pid;

    if (ld->child_watch != 0 || pid <= 0 ||
        (!exited && vn_spawn_adopted_alive(ld->port, pid, VN_LENDERS_BINARY))) {
        return false;
    }
    ld->worker_pid = 0;
    worker_gone(ld->d, ld, pid, how);
    return true;
}

static void on_port_gone(void *opaque)
{
    adopted_died(opaque, "is gone (its port closed)", false);
}

static gboolean on_adopted_check(gpointer data)
{
    VnLocalDevice *ld = data;

    if (ld->worker_pid <= 0 || ld->child_watch != 0 || adopted_died(ld, "is gone", false)) {
        ld->adopted_watch = 0;
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

static gboolean on_adopted_exit(gpointer data)
{
    VnLocalDevice *ld = data;

    ld->adopted_watch = 0; /* this source ends with this call */
    adopted_died(ld, "is gone (it exited)", true);
    return G_SOURCE_REMOVE;
}

/* What a managed function's worker keeps of it (lending/pcibind.h: vn_pcibind_keep). */
static char *managed_state_path(VnDaemon *d, VnLocalDevice *ld)
{
    return g_strdup_printf("%s/%s%s%s", d->conf->run_dir, VN_LENDERS_KEPT_PREFIX, ld->conf->name,
                           VN_LENDERS_KEPT_SUFFIX);
}

bool vn_lenders_start(VnDaemon *d, VnLocalDevice *ld, GError **error)
{
    g_autofree char *bin = vn_spawn_binary(VN_LENDERS_BINARY, error);
    g_autoptr(GPtrArray) argv = g_ptr_array_new_with_free_func(g_free);
    int conn, target = VN_SPAWN_PORT_FD;
    LendWatch *lw;
    gboolean ok;

    if (bin == NULL) {
        return false;
    }
    g_ptr_array_add(argv, g_strdup(bin));
    g_ptr_array_add(argv, g_strdup_printf("--port=%s", ld->port_path));
    g_ptr_array_add(argv, g_strdup_printf("--port-fd=%d", VN_SPAWN_PORT_FD));
    g_ptr_array_add(argv, g_strdup_printf("--node=%s", d->conf->node));
    g_ptr_array_add(argv, g_strdup_printf("--device=%s", ld->conf->name));
    g_ptr_array_add(argv, g_strdup_printf("--backend=%s", vn_conf_lend_backend(ld->conf)));
    g_ptr_array_add(argv, g_strdup_printf("--device-at=%s", vn_conf_lend_where(ld->conf)));
    g_ptr_array_add(argv, g_strdup_printf("--control=%s", ld->channel_path));
    if (d->conf->worker_user != NULL) {
        g_ptr_array_add(argv, g_strdup_printf("--run-as=%u:%u", (unsigned)d->conf->worker_uid,
                                              (unsigned)d->conf->worker_gid));
    }
    if (ld->conf->managed) {
        /* The worker binds it (a driver's unbind may take its time) and
         * keeps the driver it had there, for when it is unlent. */
        g_autofree char *kept = managed_state_path(d, ld);

        g_ptr_array_add(argv, g_strdup_printf("--managed-state=%s", kept));
    }
    g_ptr_array_add(argv, NULL);
    conn = vn_port_pair(ld->port, error);
    if (conn < 0) {
        return false;
    }
    ok = g_spawn_async_with_pipes_and_fds(NULL, (const char *const *)argv->pdata, NULL,
                                          G_SPAWN_DO_NOT_REAP_CHILD, NULL, NULL, -1, -1, -1, &conn,
                                          &target, 1, &ld->worker_pid, NULL, NULL, NULL, error);
    close(conn);
    if (!ok) {
        g_prefix_error(error, "starting %s: ", VN_LENDERS_BINARY);
        return false;
    }
    vn_port_set_worker(ld->port, ld->worker_pid);
    vn_port_on_gone(ld->port, on_port_gone, ld);
    ld->worker_server_gen = 0; /* a new worker counts from 0 */
    lw = g_new0(LendWatch, 1);
    *lw = (LendWatch){ d, ld };
    ld->child_watch =
        g_child_watch_add_full(G_PRIORITY_DEFAULT, ld->worker_pid, on_worker_exit, lw, g_free);
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, NULL, 0,
           "node %s: lender worker for %s (pid %d) started", d->conf->node, ld->conf->name,
           ld->worker_pid);
    /* In the state file at once: a daemon that dies now leaves a worker the
     * next one adopts, not a stray it has to stop (strays.c). */
    vn_state_save_or_report(d);
    /* @lw is the GLib source's now: its destroy notify (g_free) frees it. */
    /* cppcheck-suppress memleak */
    return true;
}

void vn_lenders_stop(VnDaemon *d, VnLocalDevice *ld)
{
    bool child = ld->child_watch != 0; /* else adopted after a restart */

    if (ld->respawn_timer != 0) {
        g_source_remove(ld->respawn_timer);
        ld->respawn_timer = 0;
    }
    if (ld->adopted_watch != 0) {
        g_source_remove(ld->adopted_watch);
        ld->adopted_watch = 0;
    }
    if (ld->child_watch != 0) {
        g_source_remove(ld->child_watch);
        ld->child_watch = 0;
    }
    if (ld->worker_pid > 0 || ld->conf->managed) {
        /* It fences the device on SIGTERM, through a device server that may
         * take its time: in the background, with its port.  A managed function goes back
         * to its driver after (with no worker running, at once). */
        VnEnding *e =
            vn_ending_start(d, ld->conf->name, ld->worker_pid, child, g_steal_pointer(&ld->port),
                            g_strdup(ld->channel_path), NULL, 0, VN_SPAWN_STOP_TIMEOUT_MS);

        if (ld->conf->managed) {
            g_autofree char *kept = managed_state_path(d, ld);

            vn_ending_give_back(e, ld->conf->pci, kept);
        }
        ld->worker_pid = 0;
    } else if (ld->channel_path != NULL) {
        unlink(ld->channel_path);
    }
}

bool vn_lenders_adopt(VnDaemon *d, VnLocalDevice *ld, const char *secret)
{
    /* It reconnects to its port, open again already, within 100 ms: it alone, with its
     * secret. */
    if (!vn_spawn_alive(ld->worker_pid, VN_LENDERS_BINARY) ||
        !vn_port_adopt(ld->port, ld->worker_pid, secret)) {
        ld->worker_pid = 0;
        return false;
    }
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, ld->conf->name, NULL, 0,
           "node %s: adopted lender worker (pid %d) of %s", d->conf->node, ld->worker_pid,
           ld->conf->name);
    vn_port_on_gone(ld->port, on_port_gone, ld);
    if (ld->adopted_watch == 0) {
        ld->adopted_watch = vn_spawn_watch_exit(ld->worker_pid, on_adopted_exit, ld, NULL);
    }
    if (ld->adopted_watch == 0) {
        ld->adopted_watch = g_timeout_add(VN_LENDERS_ADOPTED_CHECK_MS, on_adopted_check, ld);
    }
    return true;
}

bool vn_lenders_kill(VnDaemon *d, VnLocalDevice *ld)
{
    bool child = ld->child_watch != 0;

    if (ld->worker_pid > 0) {
        kill(ld->worker_pid, SIGKILL);
    }
    if (!child) {
        /* Adopted after a restart: not ours to reap, so no exit to hear of; SIGKILL is not
         * caught, and its files close as it exits. */
        ld->worker_pid = 0;
        respawn_later(d, ld);
        return false;
    }
    return true;
}

VnWctlCall *vn_lenders_stats(VnDaemon *d, VnLocalDevice *ld, VnWctlDone done, void *opaque)
{
    return vn_spawn_ask(ld->worker_pid, ld->channel_path, ld->conf->name, "stats", done, opaque);
}
