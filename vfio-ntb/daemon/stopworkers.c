/*
 * Stopping the workers a stopped daemon left (see stopworkers.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "stopworkers.h"

#include "lending/pcibind.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A cgroup lists at most this many pids for us to look at (a host's workers, with room). */
#define VN_STOPWORKERS_MAX_PIDS 4096

char *vn_stopworkers_own_procs(void)
{
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;

    if (!g_file_get_contents("/proc/self/cgroup", &text, NULL, NULL)) {
        return NULL;
    }
    lines = g_strsplit(text, "\n", -1);
    /* Not the root cgroup: that would be every worker of the host, not this unit's. */
    for (char **l = lines; *l != NULL; l++) {
        if (g_str_has_prefix(*l, "0::/") && strlen(*l) > 4) {
            return g_strdup_printf("/sys/fs/cgroup%s/cgroup.procs", *l + 3);
        }
    }
    for (char **l = lines; *l != NULL; l++) {
        const char *named = strstr(*l, ":name=systemd:/");

        if (named != NULL && strlen(named) > strlen(":name=systemd:/")) {
            return g_strdup_printf("/sys/fs/cgroup/systemd%s/cgroup.procs",
                                   named + strlen(":name=systemd:"));
        }
    }
    return NULL;
}

/* By its command line's first word: /proc/PID/exe of a worker that serves as the worker user
 * is not ours to read without CAP_SYS_PTRACE, which the unit does not give; only the unit's
 * own processes are looked at, all of them the daemon's children. */
static bool is_worker(pid_t pid)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/cmdline", (int)pid);
    g_autofree char *cmdline = NULL;
    g_autofree char *name = NULL;
    gsize len = 0;

    if (!g_file_get_contents(path, &cmdline, &len, NULL) || len == 0) {
        return false;
    }
    name = g_path_get_basename(cmdline); /* up to its NUL: argv[0] */
    return strcmp(name, "vfio-ntb-lender") == 0 || strcmp(name, "vfio-ntb-borrower") == 0;
}

static bool alive(pid_t pid)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/stat", (int)pid);
    g_autofree char *stat = NULL;
    const char *state;

    if (!g_file_get_contents(path, &stat, NULL, NULL)) {
        return false;
    }
    state = strrchr(stat, ')');
    return state != NULL && state[1] == ' ' && state[2] != 'Z';
}

int vn_stopworkers_run(const char *procs_path, unsigned wait_ms, unsigned *killed)
{
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;
    g_autoptr(GArray) pids = g_array_new(FALSE, FALSE, sizeof(pid_t));
    gint64 deadline = g_get_monotonic_time() + (gint64)wait_ms * 1000;
    g_autoptr(GError) error = NULL;
    bool left = true;

    *killed = 0;
    if (!g_file_get_contents(procs_path, &text, NULL, &error)) {
        return error->domain == G_FILE_ERROR && error->code == G_FILE_ERROR_NOENT ? -ENOENT : -EIO;
    }
    lines = g_strsplit(text, "\n", VN_STOPWORKERS_MAX_PIDS + 1);
    for (guint i = 0; i < VN_STOPWORKERS_MAX_PIDS && lines[i] != NULL; i++) {
        guint64 v;
        pid_t pid;

        if (!g_ascii_string_to_unsigned(g_strstrip(lines[i]), 10, 2, G_MAXINT32, &v, NULL)) {
            continue;
        }
        pid = (pid_t)v;
        if (pid != getpid() && is_worker(pid) && kill(pid, SIGTERM) == 0) {
            g_array_append_val(pids, pid);
        }
    }
    while (left && g_get_monotonic_time() < deadline) {
        left = false;
        for (guint i = 0; i < pids->len && !left; i++) {
            left = alive(g_array_index(pids, pid_t, i));
        }
        if (left) {
            g_usleep(50 * 1000);
        }
    }
    for (guint i = 0; i < pids->len; i++) {
        pid_t pid = g_array_index(pids, pid_t, i);

        /* Still our worker (not a pid reused meanwhile): it did not stop in time. */
        if (alive(pid) && is_worker(pid) && kill(pid, SIGKILL) == 0) {
            (*killed)++;
        }
    }
    return (int)pids->len;
}

unsigned vn_stopworkers_give_back(const char *sys, const char *run_dir, unsigned *failed)
{
    g_autoptr(GDir) dir = g_dir_open(run_dir, 0, NULL);
    const char *name;
    unsigned n = 0, seen = 0;

    *failed = 0;
    while (dir != NULL && (name = g_dir_read_name(dir)) != NULL &&
           seen++ < VN_STOPWORKERS_MAX_PIDS) {
        g_autofree char *path = g_build_filename(run_dir, name, NULL);
        g_autoptr(GError) error = NULL;
        struct stat st;

        /* Ours only: a worker (root before it gave that up) wrote it in our directory, where
         * the worker user cannot write. */
        if (!g_str_has_prefix(name, VN_LENDERS_KEPT_PREFIX) ||
            !g_str_has_suffix(name, VN_LENDERS_KEPT_SUFFIX) || lstat(path, &st) < 0 ||
            !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
            continue;
        }
        if (vn_pcibind_give_back(sys, path, NULL, &error)) {
            n++;
        } else {
            fprintf(stderr, "vfio-ntbd: --stop-workers: %s\n", error->message);
            (*failed)++;
        }
    }
    return n;
}
