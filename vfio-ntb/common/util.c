/*
 * Small helpers shared by every vfio-ntb module.
 */
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <glib/gstdio.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

void vn_util_close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

void vn_util_close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        vn_util_close_fd(&fds[i]);
    }
}

GSource *vn_util_fd_source_new(int fd, GIOCondition cond)
{
    GSource *src = g_unix_fd_source_new(fd, cond);

    g_source_set_can_recurse(src, TRUE);
    return src;
}

uint64_t vn_util_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool vn_util_equal_secret(const uint8_t *a, const uint8_t *b, size_t len)
{
    volatile uint8_t diff = 0;

    for (size_t i = 0; i < len; i++) {
        diff |= a[i] ^ b[i];
    }
    return diff == 0;
}

bool vn_util_json_counter(JsonObject *o, const char *path, bool booleans, uint64_t *v)
{
    const char *dot = strchr(path, '.');
    JsonNode *n;

    if (o != NULL && dot != NULL) {
        g_autofree char *outer = g_strndup(path, (gsize)(dot - path));

        n = json_object_get_member(o, outer);
        o = n != NULL && JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
        path = dot + 1;
    }
    n = o != NULL ? json_object_get_member(o, path) : NULL;
    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n)) {
        return false;
    }
    if (booleans && json_node_get_value_type(n) == G_TYPE_BOOLEAN) {
        *v = json_node_get_boolean(n) ? 1 : 0;
        return true;
    }
    if (json_node_get_value_type(n) != G_TYPE_INT64 || json_node_get_int(n) < 0) {
        return false;
    }
    *v = (uint64_t)json_node_get_int(n);
    return true;
}

bool vn_util_write_snapshot(const char *path, const char *text, GError **error)
{
    return vn_util_write_replace(path, text, 0644, error);
}

bool vn_util_write_replace(const char *path, const char *text, int mode, GError **error)
{
    g_autofree char *tmp = g_strconcat(path, ".tmp", NULL);

    /* NONE: no fsync.  (CONSISTENT would fsync the temporary file before
     * the rename on every file system but btrfs.) */
    if (!g_file_set_contents_full(tmp, text, -1, G_FILE_SET_CONTENTS_NONE, mode, error)) {
        return false;
    }
    /* @mode itself, not what the umask leaves of it (systemd's UMask=0077
     * would keep node_exporter, another user, from reading a snapshot). */
    if (g_chmod(tmp, mode) != 0 || g_rename(tmp, path) != 0) {
        int err = errno;

        g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(err), "replacing %s with %s: %s",
                    path, tmp, g_strerror(err));
        (void)g_unlink(tmp);
        return false;
    }
    return true;
}

static gboolean on_signal(gpointer data)
{
    g_main_loop_quit(data);
    return G_SOURCE_CONTINUE;
}

void vn_util_quit_on_signals(GMainLoop *loop, guint ids[2])
{
    ids[0] = g_unix_signal_add(SIGTERM, on_signal, loop);
    ids[1] = g_unix_signal_add(SIGINT, on_signal, loop);
}

void vn_util_run_until_signalled(GMainLoop *loop)
{
    guint ids[2];

    vn_util_quit_on_signals(loop, ids);
    g_main_loop_run(loop);
    g_source_remove(ids[0]);
    g_source_remove(ids[1]);
}

static void stats_file_write(VnUtilStatsFile *f)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;

    if (f->path == NULL) {
        return;
    }
    json = f->json(f->opaque);
    if (!vn_util_write_snapshot(f->path, json, &error)) {
        g_warning("stats file: %s", error->message);
    }
}

static gboolean on_usr1(gpointer data)
{
    stats_file_write(data);
    return G_SOURCE_CONTINUE;
}

void vn_util_stats_file_start(VnUtilStatsFile *f, const char *path, VnUtilStatsFn json,
                              void *opaque)
{
    *f = (VnUtilStatsFile){ .path = path, .json = json, .opaque = opaque };
    f->usr1 = g_unix_signal_add(SIGUSR1, on_usr1, f);
}

void vn_util_stats_file_stop(VnUtilStatsFile *f)
{
    if (f->usr1 != 0) {
        g_source_remove(f->usr1);
        f->usr1 = 0;
    }
    stats_file_write(f);
}

char *vn_util_size_text(uint64_t bytes)
{
    g_autofree char *text = g_format_size_full(bytes, G_FORMAT_SIZE_IEC_UNITS);
    g_auto(GStrv) parts = g_strsplit(text, "\u00a0", -1); /* GLib's no-break space */

    return g_strjoinv(" ", parts);
}

int vn_util_dial_unix(const char *path)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd;

    if (strlen(path) >= sizeof(addr.sun_path)) {
        return -ENAMETOOLONG;
    }
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return -errno;
    }
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        int e = errno;

        close(fd);
        return -e;
    }
    return fd;
}

VnUtilSocketPath vn_util_socket_path_claim(const char *path)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    struct stat st;
    int fd, ret, e;

    if (strlen(path) >= sizeof(addr.sun_path) || lstat(path, &st) < 0) {
        return VN_UTIL_SOCKET_FREE;
    }
    if (!S_ISSOCK(st.st_mode)) {
        return VN_UTIL_SOCKET_NOT_SOCKET;
    }
    /* A listener answers a connect at once (even with a full backlog:
     * EAGAIN); a socket file left by a dead server refuses it. */
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return VN_UTIL_SOCKET_FREE; /* bind will say what is wrong */
    }
    ret = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    e = errno;
    close(fd);
    if (ret == 0 || e == EAGAIN || e == EINPROGRESS) {
        return VN_UTIL_SOCKET_LIVE;
    }
    unlink(path);
    return VN_UTIL_SOCKET_FREE;
}
