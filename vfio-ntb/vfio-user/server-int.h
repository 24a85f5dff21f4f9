/*
 * The vfio-user server engine's state, shared by server.c (the client's
 * commands) and server-client-dma.c (DMA the server asks of the client).
 */
#ifndef VN_SERVER_INT_H
#define VN_SERVER_INT_H

#include "server.h"
#include "transport.h"

struct VnServer {
    char *path;
    GMainContext *ctx;
    int listen_fd;
    GSource *listen_src; /* attached only while no client is connected */
    VnDeviceInfo info;
    const VnDeviceOps *ops;
    void *opaque;
    VnDma *dma;
    VnIrqs *irqs;
    VnTransport *client;
    GSource *client_src;
    bool versioned;  /* the client's VERSION was accepted */
    VnWireCaps caps; /* the client's capabilities */
    GByteArray *out; /* reply being built */
    VnServerStats stats;
    /* Client DMA (server-client-dma.c): commands of the client's read while
     * waiting for an answer, served in order before anything newer
     * (VnTransportMsg *, at most VN_SERVER_MAX_HELD); an idle source that
     * serves them; a receive error met meanwhile (the client is dropped from
     * the loop, not from inside a device op); the last id we used, and
     * whether we ever asked (only then is a reply from the client expected). */
    GQueue held;
    GSource *held_src;
    int held_error;
    uint16_t dma_id;
    bool dma_asked;
    /* Replies in the client's order (server-replies.c): while one is deferred
     * (the device answers later), later ones wait behind it
     * (VnServerReply *); how many are deferred; whether the client's socket
     * is unwatched because VN_SERVER_MAX_DEFERRED are. */
    GQueue replies;
    guint deferred;
    bool paused;
};

typedef struct VnServerReply VnServerReply;

/* A reply built in @out, with @fds (borrowed; copied), queued behind the deferred ones
 * (s->replies not empty).  0, or the -errno of sending what could go. */
int vn_server_replies_queue(VnServer *s, const GByteArray *out, const int *fds, unsigned nfds);
/* A reply the device gives later (vn_server_complete): its id.  @iova/@size: the DMA_MAP's
 * range, undone in the table if the device refuses it. */
uint64_t vn_server_replies_defer(VnServer *s, const VnWireHdr *req, uint64_t iova, uint64_t size);
/* The device refused at once: the deferred reply @id goes (the caller replies). */
void vn_server_replies_forget(VnServer *s, uint64_t id);
/* The client unmapped [iova, iova + size) (all): deferred maps in it are not undone on
 * failure, the range is no longer theirs. */
void vn_server_replies_unmapped(VnServer *s, uint64_t iova, uint64_t size, bool all);
/* The device's answer to deferred reply @id (vn_server_complete): 1 when nothing waits for
 * it, else 0 or the -errno of sending what could go. */
int vn_server_replies_done(VnServer *s, uint64_t id, int err);
/* The client went: nothing waits for these replies. */
void vn_server_replies_clear(VnServer *s);

/* Have the loop serve s->held (and s->held_error) soon. */
void vn_server_held_arm(VnServer *s);

#endif /* VN_SERVER_INT_H */
