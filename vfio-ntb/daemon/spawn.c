/*
 * Borrower workers: each attached device's vfio-user server runs in a
 * vfio-ntb-borrower process, so that a restart of vfio-ntbd (a crash, an
 * upgrade) leaves running VMs their devices; QEMU cannot reconnect to a
 * vfio-user server.  The daemon starts a worker on attach, stops it on
 * detach (SIGTERM), asks it for counters and unplugs over its control
 * channel (common/wctl.h), and after a restart adopts the workers its
 * state file names that still run.
 *
 * The worker is not a fabric node: it speaks through its port (port.h,
 * fabric/host.h), as this host, the lease holder, whom the lender lets
 * reach the device.  The port outlives the worker's connection, and a
 * restarted daemon opens it again at the path its state file names.
 * This is vn_spawn_ops, the daemon's VnWorkerOps.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "spawn.h"
#include "p2p.h"

#include "daemon.h"
#include "devices.h"
#include "ending.h"
#include "lenders.h"
#include "port.h"
#include "spare.h"
#include "spawn-procs.h"
#include "state.h"
#include "strays.h"
#include "takeover.h"

#include "common/assign.h"
#include "common/wctl.h"
#include "lending/proto.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <fcntl.h>
#include <glib-unix.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A worker has this long to borrow the device's data path and listen. */
#define VN_SPAWN_START_TIMEOUT_MS 10000
/* How long a stop waits for QEMU to close a just-unplugged device's socket. */
#define VN_SPAWN_CLIENT_GONE_MS 1500
/* A start that waits for the device's last worker looks this often. */
#define VN_SPAWN_ENDING_POLL_MS 1
/* The worker's end of its status pipe, and how much of its reason we read. */
#define VN_SPAWN_STATUS_FD 4
#define VN_SPAWN_MAX_WHY 400
/* A spare is given them where a spawn puts them (common/assign.h). */
G_STATIC_ASSERT(VN_SPAWN_PORT_FD == VN_ASSIGN_FIRST_FD);
G_STATIC_ASSERT(VN_SPAWN_STATUS_FD == VN_ASSIGN_FIRST_FD + 1);

typedef struct ChildWatch {
    VnDaemon *d;
    VnBorrowed *b;
} ChildWatch;

static void on_detached(void *opaque, VnFabricMsg *reply, int err)
{
    /* An error only says the device was fenced already. */
}

/*
 * The worker is gone: what it sent before it went is relayed, its port
 * closed, and the lender told to fence the device (a worker that crashed
 * could not say so itself).
 */
static void worker_gone(VnDaemon *d, VnBorrowed *b)
{
    g_autofree char *json = vn_proto_device_only_to_json(b->name);

    /* Its files: one that served as the worker user could not remove them from our
     * directory. */
    if (b->socket != NULL) {
        unlink(b->socket);
    }
    if (b->channel_path != NULL) {
        unlink(b->channel_path);
    }
    if (b->port != NULL) {
        vn_port_drain(b->port);
        g_clear_pointer(&b->port, vn_port_free_unlinked);
    }
    if (vn_fabric_request(d->fab, b->lender, VN_PROTO_DETACH, json, NULL, 0, on_detached, NULL) <
        0) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, b->device, b->lender, b->lease,
               "node %s: cannot tell %s that %s is detached; its lease's end will", d->conf->node,
               b->lender, b->device);
    }
}

static GPtrArray *worker_argv(VnDaemon *d, VnBorrowed *b, const char *bin, bool status_fd);
static void watch_child(VnDaemon *d, VnBorrowed *b);
static void start_exited(void *start);

/* Another worker serves the dead one's QEMU (takeover.c), or not. */
static bool replaced(VnDaemon *d, VnBorrowed *b, int status)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *bin = vn_spawn_binary(VN_SPAWN_BINARY, &error);
    /* No status pipe: nobody waits on its answer; why it could not is in our log. */
    g_autoptr(GPtrArray) argv = bin != NULL ? worker_argv(d, b, bin, false) : NULL;

    if (argv == NULL || !vn_takeover_start(d, b, status, argv)) {
        return false;
    }
    watch_child(d, b);
    return true;
}

static void on_child_exit(GPid pid, gint status, gpointer data)
{
    ChildWatch *cw = data;
    VnBorrowed *b = cw->b;

    g_spawn_close_pid(pid);
    if (b->worker_pid != pid) {
        return;
    }
    b->worker_pid = 0;
    b->child_watch = 0;
    if (b->starting && b->start_data != NULL) {
        /* It gave up before it served: the attach that waits is answered with why. */
        worker_gone(cw->d, b);
        start_exited(b->start_data);
        return;
    }
    if (replaced(cw->d, b, status)) {
        return;
    }
    vn_log(G_LOG_LEVEL_MESSAGE, cw->d->conf->node, b->device, b->lender, b->lease,
           "borrower worker for %s (pid %d) %s %d; %s is detached", b->device, pid,
           WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), b->device);
    g_clear_pointer(&b->domain, g_free);
    worker_gone(cw->d, b);
}

/* How often an adopted worker (not our child: no exit to hear of) is looked at. */
#define VN_SPAWN_ADOPTED_CHECK_MS 1000

typedef struct Adopted {
    VnDaemon *d;
    VnBorrowed *b;
} Adopted;

/* No more looks at an adopted worker (it died, or it is stopped). */
static void adopted_unwatch(VnBorrowed *b)
{
    if (b->port != NULL) {
        vn_port_on_gone(b->port, NULL, NULL);
    }
    if (b->adopted_watch != 0) {
        g_source_remove(b->adopted_watch); /* frees its Adopted */
        b->adopted_watch = 0;
    }
}

/* An adopted worker is gone when it @exited (its pidfd said so) or its pid is no worker of
 * ours any more: replaced under its QEMU when it can be, as a child is. */
static bool adopted_died(Adopted *a, bool exited)
{
    VnBorrowed *b = a->b;
    GPid pid = b->worker_pid;
    VnDaemon *d;

    if (b->child_watch != 0 || pid <= 0 ||
        (!exited && vn_spawn_adopted_alive(b->port, pid, VN_SPAWN_BINARY))) {
        return false;
    }
    b->worker_pid = 0;
    d = a->d;
    adopted_unwatch(b); /* @a is gone now */
    /* Not our child: how it ended is unknown, and it did not end on purpose (it would have
     * forgotten what it kept). */
    if (replaced(d, b, W_EXITCODE(0, SIGKILL))) {
        return true;
    }
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, b->lender, b->lease,
           "adopted borrower worker for %s (pid %d) is gone; %s is detached", b->device, pid,
           b->device);
    g_clear_pointer(&b->domain, g_free);
    worker_gone(d, b);
    return true;
}

/* Its port closed: at once, not at the next look. */
static void on_adopted_port_gone(void *opaque)
{
    adopted_died(opaque, false);
}

/* Without a pidfd: a look every VN_SPAWN_ADOPTED_CHECK_MS. */
static gboolean on_adopted_check(gpointer data)
{
    Adopted *a = data;

    adopted_died(a, false); /* removes this source (and frees @a) when it died */
    return G_SOURCE_CONTINUE;
}

static gboolean on_adopted_exit(gpointer data)
{
    Adopted *a = data;

    if (!adopted_died(a, true)) { /* else it removed this source (and frees @a) */
        a->b->adopted_watch = 0;  /* no worker of ours any more: this source ends */
    }
    return G_SOURCE_REMOVE;
}

static void spawn_stop(VnDaemon *d, VnBorrowed *b);

/*
 * A start in progress: open the worker's port, spawn, then wait for the worker's
 * "ready" on its status pipe (or its exit) until VN_SPAWN_START_TIMEOUT_MS.  The
 * daemon's loop serves everything else meanwhile -- the worker's own ATTACH among
 * it, through its port.
 */
typedef struct Start {
    VnDaemon *d;
    VnBorrowed *b; /* NULL once finished or cancelled */
    VnWorkerStarted done;
    void *opaque;
    guint timer;        /* waiting for the device's last worker, then the start's deadline */
    guint status_watch; /* on why_fd */
    int why_fd;         /* the worker's --status-fd: "ready", or why it gave up */
    char *said;         /* why it gave up, when read before its exit */
} Start;

/* @done runs once; the Start goes when nothing refers to it any more. */
static void start_finish(Start *st, GError *error)
{
    VnBorrowed *b = st->b;
    VnWorkerStarted done = st->done;

    if (st->timer != 0) {
        g_source_remove(st->timer);
        st->timer = 0;
    }
    if (st->status_watch != 0) {
        g_source_remove(st->status_watch);
        st->status_watch = 0;
    }
    g_clear_pointer(&st->said, g_free);
    if (b != NULL) {
        b->starting = false;
        b->start_cancel = NULL;
        b->start_data = NULL;
    }
    st->b = NULL;
    st->done = NULL;
    vn_util_close_fd(&st->why_fd);
    if (done != NULL) {
        done(st->d, b, error, st->opaque);
    }
    g_free(st);
}

static void start_fail(Start *st, GQuark domain, int code, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static void start_fail(Start *st, GQuark domain, int code, const char *fmt, ...)
{
    g_autoptr(GError) error = NULL;
    va_list ap;

    va_start(ap, fmt);
    error = g_error_new_valist(domain, code, fmt, ap);
    va_end(ap);
    start_finish(st, error);
}

/* @b is being freed (returned) while its worker starts. */
static void start_cancel(void *data)
{
    Start *st = data;
    VnBorrowed *b = st->b;

    if (b != NULL && b->worker_pid > 0) {
        spawn_stop(st->d, b);
    }
    st->b = NULL;
    start_fail(st, G_IO_ERROR, G_IO_ERROR_CANCELLED,
               "the device was given back while its worker started");
}

/* A line of the worker's status pipe (VN_SPAWN_MAX_WHY at most), printable (the worker is a
 * peer too); NULL when there is none (yet). */
static char *status_line(Start *st)
{
    char buf[VN_SPAWN_MAX_WHY + 1];
    ssize_t n = st->why_fd >= 0 ? read(st->why_fd, buf, VN_SPAWN_MAX_WHY) : -1;

    if (n <= 0) {
        return NULL;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    for (char *c = buf; *c != '\0'; c++) {
        *c = g_ascii_isprint(*c) ? *c : '?';
    }
    return buf[0] != '\0' ? g_strdup(buf) : NULL;
}

/* The socket QEMU connects to is the QEMU user's alone ([node] qemu-user): the worker made
 * it 0600 as root, before it became the worker user. */
static bool socket_for_qemu_user(VnDaemon *d, VnBorrowed *b, GError **error)
{
    if (d->conf->qemu_user != NULL && fchownat(AT_FDCWD, b->socket, d->conf->qemu_uid,
                                               d->conf->qemu_gid, AT_SYMLINK_NOFOLLOW) < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e),
                    "cannot give %s's socket %s to the QEMU user %s: %s", b->device, b->socket,
                    d->conf->qemu_user, g_strerror(e));
        return false;
    }
    return true;
}

/* This host attaches devices: one worker is kept started for the next (spare.h).  A spare
 * that cannot start is no error: the next attach starts its worker itself. */
static void spare_fill(VnDaemon *d)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *bin = vn_spawn_binary(VN_SPAWN_BINARY, &error);

    if (d->spare == NULL) {
        d->spare = vn_spare_new(d->conf->node, d->conf->run_dir);
    }
    if (bin == NULL || !vn_spare_fill(d->spare, bin, &error)) {
        g_info("node %s: no spare borrower worker: %s", d->conf->node, error->message);
    }
}

/* The worker serves: QEMU's socket listens. */
static void start_ready(Start *st)
{
    VnDaemon *d = st->d;
    VnBorrowed *b = st->b;
    g_autoptr(GError) error = NULL;

    if (!g_file_test(b->socket, G_FILE_TEST_EXISTS)) {
        spawn_stop(st->d, b);
        start_fail(st, G_IO_ERROR, G_IO_ERROR_FAILED,
                   "the borrower worker for %s said it serves, but %s is not there", b->device,
                   b->socket);
        return;
    }
    if (!socket_for_qemu_user(st->d, b, &error)) {
        spawn_stop(st->d, b);
        start_fail(st, error->domain, error->code, "%s", error->message);
        return;
    }
    vn_log(G_LOG_LEVEL_MESSAGE, st->d->conf->node, b->device, b->lender, b->lease,
           "node %s: %s served on %s by worker %s (pid %d)", st->d->conf->node, b->device,
           b->socket, b->worker_name, b->worker_pid);
    start_finish(st, NULL);
    /* After the answer: the next attach finds a worker started. */
    spare_fill(d);
}

/* The worker's status pipe: "ready" once QEMU's socket listens, so the attach is answered
 * then and nothing polls; or why it gave up, then its exit (on_child_exit) ends the start. */
static gboolean on_start_status(gint fd, GIOCondition cond, gpointer data)
{
    Start *st = data;
    g_autofree char *line = status_line(st);

    if (line == NULL && (cond & (G_IO_HUP | G_IO_ERR)) == 0) {
        return G_SOURCE_CONTINUE; /* woken for nothing */
    }
    st->status_watch = 0;
    if (g_strcmp0(line, "ready") == 0) {
        start_ready(st);
    } else {
        g_free(st->said);
        st->said = g_steal_pointer(&line);
    }
    return G_SOURCE_REMOVE;
}

/* The worker exited before it said it serves. */
static void start_exited(void *start)
{
    Start *st = start;
    g_autofree char *why = st->said != NULL ? g_strdup(st->said) : status_line(st);

    start_fail(st, G_IO_ERROR, G_IO_ERROR_FAILED, "the borrower worker for %s exited: %s",
               st->b->device, why != NULL ? why : "its messages are in this daemon's log");
}

static gboolean on_start_timeout(gpointer data)
{
    Start *st = data;

    st->timer = 0;
    spawn_stop(st->d, st->b);
    start_fail(st, G_IO_ERROR, G_IO_ERROR_TIMED_OUT,
               "the borrower worker for %s did not come up in %d ms", st->b->device,
               VN_SPAWN_START_TIMEOUT_MS);
    return G_SOURCE_REMOVE;
}

/* The worker's arguments, NULL-terminated; with @status_fd, where it says why it gave up. */
static GPtrArray *worker_argv(VnDaemon *d, VnBorrowed *b, const char *bin, bool status_fd)
{
    GPtrArray *argv = g_ptr_array_new_with_free_func(g_free);

    g_ptr_array_add(argv, g_strdup(bin));
    g_ptr_array_add(argv, g_strdup_printf("--port=%s", b->port_path));
    g_ptr_array_add(argv, g_strdup_printf("--port-fd=%d", VN_SPAWN_PORT_FD));
    if (d->conf->worker_user != NULL) {
        g_ptr_array_add(argv, g_strdup_printf("--run-as=%u:%u", (unsigned)d->conf->worker_uid,
                                              (unsigned)d->conf->worker_gid));
    }
    g_ptr_array_add(argv, g_strdup_printf("--node=%s", d->conf->node));
    g_ptr_array_add(argv, g_strdup_printf("--lender=%s", b->lender));
    g_ptr_array_add(argv, g_strdup_printf("--device=%s", b->name));
    g_ptr_array_add(argv, g_strdup_printf("--socket=%s", b->socket));
    g_ptr_array_add(argv, g_strdup_printf("--irq-mode=%s", vn_irq_mode_to_string(b->irq_mode)));
    if (d->conf->dma_unmap_linger_ms >= 0) {
        g_ptr_array_add(argv,
                        g_strdup_printf("--dma-unmap-linger-ms=%d", d->conf->dma_unmap_linger_ms));
    }
    g_ptr_array_add(argv, g_strdup_printf("--control=%s", b->channel_path));
    if (status_fd) {
        g_ptr_array_add(argv, g_strdup_printf("--status-fd=%d", VN_SPAWN_STATUS_FD));
    }
    g_ptr_array_add(argv, NULL);
    return argv;
}

static void watch_child(VnDaemon *d, VnBorrowed *b)
{
    ChildWatch *cw = g_new0(ChildWatch, 1);

    *cw = (ChildWatch){ d, b };
    b->child_watch =
        g_child_watch_add_full(G_PRIORITY_DEFAULT, b->worker_pid, on_child_exit, cw, g_free);
    /* @cw is the GLib source's now: its destroy notify (g_free) frees it. */
    /* cppcheck-suppress memleak */
}

static void start_spawn(Start *st)
{
    VnDaemon *d = st->d;
    VnBorrowed *b = st->b;
    g_autofree char *bin = NULL;
    g_autoptr(GPtrArray) argv = NULL;
    g_autoptr(GError) error = NULL;
    int pipefd[2] = { -1, -1 }, source[2], target[2] = { VN_SPAWN_STATUS_FD, VN_SPAWN_PORT_FD };
    int conn;
    gboolean ok;

    bin = vn_spawn_binary(VN_SPAWN_BINARY, &error);
    if (bin == NULL) {
        start_finish(st, error);
        return;
    }
    argv = worker_argv(d, b, bin, true);
    unlink(b->socket);
    if (!g_unix_open_pipe(pipefd, FD_CLOEXEC, &error) ||
        !g_unix_set_fd_nonblocking(pipefd[0], TRUE, &error)) {
        g_prefix_error(&error, "starting %s: ", VN_SPAWN_BINARY);
        vn_util_close_fds(pipefd, 2);
        start_finish(st, error);
        return;
    }
    st->why_fd = pipefd[0];
    conn = vn_port_pair(b->port, &error);
    if (conn < 0) {
        vn_util_close_fd(&pipefd[1]);
        start_finish(st, error);
        return;
    }
    source[0] = pipefd[1];
    source[1] = conn;
    /* The spare, when one waits: its exec is done (spare.h).  Its fds by number: the port's
     * connection (3), then the status pipe (4). */
    b->worker_pid = d->spare != NULL ? vn_spare_give(d->spare, (const char *const *)argv->pdata,
                                                     (const int[]){ conn, pipefd[1] }, 2)
                                     : 0;
    ok = b->worker_pid > 0 ||
         g_spawn_async_with_pipes_and_fds(NULL, (const char *const *)argv->pdata, NULL,
                                          G_SPAWN_DO_NOT_REAP_CHILD, NULL, NULL, -1, -1, -1, source,
                                          target, 2, &b->worker_pid, NULL, NULL, NULL, &error);
    vn_util_close_fd(&pipefd[1]);
    close(conn);
    if (!ok) {
        g_prefix_error(&error, "starting %s: ", VN_SPAWN_BINARY);
        start_finish(st, error);
        return;
    }
    vn_port_set_worker(b->port, b->worker_pid);
    /* Recorded before it runs far: a daemon that dies now leaves a worker
     * the next one adopts, not a stray it has to stop (strays.c). */
    vn_state_save_or_report(d);
    watch_child(d, b);
    st->status_watch =
        g_unix_fd_add(st->why_fd, G_IO_IN | G_IO_HUP | G_IO_ERR, on_start_status, st);
    st->timer = g_timeout_add(VN_SPAWN_START_TIMEOUT_MS, on_start_timeout, st);
}

/* Its port, then the process. */
static void start_open(Start *st)
{
    VnBorrowed *b = st->b;
    g_autoptr(GError) error = NULL;

    g_clear_pointer(&b->port, vn_port_free_unlinked);
    b->port = vn_port_new(st->d->fab, b->port_path, b->lender, b->name, false, NULL, &error);
    if (b->port != NULL && !vn_spawn_port_for_worker_user(st->d, b->port, &error)) {
        g_clear_pointer(&b->port, vn_port_free_unlinked);
    }
    if (b->port == NULL) {
        start_finish(st, error);
        return;
    }
    vn_p2p_watch(st->d, b);
    start_spawn(st);
}

/* The device's last worker still ends (bounded): it shares this one's port
 * path and lease. */
static gboolean on_start_wait(gpointer data)
{
    Start *st = data;

    if (vn_ending_busy(st->d, st->b->device)) {
        return G_SOURCE_CONTINUE;
    }
    st->timer = 0;
    start_open(st);
    return G_SOURCE_REMOVE;
}

static void spawn_start(VnDaemon *d, VnBorrowed *b, VnWorkerStarted done, void *opaque)
{
    Start *st = g_new0(Start, 1);

    *st = (Start){ .d = d, .b = b, .done = done, .opaque = opaque, .why_fd = -1 };
    b->starting = true;
    b->start_cancel = start_cancel;
    b->start_data = st;
    /* Unique per lease; short enough for socket paths. */
    g_free(b->worker_name);
    b->worker_name = g_strdup_printf("%.18s-w%" G_GUINT64_FORMAT, d->conf->node,
                                     (guint64)(b->lease % 1000000000u));
    g_free(b->channel_path);
    b->channel_path = g_strdup_printf("%s/%s-channel.sock", d->conf->run_dir, b->worker_name);
    g_free(b->port_path);
    b->port_path = g_strdup_printf("%s/%s-port.sock", d->conf->run_dir, b->worker_name);
    {
        g_autoptr(GError) error = NULL;

        if (!vn_spawn_run_dir(d, &error)) {
            start_finish(st, error);
            return;
        }
    }
    if (vn_ending_busy(d, b->device)) {
        vn_log(G_LOG_LEVEL_INFO, d->conf->node, b->device, b->lender, b->lease,
               "node %s: %s waits for its last worker to be gone", d->conf->node, b->device);
        st->timer = g_timeout_add(VN_SPAWN_ENDING_POLL_MS, on_start_wait, st);
        return;
    }
    start_open(st);
}

static void spawn_stop(VnDaemon *d, VnBorrowed *b)
{
    if (b->worker_pid <= 0) {
        return;
    }
    bool child = b->child_watch != 0; /* else adopted after a restart */

    g_clear_pointer(&b->client_call, vn_wctl_call_cancel);
    b->client_state = VN_CLIENT_UNKNOWN;
    if (b->child_watch != 0) {
        g_source_remove(b->child_watch);
        b->child_watch = 0;
    }
    adopted_unwatch(b);
    /* A device just unplugged is finalized by QEMU a little later, and only
     * then does QEMU close its socket.  Stopping the server before that
     * leaves QEMU with a dead server under a live object (stock QEMU then
     * stalls or aborts: qemu-patches/0005, 0006), so the ending gives it a
     * moment first. */
    vn_ending_start(d, b->device, b->worker_pid, child, g_steal_pointer(&b->port),
                    g_strdup(b->channel_path), g_strdup(b->socket), VN_SPAWN_CLIENT_GONE_MS,
                    VN_SPAWN_STOP_TIMEOUT_MS);
    b->worker_pid = 0;
}

static VnWctlCall *ask(VnBorrowed *b, const char *name, VnWctlDone done, void *opaque)
{
    return vn_spawn_ask(b->worker_pid, b->channel_path, b->device, name, done, opaque);
}

/* The worker answers {"requested": false}, doing nothing, when its QEMU
 * registered no device request. */
static VnWctlCall *spawn_request_unplug(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque)
{
    return ask(b, "unplug", done, opaque);
}

static bool spawn_adopt(VnDaemon *d, VnBorrowed *b, const char *secret)
{
    g_autoptr(GError) error = NULL;
    Adopted *a;

    /* The pid must still be a worker of ours, for this device's socket, and the state file
     * must have what it proves itself with (a worker it has not is stopped as a stray). */
    if (!vn_spawn_alive(b->worker_pid, VN_SPAWN_BINARY) ||
        !g_file_test(b->socket, G_FILE_TEST_EXISTS) || secret == NULL) {
        b->worker_pid = 0;
        return false;
    }
    /* It reconnects to its port as soon as we listen on it again: it alone, with its
     * secret. */
    b->port = vn_port_new(d->fab, b->port_path, b->lender, b->name, false, NULL, &error);
    if (b->port != NULL && !vn_spawn_port_for_worker_user(d, b->port, &error)) {
        g_clear_pointer(&b->port, vn_port_free_unlinked);
    }
    if (b->port != NULL && !vn_port_adopt(b->port, b->worker_pid, secret)) {
        g_clear_pointer(&b->port, vn_port_free_unlinked);
        b->worker_pid = 0;
        return false;
    }
    if (b->port == NULL) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker serving %s cannot reach us: %s", d->conf->node, b->device,
               error->message);
    }
    vn_log(G_LOG_LEVEL_MESSAGE, d->conf->node, b->device, b->lender, b->lease,
           "node %s: adopted worker %s (pid %d) serving %s on %s", d->conf->node, b->worker_name,
           b->worker_pid, b->device, b->socket);
    a = g_new0(Adopted, 1);
    *a = (Adopted){ d, b };
    if (b->port != NULL) {
        vn_port_on_gone(b->port, on_adopted_port_gone, a);
        vn_p2p_watch(d, b);
    }
    b->adopted_watch = vn_spawn_watch_exit(b->worker_pid, on_adopted_exit, a, g_free);
    if (b->adopted_watch == 0) {
        b->adopted_watch = g_timeout_add_full(G_PRIORITY_DEFAULT, VN_SPAWN_ADOPTED_CHECK_MS,
                                              on_adopted_check, a, g_free);
    }
    return true;
}

static VnWctlCall *ops_stats(VnDaemon *d, VnBorrowed *b, VnWctlDone done, void *opaque)
{
    return ask(b, "stats", done, opaque);
}

static void on_client_answer(char *answer, const GError *error, void *opaque)
{
    VnBorrowed *b = opaque;
    g_autofree char *text = answer;

    b->client_call = NULL;
    if (text == NULL) {
        g_info("worker for %s: %s", b->device, error->message);
        return; /* unknown still: asked again on the next poll */
    }
    b->client_state = vn_spawn_client_of(text);
    b->client_state_us = b->client_call_us;
}

static VnClientState ops_client_state(VnDaemon *d, VnBorrowed *b, gint64 since_us)
{
    g_autoptr(GError) error = NULL;

    if (!vn_spawn_running(b->worker_pid)) {
        return VN_CLIENT_GONE;
    }
    if (b->client_call == NULL && b->channel_path != NULL) {
        b->client_call_us = g_get_monotonic_time();
        b->client_call = vn_wctl_call_async(b->channel_path, "stats", VN_SPAWN_STATS_TIMEOUT_MS,
                                            VN_SPAWN_MAX_STATS, on_client_answer, b, &error);
        if (b->client_call == NULL) {
            g_info("worker for %s: %s", b->device, error->message);
        }
    }
    return b->client_state_us >= since_us ? b->client_state : VN_CLIENT_UNKNOWN;
}

const VnWorkerOps vn_spawn_ops = {
    .name = "process",
    .lend_start = vn_lenders_start,
    .lend_stop = vn_lenders_stop,
    .lend_kill = vn_lenders_kill,
    .lend_adopt = vn_lenders_adopt,
    .lend_stats = vn_lenders_stats,
    .start = spawn_start,
    .stop = spawn_stop,
    .adopt = spawn_adopt,
    .stats = ops_stats,
    .request_unplug = spawn_request_unplug,
    .client_state = ops_client_state,
    .stop_strays = vn_strays_stop,
};
