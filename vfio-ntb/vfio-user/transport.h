/*
 * vfio-user socket transport: whole messages with SCM_RIGHTS fds over a
 * connected UNIX stream socket.
 *
 * Receiving is incremental and never blocks (MSG_DONTWAIT), so a peer that
 * sends half a message cannot stall the thread; sending blocks for at most
 * VN_TRANSPORT_SEND_TIMEOUT_S (SO_SNDTIMEO), so a peer that stops reading
 * cannot stall it forever either.
 *
 * Threads: one thread at a time per transport.
 */
#ifndef VN_TRANSPORT_H
#define VN_TRANSPORT_H

#include "wire.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* A peer that does not drain its socket for this long is dropped. */
#define VN_TRANSPORT_SEND_TIMEOUT_S 5
/* How long a close waits for what the peer still had in flight (see
 * vn_transport_free()). */
#define VN_TRANSPORT_LINGER_MS 200

typedef struct VnTransport VnTransport;

/* A received message.  fds are owned by the message until taken (set to -1). */
typedef struct VnTransportMsg {
    uint8_t *data; /* whole message, header first; owned */
    size_t len;
    int fds[VN_MAX_MSG_FDS];
    unsigned nfds;
    bool fds_overflow; /* the peer sent more than VN_MAX_MSG_FDS fds */
} VnTransportMsg;

/* Closes the fds it still owns and frees the data. */
void vn_transport_msg_clear(VnTransportMsg *msg);

/* Takes ownership of the connected socket @fd. */
VnTransport *vn_transport_new(int fd);
/* Closes like a well-behaved peer: end-of-file first, then the peer's
 * in-flight bytes (and fds) are read and dropped for at most
 * VN_TRANSPORT_LINGER_MS, then the socket is closed. */
void vn_transport_free(VnTransport *t);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnTransport, vn_transport_free)

int vn_transport_fd(VnTransport *t);

/*
 * Read what is available.  Returns 1 with @msg filled when a whole message
 * arrived, 0 when more data is needed, -ECONNRESET when the peer closed,
 * -EMSGSIZE/-EINVAL for a header that cannot be trusted (the stream is then
 * out of sync: disconnect), or another -errno.
 */
int vn_transport_recv(VnTransport *t, VnTransportMsg *msg);

/*
 * Send one whole message (@len bytes, header included) with @nfds fds
 * (borrowed).  Returns 0 or -errno (-EAGAIN after the send timeout).
 */
int vn_transport_send(VnTransport *t, const void *data, size_t len, const int *fds, unsigned nfds);

#endif /* VN_TRANSPORT_H */
