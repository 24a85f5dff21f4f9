/*
 * Just enough QMP for vfio-ntbd to take a borrowed device out of a VM when
 * the device is revoked or its lender is lost: connect to the VM's QMP
 * socket, negotiate and device_del (the caller watches for the guest
 * releasing the device).  QEMU is a peer like any other: every wait is
 * bounded and every line is checked.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "qmp.h"

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
    const char *deleted_id; /* a DEVICE_DELETED awaited for this id, or NULL */
    bool deleted;           /* ... and seen */
} Qmp;

/* A DEVICE_DELETED event for the device awaited (QEMU also sends one for the device's
 * backing objects, without "device"). */
static void note_event(Qmp *q, JsonObject *o)
{
    JsonNode *data = json_object_get_member(o, "data");
    const char *event = vn_util_json_string(o, "event");

    if (q->deleted_id != NULL && g_strcmp0(event, "DEVICE_DELETED") == 0 && data != NULL &&
        JSON_NODE_HOLDS_OBJECT(data) &&
        g_strcmp0(vn_util_json_string(json_node_get_object(data), "device"), q->deleted_id) == 0) {
        q->deleted = true;
    }
}

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

/* Send @cmd and wait for its "return", a copy of which goes to *@ret when @ret is not NULL
 * (events in between are skipped, but for the one awaited). */
static bool execute_ret(Qmp *q, const char *cmd, JsonNode **ret, GError **error)
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
            if (ret != NULL) {
                *ret = json_node_copy(json_object_get_member(o, "return"));
            }
            return true;
        }
        if (json_object_has_member(o, "error")) {
            JsonNode *e = json_object_get_member(o, "error");
            const char *desc = vn_util_json_string(
                JSON_NODE_HOLDS_OBJECT(e) ? json_node_get_object(e) : NULL, "desc");

            g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "QEMU: %s", desc != NULL ? desc : "");
            return false;
        }
        note_event(q, o);
    }
}

static bool execute(Qmp *q, const char *cmd, GError **error)
{
    return execute_ret(q, cmd, NULL, error);
}

/* A command with arguments, as one line: names and paths go through the JSON writer. */
static char *command(const char *name, JsonObject *args)
{
    g_autoptr(JsonObject) o = json_object_new();
    g_autoptr(JsonNode) root = json_node_new(JSON_NODE_OBJECT);
    g_autofree char *text = NULL;

    json_object_set_string_member(o, "execute", name);
    json_object_set_object_member(o, "arguments", args);
    json_node_set_object(root, o);
    text = json_to_string(root, FALSE);
    return g_strconcat(text, "\n", NULL);
}

/* qom-get @property of the device @id: its value, or NULL with @error. */
static JsonNode *device_property(Qmp *q, const char *id, const char *property, GError **error)
{
    JsonObject *args = json_object_new();
    g_autofree char *path = g_strdup_printf("/machine/peripheral/%s", id);
    g_autofree char *cmd = NULL;
    JsonNode *ret = NULL;

    json_object_set_string_member(args, "path", path);
    json_object_set_string_member(args, "property", property);
    cmd = command("qom-get", args);
    if (!execute_ret(q, cmd, &ret, error)) {
        g_prefix_error(error, "%s of %s: ", property, id);
        return NULL;
    }
    return ret;
}

/* Greeted, capabilities negotiated; false with @error. */
static bool qmp_open(Qmp *q, int fd, GError **error)
{
    g_autoptr(JsonObject) greeting = NULL;

    q->fd = fd;
    q->in = g_string_new(NULL);
    q->deadline = g_get_monotonic_time() + 2000 * 1000;
    greeting = next_object(q, error);
    return greeting != NULL && execute(q, "{\"execute\":\"qmp_capabilities\"}\n", error);
}

bool vn_qmp_device_del_fd(int fd, const char *id, GError **error)
{
    g_autofree char *cmd = NULL;
    JsonObject *args = json_object_new();
    Qmp q = { 0 };
    bool ok;

    json_object_set_string_member(args, "id", id);
    cmd = command("device_del", args);
    /* Only asked: the guest lets go (ACPI hot-plug) in its own time, and
     * the caller watches the device's socket for QEMU letting go of it. */
    ok = qmp_open(&q, fd, error) && execute(&q, cmd, error);
    g_string_free(q.in, TRUE);
    return ok;
}

/* The bus a device sits on, by the name device_add takes (the last part of its QOM path),
 * and its slot and function as "SS.F". */
static bool device_place(Qmp *q, const char *id, char **bus, char **addr, GError **error)
{
    g_autoptr(JsonNode) parent = device_property(q, id, "parent_bus", error);
    g_autoptr(JsonNode) devfn = NULL;
    const char *path, *name;
    gint64 fn;

    if (parent == NULL) {
        return false;
    }
    path = JSON_NODE_HOLDS_VALUE(parent) && json_node_get_value_type(parent) == G_TYPE_STRING
               ? json_node_get_string(parent)
               : NULL;
    name = path != NULL ? strrchr(path, '/') : NULL;
    if (name == NULL || name[1] == '\0' || strlen(name) > 128) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "QEMU: %s's parent_bus is not a bus path", id);
        return false;
    }
    if ((devfn = device_property(q, id, "addr", error)) == NULL) {
        return false;
    }
    fn = JSON_NODE_HOLDS_VALUE(devfn) && json_node_get_value_type(devfn) == G_TYPE_INT64
             ? json_node_get_int(devfn)
             : -1;
    if (fn < 0 || fn > 0xff) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "QEMU: %s's addr is not a slot and function", id);
        return false;
    }
    *bus = g_strdup(name + 1);
    *addr = g_strdup_printf("%02x.%x", (unsigned)fn >> 3, (unsigned)fn & 7);
    return true;
}

bool vn_qmp_device_remove_fd(int fd, const char *id, unsigned wait_ms, char **bus, char **addr,
                             GError **error)
{
    g_autofree char *del = NULL;
    JsonObject *args;
    Qmp q = { 0 };
    bool ok = false;

    if (!qmp_open(&q, fd, error) || !device_place(&q, id, bus, addr, error)) {
        goto out;
    }
    args = json_object_new();
    json_object_set_string_member(args, "id", id);
    del = command("device_del", args);
    q.deleted_id = id;
    if (!execute(&q, del, error)) {
        goto out;
    }
    /* The guest lets go in its own time (PCIe hot-plug: a few seconds): bounded. */
    q.deadline = g_get_monotonic_time() + (gint64)wait_ms * 1000;
    while (!q.deleted) {
        g_autoptr(JsonObject) o = next_object(&q, error);

        if (o == NULL) {
            g_prefix_error(error, "%s was not let go of: ", id);
            goto out;
        }
        note_event(&q, o);
    }
    ok = true;
out:
    if (!ok) {
        g_clear_pointer(bus, g_free);
        g_clear_pointer(addr, g_free);
    }
    g_string_free(q.in, TRUE);
    return ok;
}

bool vn_qmp_device_add_fd(int fd, const char *id, const char *bus, const char *addr,
                          const char *socket, GError **error)
{
    g_autofree char *add = NULL;
    JsonObject *args = json_object_new(), *sock = json_object_new();
    Qmp q = { 0 };
    bool ok;

    json_object_set_string_member(sock, "type", "unix");
    json_object_set_string_member(sock, "path", socket);
    json_object_set_string_member(args, "driver", "vfio-user-pci");
    json_object_set_string_member(args, "id", id);
    json_object_set_string_member(args, "bus", bus);
    json_object_set_string_member(args, "addr", addr);
    json_object_set_object_member(args, "socket", sock);
    add = command("device_add", args);
    ok = qmp_open(&q, fd, error);
    /* Realizing it talks to the device through its server: more than a monitor line. */
    q.deadline = g_get_monotonic_time() + 10000 * 1000;
    ok = ok && execute(&q, add, error);
    g_string_free(q.in, TRUE);
    return ok;
}

/* A connected socket to QEMU's QMP at @path, or -1 with @error. */
static int qmp_connect(const char *path, GError **error)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    int fd;

    if (strlen(path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "QMP path too long");
        return -1;
    }
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "QMP %s: %s", path,
                    g_strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

bool vn_qmp_device_remove(const char *path, const char *id, unsigned wait_ms, char **bus,
                          char **addr, GError **error)
{
    int fd = qmp_connect(path, error);
    bool ok;

    if (fd < 0) {
        return false;
    }
    ok = vn_qmp_device_remove_fd(fd, id, wait_ms, bus, addr, error);
    close(fd);
    return ok;
}

bool vn_qmp_device_add(const char *path, const char *id, const char *bus, const char *addr,
                       const char *socket, GError **error)
{
    int fd = qmp_connect(path, error);
    bool ok;

    if (fd < 0) {
        return false;
    }
    ok = vn_qmp_device_add_fd(fd, id, bus, addr, socket, error);
    close(fd);
    return ok;
}

bool vn_qmp_device_del(const char *path, const char *id, GError **error)
{
    bool ok;
    int fd;

    if ((fd = qmp_connect(path, error)) < 0) {
        return false;
    }
    ok = vn_qmp_device_del_fd(fd, id, error);
    close(fd);
    return ok;
}
