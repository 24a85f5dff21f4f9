/*
 * DMA the server asks its client to carry out (VFIO_USER_DMA_READ and
 * VFIO_USER_DMA_WRITE; see vn_server_client_dma() in server.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "server-int.h"

#include "trace-vfio-user.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

/*
 * The message as vfio-user.rst lays it out, and QEMU 11 reads it: after the
 * header the address (8 bytes) and the count (8 bytes), then the data (a
 * write's request, a read's reply).  (QEMU 10's client took a 4-byte count
 * with the data right after it: peer-to-peer DMA needs QEMU 11.)
 */
#define DMA_ADDR_AT VN_WIRE_HDR_SIZE
#define DMA_COUNT_AT (DMA_ADDR_AT + 8u)
#define DMA_DATA_AT (DMA_COUNT_AT + 8u)
#define DMA_MSG_SIZE DMA_DATA_AT

/* Read the client's messages until the answer to @id: commands are held for
 * the loop (in order), other answers of the client's to us dropped (a read
 * that timed out, a posted write that failed). */
static int answer_wait(VnServer *s, uint16_t id, void *buf, uint32_t len)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)VN_SERVER_CLIENT_DMA_TIMEOUT_MS * 1000;

    while (s->held.length < VN_SERVER_MAX_HELD) {
        VnTransportMsg msg = { 0 };
        VnWireHdr h;
        int ret = vn_transport_recv(s->client, &msg);

        if (ret == 0) {
            gint64 left = deadline - g_get_monotonic_time();
            struct pollfd p = { .fd = vn_transport_fd(s->client), .events = POLLIN };

            if (left <= 0) {
                return -ETIMEDOUT;
            }
            if (poll(&p, 1, (int)((left + 999) / 1000)) < 0 && errno != EINTR) {
                return -errno;
            }
            continue;
        }
        if (ret < 0) {
            s->held_error = ret;
            vn_server_held_arm(s);
            return -ENOTCONN;
        }
        memcpy(&h, msg.data, sizeof(h));
        if ((h.flags & VN_WIRE_FLAG_TYPE_MASK) == VN_WIRE_FLAG_COMMAND ||
            vn_server_asked_is_answer(&h)) {
            g_queue_push_tail(&s->held, g_memdup2(&msg, sizeof(msg))); /* data and fds */
            vn_server_held_arm(s);
            continue;
        }
        if (h.id == id && h.cmd == VN_CMD_DMA_READ) {
            ret = 0;
            if (h.flags & VN_WIRE_FLAG_ERROR) {
                ret = h.error > 0 && h.error < 4096 ? -(int)h.error : -EIO;
            } else if (msg.len < DMA_DATA_AT + len) {
                ret = -EPROTO;
            } else {
                memcpy(buf, msg.data + DMA_DATA_AT, len);
            }
            vn_transport_msg_clear(&msg);
            return ret;
        }
        vn_transport_msg_clear(&msg);
    }
    return -EBUSY;
}

int vn_server_client_dma(VnServer *s, uint64_t addr, void *buf, uint32_t len, bool to_client)
{
    uint8_t msg[DMA_MSG_SIZE + VN_SERVER_CLIENT_DMA_MAX] = { 0 };
    uint64_t count = len;
    VnWireHdr h = { .id = ++s->dma_id,
                    .cmd = to_client ? VN_CMD_DMA_WRITE : VN_CMD_DMA_READ,
                    .size = DMA_MSG_SIZE + (to_client ? len : 0),
                    .flags = VN_WIRE_FLAG_COMMAND | (to_client ? VN_WIRE_FLAG_NO_REPLY : 0) };
    int ret;

    if (s->client == NULL || !s->versioned) {
        return -ENOTCONN;
    }
    if (len == 0 || len > VN_SERVER_CLIENT_DMA_MAX) {
        return -E2BIG;
    }
    memcpy(msg, &h, sizeof(h));
    memcpy(msg + DMA_ADDR_AT, &addr, sizeof(addr));
    memcpy(msg + DMA_COUNT_AT, &count, sizeof(count));
    if (to_client) {
        memcpy(msg + DMA_DATA_AT, buf, len);
    }
    s->dma_asked = true;
    ret = vn_transport_send(s->client, msg, h.size, NULL, 0);
    if (ret == 0 && !to_client) {
        ret = answer_wait(s, h.id, buf, len);
    }
    if (trace_server_client_dma_enabled()) {
        uint32_t first = 0;

        memcpy(&first, buf, MIN(len, sizeof(first)));
        trace_server_client_dma(s->path, to_client ? "write" : "read", addr, len, first, ret);
    }
    if (ret < 0) {
        s->stats.client_dma_failures++;
    } else if (to_client) {
        s->stats.client_dma_writes++;
    } else {
        s->stats.client_dma_reads++;
    }
    return ret;
}
