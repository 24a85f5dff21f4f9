/*
 * Inside the `host` fabric backend (host.h): the worker's connection to its daemon (host.c),
 * the ops it answers later (host-ask.c) and what a worker says to its daemon besides fabric
 * traffic (host-worker.c).  Not for other layers.
 */
#ifndef VN_HOST_INT_H
#define VN_HOST_INT_H

#include "host.h"
#include "fabric-int.h"
#include "record.h"

#include <errno.h>
#include <fcntl.h>

/* What may wait to go to the daemon: a few of the largest records, or many small ones
 * (what waits for its socket, or for its return: VnHostHeld). */
#define VN_HOST_MAX_QUEUED (16u * VN_HOST_MAX_RECORD)
#define VN_HOST_MAX_HELD 4096u
/* Ops sent without waiting and not yet answered: far more than a worker's maps and route
 * opens in flight (its lender takes one request at a time). */
#define VN_HOST_MAX_ASKED 256u

typedef struct VnHost {
    VnFabric *fab;
    GMainContext *ctx;
    char *path;
    int fd; /* -1 while the daemon is away */
    /* Greeted on this connection: until then only the HELLO goes (hello_seq: its seq), so
     * nothing we say reaches a daemon before it knows what we hold. */
    bool ready;
    uint64_t hello_seq;
    gint64 hello_sent_us;
    GQueue held; /* VnHostHeld: said while the daemon was away (vn_host_send_record) */
    size_t held_bytes;
    GSource *src;
    VnRecordOut *out;      /* what goes to the daemon, without waiting (NULL while away) */
    GSource *retry;        /* reconnecting */
    gint64 away_since_us;  /* when the daemon went; 0 while it is here */
    bool links_dropped;    /* away past the bound: every link reported down */
    unsigned reconnect_ms; /* the bound ("reconnect-ms", VN_HOST_RECONNECT_MS) */
    VnRecordReader rx;
    uint64_t seq;
    GHashTable *wanted; /* peers we asked for (asked again after a restart) */
    GHashTable *up;     /* peers the daemon says are up */
    uint64_t doorbells; /* bit i: ours (claimed again after a restart) */
    bool greeted;       /* by a daemon once: limits and caps set */
    /* A lender's device server, as last said (vn_host_device_server); said again at each
     * greeting.  server_said: there is something to say. */
    bool server_said, server_up;
    uint32_t server_gen;
    VnHostGreetedFn greeted_fn; /* vn_host_on_greeted() */
    void *greeted_opaque;
    VnHostP2pFn p2p_fn; /* vn_host_on_p2p() */
    void *p2p_opaque;
    /* Ops sent without waiting (host_ask): by seq, then answered, completed from answer_src
     * (never inside a caller's call, nor inside a wait). */
    GHashTable *asked;
    GQueue answered;
    GSource *answer_src;
    /* What the daemon's port gave us to prove ourselves with when we reconnect (its first
     * HELLO's answer); has_secret: we have it. */
    uint8_t secret[VN_HOST_SECRET_LEN];
    bool has_secret;
} VnHost;

/* What an op sent without waiting is told: 0 or -errno, the REPLY's header (or zeros),
 * the fd that came with it (ours to close) or -1. */
typedef void (*VnHostAnswerFn)(void *opaque, int status, const VnHostHdr *rep, int fd);

typedef struct VnHostAsk {
    VnHost *h;
    uint64_t seq;
    VnHostAnswerFn done;
    void *opaque;
    GSource *timer;
    int status;
    VnHostHdr rep;
    int fd;
} VnHostAsk;

/* A record said while the daemon is away or has not greeted us yet: sent once it has
 * (host.c), in order, after what the greeting says; its fd a dup of ours. */
typedef struct VnHostHeld {
    uint8_t *buf;
    size_t len;
    uint64_t seq; /* an ask's: sent only if it is still asked then */
    int fd;
} VnHostHeld;

/* One record to the daemon, 0 or -errno.  Never waits: what the daemon's socket does not
 * take now goes from the loop (a daemon that takes nothing for VN_HOST_SEND_TIMEOUT_S
 * loses us, and the reader reconnects).  While the daemon is away (within its bound, not
 * past it: then -ENOTCONN) it waits in h->held, at most VN_HOST_MAX_HELD records and
 * VN_HOST_MAX_QUEUED bytes (-ENOBUFS past them).  Inline: host.c and host-ask.c both send,
 * and neither calls up into the other for it. */
static inline int vn_host_send_record(VnHost *h, uint32_t op, uint64_t seq, const char *peer,
                                      uint64_t arg, uint64_t arg2, const void *data, size_t len,
                                      int fd)
{
    g_autofree uint8_t *buf = NULL;
    VnHostHeld *held;
    size_t n;

    buf = vn_host_record_new(op, seq, 0, peer, arg, arg2, data, len, &n);
    if (op == VN_HOST_HELLO || (h->fd >= 0 && h->out != NULL && h->ready)) {
        return h->out != NULL ? vn_record_out_send(h->out, buf, n, VN_HOST_MAX_RECORD, fd)
                              : -ENOTCONN;
    }
    if (h->links_dropped) {
        return -ENOTCONN;
    }
    if (h->held.length >= VN_HOST_MAX_HELD || n > VN_HOST_MAX_QUEUED - h->held_bytes) {
        return -ENOBUFS;
    }
    held = g_new0(VnHostHeld, 1);
    held->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd >= 0 && held->fd < 0) {
        int e = errno;

        g_free(held);
        return -e;
    }
    held->buf = g_steal_pointer(&buf);
    held->len = n;
    held->seq = seq;
    h->held_bytes += n;
    g_queue_push_tail(&h->held, held);
    return 0;
}

/* host-ask.c.  ask: send op @op (with @fd, borrowed, unless -1) and return at once; @done
 * is told its REPLY later (from the loop, never inside this call), or why there is none.
 * answer: settle @ask (taken out of h->asked) with @status and @fd (taken),
 * told from the loop.  asked_fail: every op still asked gets @status (the daemon went:
 * its answers with it).  asks_close: at the node's close, each is told -ECANCELED now.
 * The backend's map_segment_async and open_route_async; connect_ask: ask the daemon for the
 * link to @peer, reported up when its answer comes. */
void vn_host_ask(VnHost *h, uint32_t op, const char *peer, uint64_t arg, uint64_t arg2,
                 const void *data, size_t len, int fd, VnHostAnswerFn done, void *opaque);
void vn_host_answer(VnHostAsk *ask, int status, int fd);
void vn_host_asked_fail(VnHost *h, int status);
void vn_host_asks_close(VnHost *h);
void vn_host_map_segment_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                               void (*done)(void *opaque, int fd, uint64_t size, uint64_t offset),
                               void *opaque);
void vn_host_open_route_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                              void (*done)(void *opaque, int fd), void *opaque);
void vn_host_connect_ask(VnHost *h, const char *peer);

#endif /* VN_HOST_INT_H */
