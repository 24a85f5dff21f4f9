/*
 * vfio-ntbd control socket client (docs/control.md): plain blocking-style
 * I/O over a non-blocking UNIX socket, every wait a poll() against a
 * deadline, so one slow or silent daemon costs the caller at most the
 * timeout.
 */
#define G_LOG_DOMAIN "vfio-ntb.client"

#include "client/ctl-client.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"
#include "fabric/fabric.h"
#include "lending/proto.h"
#include "trace-client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* Bytes asked of recv() at once; a 64 KiB line takes a few calls. */
#define VN_CTL_READ_CHUNK 16384
/* A version string ("0.1.0") longer than this is not one; it is only kept
 * for messages, so bound what a peer makes us carry around. */
#define VN_CTL_MAX_VERSION 32

struct VnCtlClient {
    char *path;
    int fd;
    int timeout_ms;
    GByteArray *buf; /* received, not yet consumed (no complete line) */
    char *node;      /* from the greeting */
    char *version;
    gint64 next_id;
    bool broken; /* a timeout or protocol error: stream state unknown */
};

G_DEFINE_QUARK(vn - ctl - error - quark, vn_ctl_error)

static const char *const error_names[VN_CTL_ERROR_LAST] = {
    [VN_CTL_ERROR_COMMAND_NOT_FOUND] = "CommandNotFound",
    [VN_CTL_ERROR_INVALID_PARAMETER] = "InvalidParameter",
    [VN_CTL_ERROR_DEVICE_NOT_FOUND] = "DeviceNotFound",
    [VN_CTL_ERROR_ACCESS_DENIED] = "AccessDenied",
    [VN_CTL_ERROR_DEVICE_BUSY] = "DeviceBusy",
    [VN_CTL_ERROR_NOT_BORROWED] = "NotBorrowed",
    [VN_CTL_ERROR_NODE_UNREACHABLE] = "NodeUnreachable",
    [VN_CTL_ERROR_GENERIC] = "GenericError",
    [VN_CTL_ERROR_UNREACHABLE] = "DaemonUnreachable",
    [VN_CTL_ERROR_TIMEOUT] = "Timeout",
    [VN_CTL_ERROR_PROTOCOL] = "ProtocolError",
    [VN_CTL_ERROR_USAGE] = "UsageError",
    [VN_CTL_ERROR_DOMAIN_NOT_FOUND] = "DomainNotFound",
    [VN_CTL_ERROR_LIBVIRT] = "LibvirtError",
};

const char *vn_ctl_error_to_string(VnCtlError code)
{
    if ((unsigned)code >= VN_CTL_ERROR_LAST) {
        return "unknown";
    }
    return error_names[code];
}

VnCtlError vn_ctl_error_from_class(const char *cls)
{
    /* Only the daemon's classes: a daemon cannot claim to be "Unreachable". */
    for (unsigned i = 0; i <= VN_CTL_ERROR_GENERIC; i++) {
        if (cls != NULL && strcmp(cls, error_names[i]) == 0) {
            return (VnCtlError)i;
        }
    }
    return VN_CTL_ERROR_GENERIC;
}

/* ---- device names --------------------------------------------------------- */

bool vn_ctl_device_valid(const char *dev, GError **error)
{
    const char *slash;
    size_t host_len;
    char host[VN_MAX_NODE_NAME + 1];

    if (dev == NULL || *dev == '\0') {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "missing device: name it as host/name (e.g. hosta/nvme0)");
        return false;
    }
    slash = strchr(dev, '/');
    if (slash == NULL) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "device \"%.*s\" names no host: write it as host/name (e.g. hosta/nvme0)",
                    VN_CTL_MAX_DEVICE, dev);
        return false;
    }
    host_len = (size_t)(slash - dev);
    if (host_len > VN_MAX_NODE_NAME) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "device host \"%.*s...\" is longer than %d characters", VN_MAX_NODE_NAME, dev,
                    VN_MAX_NODE_NAME);
        return false;
    }
    memcpy(host, dev, host_len);
    host[host_len] = '\0';
    if (!vn_name_valid(VN_NAME_NODE, host)) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE,
                    "device host \"%s\" is not a node name: %s", host, vn_name_rule(VN_NAME_NODE));
        return false;
    }
    /* The offending text may be anything (a second '/', a control
     * character): say which rule, not the raw bytes. */
    if (!vn_name_valid(VN_NAME_DEVICE, slash + 1)) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_USAGE, "device name after \"%s/\" must be %s",
                    host, vn_name_rule(VN_NAME_DEVICE));
        return false;
    }
    return true;
}

const char *vn_ctl_default_socket(void)
{
    const char *env = g_getenv(VN_CTL_SOCKET_ENV);

    return env != NULL && *env != '\0' ? env : VN_CTL_DEFAULT_SOCKET;
}

/* ---- I/O against a deadline ------------------------------------------------ */

/* Milliseconds left until deadline (monotonic us), rounded up; 0 when past. */
static int remaining_ms(gint64 deadline)
{
    gint64 left = deadline - g_get_monotonic_time();

    if (left <= 0) {
        return 0;
    }
    return (int)MIN((left + 999) / 1000, G_MAXINT);
}

/* Wait until fd is ready for events; 1 ready, 0 timed out, -errno. */
static int wait_fd(int fd, short events, gint64 deadline)
{
    for (;;) {
        struct pollfd p = { .fd = fd, .events = events };
        int ms = remaining_ms(deadline);
        int r;

        if (ms == 0) {
            return 0;
        }
        r = poll(&p, 1, ms);
        if (r > 0) {
            return 1;
        }
        if (r < 0 && errno != EINTR) {
            return -errno;
        }
    }
}

static void set_broken(VnCtlClient *c, GError **error, VnCtlError code, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

/* Fail the stream: after a half-read line or a lost answer nothing on it
 * can be trusted to line up with our requests again. */
static void set_broken(VnCtlClient *c, GError **error, VnCtlError code, const char *fmt, ...)
{
    g_autofree char *msg = NULL;
    va_list ap;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    c->broken = true;
    g_set_error(error, VN_CTL_ERROR, code, "vfio-ntbd at %s: %s", c->path, msg);
}

static bool write_all(VnCtlClient *c, const char *data, size_t len, gint64 deadline, GError **error)
{
    size_t done = 0;

    while (done < len) {
        /* MSG_NOSIGNAL: a daemon that went away is an error, not SIGPIPE. */
        ssize_t n = send(c->fd, data + done, len - done, MSG_NOSIGNAL);
        int err = errno;
        int r;

        if (n >= 0) {
            done += (size_t)n;
            continue;
        }
        if (err == EINTR) {
            continue;
        }
        if (err != EAGAIN && err != EWOULDBLOCK) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "sending the request: %s", g_strerror(err));
            return false;
        }
        r = wait_fd(c->fd, POLLOUT, deadline);
        if (r == 0) {
            set_broken(c, error, VN_CTL_ERROR_TIMEOUT, "did not take the request within %d ms",
                       c->timeout_ms);
            return false;
        }
        if (r < 0) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "poll: %s", g_strerror(-r));
            return false;
        }
    }
    return true;
}

/*
 * Read one line (without its '\n') by deadline.  A line over
 * VN_CTL_MAX_LINE, EOF or the deadline fail; what says what we waited for.
 */
static char *read_line(VnCtlClient *c, gint64 deadline, VnCtlError timeout_code, const char *what,
                       guint *len_out, GError **error)
{
    guint scanned = 0;

    for (;;) {
        /* An empty GByteArray's data may be NULL: memchr must not see it. */
        guint8 *nl = c->buf->len > scanned
                         ? memchr(c->buf->data + scanned, '\n', c->buf->len - scanned)
                         : NULL;
        guint8 chunk[VN_CTL_READ_CHUNK];
        ssize_t n;
        int err;
        int r;

        if (nl != NULL) {
            guint len = (guint)(nl - c->buf->data);
            char *line;

            if (len > VN_CTL_MAX_LINE) {
                break;
            }
            line = g_strndup((const char *)c->buf->data, len);
            g_byte_array_remove_range(c->buf, 0, len + 1);
            *len_out = len;
            return line;
        }
        scanned = c->buf->len;
        if (c->buf->len > VN_CTL_MAX_LINE) {
            break;
        }
        n = recv(c->fd, chunk, sizeof(chunk), 0);
        err = errno;
        if (n > 0) {
            g_byte_array_append(c->buf, chunk, (guint)n);
            continue;
        }
        if (n == 0) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                       c->buf->len > 0 ? "closed the connection in the middle of %s"
                                       : "closed the connection before %s",
                       what);
            return NULL;
        }
        if (err == EINTR) {
            continue;
        }
        if (err != EAGAIN && err != EWOULDBLOCK) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "reading %s: %s", what, g_strerror(err));
            return NULL;
        }
        r = wait_fd(c->fd, POLLIN, deadline);
        if (r == 0) {
            set_broken(c, error, timeout_code, "%s did not come within %d ms", what, c->timeout_ms);
            return NULL;
        }
        if (r < 0) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "poll: %s", g_strerror(-r));
            return NULL;
        }
    }
    set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "%s is longer than the %d-byte line limit", what,
               VN_CTL_MAX_LINE);
    return NULL;
}

/* Parse a line into its object (owned). */
static JsonObject *parse_line(VnCtlClient *c, const char *line, guint len, const char *what,
                              GError **error)
{
    g_autoptr(GError) local = NULL;
    JsonObject *o;

    /* With a length, g_utf8_validate() also refuses NUL bytes, which would
     * otherwise cut the line short for the parser and hide what follows. */
    if (len > 0 && !g_utf8_validate(line, len, NULL)) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "%s is not valid UTF-8 text", what);
        return NULL;
    }
    o = vn_json_parse_object(line, (gssize)len, VN_CTL_MAX_LINE, &local);
    if (o == NULL && local->domain == JSON_PARSER_ERROR) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "%s is not JSON: %s", what, local->message);
    } else if (o == NULL && g_error_matches(local, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE)) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "%s is refused: %s", what, local->message);
    } else if (o == NULL) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL, "%s is not a JSON object", what);
    }
    return o;
}

/* ---- connect and greeting -------------------------------------------------- */

static bool do_connect(VnCtlClient *c, gint64 deadline, GError **error)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    /* At least 1 ms: a zero SO_SNDTIMEO means "wait forever". */
    int ms = MAX(remaining_ms(deadline), 1);
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    int err;
    int r;

    if (strlen(c->path) >= sizeof(sa.sun_path)) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE,
                    "cannot reach vfio-ntbd at %s: the path is longer than %zu bytes", c->path,
                    sizeof(sa.sun_path) - 1);
        return false;
    }
    memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        err = errno;
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE,
                    "cannot reach vfio-ntbd at %s: socket: %s", c->path, g_strerror(err));
        return false;
    }
    /* A UNIX connect() only blocks while the listener's backlog is full;
     * Linux bounds that wait by the send timeout. */
    (void)setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    do {
        r = connect(c->fd, (struct sockaddr *)&sa, sizeof(sa));
        err = errno;
    } while (r < 0 && err == EINTR && remaining_ms(deadline) > 0);
    if (r < 0) {
        const char *why = g_strerror(err);

        if (err == EAGAIN || err == EINPROGRESS || err == EINTR) {
            why = "connect timed out (the daemon is not accepting)";
        } else if (err == EACCES || err == EPERM) {
            why = "permission denied (the control socket is root only)";
        }
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE,
                    "cannot reach vfio-ntbd at %s: %s", c->path, why);
        return false;
    }
    if (fcntl(c->fd, F_SETFL, O_NONBLOCK) < 0) {
        err = errno;
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_UNREACHABLE,
                    "cannot reach vfio-ntbd at %s: fcntl: %s", c->path, g_strerror(err));
        return false;
    }
    return true;
}

/* {"vfio-ntbd": {"version": "0.1.0", "node": "hosta"}} */
static bool read_greeting(VnCtlClient *c, gint64 deadline, GError **error)
{
    g_autofree char *line = NULL;
    g_autoptr(JsonObject) o = NULL;
    JsonNode *g;
    const char *version, *node;
    guint len = 0;

    line = read_line(c, deadline, VN_CTL_ERROR_UNREACHABLE, "the greeting", &len, error);
    if (line == NULL || !(o = parse_line(c, line, len, "the greeting", error))) {
        return false;
    }
    g = json_object_get_member(o, "vfio-ntbd");
    if (g == NULL || !JSON_NODE_HOLDS_OBJECT(g) ||
        !(version = vn_util_json_string(json_node_get_object(g), "version")) ||
        !(node = vn_util_json_string(json_node_get_object(g), "node"))) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                   "not a vfio-ntbd greeting (is this the daemon's control socket?)");
        return false;
    }
    if (!vn_name_valid(VN_NAME_NODE, node) || strlen(version) > VN_CTL_MAX_VERSION) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                   "the greeting names an invalid node or version");
        return false;
    }
    c->node = g_strdup(node);
    c->version = g_strdup(version);
    trace_client_greeting(c->path, node, version);
    return true;
}

VnCtlClient *vn_ctl_client_connect(const char *path, int timeout_ms, GError **error)
{
    g_autoptr(VnCtlClient) c = NULL;
    gint64 deadline;

    g_return_val_if_fail(path != NULL && timeout_ms > 0, NULL);
    c = g_new0(VnCtlClient, 1);
    c->path = g_strdup(path);
    c->fd = -1;
    c->timeout_ms = timeout_ms;
    c->buf = g_byte_array_new();
    c->next_id = 1;
    deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;
    if (!do_connect(c, deadline, error) || !read_greeting(c, deadline, error)) {
        return NULL;
    }
    return g_steal_pointer(&c);
}

void vn_ctl_client_free(VnCtlClient *c)
{
    if (c == NULL) {
        return;
    }
    vn_util_close_fd(&c->fd);
    g_byte_array_unref(c->buf);
    g_free(c->path);
    g_free(c->node);
    g_free(c->version);
    g_free(c);
}

const char *vn_ctl_client_node(const VnCtlClient *c)
{
    return c->node;
}

const char *vn_ctl_client_version(const VnCtlClient *c)
{
    return c->version;
}

const char *vn_ctl_client_path(const VnCtlClient *c)
{
    return c->path;
}

/* ---- execute ------------------------------------------------------------ */

static char *build_request(const char *command, JsonObject *arguments, gint64 id)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "execute");
    json_builder_add_string_value(b, command);
    if (arguments != NULL) {
        JsonNode *args = json_node_alloc();

        json_builder_set_member_name(b, "arguments");
        /* json_node_init_object takes its own reference: arguments stays the caller's. */
        json_builder_add_value(b, json_node_init_object(args, arguments));
    }
    json_builder_set_member_name(b, "id");
    json_builder_add_int_value(b, id);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    /* Not pretty: json-glib escapes control characters inside strings, so
     * the request is one line. */
    return json_to_string(root, FALSE);
}

/* The answer's error as a GError: class -> code, desc verbatim. */
static void answer_error(VnCtlClient *c, JsonNode *err, const char *command, GError **error)
{
    JsonObject *o = err != NULL && JSON_NODE_HOLDS_OBJECT(err) ? json_node_get_object(err) : NULL;
    const char *cls = o != NULL ? vn_util_json_string(o, "class") : NULL;
    const char *desc = o != NULL ? vn_util_json_string(o, "desc") : NULL;

    if (cls == NULL || desc == NULL) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                   "malformed error answer to %s (no \"class\" and \"desc\" strings)", command);
        return;
    }
    trace_client_refused(c->path, command, cls);
    g_set_error_literal(error, VN_CTL_ERROR, vn_ctl_error_from_class(cls), desc);
}

JsonNode *vn_ctl_client_execute(VnCtlClient *c, const char *command, JsonObject *arguments,
                                GError **error)
{
    g_autofree char *req = NULL;
    gint64 id, deadline;
    size_t len;

    g_return_val_if_fail(c != NULL && command != NULL, NULL);
    if (c->broken) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL,
                    "vfio-ntbd at %s: connection unusable after an earlier error", c->path);
        return NULL;
    }
    id = c->next_id++;
    req = build_request(command, arguments, id);
    len = strlen(req);
    if (len > VN_CTL_MAX_LINE) {
        /* The daemon would refuse it and hang up; say so without sending. */
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_INVALID_PARAMETER,
                    "%s: request is longer than the %d-byte line limit", command, VN_CTL_MAX_LINE);
        return NULL;
    }
    req[len] = '\n'; /* replaces the NUL; len + 1 bytes go out */
    trace_client_send(c->path, command, id);
    deadline = g_get_monotonic_time() + (gint64)c->timeout_ms * 1000;
    if (!write_all(c, req, len + 1, deadline, error)) {
        return NULL;
    }
    for (;;) {
        g_autofree char *line = NULL;
        g_autofree char *what = g_strdup_printf("the answer to %s", command);
        g_autoptr(JsonObject) o = NULL;
        JsonNode *idn, *ret, *err;
        guint len_in = 0;

        line = read_line(c, deadline, VN_CTL_ERROR_TIMEOUT, what, &len_in, error);
        if (line == NULL || !(o = parse_line(c, line, len_in, what, error))) {
            return NULL;
        }
        if (json_object_has_member(o, "event")) {
            /* subscribe-events output; this client waits for its answer. */
            trace_client_event_skipped(
                c->path, vn_util_json_string(o, "event") ? vn_util_json_string(o, "event") : "?");
            continue;
        }
        idn = json_object_get_member(o, "id");
        if (idn == NULL || json_node_get_value_type(idn) != G_TYPE_INT64 ||
            json_node_get_int(idn) != id) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                       "answered %s with another id than %" G_GINT64_FORMAT, command, id);
            return NULL;
        }
        ret = json_object_get_member(o, "return");
        err = json_object_get_member(o, "error");
        if ((ret == NULL) == (err == NULL)) {
            set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                       "answer to %s has %s of \"return\" and \"error\"", command,
                       ret == NULL ? "neither" : "both");
            return NULL;
        }
        if (err != NULL) {
            answer_error(c, err, command, error);
            return NULL;
        }
        trace_client_reply(c->path, command, id);
        return json_node_copy(ret);
    }
}

/* ---- events --------------------------------------------------------------- */

/* docs/control.md's event names: upper case and '_', short. */
static bool event_name_ok(const char *name)
{
    size_t n = strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");

    return n > 0 && n <= 32 && name[n] == '\0';
}

JsonObject *vn_ctl_client_next_event(VnCtlClient *c, int timeout_ms, GError **error)
{
    /* "Until one comes": far enough that remaining_ms() cannot overflow. */
    gint64 deadline =
        timeout_ms < 0 ? G_MAXINT64 / 2 : g_get_monotonic_time() + (gint64)timeout_ms * 1000;
    g_autofree char *line = NULL;
    g_autoptr(JsonObject) o = NULL;
    g_autoptr(GError) local = NULL;
    const char *name;
    JsonNode *data, *ts;
    guint len = 0;

    g_return_val_if_fail(c != NULL, NULL);
    if (c->broken) {
        g_set_error(error, VN_CTL_ERROR, VN_CTL_ERROR_PROTOCOL,
                    "vfio-ntbd at %s: connection unusable after an earlier error", c->path);
        return NULL;
    }
    line = read_line(c, deadline, VN_CTL_ERROR_TIMEOUT, "an event", &len, &local);
    if (line == NULL && g_error_matches(local, VN_CTL_ERROR, VN_CTL_ERROR_TIMEOUT)) {
        c->broken = false; /* nothing was half read: waiting again is fine */
    }
    if (line == NULL) {
        g_propagate_error(error, g_steal_pointer(&local));
        return NULL;
    }
    if (!(o = parse_line(c, line, len, "an event", error))) {
        return NULL;
    }
    name = vn_util_json_string(o, "event");
    data = json_object_get_member(o, "data");
    ts = json_object_get_member(o, "timestamp");
    if (name == NULL || !event_name_ok(name) || data == NULL || !JSON_NODE_HOLDS_OBJECT(data) ||
        ts == NULL || !JSON_NODE_HOLDS_OBJECT(ts)) {
        set_broken(c, error, VN_CTL_ERROR_PROTOCOL,
                   "malformed event line (wants \"event\", \"data\" and \"timestamp\")");
        return NULL;
    }
    trace_client_event(c->path, name);
    return g_steal_pointer(&o);
}
