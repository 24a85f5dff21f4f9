/*
 * The `host` backend's ops that are not waited for (see host-int.h): sent to the daemon
 * with a sequence number, and answered from the loop when its REPLY comes -- a window's
 * map, a route's open and a connect, which wait on a peer behind the daemon.  At most
 * VN_HOST_MAX_ASKED at once; each times out after VN_HOST_REPLY_TIMEOUT_MS; all fail when
 * the daemon goes, and are cancelled when the node closes.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "host-int.h"

#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <sys/socket.h>

static gboolean on_answered(gpointer data)
{
    VnHost *h = data;
    VnHostAsk *ask = g_queue_pop_head(&h->answered);
    bool more = !g_queue_is_empty(&h->answered);

    if (!more) {
        /* Dispatch holds its own reference; an answer its callback settles makes a new one. */
        g_clear_pointer(&h->answer_src, g_source_unref);
    }
    if (ask != NULL) {
        ask->done(ask->opaque, ask->status, &ask->rep, ask->fd);
        g_free(ask);
    }
    /* @h may be gone now (a callback that closed the fabric destroyed this source). */
    return more ? G_SOURCE_CONTINUE : G_SOURCE_REMOVE;
}

void vn_host_answer(VnHostAsk *ask, int status, int fd)
{
    VnHost *h = ask->h;

    if (ask->timer != NULL) {
        g_source_destroy(ask->timer);
        g_clear_pointer(&ask->timer, g_source_unref);
    }
    ask->status = status;
    ask->fd = fd;
    if (status < 0) {
        vn_util_close_fd(&ask->fd);
    }
    g_queue_push_tail(&h->answered, ask);
    if (h->answer_src == NULL) {
        h->answer_src = g_idle_source_new();
        g_source_set_priority(h->answer_src, G_PRIORITY_DEFAULT);
        g_source_set_callback(h->answer_src, on_answered, h, NULL);
        g_source_attach(h->answer_src, h->ctx);
    }
}

static gboolean on_ask_timeout(gpointer data)
{
    VnHostAsk *ask = data;
    VnHost *h = ask->h;

    g_info("port %s: no answer to op %" PRIu64 " in %d ms; the daemon is stuck", h->path, ask->seq,
           VN_HOST_REPLY_TIMEOUT_MS);
    g_hash_table_steal(h->asked, &ask->seq);
    vn_host_answer(ask, -ETIMEDOUT, -1);
    if (h->fd >= 0 && h->ready) {
        shutdown(h->fd, SHUT_RDWR); /* a daemon that took it and is stuck: we reconnect */
    }
    return G_SOURCE_REMOVE;
}

void vn_host_ask(VnHost *h, uint32_t op, const char *peer, uint64_t arg, uint64_t arg2,
                 const void *data, size_t len, int fd, VnHostAnswerFn done, void *opaque)
{
    VnHostAsk *ask = g_new0(VnHostAsk, 1);
    int ret = -EAGAIN;

    *ask = (VnHostAsk){ .h = h, .seq = ++h->seq, .done = done, .opaque = opaque, .fd = -1 };
    if (g_hash_table_size(h->asked) < VN_HOST_MAX_ASKED) {
        ret = vn_host_send_record(h, op, ask->seq, peer, arg, arg2, data, len, fd);
    }
    if (ret < 0) {
        vn_host_answer(ask, ret, -1);
        return;
    }
    ask->timer = g_timeout_source_new(VN_HOST_REPLY_TIMEOUT_MS);
    g_source_set_callback(ask->timer, on_ask_timeout, ask, NULL);
    g_source_attach(ask->timer, h->ctx);
    g_hash_table_insert(h->asked, &ask->seq, ask);
}

void vn_host_asked_fail(VnHost *h, int status)
{
    GHashTableIter it;
    gpointer value;

    g_hash_table_iter_init(&it, h->asked);
    while (g_hash_table_iter_next(&it, NULL, &value)) {
        g_hash_table_iter_steal(&it);
        vn_host_answer(value, status, -1);
    }
}

void vn_host_asks_close(VnHost *h)
{
    vn_host_asked_fail(h, -ECANCELED);
    if (h->answer_src != NULL) {
        g_source_destroy(h->answer_src);
        g_clear_pointer(&h->answer_src, g_source_unref);
    }
    for (VnHostAsk *ask; (ask = g_queue_pop_head(&h->answered)) != NULL; g_free(ask)) {
        vn_util_close_fd(&ask->fd);
        ask->done(ask->opaque, -ECANCELED, &ask->rep, -1);
    }
    g_hash_table_unref(h->asked);
}

/* A map or route open asked without waiting: what its caller is told. */
typedef struct VnHostFdAsk {
    void (*mapped)(void *opaque, int fd, uint64_t size, uint64_t offset);
    void (*opened)(void *opaque, int fd);
    void *opaque;
} VnHostFdAsk;

static void fd_answered(void *opaque, int status, const VnHostHdr *rep, int fd)
{
    VnHostFdAsk *a = opaque;

    if (status == 0 && fd < 0) {
        status = -EPROTO; /* an answer without the fd */
    }
    if (status < 0) {
        vn_util_close_fd(&fd);
        fd = status;
    }
    if (a->mapped != NULL) {
        a->mapped(a->opaque, fd, fd >= 0 ? rep->arg : 0, fd >= 0 ? rep->arg2 : 0);
    } else {
        a->opened(a->opaque, fd);
    }
    g_free(a);
}

void vn_host_map_segment_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                               void (*done)(void *opaque, int fd, uint64_t size, uint64_t offset),
                               void *opaque)
{
    VnHostFdAsk *a = g_new0(VnHostFdAsk, 1);

    *a = (VnHostFdAsk){ .mapped = done, .opaque = opaque };
    vn_host_ask(backend, VN_HOST_MAP, peer, id, 0, NULL, 0, -1, fd_answered, a);
}

void vn_host_open_route_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                              void (*done)(void *opaque, int fd), void *opaque)
{
    VnHostFdAsk *a = g_new0(VnHostFdAsk, 1);

    *a = (VnHostFdAsk){ .opened = done, .opaque = opaque };
    vn_host_ask(backend, VN_HOST_OPEN_ROUTE, peer, id, 0, NULL, 0, -1, fd_answered, a);
}

/* A connect asked without waiting: the peer whose link it asks for. */
typedef struct VnHostLinkAsk {
    VnHost *h;
    char peer[VN_MAX_NODE_NAME + 1];
} VnHostLinkAsk;

static void link_answered(void *opaque, int status, const VnHostHdr *rep, int fd)
{
    VnHostLinkAsk *a = opaque;
    VnHost *h = a->h;

    vn_util_close_fd(&fd);
    /* Not up (the daemon's connect gave up), or the node closes (-ECANCELED: nothing of @h
     * may be touched): whoever waits for the link hears of its deadline (fabric/connect.c). */
    if (status == 0 && !g_hash_table_contains(h->up, a->peer)) {
        g_hash_table_add(h->up, g_strdup(a->peer));
        vn_fabric_backend_link(h->fab, a->peer, true);
    }
    g_free(a);
}

void vn_host_connect_ask(VnHost *h, const char *peer)
{
    VnHostLinkAsk *a = g_new0(VnHostLinkAsk, 1);

    a->h = h;
    g_strlcpy(a->peer, peer, sizeof(a->peer));
    vn_host_ask(h, VN_HOST_CONNECT, peer, 0, 0, NULL, 0, -1, link_answered, a);
}
