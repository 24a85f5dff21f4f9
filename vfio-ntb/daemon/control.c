/*
 * vfio-ntbd's control socket: QMP-style JSON lines (docs/control.md).
 *
 * Clients are untrusted, and none may lock the others out or slow the
 * daemon: a line is at most VN_CONTROL_MAX_LINE bytes (a NUL byte in it is
 * refused with an answer), every request is checked (object, "execute"
 * string, "arguments" object with known names only) before a command runs,
 * and a bad request gets an error answer and changes nothing.  Sends never
 * wait: what a client has not read yet waits in its queue, and one whose
 * queue passes VN_CONTROL_MAX_QUEUED is dropped.  A client idle for
 * VN_CONTROL_IDLE_MS (no request, no answer due, no events asked for) is
 * closed; when VN_CONTROL_MAX_CLIENTS are connected, a new one takes the
 * place of the one idle longest, so held connections never lock ntbctl out.
 * The last VN_CONTROL_MAX_HISTORY events are kept for a subscriber that
 * asks for those since a time (one that reconnects after a restart).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "control.h"

#include "conf.h"

#include "common/json.h"
#include "common/name.h"
#include "common/util.h"
#include "config.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* One request line; generous for any argument we take. */
#define VN_CONTROL_MAX_LINE (64 * 1024)
/* ntbctl, hooks, scripts, event followers: a handful at a time. */
#define VN_CONTROL_MAX_CLIENTS 64
/* Answers waiting per client (a revoke waits its grace period). */
#define VN_CONTROL_MAX_PENDING 16
/* Unread output per client: the largest answer (a full cluster's list,
 * counters) many times over; a client that lets more pile up is not
 * reading. */
#define VN_CONTROL_MAX_QUEUED (4 * 1024 * 1024)
/* A connection that asks nothing and waits for nothing this long is
 * closed: long enough for a script that keeps one open between steps (a
 * held connection never locks a new one out: make_room()). */
#define VN_CONTROL_IDLE_MS (10 * 60 * 1000)
/* Looked for this often: a tenth of the timeout is precise enough, and an
 * idle daemon does not wake each second for it. */
#define VN_CONTROL_IDLE_CHECK_MS (VN_CONTROL_IDLE_MS / 10)
/* Events kept for subscribers that ask for those since a time. */
#define VN_CONTROL_MAX_HISTORY 256
/* Connects the kernel queues before we accept them: a burst of ntbctl. */
#define VN_CONTROL_BACKLOG 256

typedef struct Client {
    VnControl *ctl;
    int fd;
    guint watch;
    guint out_watch; /* while @out holds what the socket did not take */
    GString *in;
    GString *out;
    gint64 active_us; /* the last request (or the connect) */
    bool events;
    unsigned pending; /* replies not yet answered */
    unsigned refs;    /* the client and each pending reply */
} Client;

struct VnControlReply {
    Client *client; /* NULL once the client went */
    JsonNode *id;
};

typedef struct Event {
    gint64 real_us;
    char *line; /* with its newline */
} Event;

struct VnControl {
    VnDaemon *d;
    VnCommandLookup lookup; /* the command table (commands.c's, or a test's) */
    char *path;
    int fd;
    guint watch;
    guint idle_timer;
    GPtrArray *clients;
    GQueue history; /* Event, oldest first */
};

static void client_unref(Client *c)
{
    if (--c->refs == 0) {
        g_string_free(c->in, TRUE);
        g_string_free(c->out, TRUE);
        g_free(c);
    }
}

static void client_close(Client *c)
{
    if (c->fd < 0) {
        return;
    }
    g_source_remove(c->watch);
    if (c->out_watch != 0) {
        g_source_remove(c->out_watch);
        c->out_watch = 0;
    }
    vn_util_close_fd(&c->fd);
    g_ptr_array_remove(c->ctl->clients, c);
    client_unref(c);
}

static gboolean on_writable(int fd, GIOCondition cond, gpointer data);

/* Send what the socket takes now; false when the client was dropped. */
static bool client_flush(Client *c)
{
    while (c->fd >= 0 && c->out->len > 0) {
        ssize_t n = send(c->fd, c->out->str, c->out->len, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (c->out_watch == 0) {
                c->out_watch = g_unix_fd_add(c->fd, G_IO_OUT, on_writable, c);
            }
            return true;
        }
        if (n <= 0) {
            g_info("control: a client's connection broke (%s); dropped", g_strerror(errno));
            client_close(c);
            return false;
        }
        g_string_erase(c->out, 0, n);
    }
    if (c->out_watch != 0) {
        g_source_remove(c->out_watch);
        c->out_watch = 0;
    }
    return c->fd >= 0;
}

static gboolean on_writable(int fd, GIOCondition cond, gpointer data)
{
    Client *c = data;

    c->out_watch = 0; /* client_flush adds it again while something is left */
    client_flush(c);
    return G_SOURCE_REMOVE;
}

/* Queue @line (with its newline) for @c, never waiting. */
static void send_line(Client *c, const char *line, size_t len)
{
    if (c->fd < 0) {
        return;
    }
    if (c->out->len + len > VN_CONTROL_MAX_QUEUED) {
        g_info("control: a client left %zu bytes unread; dropped", c->out->len);
        client_close(c);
        return;
    }
    g_string_append_len(c->out, line, (gssize)len);
    if (c->out_watch == 0) {
        client_flush(c);
    }
}

static void send_node(Client *c, JsonNode *node)
{
    g_autofree char *text = json_to_string(node, FALSE);
    g_autofree char *line = g_strconcat(text, "\n", NULL);

    send_line(c, line, strlen(line));
}

static void reply_free(VnControlReply *r)
{
    if (r->client != NULL) {
        r->client->pending--;
        client_unref(r->client);
    }
    if (r->id != NULL) {
        json_node_unref(r->id);
    }
    g_free(r);
}

static void reply_send(VnControlReply *r, const char *member, JsonNode *value)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, member);
    json_builder_add_value(b, value);
    if (r->id != NULL) {
        json_builder_set_member_name(b, "id");
        json_builder_add_value(b, json_node_copy(r->id));
    }
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    if (r->client != NULL) {
        send_node(r->client, root);
    }
    reply_free(r);
}

void vn_control_return(VnControlReply *r, JsonNode *value)
{
    if (value == NULL) {
        /* take: json_node_init_object() would add a reference of its own */
        value = json_node_new(JSON_NODE_OBJECT);
        json_node_take_object(value, json_object_new());
    }
    /* What changed may not survive a restart: every answer says so until a
     * save works (docs/control.md, "saved"). */
    if (r->client != NULL && r->client->ctl->d->unsaved && JSON_NODE_HOLDS_OBJECT(value) &&
        !json_object_has_member(json_node_get_object(value), "saved")) {
        json_object_set_boolean_member(json_node_get_object(value), "saved", FALSE);
    }
    reply_send(r, "return", value);
}

void vn_control_error(VnControlReply *r, const char *klass, const char *fmt, ...)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autofree char *desc = NULL;
    va_list ap;

    va_start(ap, fmt);
    desc = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "class");
    json_builder_add_string_value(b, klass);
    json_builder_set_member_name(b, "desc");
    json_builder_add_string_value(b, desc);
    json_builder_end_object(b);
    reply_send(r, "error", json_builder_get_root(b));
}

bool vn_control_arg_device(JsonObject *a, VnControlReply *r, char **node, char **name)
{
    const char *dev = vn_util_json_string(a, "device");
    const char *slash = dev ? strchr(dev, '/') : NULL;

    if (dev == NULL) {
        vn_control_error(r, VN_ERR_PARAM, "\"device\" (a string, host/name) is required");
        return false;
    }
    if (slash == NULL || strchr(slash + 1, '/') != NULL) {
        vn_control_error(r, VN_ERR_PARAM, "device \"%.80s\" is not host/name", dev);
        return false;
    }
    *node = g_strndup(dev, (gsize)(slash - dev));
    *name = g_strdup(slash + 1);
    if (!vn_name_valid(VN_NAME_NODE, *node) || !vn_name_valid(VN_NAME_DEVICE, *name)) {
        vn_control_error(r, VN_ERR_PARAM, "device \"%.80s\" is not host/name", dev);
        g_clear_pointer(node, g_free);
        g_clear_pointer(name, g_free);
        return false;
    }
    return true;
}

static void event_free(gpointer p)
{
    Event *e = p;

    g_free(e->line);
    g_free(e);
}

void vn_control_event(VnControl *ctl, const char *name, JsonNode *data)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *text = NULL;
    gint64 now = g_get_real_time();
    Event *e;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "event");
    json_builder_add_string_value(b, name);
    json_builder_set_member_name(b, "data");
    json_builder_add_value(b, data);
    json_builder_set_member_name(b, "timestamp");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "seconds");
    json_builder_add_int_value(b, now / G_USEC_PER_SEC);
    json_builder_set_member_name(b, "microseconds");
    json_builder_add_int_value(b, now % G_USEC_PER_SEC);
    json_builder_end_object(b);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    text = json_to_string(root, FALSE);
    g_info("event %s", name);
    e = g_new0(Event, 1);
    e->real_us = now;
    e->line = g_strconcat(text, "\n", NULL);
    g_queue_push_tail(&ctl->history, e);
    if (g_queue_get_length(&ctl->history) > VN_CONTROL_MAX_HISTORY) {
        event_free(g_queue_pop_head(&ctl->history));
    }
    /* Backwards: send_line may drop a client from the array. */
    for (guint i = ctl->clients->len; i > 0; i--) {
        Client *c = ctl->clients->pdata[i - 1];

        if (c->events) {
            send_line(c, e->line, strlen(e->line));
        }
    }
}

void vn_control_subscribe(VnControlReply *r, gint64 since_us)
{
    Client *c = r->client;

    if (c == NULL) {
        vn_control_return(r, NULL);
        return;
    }
    c->refs++; /* the answer may drop it */
    vn_control_return(r, NULL);
    if (c->fd >= 0) {
        c->events = true;
    }
    /* What happened after @since_us and is still kept, oldest first. */
    for (GList *l = c->ctl->history.head; since_us > 0 && l != NULL && c->fd >= 0; l = l->next) {
        Event *e = l->data;

        if (e->real_us > since_us) {
            send_line(c, e->line, strlen(e->line));
        }
    }
    client_unref(c);
}

/* Check a request and run its command. */
static void dispatch(Client *c, const char *line)
{
    g_autoptr(GError) error = NULL;
    VnControlReply *r = g_new0(VnControlReply, 1);
    const char *const *allowed = NULL;
    g_autoptr(JsonObject) args = NULL;
    g_autoptr(GList) members = NULL;
    g_autoptr(JsonObject) req = NULL;
    JsonNode *exe, *argn;
    const char *name;
    VnCommandFn fn;

    r->client = c;
    c->refs++;
    c->pending++;
    req = vn_json_parse_object(line, -1, VN_CONTROL_MAX_LINE, &error);
    if (req == NULL) {
        vn_control_error(r, VN_ERR_PARAM, "malformed request: %s", error->message);
        return;
    }
    if (json_object_has_member(req, "id")) {
        r->id = json_node_copy(json_object_get_member(req, "id"));
    }
    exe = json_object_get_member(req, "execute");
    if (exe == NULL || !JSON_NODE_HOLDS_VALUE(exe) ||
        json_node_get_value_type(exe) != G_TYPE_STRING) {
        vn_control_error(r, VN_ERR_PARAM, "a request needs \"execute\": a command name");
        return;
    }
    name = json_node_get_string(exe);
    fn = c->ctl->lookup(name, &allowed);
    if (fn == NULL) {
        vn_control_error(r, VN_ERR_COMMAND, "unknown command \"%.64s\"", name);
        return;
    }
    argn = json_object_get_member(req, "arguments");
    if (argn != NULL && !JSON_NODE_HOLDS_OBJECT(argn)) {
        vn_control_error(r, VN_ERR_PARAM, "\"arguments\" must be an object");
        return;
    }
    args = argn != NULL ? json_object_ref(json_node_get_object(argn)) : json_object_new();
    members = json_object_get_members(args);
    for (GList *it = members; it != NULL; it = it->next) {
        if (allowed == NULL || !g_strv_contains(allowed, it->data)) {
            vn_control_error(r, VN_ERR_PARAM, "%s: unknown argument \"%.64s\"", name,
                             (const char *)it->data);
            return;
        }
    }
    fn(c->ctl->d, args, r);
}

/* Answer @c with an error at once (a request that never reached a command). */
static void refuse(Client *c, const char *klass, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static void refuse(Client *c, const char *klass, const char *fmt, ...)
{
    VnControlReply *r = g_new0(VnControlReply, 1);
    g_autofree char *desc = NULL;
    va_list ap;

    va_start(ap, fmt);
    desc = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    r->client = c;
    c->refs++;
    c->pending++;
    vn_control_error(r, klass, "%s", desc);
}

static gboolean on_client(int fd, GIOCondition cond, gpointer data)
{
    Client *c = data;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    char *nl;

    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        /* Answers still pending keep the Client; they are dropped unsent. */
        client_close(c);
        return G_SOURCE_REMOVE;
    }
    if (n < 0) {
        return G_SOURCE_CONTINUE;
    }
    c->active_us = g_get_monotonic_time();
    g_string_append_len(c->in, buf, n);
    c->refs++; /* dispatch may close the client */
    while (c->fd >= 0 && (nl = memchr(c->in->str, '\n', c->in->len)) != NULL) {
        size_t len = (size_t)(nl - c->in->str);
        g_autofree char *line = g_strndup(c->in->str, len);
        bool nul = memchr(c->in->str, '\0', len) != NULL;

        g_string_erase(c->in, 0, (gssize)len + 1);
        if (nul) {
            refuse(c, VN_ERR_PARAM, "malformed request: a NUL byte in the line");
            continue;
        }
        if (line[0] == '\0') {
            continue;
        }
        if (c->pending >= VN_CONTROL_MAX_PENDING) {
            refuse(c, VN_ERR_GENERIC, "too many requests in flight");
            continue;
        }
        dispatch(c, line);
    }
    if (c->fd >= 0 && c->in->len > VN_CONTROL_MAX_LINE) {
        refuse(c, VN_ERR_PARAM, "request longer than %d bytes", VN_CONTROL_MAX_LINE);
        client_close(c);
    }
    client_unref(c);
    return G_SOURCE_CONTINUE;
}

/* Waiting for nothing: no answer due, no events asked for. */
static bool client_idle(const Client *c)
{
    return c->pending == 0 && !c->events;
}

static gboolean on_idle_check(gpointer data)
{
    VnControl *ctl = data;
    gint64 now = g_get_monotonic_time();

    for (guint i = ctl->clients->len; i > 0; i--) {
        Client *c = ctl->clients->pdata[i - 1];

        if (client_idle(c) && now - c->active_us > (gint64)VN_CONTROL_IDLE_MS * 1000) {
            g_info("control: a client idle for %d ms; closed", VN_CONTROL_IDLE_MS);
            client_close(c);
        }
    }
    return G_SOURCE_CONTINUE;
}

/* Room for a new client: the one whose last request is oldest goes, an idle
 * one first, else a subscriber; false when every one waits for an answer. */
static bool make_room(VnControl *ctl)
{
    Client *oldest = NULL;

    for (int pass = 0; pass < 2 && oldest == NULL; pass++) {
        for (guint i = 0; i < ctl->clients->len; i++) {
            Client *c = ctl->clients->pdata[i];
            bool candidate = pass == 0 ? client_idle(c) : c->pending == 0;

            if (candidate && (oldest == NULL || c->active_us < oldest->active_us)) {
                oldest = c;
            }
        }
    }
    if (oldest == NULL) {
        return false;
    }
    g_info("control: %d clients; the one idle longest makes room for a new one",
           VN_CONTROL_MAX_CLIENTS);
    client_close(oldest);
    return true;
}

static void greet(VnControl *ctl, Client *c)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "vfio-ntbd");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "version");
    json_builder_add_string_value(b, VN_VERSION);
    json_builder_set_member_name(b, "node");
    json_builder_add_string_value(b, ctl->d->conf->node);
    json_builder_end_object(b);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    send_node(c, root);
}

static gboolean on_accept(int fd, GIOCondition cond, gpointer data)
{
    VnControl *ctl = data;
    int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    Client *c;

    if (cfd < 0) {
        return G_SOURCE_CONTINUE;
    }
    if (ctl->clients->len >= VN_CONTROL_MAX_CLIENTS && !make_room(ctl)) {
        g_info("control: %d clients, each waiting for an answer; refusing one",
               VN_CONTROL_MAX_CLIENTS);
        close(cfd);
        return G_SOURCE_CONTINUE;
    }
    c = g_new0(Client, 1);
    c->ctl = ctl;
    c->fd = cfd;
    c->refs = 1;
    c->in = g_string_new(NULL);
    c->out = g_string_new(NULL);
    c->active_us = g_get_monotonic_time();
    c->watch = g_unix_fd_add(cfd, G_IO_IN | G_IO_HUP | G_IO_ERR, on_client, c);
    g_ptr_array_add(ctl->clients, c);
    greet(ctl, c);
    return G_SOURCE_CONTINUE;
}

bool vn_control_path_free(const char *path, GError **error)
{
    struct sockaddr_un addr;

    if (strlen(path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "control socket %s: path too long", path);
        return false;
    }
    switch (vn_util_socket_path_claim(path)) {
    case VN_UTIL_SOCKET_NOT_SOCKET:
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_EXISTS,
                    "control socket %s: exists and is not a socket; not replacing it", path);
        return false;
    case VN_UTIL_SOCKET_LIVE:
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE,
                    "control socket %s: a running vfio-ntbd answers on it; "
                    "not starting a second one",
                    path);
        return false;
    default:
        return true;
    }
}

VnControl *vn_control_new(VnDaemon *d, const char *path, VnCommandLookup lookup, GError **error)
{
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    g_autofree char *dir = g_path_get_dirname(path);
    g_autofree char *pending = g_strconcat(path, ".new", NULL);
    VnControl *ctl;
    mode_t old;
    int fd;

    if (strlen(pending) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "control socket %s: path too long", path);
        return NULL;
    }
    if (g_mkdir_with_parents(dir, 0700) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "control socket %s: %s", path,
                    g_strerror(errno));
        return NULL;
    }
    /* A socket left by a dead daemon (nobody answers on it) is replaced; a
     * live daemon's is not. */
    if (!vn_control_path_free(path, error)) {
        return NULL;
    }
    /* Bound under another name and renamed once it listens: whoever sees the path can
     * connect (a connect between bind() and listen() is refused). */
    unlink(pending);
    strcpy(addr.sun_path, pending);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    old = umask(0177); /* root-only from the start, no chmod race */
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        listen(fd, VN_CONTROL_BACKLOG) < 0 || rename(pending, path) < 0) {
        int e = errno;

        umask(old);
        if (fd >= 0) {
            close(fd);
            unlink(pending);
        }
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "control socket %s: %s", path,
                    g_strerror(e));
        return NULL;
    }
    umask(old);
    ctl = g_new0(VnControl, 1);
    ctl->d = d;
    ctl->lookup = lookup;
    ctl->path = g_strdup(path);
    ctl->fd = fd;
    ctl->clients = g_ptr_array_new();
    ctl->watch = g_unix_fd_add(fd, G_IO_IN, on_accept, ctl);
    g_queue_init(&ctl->history);
    ctl->idle_timer = g_timeout_add(VN_CONTROL_IDLE_CHECK_MS, on_idle_check, ctl);
    return ctl;
}

void vn_control_free(VnControl *ctl)
{
    if (ctl == NULL) {
        return;
    }
    while (ctl->clients->len > 0) {
        client_close(ctl->clients->pdata[0]);
    }
    g_ptr_array_unref(ctl->clients);
    g_source_remove(ctl->watch);
    g_source_remove(ctl->idle_timer);
    g_queue_clear_full(&ctl->history, event_free);
    close(ctl->fd);
    unlink(ctl->path);
    g_free(ctl->path);
    g_free(ctl);
}
