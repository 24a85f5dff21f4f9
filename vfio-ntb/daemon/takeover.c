/*
 * A borrower worker that dies under its VM is replaced without QEMU seeing it go.
 *
 * QEMU cannot reconnect to a vfio-user server.  So the worker keeps with its port what the
 * next one needs (keep.h: its listening socket, QEMU's connection, the eventfds it holds,
 * its state), and when it dies the daemon keeps the port too -- the guest memory it
 * exported to the lender, the interrupt routes, the windows onto the device's BARs -- so
 * the data path runs on as if nothing happened, tells the lender nothing, and starts a
 * worker with --take-over: it gets all of it and resumes the attachment
 * (borrower/takeover.c).  QEMU's connection never closes: a request it sent meanwhile waits
 * in the socket for the new worker.
 *
 * Not for a worker that ended on purpose (it forgets what it kept first), nor for one that
 * could not take over (VN_BORROWER_EXIT_NO_TAKEOVER), nor more than VN_TAKEOVER_BURST times in
 * VN_TAKEOVER_WINDOW_MS (a worker that QEMU's requests kill each time): the device is then
 * detached as before.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "takeover.h"

#include "events.h"
#include "keep.h"
#include "port.h"
#include "spawn-procs.h"
#include "state.h"

#include "borrower/borrower.h"
#include "common/util.h"
#include "fabric/host.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <json-glib/json-glib.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* The handoff's fd in the new worker, and the first of the kept fds after it. */
#define VN_TAKEOVER_HANDOFF_FD 4
#define VN_TAKEOVER_FIRST_FD 5
G_STATIC_ASSERT(VN_SPAWN_PORT_FD < VN_TAKEOVER_HANDOFF_FD);

/* A memfd holding @text: the handoff (it may be longer than a pipe holds). */
static int handoff_memfd(const char *text, GError **error)
{
    int fd = memfd_create("vfio-ntb-handoff", MFD_CLOEXEC);
    size_t len = strlen(text), done = 0;

    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "memfd: %s",
                    g_strerror(errno));
        return -1;
    }
    while (done < len) {
        ssize_t n = write(fd, text + done, len - done);

        if (n <= 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "handoff: %s", g_strerror(errno));
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    return fd;
}

/* {"state": ..., "fds": {"KEY": FD}}: borrower.h, vn_borrower_take_over(). */
static char *handoff_json(GBytes *state, const uint64_t *keys, guint n)
{
    g_autoptr(JsonBuilder) jb = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *text = g_strndup(g_bytes_get_data(state, NULL), g_bytes_get_size(state));

    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "state");
    json_builder_add_string_value(jb, text);
    json_builder_set_member_name(jb, "fds");
    json_builder_begin_object(jb);
    for (guint i = 0; i < n; i++) {
        g_autofree char *key = g_strdup_printf("%" G_GUINT64_FORMAT, keys[i]);

        json_builder_set_member_name(jb, key);
        json_builder_add_int_value(jb, VN_TAKEOVER_FIRST_FD + (gint64)i);
    }
    json_builder_end_object(jb);
    json_builder_end_object(jb);
    root = json_builder_get_root(jb);
    return json_to_string(root, FALSE);
}

/* Whether a worker that ended with @status may be replaced under its QEMU now. */
static bool worth_it(VnDaemon *d, VnBorrowed *b, int status, VnKeep *keep)
{
    gint64 now = g_get_monotonic_time();
    guint recent = 0;

    if (WIFEXITED(status) &&
        (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == VN_BORROWER_EXIT_NO_TAKEOVER)) {
        return false; /* ended on purpose, or the last takeover could not be done */
    }
    /* Its sandbox killed it: what QEMU sent made it try what no worker does; another would
     * be one more try for whoever made it. */
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker serving %s was killed by its sandbox (a system call its "
               "seccomp filter does not allow); it is not replaced",
               d->conf->node, b->device);
        return false;
    }
    if (keep == NULL || vn_keep_get_fd(keep, VN_HOST_KEEP_LISTEN) < 0 || b->lost ||
        b->server_down || b->starting) {
        return false;
    }
    for (guint i = 0; i < VN_TAKEOVER_BURST; i++) {
        recent += b->takeover_us[i] != 0 && now - b->takeover_us[i] < VN_TAKEOVER_WINDOW_MS * 1000;
    }
    if (recent >= VN_TAKEOVER_BURST) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker serving %s died %u times in %d s: it is not replaced again; "
               "the device is detached",
               d->conf->node, b->device, recent + 1, VN_TAKEOVER_WINDOW_MS / 1000);
        return false;
    }
    return true;
}

bool vn_takeover_start(VnDaemon *d, VnBorrowed *b, int status, GPtrArray *argv)
{
    g_autoptr(GError) error = NULL;
    VnKeep *keep = b->port != NULL ? vn_port_keep(b->port) : NULL;
    g_autoptr(GBytes) state = NULL;
    uint64_t keys[VN_KEEP_MAX_FDS];
    int source[VN_KEEP_MAX_FDS + 2], target[VN_KEEP_MAX_FDS + 2];
    int conn;
    g_autofree char *text = NULL;
    int memfd;
    guint n;
    gboolean ok;

    if (!worth_it(d, b, status, keep)) {
        return false;
    }
    /* What the worker sent before it died is in the port still: its last KEEPs first. */
    vn_port_drain(b->port);
    state = vn_keep_get_state(keep);
    if (state == NULL) {
        return false;
    }
    n = vn_keep_keys(keep, keys, VN_KEEP_MAX_FDS);
    text = handoff_json(state, keys, n);
    memfd = handoff_memfd(text, &error);
    if (memfd < 0) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker serving %s cannot be replaced: %s", d->conf->node, b->device,
               error->message);
        return false;
    }
    /* Its own connection to the port (the dead one's goes). */
    conn = vn_port_pair(b->port, &error);
    if (conn < 0) {
        close(memfd);
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker serving %s cannot be replaced: %s", d->conf->node, b->device,
               error->message);
        return false;
    }
    source[0] = memfd;
    target[0] = VN_TAKEOVER_HANDOFF_FD;
    source[1] = conn;
    target[1] = VN_SPAWN_PORT_FD;
    for (guint i = 0; i < n; i++) {
        source[i + 2] = vn_keep_get_fd(keep, keys[i]);
        target[i + 2] = VN_TAKEOVER_FIRST_FD + (int)i;
    }
    g_ptr_array_insert(argv, (gint)argv->len - 1,
                       g_strdup_printf("--take-over=%d", VN_TAKEOVER_HANDOFF_FD));
    ok = g_spawn_async_with_pipes_and_fds(NULL, (const char *const *)argv->pdata, NULL,
                                          G_SPAWN_DO_NOT_REAP_CHILD, NULL, NULL, -1, -1, -1, source,
                                          target, n + 2, &b->worker_pid, NULL, NULL, NULL, &error);
    close(memfd);
    close(conn);
    if (!ok) {
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
               "node %s: the worker serving %s cannot be replaced: %s", d->conf->node, b->device,
               error->message);
        b->worker_pid = 0;
        return false;
    }
    vn_port_set_worker(b->port, b->worker_pid);
    memmove(&b->takeover_us[1], &b->takeover_us[0],
            (VN_TAKEOVER_BURST - 1) * sizeof(b->takeover_us[0]));
    b->takeover_us[0] = g_get_monotonic_time();
    b->takeovers++;
    vn_log(G_LOG_LEVEL_WARNING, d->conf->node, b->device, b->lender, b->lease,
           "node %s: the worker serving %s to %s died (%s %d); worker pid %d takes over its "
           "QEMU",
           d->conf->node, b->device, b->domain != NULL ? b->domain : "its VM",
           WIFSIGNALED(status) ? "signal" : "status",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), b->worker_pid);
    vn_events_emit(d, "WORKER_REPLACED", b->device, b->lease, b->lender, b->domain);
    vn_state_save_or_report(d);
    return true;
}
