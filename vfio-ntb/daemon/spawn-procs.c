/*
 * The daemon's worker processes, whichever side they serve (spawn.c
 * borrower workers, lenders.c lender workers): where their binaries are,
 * whether a pid is still one of ours, hearing of an adopted one's exit, the
 * run dir and ports they reach, and asking one over its control channel
 * (common/wctl.h) without waiting.  Below both: it knows no device.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "spawn-procs.h"

#include "common/json.h"
#include "common/util.h"
#include "common/wctl.h"
#include "config.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <signal.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <unistd.h>

char *vn_spawn_find(const char *name, const char *const *dirs, GError **error)
{
    g_autoptr(GString) tried = g_string_new(NULL);
    char *found;

    for (; *dirs != NULL; dirs++) {
        g_autofree char *path = g_build_filename(*dirs, name, NULL);

        if (g_file_test(path, G_FILE_TEST_IS_EXECUTABLE) &&
            !g_file_test(path, G_FILE_TEST_IS_DIR)) {
            return g_steal_pointer(&path);
        }
        g_string_append_printf(tried, "%s, ", *dirs);
    }
    found = g_find_program_in_path(name);
    if (found == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND,
                    "%s is in none of %sthe directories of PATH", name, tried->str);
    }
    return found;
}

/*
 * The directory of our own binary comes first, VN_LIBEXECDIR second: the
 * build tree's vfio-ntbd (tests run build/vfio-ntbd) must run the workers
 * built with it even on a machine where vfio-ntb is also installed, and an
 * installed vfio-ntbd (in sbin, where no worker is) reaches libexec.  Had
 * libexec come first, the build tree's daemon would talk to the installed,
 * older workers.  PATH last, as before there was a libexec.
 */
char *vn_spawn_binary(const char *name, GError **error)
{
    g_autofree char *self = g_file_read_link("/proc/self/exe", NULL);
    g_autofree char *dir = self != NULL ? g_path_get_dirname(self) : NULL;
    const char *dirs[3] = { NULL, NULL, NULL };
    size_t n = 0;

    if (dir != NULL) {
        dirs[n++] = dir;
    }
    dirs[n] = VN_LIBEXECDIR;
    return vn_spawn_find(name, dirs, error);
}

bool vn_spawn_adopted_alive(VnPort *port, GPid pid, const char *binary)
{
    /* One its port refused (it had the pid, not the secret) is no worker of ours. */
    return vn_spawn_alive(pid, binary) && (port == NULL || vn_port_worker(port) == pid);
}

bool vn_spawn_alive(GPid pid, const char *binary)
{
    g_autofree char *cmdline = NULL;
    g_autofree char *proc = g_strdup_printf("/proc/%d/cmdline", pid);
    gsize len = 0;

    return pid > 1 && kill(pid, 0) == 0 && g_file_get_contents(proc, &cmdline, &len, NULL) &&
           len > 0 && strstr(cmdline, binary) != NULL;
}

typedef struct ExitWatch {
    int pidfd;
    GSourceFunc fn;
    void *data;
    GDestroyNotify destroy;
} ExitWatch;

static gboolean on_exit_readable(gint fd, GIOCondition cond, gpointer data)
{
    ExitWatch *w = data;

    w->fn(w->data);
    return G_SOURCE_REMOVE; /* it exited: once is all there is */
}

static void exit_watch_free(gpointer data)
{
    ExitWatch *w = data;

    close(w->pidfd);
    if (w->destroy != NULL) {
        w->destroy(w->data);
    }
    g_free(w);
}

guint vn_spawn_watch_exit(GPid pid, GSourceFunc fn, void *data, GDestroyNotify destroy)
{
    int fd = pid > 1 ? pidfd_open(pid, 0) : -1;
    ExitWatch *w;

    if (fd < 0) {
        return 0;
    }
    w = g_new(ExitWatch, 1);
    *w = (ExitWatch){ .pidfd = fd, .fn = fn, .data = data, .destroy = destroy };
    return g_unix_fd_add_full(G_PRIORITY_DEFAULT, fd, G_IO_IN | G_IO_HUP | G_IO_ERR,
                              on_exit_readable, w, exit_watch_free);
}

/* The worker user may dial its port again (only its own process gets in: port.h). */
bool vn_spawn_port_for_worker_user(VnDaemon *d, VnPort *port, GError **error)
{
    const char *path = vn_port_path(port);

    if (d->conf->worker_user != NULL && chown(path, d->conf->worker_uid, d->conf->worker_gid) < 0) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "port %s for user %s: %s", path,
                    d->conf->worker_user, g_strerror(e));
        return false;
    }
    return true;
}

bool vn_spawn_run_dir(VnDaemon *d, GError **error)
{
    const char *dir = d->conf->run_dir;
    struct stat st;

    /* Others may pass through (QEMU's user to its socket, the worker user to its port) but
     * not list it; each socket in it says who may use it. */
    if (g_mkdir_with_parents(dir, 0711) < 0 || stat(dir, &st) < 0 ||
        ((st.st_mode & 0011) != 0011 && st.st_uid == geteuid() &&
         chmod(dir, (st.st_mode & 07777) | 0011) < 0)) {
        int e = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "run dir %s: %s", dir,
                    g_strerror(e));
        return false;
    }
    return true;
}

bool vn_spawn_running(GPid pid)
{
    return pid > 0 && kill(pid, 0) == 0;
}

/* Command @name on the worker's control channel, answered from the loop. */
VnWctlCall *vn_spawn_ask(GPid pid, const char *channel, const char *what, const char *name,
                         VnWctlDone done, void *opaque)
{
    g_autoptr(GError) error = NULL;
    VnWctlCall *c;

    if (!vn_spawn_running(pid) || channel == NULL) {
        done(NULL, NULL, opaque);
        return NULL;
    }
    c = vn_wctl_call_async(channel, name, VN_SPAWN_STATS_TIMEOUT_MS, VN_SPAWN_MAX_STATS, done,
                           opaque, &error);
    if (c == NULL) {
        g_info("worker for %s: %s", what, error->message);
        done(NULL, error, opaque);
    }
    return c;
}

VnClientState vn_spawn_client_of(const char *stats)
{
    g_autoptr(JsonObject) o = NULL;

    if (stats == NULL) {
        return VN_CLIENT_UNKNOWN;
    }
    o = vn_json_parse_object(stats, -1, VN_SPAWN_MAX_STATS, NULL);
    return vn_util_json_bool(o, "client_connected") ? VN_CLIENT_CONNECTED : VN_CLIENT_GONE;
}
