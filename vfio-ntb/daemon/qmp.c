/*
 * Just enough QMP for vfio-ntbd to take a borrowed device out of a VM when
 * the device is revoked or its lender is lost: connect to the VM's QMP
 * socket, negotiate and device_del (the caller watches for the guest
 * releasing the device).  QEMU is a peer like any other: every wait is
 * bounded and every line is checked.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "daemon-int.h"
#include "common/json.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* QMP lines we accept (greetings and events are small). */
#define VN_QMP_MAX_LINE (64 * 1024)

typedef struct Qmp {
    int fd;
    GString *in;
    gint64 deadline;
} Qmp;

/* The next line that is a JSON object (owned), or NULL on timeout/error.
 * Lines that are not (or nest too deep) are skipped. */
static JsonObject *next_object(Qmp *q, GError **error)
{
    for (;;) {
        char *nl = memchr(q->in->str, '\n', q->in->len);
        struct pollfd pfd = { .fd = q->fd, .events = POLLIN };
        char buf[4096];
        gint64 left;
        ssize_t n;

        if (nl != NULL) {
            g_autofree char *line = g_strndup(q->in->str, (gsize)(nl - q->in->str));
            JsonObject *o;

            g_string_erase(q->in, 0, nl - q->in->str + 1);
            o = vn_json_parse_object(line, -1, VN_QMP_MAX_LINE, NULL);
            if (o == NULL) {
                continue; /* not ours to understand; keep reading */
            }
            return o;
        }
        if (q->in->len > VN_QMP_MAX_LINE) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "QMP line too long");
            return NULL;
        }
        left = (q->deadline - g_get_monotonic_time()) / 1000;
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT, "QEMU did not answer");
            return NULL;
        }
        n = recv(q->fd, buf, sizeof(buf), 0);
        if (n <= 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED, "QMP socket closed");
            return NULL;
        }
        g_string_append_len(q->in, buf, n);
    }
}

/* Send @cmd and wait for its "return" (events in between are skipped). */
static bool execute(Qmp *q, const char *cmd, GError **error)
{
    size_t len = strlen(cmd);

    if (send(q->fd, cmd, len, MSG_NOSIGNAL) != (ssize_t)len) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "QMP: %s", g_strerror(errno));
        return false;
    }
    for (;;) {
        g_autoptr(JsonObject) o = next_object(q, error);

        if (o == NULL) {
            return false;
        }
        if (json_object_has_member(o, "return")) {
            return true;
        }
        if (json_object_has_member(o, "error")) {
            JsonNode *e = json_object_get_member(o, "error");
            const char *desc = vn_util_json_string(
                JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL, "desc");

            g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "QEMU: %s", desc != NULL ? desc : "");
            return false;
        }
    }
}

bool vn_qmp_device_del_fd(int fd, const char *id, GError **error)
{
    g_autofree char *cmd = NULL;
    Qmp q = { .fd = fd };
    bool ok = false;

    q.in = g_string_new(NULL);
    q.deadline = g_get_monotonic_time() + 2000 * 1000;
    {
        g_autoptr(JsonObject) greeting = next_object(&q, error);

        if (greeting == NULL) {
            goto out;
        }
    }
    cmd = g_strdup_printf("{\"execute\":\"device_del\",\"arguments\":{\"id\":\"%s\"}}\n", id);
    if (!execute(&q, "{\"execute\":\"qmp_capabilities\"}\n", error) || !execute(&q, cmd, error)) {
        goto out;
    }
    /* Only asked: the guest lets go (ACPI hot-plug) in its own time, and
     * the caller watches the device's socket for QEMU letting go of it. */
    ok = true;
out:
    g_string_free(q.in, TRUE);
    return ok;
}

bool vn_qmp_device_del(const char *path, const char *id, GError **error)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    bool ok;
    int fd;

    if (strlen(path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "QMP path too long");
        return false;
    }
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "QMP %s: %s", path,
                    g_strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return false;
    }
    ok = vn_qmp_device_del_fd(fd, id, error);
    close(fd);
    return ok;
}
