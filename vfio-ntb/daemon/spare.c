/*
 * The spare borrower worker (see spare.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "spare.h"

#include "common/assign.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct VnSpare {
    char *node;
    char *run_dir;
    char *binary; /* what the waiting spare runs */
    GPid pid;     /* the waiting spare, or 0 */
    int sock;     /* our end of its socket */
    guint watch;  /* its exit */
    size_t room;  /* the bytes of its command line */
};

VnSpare *vn_spare_new(const char *node, const char *run_dir)
{
    VnSpare *s = g_new0(VnSpare, 1);

    s->node = g_strdup(node);
    s->run_dir = g_strdup(run_dir);
    s->sock = -1;
    return s;
}

static void on_reaped(GPid pid, gint status, gpointer data)
{
    g_spawn_close_pid(pid);
}

/* No spare waits any more: @pid's exit is only reaped (when it is still ours to reap). */
static void forget(VnSpare *s, bool reap)
{
    if (s->watch != 0) {
        g_source_remove(s->watch);
        s->watch = 0;
        if (reap) {
            g_child_watch_add(s->pid, on_reaped, NULL);
        }
    }
    vn_util_close_fd(&s->sock); /* a spare that still waits exits */
    g_clear_pointer(&s->binary, g_free);
    s->pid = 0;
}

void vn_spare_free(VnSpare *s)
{
    if (s == NULL) {
        return;
    }
    forget(s, false); /* the daemon goes: nothing would reap it */
    g_free(s->node);
    g_free(s->run_dir);
    g_free(s);
}

static void on_spare_exit(GPid pid, gint status, gpointer data)
{
    VnSpare *s = data;

    g_spawn_close_pid(pid);
    if (s->pid != pid) {
        return;
    }
    s->watch = 0; /* this source ends */
    g_info("node %s: the spare borrower worker (pid %d) exited (status %d); the next attach "
           "starts its own",
           s->node, pid, status);
    forget(s, false);
}

bool vn_spare_fill(VnSpare *s, const char *binary, GError **error)
{
    g_autofree char *fd_arg = g_strdup_printf("--spare-fd=%d", VN_ASSIGN_FIRST_FD);
    g_autofree char *node_arg = g_strdup_printf("--node=%s", s->node);
    g_autofree char *dir_arg = g_strdup_printf("--run-dir=%s", s->run_dir);
    g_autofree char *room_arg = g_strnfill(VN_SPARE_TITLE_ROOM, ' ');
    g_autofree char *title_arg = g_strdup_printf("--title-room=%s", room_arg);
    const char *argv[] = { binary, fd_arg, node_arg, dir_arg, title_arg, NULL };
    int sv[2], target = VN_ASSIGN_FIRST_FD;
    gboolean ok;

    if (s->pid > 0) {
        return true;
    }
    /* Packets: the one assignment arrives whole or not at all. */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "a spare's socket: %s",
                    g_strerror(e));
        return false;
    }
    ok = g_spawn_async_with_pipes_and_fds(NULL, argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD, NULL, NULL,
                                          -1, -1, -1, &sv[1], &target, 1, &s->pid, NULL, NULL, NULL,
                                          error);
    close(sv[1]);
    if (!ok) {
        close(sv[0]);
        s->pid = 0;
        g_prefix_error(error, "starting a spare %s: ", binary);
        return false;
    }
    s->sock = sv[0];
    s->binary = g_strdup(binary);
    s->room = vn_assign_length(argv);
    s->watch = g_child_watch_add(s->pid, on_spare_exit, s);
    return true;
}

GPid vn_spare_give(VnSpare *s, const char *const *argv, const int *fds, unsigned nfds)
{
    g_autoptr(GError) error = NULL;
    GPid pid = s->pid;

    if (pid <= 0) {
        return 0;
    }
    if (strcmp(argv[0], s->binary) != 0) {
        /* The workers' binary moved (an upgrade): this spare is of the old one. */
        forget(s, true);
        return 0;
    }
    if (vn_assign_length(argv) > s->room) {
        return 0; /* it waits on, for a job that fits */
    }
    /* Ours to watch from now on, as a worker: the caller's. */
    g_source_remove(s->watch);
    s->watch = 0;
    if (!vn_assign_send(s->sock, argv, fds, nfds, &error)) {
        g_info("node %s: the spare borrower worker (pid %d): %s; starting one instead", s->node,
               pid, error->message);
        kill(pid, SIGKILL);
        g_child_watch_add(pid, on_reaped, NULL);
        forget(s, false);
        return 0;
    }
    s->pid = 0;
    forget(s, false);
    return pid;
}
