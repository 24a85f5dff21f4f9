/*
 * The `host` backend's wire (see host.h): the records a worker and its daemon's port
 * exchange, how one is sent, and how its receiver checks it.  Both ends use it.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "host.h"
#include "record.h"

#include "common/name.h"

#include <glib.h>
#include <string.h>

G_STATIC_ASSERT(sizeof(VnHostHdr) == 64);
G_STATIC_ASSERT(sizeof(VnHostBar) == 160);
G_STATIC_ASSERT(sizeof(VnHostP2pTarget) == 152);

static const char *const op_names[VN_HOST_OP_LAST] = {
    [VN_HOST_HELLO] = "HELLO",
    [VN_HOST_CONNECT] = "CONNECT",
    [VN_HOST_SEND] = "SEND",
    [VN_HOST_MAP] = "MAP",
    [VN_HOST_UNMAP] = "UNMAP",
    [VN_HOST_EXPORT_SEGMENT] = "EXPORT_SEGMENT",
    [VN_HOST_EXPORT_ROUTE] = "EXPORT_ROUTE",
    [VN_HOST_UNEXPORT_SEGMENT] = "UNEXPORT_SEGMENT",
    [VN_HOST_UNEXPORT_ROUTE] = "UNEXPORT_ROUTE",
    [VN_HOST_OPEN_ROUTE] = "OPEN_ROUTE",
    [VN_HOST_DOORBELLS_ALLOC] = "DOORBELLS_ALLOC",
    [VN_HOST_DOORBELLS_CLAIM] = "DOORBELLS_CLAIM",
    [VN_HOST_DOORBELLS_FREE] = "DOORBELLS_FREE",
    [VN_HOST_REPLY] = "REPLY",
    [VN_HOST_LINK] = "LINK",
    [VN_HOST_RECV] = "RECV",
    [VN_HOST_DEVICE_REQUEST] = "DEVICE_REQUEST",
    [VN_HOST_WITHHOLD_SEGMENT] = "WITHHOLD_SEGMENT",
    [VN_HOST_FENCED] = "FENCED",
    [VN_HOST_JOIN_WINDOWS] = "JOIN_WINDOWS",
    [VN_HOST_DEVICE_SERVER] = "DEVICE_SERVER",
    [VN_HOST_KEEP] = "KEEP",
    [VN_HOST_FORGET] = "FORGET",
    [VN_HOST_DIAL_DEVICE] = "DIAL_DEVICE",
    [VN_HOST_CLAIM] = "CLAIM",
    [VN_HOST_P2P_PLACE] = "P2P_PLACE",
    [VN_HOST_P2P_OFFER] = "P2P_OFFER",
    [VN_HOST_P2P_WITHDRAW] = "P2P_WITHDRAW",
    [VN_HOST_P2P_TARGET] = "P2P_TARGET",
    [VN_HOST_P2P_GONE] = "P2P_GONE",
};

const char *vn_host_op_to_string(uint32_t op)
{
    return op < VN_HOST_OP_LAST && op_names[op] != NULL ? op_names[op] : "unknown";
}

/* Whether @op names a peer, carries a frame, carries an fd. */
static bool op_has_peer(uint32_t op)
{
    return op == VN_HOST_CONNECT || op == VN_HOST_SEND || op == VN_HOST_MAP ||
           op == VN_HOST_UNMAP || op == VN_HOST_EXPORT_SEGMENT || op == VN_HOST_EXPORT_ROUTE ||
           op == VN_HOST_OPEN_ROUTE || op == VN_HOST_LINK || op == VN_HOST_RECV ||
           op == VN_HOST_JOIN_WINDOWS || op == VN_HOST_CLAIM || op == VN_HOST_P2P_TARGET;
}

/* A frame, or (JOIN_WINDOWS) ids, (P2P_TARGET) a target: bytes after the header. */
static bool op_has_frame(uint32_t op)
{
    return op == VN_HOST_SEND || op == VN_HOST_RECV || op == VN_HOST_JOIN_WINDOWS ||
           op == VN_HOST_P2P_TARGET;
}

char *vn_host_record_check(const uint8_t *buf, size_t len, unsigned nfds, bool overflow,
                           bool from_worker, VnHostHdr *hdr, const uint8_t **frame,
                           size_t *frame_len)
{
    bool worker_op, fd_ok;

    if (len < sizeof(*hdr) || len > VN_HOST_MAX_RECORD) {
        return g_strdup_printf("a record of %zu bytes", len);
    }
    memcpy(hdr, buf, sizeof(*hdr));
    worker_op = (hdr->op >= VN_HOST_HELLO && hdr->op <= VN_HOST_DOORBELLS_FREE) ||
                hdr->op == VN_HOST_DEVICE_REQUEST || hdr->op == VN_HOST_WITHHOLD_SEGMENT ||
                hdr->op == VN_HOST_FENCED || hdr->op == VN_HOST_JOIN_WINDOWS ||
                hdr->op == VN_HOST_DEVICE_SERVER || hdr->op == VN_HOST_KEEP ||
                hdr->op == VN_HOST_FORGET || hdr->op == VN_HOST_DIAL_DEVICE ||
                hdr->op == VN_HOST_CLAIM || hdr->op == VN_HOST_P2P_PLACE ||
                hdr->op == VN_HOST_P2P_OFFER || hdr->op == VN_HOST_P2P_WITHDRAW;
    if (hdr->op == VN_HOST_INVALID || hdr->op >= VN_HOST_OP_LAST || worker_op != from_worker) {
        return g_strdup_printf("op %u where %s ops belong", hdr->op,
                               from_worker ? "a worker's" : "a daemon's");
    }
    if (memchr(hdr->peer, '\0', sizeof(hdr->peer)) == NULL ||
        (op_has_peer(hdr->op) ? !vn_name_valid(VN_NAME_NODE, hdr->peer) : hdr->peer[0] != 0)) {
        return g_strdup_printf("%s with a bad peer name", vn_host_op_to_string(hdr->op));
    }
    if (hdr->status < 0 || hdr->status > 4095 || (hdr->op != VN_HOST_REPLY && hdr->status)) {
        return g_strdup_printf("%s with status %d", vn_host_op_to_string(hdr->op), hdr->status);
    }
    /* KEEP: an fd or a state (bytes), so either; P2P_PLACE: no BARs, or some. */
    if (op_has_frame(hdr->op) != (len > sizeof(*hdr)) && hdr->op != VN_HOST_HELLO &&
        hdr->op != VN_HOST_REPLY && hdr->op != VN_HOST_KEEP && hdr->op != VN_HOST_P2P_PLACE) {
        return g_strdup_printf("%s with %zu bytes after its header", vn_host_op_to_string(hdr->op),
                               len - sizeof(*hdr));
    }
    fd_ok = hdr->op == VN_HOST_EXPORT_SEGMENT || hdr->op == VN_HOST_EXPORT_ROUTE ||
            hdr->op == VN_HOST_REPLY || (hdr->op == VN_HOST_KEEP && len == sizeof(*hdr));
    if (overflow || nfds > 1 || (nfds == 1 && !fd_ok)) {
        return g_strdup_printf("%s with %u fds", vn_host_op_to_string(hdr->op), nfds);
    }
    *frame = len > sizeof(*hdr) ? buf + sizeof(*hdr) : NULL;
    *frame_len = len - sizeof(*hdr);
    return NULL;
}

uint8_t *vn_host_record_new(uint32_t op, uint64_t seq, int status, const char *peer, uint64_t arg,
                            uint64_t arg2, const void *data, size_t len, size_t *out_len)
{
    VnHostHdr hdr = { .op = op, .status = status, .seq = seq, .arg = arg, .arg2 = arg2 };
    uint8_t *buf = g_malloc(sizeof(hdr) + len);

    if (peer != NULL) {
        g_strlcpy(hdr.peer, peer, sizeof(hdr.peer));
    }
    memcpy(buf, &hdr, sizeof(hdr));
    if (len > 0) {
        memcpy(buf + sizeof(hdr), data, len);
    }
    *out_len = sizeof(hdr) + len;
    return buf;
}

int vn_host_send(int sock, uint32_t op, uint64_t seq, int status, const char *peer, uint64_t arg,
                 uint64_t arg2, const void *data, size_t len, int fd)
{
    size_t n;
    g_autofree uint8_t *buf = vn_host_record_new(op, seq, status, peer, arg, arg2, data, len, &n);

    return vn_record_send(sock, buf, n, VN_HOST_MAX_RECORD, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}
