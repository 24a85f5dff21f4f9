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
    /* Replies in the client's order (server-replies.c): while one is owed
     * (the device answers later), later ones wait behind it
     * (VnServerReply *); how many are owed; whether the client's socket is
     * unwatched because VN_SERVER_MAX_DEFERRED are. */
    GQueue replies;
    guint deferred;
    bool paused;
    /* vn_server_pause()s not yet resumed: the client's next commands wait meanwhile; the
     * client they were for (a count of clients, so one that came after is not resumed). */
    guint stopped;
    uint64_t client_gen;
    /* The command being handled (NULL: none) and the id vn_server_later() gave its op
     * (0: the op answers now). */
    const VnWireRequest *handling;
    uint64_t later;
    /* Region maps asked of the client, unanswered (server-region-map.c), in the order
     * sent, at most VN_SERVER_MAX_ASKED. */
    GQueue asked;
};

typedef struct VnServerReply VnServerReply;

/* Have the loop serve s->held (and s->held_error) soon. */
void vn_server_held_arm(VnServer *s);

/* A reply built in @out, with @fds (borrowed; copied), queued behind the owed ones
 * (s->replies not empty).  0, or the -errno of sending what could go. */
int vn_server_replies_queue(VnServer *s, const GByteArray *out, const int *fds, unsigned nfds);
/* A reply to @req the device gives later (vn_server_later()): its id. */
uint64_t vn_server_replies_owe(VnServer *s, const VnWireRequest *req);
/* Owed reply @id's template, built by its handler as if the device had answered:
 * @data_len bytes at @data_at are a REGION_READ's, to come.  0, or a send's -errno. */
int vn_server_replies_built(VnServer *s, uint64_t id, const GByteArray *out, size_t data_at,
                            uint32_t data_len);
/* The device's answer to owed reply @id (@data: a REGION_READ's bytes): 1 when nothing
 * waits for it, else 0 or the -errno of sending what could go.  A refused DMA_MAP is
 * taken out of the table again. */
int vn_server_replies_done(VnServer *s, uint64_t id, int err, const void *data, uint32_t len);
/* The client unmapped [iova, iova + size) (all): owed maps in it are not undone on
 * failure, the range is no longer theirs. */
void vn_server_replies_unmapped(VnServer *s, uint64_t iova, uint64_t size, bool all);
/* The client went: nothing waits for these replies. */
void vn_server_replies_clear(VnServer *s);

/* A message that answers a region map of ours (held like a command while a client DMA
 * waits, then served in order). */
bool vn_server_asked_is_answer(const VnWireHdr *h);
/* End the ask @h answers; -EPROTO (the client is to be dropped) when we asked nothing by
 * that id, or it refused a trap. */
int vn_server_asked_answer(VnServer *s, const VnWireHdr *h);
/* The client went: every unanswered ask ends with -ENOTCONN. */
void vn_server_asked_fail(VnServer *s);

#endif /* VN_SERVER_INT_H */
