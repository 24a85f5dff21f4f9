/*
 * Workers nobody recorded.  A daemon that starts adopts the workers its
 * state file names; any other worker process of its node is a stray: one
 * whose device left the config, one started just before a crash that the
 * state file missed, one a failed save left out.  A stray would serve on
 * unseen, and a lender stray would dial the port of its device's new worker
 * and take it over.  So at start, before any worker of its own starts, the
 * daemon stops them: a worker of this node is a vfio-ntb-lender or
 * vfio-ntb-borrower process started with --node=NODE and a --port in this
 * node's run-dir (two nodes on one host have two run-dirs).
 *
 * SIGKILL, not SIGTERM: a stray's lease is unknown, so there is nothing
 * for it to finish; its device server sees its client go and quiesces the
 * device, as it does for any worker that dies.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "strays.h"

#include "devices.h"
#include "spawn-procs.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* A worker's command line is a few hundred bytes; a longer one is not ours. */
#define VN_STRAYS_MAX_CMDLINE 8192
/* A killed process is gone at once unless the kernel holds it (D state). */
#define VN_STRAYS_WAIT_MS 2000

static const char *const worker_binaries[] = { VN_LENDERS_BINARY, VN_SPAWN_BINARY, NULL };

/* @pid's argument @prefix..., or NULL. */
static const char *arg_value(const char *cmdline, gsize len, const char *prefix)
{
    size_t plen = strlen(prefix);

    for (const char *a = cmdline; a < cmdline + len; a += strlen(a) + 1) {
        if (strncmp(a, prefix, plen) == 0) {
            return a + plen;
        }
    }
    return NULL;
}

/* @pid is one of this node's workers: its port, else NULL. */
static char *worker_port(VnDaemon *d, GPid pid)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/cmdline", pid);
    g_autofree char *cmdline = NULL;
    g_autofree char *base = NULL;
    g_autofree char *dir = NULL;
    const char *node, *port;
    gsize len = 0;

    if (!g_file_get_contents(path, &cmdline, &len, NULL) || len == 0 ||
        len > VN_STRAYS_MAX_CMDLINE || cmdline[len - 1] != '\0') {
        return NULL;
    }
    base = g_path_get_basename(cmdline);
    node = arg_value(cmdline, len, "--node=");
    port = arg_value(cmdline, len, "--port=");
    if (!g_strv_contains(worker_binaries, base) || node == NULL ||
        strcmp(node, d->conf->node) != 0 || port == NULL) {
        return NULL;
    }
    dir = g_path_get_dirname(port);
    return strcmp(dir, d->conf->run_dir) == 0 ? g_strdup(port) : NULL;
}

static bool adopted(VnDaemon *d, GPid pid)
{
    for (guint i = 0; i < d->local->len; i++) {
        if (((VnLocalDevice *)d->local->pdata[i])->worker_pid == pid) {
            return true;
        }
    }
    for (guint i = 0; i < d->borrowed->len; i++) {
        if (((VnBorrowed *)d->borrowed->pdata[i])->worker_pid == pid) {
            return true;
        }
    }
    return false;
}

/* Gone, or a zombie (its parent, not us, reaps it). */
static bool gone(GPid pid)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/stat", pid);
    g_autofree char *stat = NULL;
    const char *end;

    if (!g_file_get_contents(path, &stat, NULL, NULL)) {
        return true;
    }
    end = strrchr(stat, ')'); /* the name may hold anything, ')' too */
    return end == NULL || end[1] == '\0' || end[2] == 'Z' || end[2] == 'X';
}

guint vn_strays_stop(VnDaemon *d)
{
    g_autoptr(GArray) killed = g_array_new(FALSE, FALSE, sizeof(GPid));
    gint64 deadline;
    DIR *proc = opendir("/proc");
    struct dirent *e;

    if (proc == NULL) {
        g_warning("node %s: /proc: %s; workers nobody recorded are not looked for", d->conf->node,
                  g_strerror(errno));
        return 0;
    }
    while ((e = readdir(proc)) != NULL) {
        guint64 n;
        g_autofree char *port = NULL;
        GPid pid;

        if (!g_ascii_string_to_unsigned(e->d_name, 10, 2, G_MAXINT, &n, NULL)) {
            continue;
        }
        pid = (GPid)n;
        if (pid == getpid() || adopted(d, pid) || (port = worker_port(d, pid)) == NULL) {
            continue;
        }
        if (kill(pid, SIGKILL) < 0) {
            g_warning("node %s: a worker nobody recorded (pid %d, port %s) cannot be stopped: %s",
                      d->conf->node, pid, port, g_strerror(errno));
            continue;
        }
        vn_log(G_LOG_LEVEL_WARNING, d->conf->node, NULL, NULL, 0,
               "node %s: stopped a worker nobody recorded (pid %d, port %s): its device left the "
               "config, or the state file missed it",
               d->conf->node, pid, port);
        g_array_append_val(killed, pid);
    }
    closedir(proc);
    /* Before our own workers start: a lender stray would dial their ports. */
    deadline = g_get_monotonic_time() + VN_STRAYS_WAIT_MS * 1000;
    for (guint i = 0; i < killed->len; i++) {
        while (!gone(g_array_index(killed, GPid, i)) && g_get_monotonic_time() < deadline) {
            g_usleep(10 * 1000);
        }
    }
    return killed->len;
}
