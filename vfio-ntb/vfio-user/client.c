/*
 * vfio-user client engine (see client.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "client.h"

#include "common/peerfd.h"

#include "common/util.h"
#include "transport.h"

#include <errno.h>
#include <gio/gio.h>
#include <glib-unix.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct VnClient {
    char *path;
    VnTransport *t;
    unsigned timeout_ms;
    uint16_t next_id;
    VnWireCaps caps;
    GByteArray *out;
    VnClientStats stats;
    VnClientObserver observe;
    void *observe_opaque;
    /* Requests that timed out and were not answered yet: their replies may
     * still come, and must not be taken for a later request's.  One bit
     * per id, so any number of them is remembered (an id still marked is
     * never sent again); the send times of the last VN_CLIENT_LATE_TIMES,
     * for how late an answer came. */
    uint64_t late_ids[(G_MAXUINT16 + 1) / 64];
    uint32_t nlate;
    struct {
        uint16_t id;
        uint64_t sent_ns;
    } late_times[VN_CLIENT_LATE_TIMES];
    unsigned late_times_next;
};

static bool late_marked(const VnClient *c, uint16_t id)
{
    return (c->late_ids[id / 64] >> (id % 64)) & 1;
}

static void observe(VnClient *c, VnClientEvent ev, uint16_t cmd, uint64_t ms)
{
    if (c->observe != NULL) {
        c->observe(c->observe_opaque, ev, cmd, ms);
    }
}

/* Request @id (@cmd, sent at @sent_ns) got no reply in time. */
static void late_add(VnClient *c, uint16_t id, uint16_t cmd, uint64_t sent_ns)
{
    c->late_ids[id / 64] |= UINT64_C(1) << (id % 64);
    c->nlate++;
    c->late_times[c->late_times_next].id = id;
    c->late_times[c->late_times_next].sent_ns = sent_ns;
    c->late_times_next = (c->late_times_next + 1) % VN_CLIENT_LATE_TIMES;
    c->stats.timeouts++;
    c->stats.stalled = true;
    observe(c, VN_CLIENT_TIMED_OUT, cmd, c->timeout_ms);
}

/* True (and forgotten) when @id is a request that timed out: its reply
 * (to @cmd) came late and is dropped. */
static bool late_take(VnClient *c, uint16_t id, uint16_t cmd)
{
    uint64_t ms = c->timeout_ms; /* at least; more when its send time is kept */

    if (!late_marked(c, id)) {
        return false;
    }
    c->late_ids[id / 64] &= ~(UINT64_C(1) << (id % 64));
    c->nlate--;
    for (unsigned i = 0; i < VN_CLIENT_LATE_TIMES; i++) {
        if (c->late_times[i].id == id && c->late_times[i].sent_ns != 0) {
            ms = (vn_util_now_ns() - c->late_times[i].sent_ns) / 1000000ull;
            c->late_times[i].sent_ns = 0;
        }
    }
    c->stats.late_replies++;
    observe(c, VN_CLIENT_LATE_REPLY, cmd, ms);
    return true;
}

/* The next id no late reply can still come for. */
static uint16_t fresh_id(VnClient *c)
{
    for (unsigned tries = 0; tries <= G_MAXUINT16 && late_marked(c, c->next_id); tries++) {
        c->next_id++;
    }
    return c->next_id++; /* every id late: its reply mismatches, -EPROTO */
}

/* Wait until @deadline (vn_util_now_ns()) for one whole message; the caller
 * owns it. */
static int recv_msg(VnClient *c, VnTransportMsg *msg, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd = { .fd = vn_transport_fd(c->t), .events = POLLIN };
        uint64_t now;
        int ret = vn_transport_recv(c->t, msg);

        if (ret != 0) {
            return ret < 0 ? ret : 0;
        }
        now = vn_util_now_ns();
        if (now >= deadline) {
            return -ETIMEDOUT;
        }
        if (poll(&pfd, 1, (int)((deadline - now) / 1000000ull) + 1) < 0 && errno != EINTR) {
            return -errno;
        }
    }
}

/*
 * Send c->out and receive its reply.  Checks id and command; returns the
 * server's -errno for an error reply.  @fds_out receives up to @max_fds fds.
 */
static int transact(VnClient *c, const int *fds, unsigned nfds, VnTransportMsg *reply)
{
    uint64_t sent = vn_util_now_ns();
    uint64_t deadline = sent + (uint64_t)c->timeout_ms * 1000000ull;
    VnWireHdr req, hdr;
    int ret;

    memcpy(&req, c->out->data, sizeof(req));
    ret = vn_transport_send(c->t, c->out->data, c->out->len, fds, nfds);
    if (ret < 0) {
        return ret;
    }
    for (;;) {
        ret = recv_msg(c, reply, deadline);
        if (ret == -ETIMEDOUT) {
            late_add(c, req.id, req.cmd, sent);
        }
        if (ret < 0) {
            return ret;
        }
        memcpy(&hdr, reply->data, sizeof(hdr));
        /* A stalled server answers what we gave up on, in order, before it
         * answers this request: match by id and drop those. */
        if ((hdr.flags & VN_WIRE_FLAG_TYPE_MASK) == VN_WIRE_FLAG_REPLY && hdr.id != req.id &&
            late_take(c, hdr.id, hdr.cmd)) {
            vn_transport_msg_clear(reply);
            continue;
        }
        break;
    }
    c->stats.stalled = false; /* it answered; older answers may still come */
    if ((hdr.flags & VN_WIRE_FLAG_TYPE_MASK) != VN_WIRE_FLAG_REPLY || hdr.id != req.id ||
        hdr.cmd != req.cmd) {
        vn_transport_msg_clear(reply);
        return -EPROTO;
    }
    if (hdr.flags & VN_WIRE_FLAG_ERROR) {
        int err = hdr.error > 0 && hdr.error < 4096 ? (int)hdr.error : EIO;

        vn_transport_msg_clear(reply);
        return -err;
    }
    return 0;
}

static void begin(VnClient *c, uint16_t cmd, uint32_t flags)
{
    vn_wire_begin(c->out, fresh_id(c), cmd, flags);
}

static void append(VnClient *c, const void *p, size_t n)
{
    g_byte_array_append(c->out, p, (guint)n);
}

/* A command whose reply is a fixed struct copied to @out (may be NULL). */
static int simple(VnClient *c, const int *fds, unsigned nfds, void *out, size_t out_len)
{
    VnTransportMsg reply = { 0 };
    int ret;

    vn_wire_finish(c->out);
    ret = transact(c, fds, nfds, &reply);
    if (ret < 0) {
        return ret;
    }
    if (out != NULL) {
        if (reply.len < VN_WIRE_HDR_SIZE + out_len) {
            ret = -EPROTO;
        } else {
            memcpy(out, reply.data + VN_WIRE_HDR_SIZE, out_len);
        }
    }
    vn_transport_msg_clear(&reply);
    return ret;
}

static bool negotiate(VnClient *c, GError **error)
{
    g_autofree char *caps = vn_wire_caps_json();
    VnWireVersion v = { VN_WIRE_VERSION_MAJOR, VN_WIRE_VERSION_MINOR };
    VnTransportMsg reply = { 0 };
    VnWireVersion got;
    const char *json;
    size_t json_len;
    int ret;

    begin(c, VN_CMD_VERSION, 0);
    append(c, &v, sizeof(v));
    append(c, caps, strlen(caps) + 1);
    vn_wire_finish(c->out);
    ret = transact(c, NULL, 0, &reply);
    if (ret < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret), "socket %s: VERSION failed: %s",
                    c->path, g_strerror(-ret));
        return false;
    }
    if (reply.len < VN_WIRE_HDR_SIZE + sizeof(got)) {
        vn_transport_msg_clear(&reply);
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "socket %s: VERSION reply too short", c->path);
        return false;
    }
    memcpy(&got, reply.data + VN_WIRE_HDR_SIZE, sizeof(got));
    json = (const char *)reply.data + VN_WIRE_HDR_SIZE + sizeof(got);
    json_len = reply.len - VN_WIRE_HDR_SIZE - sizeof(got);
    if (got.major != VN_WIRE_VERSION_MAJOR ||
        (json_len > 0 && (json_len > VN_MAX_VERSION_JSON || json[json_len - 1] != '\0'))) {
        vn_transport_msg_clear(&reply);
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "socket %s: incompatible or corrupt VERSION reply", c->path);
        return false;
    }
    if (!vn_wire_parse_caps(json_len > 0 ? json : NULL, &c->caps, error)) {
        vn_transport_msg_clear(&reply);
        g_prefix_error(error, "socket %s: ", c->path);
        return false;
    }
    c->caps.max_data_xfer_size = MIN(c->caps.max_data_xfer_size, VN_MAX_DATA_XFER);
    vn_transport_msg_clear(&reply);
    return true;
}

VnClient *vn_client_connect(const char *socket_path, unsigned timeout_ms, GError **error)
{
    struct sockaddr_un addr;
    int fd;

    if (strlen(socket_path) >= sizeof(addr.sun_path)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "socket %s: path too long",
                    socket_path);
        return NULL;
    }
    /* Non-blocking for the connect only: a server that is stopped and whose backlog is full
     * (our own earlier tries, say) would otherwise hold the caller until it resumes.  EAGAIN
     * then says so; the calls after it wait with a timeout of their own (new_fd makes the
     * socket blocking). */
    fd = vn_util_dial_unix(socket_path);
    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-fd), "socket %s: %s", socket_path,
                    fd == -EAGAIN ? "the server accepts no connection (its backlog is full)"
                                  : g_strerror(-fd));
        return NULL;
    }
    return vn_client_new_fd(fd, socket_path, timeout_ms, error);
}

VnClient *vn_client_new_fd(int fd, const char *name, unsigned timeout_ms, GError **error)
{
    g_autoptr(VnClient) c = g_new0(VnClient, 1);
    int type = 0;
    socklen_t len = sizeof(type);

    c->path = g_strdup(name);
    c->timeout_ms = timeout_ms;
    c->out = g_byte_array_sized_new(4096);
    /* Whoever handed it over is a peer too: a connected UNIX stream socket, or nothing. */
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM ||
        !g_unix_set_fd_nonblocking(fd, FALSE, NULL)) {
        close(fd);
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "socket %s: what was handed over is not a stream socket", name);
        return NULL;
    }
    c->t = vn_transport_new(fd);
    if (!negotiate(c, error)) {
        return NULL;
    }
    return g_steal_pointer(&c);
}

void vn_client_free(VnClient *c)
{
    if (c == NULL) {
        return;
    }
    vn_transport_free(c->t);
    if (c->out != NULL) {
        g_byte_array_unref(c->out);
    }
    g_free(c->path);
    g_free(c);
}

int vn_client_fd(VnClient *c)
{
    return vn_transport_fd(c->t);
}

const VnWireCaps *vn_client_caps(VnClient *c)
{
    return &c->caps;
}

void vn_client_stats(VnClient *c, VnClientStats *out)
{
    *out = c->stats;
    out->awaiting = c->nlate;
}

void vn_client_set_observer(VnClient *c, VnClientObserver fn, void *opaque)
{
    c->observe = fn;
    c->observe_opaque = opaque;
}

int vn_client_get_info(VnClient *c, VnWireDeviceInfo *info)
{
    VnWireDeviceInfo q = { .argsz = sizeof(q) };

    begin(c, VN_CMD_DEVICE_GET_INFO, 0);
    append(c, &q, sizeof(q));
    return simple(c, NULL, 0, info, sizeof(*info));
}

/* A region's fds are one file: libvfio-user sends it once per sparse mmap area (QEMU's
 * client takes the first), we keep the first; fds of different files are refused. */
static bool one_file(VnTransportMsg *reply)
{
    for (unsigned i = 1; i < reply->nfds; i++) {
        if (vn_peerfd_same_file(reply->fds[0], reply->fds[i]) != 1) {
            return false;
        }
    }
    return !reply->fds_overflow;
}

static int region_info_once(VnClient *c, uint32_t index, uint32_t argsz, VnTransportMsg *reply)
{
    struct vfio_region_info q = { .argsz = argsz, .index = index };

    begin(c, VN_CMD_DEVICE_GET_REGION_INFO, 0);
    append(c, &q, sizeof(q));
    vn_wire_finish(c->out);
    return transact(c, NULL, 0, reply);
}

int vn_client_get_region_info(VnClient *c, uint32_t index, struct vfio_region_info *info, int *fd,
                              struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                              uint32_t *nr_sparse)
{
    VnTransportMsg reply = { 0 };
    uint32_t argsz = sizeof(*info);
    int ret;

    *fd = -1;
    if (nr_sparse != NULL) {
        *nr_sparse = 0;
    }
    /* linux/vfio.h: ask with the fixed size, then again with what the
     * server says it needs for the capabilities. */
    for (int round = 0; round < 2; round++) {
        ret = region_info_once(c, index, argsz, &reply);
        if (ret < 0) {
            return ret;
        }
        if (reply.len < VN_WIRE_HDR_SIZE + sizeof(*info) || !one_file(&reply)) {
            vn_transport_msg_clear(&reply);
            return -EPROTO;
        }
        memcpy(info, reply.data + VN_WIRE_HDR_SIZE, sizeof(*info));
        if (info->argsz <= argsz || info->argsz > VN_MAX_REGION_INFO_ARGSZ || round == 1) {
            break;
        }
        argsz = info->argsz;
        vn_transport_msg_clear(&reply);
    }
    if ((info->flags & VFIO_REGION_INFO_FLAG_CAPS) && sparse != NULL &&
        info->cap_offset >= sizeof(*info) &&
        reply.len >= VN_WIRE_HDR_SIZE + (size_t)info->cap_offset +
                         sizeof(struct vfio_region_info_cap_sparse_mmap)) {
        struct vfio_region_info_cap_sparse_mmap cap;
        const uint8_t *p = reply.data + VN_WIRE_HDR_SIZE + info->cap_offset;
        size_t avail = reply.len - VN_WIRE_HDR_SIZE - info->cap_offset - sizeof(cap);

        memcpy(&cap, p, sizeof(cap));
        if (cap.header.id == VFIO_REGION_INFO_CAP_SPARSE_MMAP) {
            uint32_t n = MIN(cap.nr_areas, max_sparse);

            n = MIN(n, avail / sizeof(sparse[0]));
            memcpy(sparse, p + sizeof(cap), n * sizeof(sparse[0]));
            if (nr_sparse != NULL) {
                *nr_sparse = n;
            }
        }
    }
    if (reply.nfds >= 1) {
        *fd = reply.fds[0];
        reply.fds[0] = -1; /* the others are closed with the reply */
    }
    vn_transport_msg_clear(&reply);
    return 0;
}

int vn_client_get_irq_info(VnClient *c, uint32_t index, struct vfio_irq_info *info)
{
    struct vfio_irq_info q = { .argsz = sizeof(q), .index = index };

    begin(c, VN_CMD_DEVICE_GET_IRQ_INFO, 0);
    append(c, &q, sizeof(q));
    return simple(c, NULL, 0, info, sizeof(*info));
}

int vn_client_set_irqs(VnClient *c, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                       const uint8_t *bools, const int *fds)
{
    VnWireIrqSet s = {
        .argsz = sizeof(s), .flags = flags, .index = index, .start = start, .count = count
    };
    bool with_bools = (flags & VFIO_IRQ_SET_DATA_BOOL) && bools != NULL;
    unsigned nfds = ((flags & VFIO_IRQ_SET_DATA_EVENTFD) && fds != NULL) ? count : 0;

    if (nfds > VN_MAX_MSG_FDS || (with_bools && count > VN_MAX_IRQ_VECTORS)) {
        return -EINVAL;
    }
    if (with_bools) {
        s.argsz += count;
    }
    begin(c, VN_CMD_DEVICE_SET_IRQS, 0);
    append(c, &s, sizeof(s));
    if (with_bools) {
        append(c, bools, count);
    }
    return simple(c, fds, nfds, NULL, 0);
}

int vn_client_region_read(VnClient *c, uint32_t region, uint64_t offset, void *buf, uint32_t count)
{
    VnWireRegionRw rw = { .offset = offset, .region = region, .count = count };
    VnTransportMsg reply = { 0 };
    VnWireRegionRw got;
    int ret;

    if (count > c->caps.max_data_xfer_size) {
        return -E2BIG;
    }
    begin(c, VN_CMD_REGION_READ, 0);
    append(c, &rw, sizeof(rw));
    vn_wire_finish(c->out);
    ret = transact(c, NULL, 0, &reply);
    if (ret < 0) {
        return ret;
    }
    if (reply.len < VN_WIRE_HDR_SIZE + sizeof(got)) {
        vn_transport_msg_clear(&reply);
        return -EPROTO;
    }
    memcpy(&got, reply.data + VN_WIRE_HDR_SIZE, sizeof(got));
    if (got.count > count || reply.len != VN_WIRE_HDR_SIZE + sizeof(got) + got.count) {
        vn_transport_msg_clear(&reply);
        return -EPROTO;
    }
    memcpy(buf, reply.data + VN_WIRE_HDR_SIZE + sizeof(got), got.count);
    vn_transport_msg_clear(&reply);
    return (int)got.count;
}

int vn_client_region_write(VnClient *c, uint32_t region, uint64_t offset, const void *buf,
                           uint32_t count, bool posted)
{
    VnWireRegionRw rw = { .offset = offset, .region = region, .count = count };
    int ret;

    if (count > c->caps.max_data_xfer_size) {
        return -E2BIG;
    }
    begin(c, VN_CMD_REGION_WRITE, posted ? VN_WIRE_FLAG_NO_REPLY : 0);
    append(c, &rw, sizeof(rw));
    append(c, buf, count);
    vn_wire_finish(c->out);
    if (posted) {
        ret = vn_transport_send(c->t, c->out->data, c->out->len, NULL, 0);
    } else {
        ret = simple(c, NULL, 0, NULL, 0);
    }
    return ret < 0 ? ret : (int)count;
}

int vn_client_dma_map(VnClient *c, uint64_t iova, uint64_t size, uint64_t offset, uint32_t prot,
                      int fd)
{
    VnWireDmaMap m = {
        .argsz = sizeof(m), .flags = prot, .offset = offset, .iova = iova, .size = size
    };

    begin(c, VN_CMD_DMA_MAP, 0);
    append(c, &m, sizeof(m));
    return simple(c, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, NULL, 0);
}

int vn_client_dma_map_many(VnClient *c, const VnClientDmaMap *maps, unsigned n)
{
    g_autofree uint16_t *ids = g_new(uint16_t, MAX(n, 1u));
    int first = 0;
    unsigned sent;

    for (sent = 0; sent < n; sent++) {
        VnWireDmaMap m = { .argsz = sizeof(m),
                           .flags = maps[sent].prot,
                           .offset = maps[sent].offset,
                           .iova = maps[sent].iova,
                           .size = maps[sent].size };
        int fd = maps[sent].fd;
        int ret;

        ids[sent] = fresh_id(c);
        vn_wire_begin(c->out, ids[sent], VN_CMD_DMA_MAP, 0);
        append(c, &m, sizeof(m));
        vn_wire_finish(c->out);
        ret = vn_transport_send(c->t, c->out->data, c->out->len, fd >= 0 ? &fd : NULL,
                                fd >= 0 ? 1 : 0);
        if (ret < 0) {
            first = ret;
            break;
        }
    }
    for (unsigned i = 0; i < sent; i++) {
        uint64_t deadline = vn_util_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
        VnTransportMsg reply = { 0 };
        VnWireHdr hdr;
        int ret = recv_msg(c, &reply, deadline);

        if (ret < 0) {
            return first < 0 ? first : ret; /* the rest cannot be matched any more */
        }
        memcpy(&hdr, reply.data, sizeof(hdr));
        vn_transport_msg_clear(&reply);
        if ((hdr.flags & VN_WIRE_FLAG_TYPE_MASK) != VN_WIRE_FLAG_REPLY || hdr.id != ids[i] ||
            hdr.cmd != VN_CMD_DMA_MAP) {
            return -EPROTO; /* out of order, or not ours */
        }
        if ((hdr.flags & VN_WIRE_FLAG_ERROR) && first == 0) {
            first = hdr.error > 0 && hdr.error < 4096 ? -(int)hdr.error : -EIO;
        }
    }
    return first;
}

int vn_client_dma_unmap(VnClient *c, uint64_t iova, uint64_t size, bool all)
{
    VnWireDmaUnmap u = {
        .argsz = sizeof(u), .flags = all ? VFIO_DMA_UNMAP_FLAG_ALL : 0, .iova = iova, .size = size
    };

    begin(c, VN_CMD_DMA_UNMAP, 0);
    append(c, &u, sizeof(u));
    return simple(c, NULL, 0, NULL, 0);
}

int vn_client_reset(VnClient *c)
{
    begin(c, VN_CMD_DEVICE_RESET, 0);
    return simple(c, NULL, 0, NULL, 0);
}

int vn_client_raw(VnClient *c, const void *msg, size_t len, const int *fds, unsigned nfds,
                  GByteArray **reply)
{
    VnTransportMsg r = { 0 };
    int ret;

    ret = msg != NULL ? vn_transport_send(c->t, msg, len, fds, nfds) : 0;
    if (ret < 0 || reply == NULL) {
        return ret;
    }
    ret = recv_msg(c, &r, vn_util_now_ns() + (uint64_t)c->timeout_ms * 1000000ull);
    if (ret < 0) {
        return ret;
    }
    *reply = g_byte_array_new_take(g_steal_pointer(&r.data), r.len);
    vn_transport_msg_clear(&r);
    return 0;
}
