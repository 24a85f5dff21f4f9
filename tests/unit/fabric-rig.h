/*
 * The rig of the fabric unit tests (check_fabric.c, check_fabric_untrusted.c):
 * nodes in this process, each test in a fabric directory of its own.
 *
 * Most nodes share the test's GMainContext, iterated by the test (WAIT_FOR,
 * spin, fabric-wait.h); a node that must answer while the test waits on another
 * runs its own context in a thread (node_start), after which only that thread
 * touches it.  Each node logs
 * what its handlers saw ("up:b", "req:1:{json}:3:1", "ev:...", "db:a:3").
 */
#ifndef VN_CHECK_FABRIC_RIG_H
#define VN_CHECK_FABRIC_RIG_H

#include "common/lock.h"
#include "common/peerfd.h"
#include "fabric/fabric.h"
#include "fabric/frame.h"
#include "fabric/shm.h"
#include "fabric-wait.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Message types the test nodes answer (see on_request). */
enum {
    T_ECHO = 1,     /* reply with the request's JSON and data */
    T_SIGNAL_ROUTE, /* open the asker's route (id in data), signal it once */
    T_FAIL,         /* error reply EPERM */
    T_HOLD,         /* keep the token, never answer */
    T_HOLD_QUIT,    /* keep the token, stop the node's thread (it closes) */
    T_MAP_BACK,     /* map the asker's segment (id in data), reply its bytes */
    T_CONNECT,      /* connect to the node named in data, reply {"up":0|1} */
    T_KEEP,         /* keep the token for the test to answer (node_answer_kept) */
    T_SLOW_ECHO,    /* T_ECHO after 1 ms of the node's thread (a peer slower than the asker) */
};

typedef struct Node {
    char name[VN_MAX_NODE_NAME + 1];
    VnFabric *fab;
    GMainContext *ctx;
    GThread *thread; /* threaded nodes */
    gint stop;       /* atomic: the thread's loop ends */
    bool close_in_thread;
    VnMutex lock;   /* log: written by the node's thread */
    GPtrArray *log; /* "up:b", "down:b", "req:1", "ev:7:...", "db:a:3" */
    GArray *kept;   /* T_KEEP's tokens, oldest first (unthreaded nodes) */
} Node;

static char *tmpdir;
/* "shm", or "ntb" over emulated ports: every node of rig_names joined to
 * every other by a port pair cabled to it (ports=...=NODE). */
static const char *rig_backend = "shm";
static const char *const rig_names[] = { "a", "b", "c", NULL };
static GMainContext *ctx; /* the shared one, iterated by the test */
static GPtrArray *nodes;

/* ---- rig ---------------------------------------------------------------- */

static inline void log_add(Node *n, char *entry)
{
    vn_mutex_lock(&n->lock);
    g_ptr_array_add(n->log, entry);
    vn_mutex_unlock(&n->lock);
}

static inline unsigned log_count(Node *n, const char *prefix)
{
    unsigned count = 0;

    vn_mutex_lock(&n->lock);
    for (guint i = 0; i < n->log->len; i++) {
        count += g_str_has_prefix(n->log->pdata[i], prefix);
    }
    vn_mutex_unlock(&n->lock);
    return count;
}

static inline bool log_has(Node *n, const char *entry)
{
    bool found = false;

    vn_mutex_lock(&n->lock);
    for (guint i = 0; i < n->log->len && !found; i++) {
        found = strcmp(n->log->pdata[i], entry) == 0;
    }
    vn_mutex_unlock(&n->lock);
    return found;
}

/* Where @entry first is in @n's log, or -1. */
static inline int log_index(Node *n, const char *entry)
{
    int at = -1;

    vn_mutex_lock(&n->lock);
    for (guint i = 0; i < n->log->len && at < 0; i++) {
        at = strcmp(n->log->pdata[i], entry) == 0 ? (int)i : -1;
    }
    vn_mutex_unlock(&n->lock);
    return at;
}

/* Whether @n's log entry @i is @entry. */
static inline bool log_at_is(Node *n, guint i, const char *entry)
{
    bool is;

    vn_mutex_lock(&n->lock);
    is = i < n->log->len && strcmp(n->log->pdata[i], entry) == 0;
    vn_mutex_unlock(&n->lock);
    return is;
}

static inline void on_link(void *opaque, const char *peer, bool up)
{
    log_add(opaque, g_strdup_printf("%s:%s", up ? "up" : "down", peer));
}

/* A request a node answers once the fabric answered it (a route opened, a window mapped). */
typedef struct RigLater {
    Node *n;
    uint64_t token;
} RigLater;

static inline RigLater *rig_later_new(Node *n, uint64_t token)
{
    RigLater *r = g_new(RigLater, 1);

    *r = (RigLater){ .n = n, .token = token };
    return r;
}

/* T_SIGNAL_ROUTE's route: signal it once, and answer. */
static inline void route_for_reply(void *opaque, int fd, const GError *error)
{
    RigLater *r = opaque;
    uint64_t one = 1;

    if (fd < 0) {
        vn_fabric_reply_error(r->n->fab, r->token, fd, error != NULL ? error->message : NULL);
    } else {
        ck_assert_int_eq(write(fd, &one, sizeof(one)), sizeof(one));
        close(fd);
        vn_fabric_reply(r->n->fab, r->token, "{\"signalled\":1}", NULL, 0);
    }
    g_free(r);
}

/* T_MAP_BACK's window: answer with its first bytes, and unmap it. */
static inline void window_for_reply(void *opaque, VnFabricWindow *w, const GError *error)
{
    RigLater *r = opaque;
    uint8_t head[8] = { 0 };

    if (w == NULL) {
        vn_fabric_reply_error(r->n->fab, r->token, -EIO, error != NULL ? error->message : NULL);
    } else {
        memcpy(head, w->host, sizeof(head));
        vn_fabric_window_unmap(r->n->fab, w);
        vn_fabric_reply(r->n->fab, r->token, NULL, head, sizeof(head));
    }
    g_free(r);
}

static inline void on_request(void *opaque, VnFabricMsg *msg, uint64_t token)
{
    Node *n = opaque;

    log_add(
        n, g_strdup_printf("req:%u:%s:%zu", msg->type, msg->json ? msg->json : "-", msg->data_len));
    switch (msg->type) {
    case T_SLOW_ECHO:
        g_usleep(1000);
        /* fall through */
    case T_ECHO:
        vn_fabric_reply(n->fab, token, msg->json, msg->data, msg->data_len);
        break;
    case T_SIGNAL_ROUTE: {
        uint64_t id = 0;

        if (msg->data_len != sizeof(id)) {
            vn_fabric_reply_error(n->fab, token, -EINVAL, "no route id");
            break;
        }
        memcpy(&id, msg->data, sizeof(id));
        vn_fabric_route_open_async(n->fab, msg->peer, id, route_for_reply, rig_later_new(n, token));
        break;
    }
    case T_FAIL:
        vn_fabric_reply_error(n->fab, token, -EPERM, "not allowed here");
        break;
    case T_HOLD:
        break;
    case T_KEEP:
        g_array_append_val(n->kept, token);
        break;
    case T_HOLD_QUIT:
        n->close_in_thread = true;
        g_atomic_int_set(&n->stop, 1);
        break;
    case T_CONNECT: {
        /* From inside the handler: the backend must not read its links again here. */
        g_autofree char *peer = g_strndup((const char *)msg->data, msg->data_len);
        bool up = vn_fabric_connect(n->fab, peer, NULL);

        vn_fabric_reply(n->fab, token, up ? "{\"up\":1}" : "{\"up\":0}", NULL, 0);
        break;
    }
    case T_MAP_BACK: {
        uint64_t id = 0;

        if (msg->data_len != sizeof(id)) {
            vn_fabric_reply_error(n->fab, token, -EIO, "no id");
            break;
        }
        memcpy(&id, msg->data, sizeof(id));
        vn_fabric_window_map_async(n->fab, msg->peer, id, window_for_reply,
                                   rig_later_new(n, token));
        break;
    }
    default:
        vn_fabric_reply_error(n->fab, token, -ENOTSUP, NULL);
        break;
    }
}

static inline void on_event(void *opaque, VnFabricMsg *msg)
{
    Node *n = opaque;

    log_add(n,
            g_strdup_printf("ev:%u:%s:%zu", msg->type, msg->json ? msg->json : "-", msg->data_len));
}

static inline void on_doorbell(void *opaque, const char *peer, uint32_t bit)
{
    log_add(opaque, g_strdup_printf("db:%s:%u", peer, bit));
}

static inline void on_paths_lost(void *opaque, const char *peer)
{
    log_add(opaque, g_strdup_printf("lost:%s", peer));
}

static const VnFabricHandlers handlers = {
    .on_link = on_link,
    .on_request = on_request,
    .on_event = on_event,
    .on_doorbell = on_doorbell,
    .on_paths_lost = on_paths_lost,
};

/* Open node @name; @kv are extra parameters (key, value, ..., NULL). */
static inline Node *node_open_kv(const char *name, bool threaded, const char *const *kv)
{
    g_autoptr(GHashTable) params = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GString) ports = g_string_new(NULL);
    g_autoptr(GError) error = NULL;
    Node *n = g_new0(Node, 1);

    g_strlcpy(n->name, name, sizeof(n->name));
    vn_mutex_init(&n->lock);
    n->log = g_ptr_array_new_with_free_func(g_free);
    n->kept = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    n->ctx = threaded ? g_main_context_new() : g_main_context_ref(ctx);

    if (strcmp(rig_backend, "ntb") == 0) {
        for (unsigned i = 0; rig_names[i] != NULL; i++) {
            int order = strcmp(name, rig_names[i]);

            if (order != 0) {
                g_string_append_printf(ports, "%spair:%s/%s+%s/%d=%s", ports->len ? "," : "",
                                       tmpdir, order < 0 ? name : rig_names[i],
                                       order < 0 ? rig_names[i] : name, order > 0, rig_names[i]);
            }
        }
        g_hash_table_insert(params, "ports", ports->str);
    } else {
        g_hash_table_insert(params, "dir", tmpdir);
    }
    for (; kv != NULL && kv[0] != NULL; kv += 2) {
        g_hash_table_insert(params, (char *)kv[0], (char *)kv[1]);
    }
    n->fab = vn_fabric_open(rig_backend, name, params, &handlers, n, n->ctx, &error);
    ck_assert_msg(n->fab != NULL, "%s", error ? error->message : "");
    g_ptr_array_add(nodes, n);
    return n;
}

static inline Node *node_open(const char *name, bool threaded)
{
    return node_open_kv(name, threaded, NULL);
}

static inline gpointer node_thread(gpointer data)
{
    Node *n = data;

    g_main_context_push_thread_default(n->ctx);
    while (!g_atomic_int_get(&n->stop)) {
        g_main_context_iteration(n->ctx, TRUE);
    }
    if (n->close_in_thread) {
        g_clear_pointer(&n->fab, vn_fabric_close);
    }
    g_main_context_pop_thread_default(n->ctx);
    return NULL;
}

/* Run a threaded node's loop; from here on only its thread touches it. */
static inline void node_start(Node *n)
{
    n->thread = g_thread_new(n->name, node_thread, n);
}

static inline void node_close(Node *n)
{
    if (n->thread != NULL) {
        /* A flag and a wakeup, not a source handed to the thread: GLib's own locks are
         * futexes ThreadSanitizer cannot see, so memory passed through them is reported
         * as a race (seen in check_fabric's teardown). */
        g_atomic_int_set(&n->stop, 1);
        g_main_context_wakeup(n->ctx);
        g_thread_join(n->thread);
        n->thread = NULL;
    }
    g_clear_pointer(&n->fab, vn_fabric_close);
    g_main_context_unref(n->ctx);
    g_ptr_array_unref(n->log);
    g_array_unref(n->kept);
    vn_mutex_clear(&n->lock);
    g_ptr_array_remove(nodes, n);
    g_free(n);
}

static inline void rm_rf(const char *path)
{
    GDir *d = g_dir_open(path, 0, NULL);
    const char *name;

    if (d != NULL) {
        while ((name = g_dir_read_name(d)) != NULL) {
            g_autofree char *sub = g_build_filename(path, name, NULL);

            rm_rf(sub);
        }
        g_dir_close(d);
        g_rmdir(path);
    } else {
        g_unlink(path);
    }
}

static inline void setup(void)
{
    rig_backend = "shm";
    tmpdir = g_dir_make_tmp("vn-fabric-XXXXXX", NULL);
    ck_assert_ptr_nonnull(tmpdir);
    ctx = g_main_context_new();
    nodes = g_ptr_array_new();
}

/* The same fixture for the ntb backend over emulated port pairs. */
static inline void setup_ntb(void)
{
    setup();
    rig_backend = "ntb";
}

static inline void teardown(void)
{
    while (nodes->len > 0) {
        node_close(nodes->pdata[nodes->len - 1]);
    }
    g_ptr_array_unref(nodes);
    /* Drain what closing left behind (sources already destroyed). */
    while (g_main_context_iteration(ctx, FALSE)) {
    }
    g_main_context_unref(ctx);
    rm_rf(tmpdir);
    g_free(tmpdir);
}

static inline gint64 now_ms(void)
{
    return g_get_monotonic_time() / 1000;
}

/* Iterate the shared context until @cond holds (bounded), then assert it. */
#define WAIT_FOR(cond) WAIT_FOR_MS(cond, 3000)
#define WAIT_FOR_MS(cond, ms)                                      \
    do {                                                           \
        gint64 end_ = now_ms() + (ms);                             \
        while (!(cond) && now_ms() < end_) {                       \
            if (!g_main_context_iteration(ctx, FALSE)) {           \
                g_usleep(500);                                     \
            }                                                      \
        }                                                          \
        ck_assert_msg((cond), "timed out waiting for: %s", #cond); \
    } while (0)

/* Iterate the shared context for @ms (to see that something does NOT
 * happen). */
static inline void spin(int ms)
{
    gint64 end = now_ms() + ms;

    while (now_ms() < end) {
        if (!g_main_context_iteration(ctx, FALSE)) {
            g_usleep(500);
        }
    }
}

static inline void link_nodes(Node *a, Node *b)
{
    g_autoptr(GError) error = NULL;

    /* An ntb link is up once the peer's HELLO came, which a peer on our own loop sends
     * only when the loop runs again: the connect says it is on its way (it does not wait),
     * and the link comes up below. */
    if (!vn_fabric_connect(a->fab, b->name, &error)) {
        ck_assert_msg(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_PENDING), "%s", error->message);
    }
    if (b->thread == NULL) {
        WAIT_FOR(vn_fabric_link_up(b->fab, a->name));
    }
    WAIT_FOR(log_count(a, "up:") > 0);
}

/* A connect's answer (vn_fabric_connect_async). */
typedef struct Conn {
    int calls;
    int err;
} Conn;

static inline void on_conn(void *opaque, int err)
{
    Conn *c = opaque;

    c->calls++;
    c->err = err;
}

/* Connect @n to @peer and wait for the link: a threaded peer's greeting comes when it
 * comes (an ntb connect does not wait for it). */
static inline void connect_wait(Node *n, const char *peer)
{
    Conn c = { 0 };

    ck_assert_ptr_nonnull(vn_fabric_connect_async(n->fab, peer, on_conn, &c));
    WAIT_FOR(c.calls == 1);
    ck_assert_msg(c.err == 0, "%s: connect to %s: %s", n->name, peer, g_strerror(-c.err));
}

/* A memfd of @size bytes and a mapping of it. */
static inline int memfd_new(size_t size, uint8_t **map)
{
    int fd = vn_peerfd_memfd_new("check-fabric", size);

    ck_assert_int_ge(fd, 0);
    if (map != NULL) {
        *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert(*map != MAP_FAILED);
    }
    return fd;
}

static inline VnFabricStats stats_of(Node *n)
{
    VnFabricStats st;

    vn_fabric_stats(n->fab, &st);
    return st;
}

/* What an async request got back. */
typedef struct Reply {
    bool done;
    int calls;
    int err;
    char *json;
    GByteArray *data;
} Reply;

static inline void on_reply(void *opaque, VnFabricMsg *msg, int err)
{
    Reply *r = opaque;

    r->done = true;
    r->calls++;
    r->err = err;
    if (msg != NULL) {
        r->json = g_strdup(msg->json);
        r->data = g_byte_array_new();
        g_byte_array_append(r->data, msg->data, (guint)msg->data_len);
    }
}

/* Answer every request @n kept (T_KEEP), oldest first: "{}". */
static inline void node_answer_kept(Node *n)
{
    for (guint i = 0; i < n->kept->len; i++) {
        vn_fabric_reply(n->fab, g_array_index(n->kept, uint64_t, i), "{}", NULL, 0);
    }
    g_array_set_size(n->kept, 0);
}

static inline void reply_clear(Reply *r)
{
    g_free(r->json);
    if (r->data != NULL) {
        g_byte_array_unref(r->data);
    }
    memset(r, 0, sizeof(*r));
}

/* @from's request to @peer, answered with what it carried (@json). */
static inline void assert_echo(Node *from, const char *peer, const char *json)
{
    Reply r = { 0 };

    ck_assert_int_eq(vn_fabric_request(from->fab, peer, T_ECHO, json, NULL, 0, on_reply, &r), 0);
    WAIT_FOR(r.done);
    ck_assert_int_eq(r.err, 0);
    ck_assert_str_eq(r.json, json);
    reply_clear(&r);
}

#endif /* VN_CHECK_FABRIC_RIG_H */
