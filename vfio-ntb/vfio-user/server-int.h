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
};

/* Have the loop serve s->held (and s->held_error) soon. */
void vn_server_held_arm(VnServer *s);

#endif /* VN_SERVER_INT_H */
