/*
 * A worker's control channel (wctl.h): a small JSON-line server in the
 * worker, and the daemon's bounded client.
 */
#define G_LOG_DOMAIN "vfio-ntb.common"

#include "common/wctl.h"
#include "common/json.h"

#include <errno.h>
#include <gio/gio.h>
#include <gio/gunixsocketaddress.h>
#include <json-glib/json-glib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct VnWctl {
    char *path;
    GSocket *listener;
    GSource *src;
    VnWctlHandler handler;
    void *opaque;
    GPtrArray *clients; /* WctlClient */
};

typedef struct WctlClient {
    VnWctl *w;
    GSocket *sock;
    GSource *src;
    GString *buf;
} WctlClient;

static void client_free(gpointer p)
{
    WctlClient *c = p;

    if (c->src != NULL) {
        g_source_destroy(c->src);
        g_source_unref(c->src);
    }
    g_socket_close(c->sock, NULL);
    g_object_unref(c->sock);
    g_string_free(c->buf, TRUE);
    g_free(c);
}

/* The reply line to @line (new). */
static char *answer(VnWctl *w, const char *line)
{
    g_autoptr(JsonObject) req = vn_json_parse_object(line, -1, VN_WCTL_MAX_REQUEST, NULL);
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *value = NULL;
    JsonNode *exe = req != NULL ? json_object_get_member(req, "execute") : NULL;

    if (exe == NULL || !JSON_NODE_HOLDS_VALUE(exe) ||
        json_node_get_value_type(exe) != G_TYPE_STRING) {
        g_set_error(&error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "a request is {\"execute\": NAME}");
    } else {
        value = w->handler(w->opaque, json_node_get_string(exe), &error);
    }
    if (value != NULL) {
        return g_strdup_printf("{\"return\":%s}\n", value);
    }
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "error");
    json_builder_add_string_value(b, error != NULL ? error->message : "failed");
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    {
        g_autofree char *text = json_to_string(root, FALSE);

        return g_strdup_printf("%s\n", text);
    }
}

static gboolean on_client(GSocket *sock, GIOCondition cond, gpointer data)
{
    WctlClient *c = data;
    VnWctl *w = c->w;
    char chunk[256];
    gssize n = g_socket_receive(sock, chunk, sizeof(chunk), NULL, NULL);
    const char *nl;

    if (n <= 0) {
        if (n < 0 && (cond & (G_IO_HUP | G_IO_ERR)) == 0) {
            return G_SOURCE_CONTINUE; /* EAGAIN */
        }
        g_ptr_array_remove(w->clients, c);
        return G_SOURCE_REMOVE;
    }
    g_string_append_len(c->buf, chunk, n);
    nl = memchr(c->buf->str, '\n', c->buf->len);
    if (nl == NULL && c->buf->len < VN_WCTL_MAX_REQUEST) {
        return G_SOURCE_CONTINUE;
    }
    if (nl != NULL) {
        g_autofree char *reply = NULL;

        g_string_truncate(c->buf, (gsize)(nl - c->buf->str));
        reply = answer(w, c->buf->str);
        /* Non-blocking, once: a daemon that does not read its answer gets
         * none, and the worker never waits on it. */
        g_socket_send(sock, reply, strlen(reply), NULL, NULL);
    }
    g_ptr_array_remove(w->clients, c); /* one request per connection */
    return G_SOURCE_REMOVE;
}

static gboolean on_accept(GSocket *listener, GIOCondition cond, gpointer data)
{
    VnWctl *w = data;
    GSocket *sock = g_socket_accept(listener, NULL, NULL);
    WctlClient *c;

    if (sock == NULL) {
        return G_SOURCE_CONTINUE;
    }
    if (w->clients->len >= VN_WCTL_MAX_CLIENTS) {
        g_socket_close(sock, NULL);
        g_object_unref(sock);
        return G_SOURCE_CONTINUE;
    }
    g_socket_set_blocking(sock, FALSE);
    c = g_new0(WctlClient, 1);
    c->w = w;
    c->sock = sock;
    c->buf = g_string_new(NULL);
    c->src = g_socket_create_source(sock, G_IO_IN | G_IO_HUP | G_IO_ERR, NULL);
    g_source_set_callback(c->src, (GSourceFunc)(void (*)(void))on_client, c, NULL);
    g_source_attach(c->src, g_main_context_get_thread_default());
    g_ptr_array_add(w->clients, c);
    return G_SOURCE_CONTINUE;
}

VnWctl *vn_wctl_new(const char *path, VnWctlHandler handler, void *opaque, GError **error)
{
    g_autoptr(GSocketAddress) addr = NULL;
    g_autoptr(VnWctl) w = g_new0(VnWctl, 1);
    mode_t old;
    bool ok;

    w->path = g_strdup(path);
    w->handler = handler;
    w->opaque = opaque;
    w->clients = g_ptr_array_new_with_free_func(client_free);
    w->listener =
        g_socket_new(G_SOCKET_FAMILY_UNIX, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_DEFAULT, error);
    if (w->listener == NULL) {
        g_prefix_error(error, "control channel %s: ", path);
        return NULL;
    }
    unlink(path); /* one per worker: a file there is a dead one's */
    addr = g_unix_socket_address_new(path);
    old = umask(0177); /* the daemon's alone, from the start */
    ok = g_socket_bind(w->listener, addr, FALSE, error) && g_socket_listen(w->listener, error);
    umask(old);
    if (!ok) {
        g_prefix_error(error, "control channel %s: ", path);
        return NULL;
    }
    g_socket_set_blocking(w->listener, FALSE);
    w->src = g_socket_create_source(w->listener, G_IO_IN, NULL);
    g_source_set_callback(w->src, (GSourceFunc)(void (*)(void))on_accept, w, NULL);
    g_source_attach(w->src, g_main_context_get_thread_default());
    return g_steal_pointer(&w);
}

void vn_wctl_free(VnWctl *w)
{
    if (w == NULL) {
        return;
    }
    if (w->src != NULL) {
        g_source_destroy(w->src);
        g_source_unref(w->src);
        unlink(w->path);
    }
    g_clear_pointer(&w->clients, g_ptr_array_unref);
    if (w->listener != NULL) {
        g_socket_close(w->listener, NULL);
        g_object_unref(w->listener);
    }
    g_free(w->path);
    g_free(w);
}

/* ---- the daemon's side ---- */

/* The "return" value of the answer line in @in (ends at its first newline). */
static char *answer_parse(const char *path, GString *in, size_t max_reply, GError **error)
{
    g_autoptr(JsonObject) reply = NULL;
    JsonNode *ret, *err;

    g_string_truncate(in, (gsize)((char *)memchr(in->str, '\n', in->len) - in->str));
    reply = vn_json_parse_object(in->str, (gssize)in->len, max_reply, error);
    if (reply == NULL) {
        g_prefix_error(error, "worker channel %s: ", path);
        return NULL;
    }
    ret = json_object_get_member(reply, "return");
    err = json_object_get_member(reply, "error");
    if (ret == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "worker channel %s: %s", path,
                    err != NULL && JSON_NODE_HOLDS_VALUE(err) &&
                            json_node_get_value_type(err) == G_TYPE_STRING
                        ? json_node_get_string(err)
                        : "no \"return\" in the answer");
        return NULL;
    }
    return json_to_string(ret, FALSE);
}

/* A connected socket with the request for @name sent, or NULL.  Never
 * waits: a worker whose backlog is full is busy, not waited for. */
static GSocket *call_open(const char *path, const char *name, GError **error)
{
    g_autoptr(GSocketAddress) addr = g_unix_socket_address_new(path);
    g_autoptr(GSocket) sock = NULL;
    g_autofree char *req = g_strdup_printf("{\"execute\":\"%s\"}\n", name);

    sock =
        g_socket_new(G_SOCKET_FAMILY_UNIX, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_DEFAULT, error);
    if (sock != NULL) {
        g_socket_set_blocking(sock, FALSE);
    }
    if (sock == NULL || !g_socket_connect(sock, addr, NULL, error) ||
        g_socket_send(sock, req, strlen(req), NULL, error) != (gssize)strlen(req)) {
        g_prefix_error(error, "worker channel %s: ", path);
        return NULL;
    }
    return g_steal_pointer(&sock);
}

struct VnWctlCall {
    char *path;
    GSocket *sock;
    GSource *io;
    GSource *timer;
    GString *in;
    size_t max_reply;
    VnWctlDone done;
    void *opaque;
};

void vn_wctl_call_cancel(VnWctlCall *c)
{
    if (c == NULL) {
        return;
    }
    g_source_destroy(c->io);
    g_source_unref(c->io);
    g_source_destroy(c->timer);
    g_source_unref(c->timer);
    g_socket_close(c->sock, NULL);
    g_object_unref(c->sock);
    g_string_free(c->in, TRUE);
    g_free(c->path);
    g_free(c);
}

/* @done last: it may start the next call, or free what owns this one. */
static void call_end(VnWctlCall *c, char *answer, GError *error)
{
    VnWctlDone done = c->done;
    void *opaque = c->opaque;

    vn_wctl_call_cancel(c);
    done(answer, error, opaque);
    g_clear_error(&error);
}

static gboolean on_call_timeout(gpointer data)
{
    VnWctlCall *c = data;
    GError *error = g_error_new(G_IO_ERROR, G_IO_ERROR_TIMED_OUT,
                                "worker channel %s: no answer in time", c->path);

    call_end(c, NULL, error);
    return G_SOURCE_REMOVE;
}

static gboolean on_call_input(GSocket *sock, GIOCondition cond, gpointer data)
{
    VnWctlCall *c = data;
    GError *error = NULL;
    char chunk[4096];
    gssize n = g_socket_receive(sock, chunk, sizeof(chunk), NULL, NULL);
    char *answer;

    if (n < 0 && errno == EAGAIN) {
        return G_SOURCE_CONTINUE;
    }
    if (n <= 0) {
        error = g_error_new(G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED,
                            "worker channel %s: closed without an answer", c->path);
        call_end(c, NULL, error);
        return G_SOURCE_REMOVE;
    }
    g_string_append_len(c->in, chunk, n);
    if (memchr(c->in->str, '\n', c->in->len) == NULL) {
        if (c->in->len <= c->max_reply) {
            return G_SOURCE_CONTINUE;
        }
        error = g_error_new(G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE,
                            "worker channel %s: answer too long", c->path);
        call_end(c, NULL, error);
        return G_SOURCE_REMOVE;
    }
    answer = answer_parse(c->path, c->in, c->max_reply, &error);
    call_end(c, answer, error);
    return G_SOURCE_REMOVE;
}

VnWctlCall *vn_wctl_call_async(const char *path, const char *name, unsigned timeout_ms,
                               size_t max_reply, VnWctlDone done, void *opaque, GError **error)
{
    GSocket *sock = call_open(path, name, error);
    VnWctlCall *c;

    if (sock == NULL) {
        return NULL;
    }
    c = g_new0(VnWctlCall, 1);
    *c = (VnWctlCall){ .path = g_strdup(path),
                       .sock = sock,
                       .in = g_string_new(NULL),
                       .max_reply = max_reply,
                       .done = done,
                       .opaque = opaque };
    c->io = g_socket_create_source(sock, G_IO_IN | G_IO_HUP | G_IO_ERR, NULL);
    g_source_set_callback(c->io, (GSourceFunc)(void (*)(void))on_call_input, c, NULL);
    g_source_attach(c->io, g_main_context_get_thread_default());
    c->timer = g_timeout_source_new(timeout_ms);
    g_source_set_callback(c->timer, on_call_timeout, c, NULL);
    g_source_attach(c->timer, g_main_context_get_thread_default());
    return c;
}
