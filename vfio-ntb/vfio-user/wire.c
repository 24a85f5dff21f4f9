/*
 * vfio-user wire format: pure decode/encode, no I/O.
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "wire.h"
#include "common/util.h"

#include "common/json.h"

#include <errno.h>
#include <gio/gio.h>
#include <json-glib/json-glib.h>
#include <string.h>

G_STATIC_ASSERT(G_BYTE_ORDER == G_LITTLE_ENDIAN);
G_STATIC_ASSERT(sizeof(VnWireHdr) == 16);
G_STATIC_ASSERT(sizeof(VnWireDmaMap) == 32);
G_STATIC_ASSERT(sizeof(VnWireDmaUnmap) == 24);
G_STATIC_ASSERT(sizeof(VnWireDeviceInfo) == 16);
G_STATIC_ASSERT(sizeof(VnWireRegionRw) == 16);
G_STATIC_ASSERT(sizeof(struct vfio_region_info) == 32);
G_STATIC_ASSERT(sizeof(struct vfio_irq_info) == 16);
G_STATIC_ASSERT(sizeof(VnWireIrqSet) == 20);
G_STATIC_ASSERT(sizeof(VnWireRegionMap) == 32);
G_STATIC_ASSERT(sizeof(VnWireRegionExtent) == 24);

/* DMA is managed in pages of this size; we advertise it as pgsizes. */
#define VN_WIRE_PAGE_SIZE 4096u

static const char *const cmd_names[VN_CMD_LAST] = {
    [VN_CMD_INVALID] = "INVALID",
    [VN_CMD_VERSION] = "VERSION",
    [VN_CMD_DMA_MAP] = "DMA_MAP",
    [VN_CMD_DMA_UNMAP] = "DMA_UNMAP",
    [VN_CMD_DEVICE_GET_INFO] = "DEVICE_GET_INFO",
    [VN_CMD_DEVICE_GET_REGION_INFO] = "DEVICE_GET_REGION_INFO",
    [VN_CMD_DEVICE_GET_REGION_IO_FDS] = "DEVICE_GET_REGION_IO_FDS",
    [VN_CMD_DEVICE_GET_IRQ_INFO] = "DEVICE_GET_IRQ_INFO",
    [VN_CMD_DEVICE_SET_IRQS] = "DEVICE_SET_IRQS",
    [VN_CMD_REGION_READ] = "REGION_READ",
    [VN_CMD_REGION_WRITE] = "REGION_WRITE",
    [VN_CMD_DMA_READ] = "DMA_READ",
    [VN_CMD_DMA_WRITE] = "DMA_WRITE",
    [VN_CMD_DEVICE_RESET] = "DEVICE_RESET",
};

const char *vn_wire_cmd_to_string(uint32_t cmd)
{
    if (cmd < VN_CMD_LAST && cmd_names[cmd] != NULL) {
        return cmd_names[cmd];
    }
    if (cmd == VN_CMD_X_REGION_MAP) {
        return "X_REGION_MAP";
    }
    return "UNKNOWN";
}

int vn_wire_check_hdr(const VnWireHdr *hdr)
{
    uint32_t type = hdr->flags & VN_WIRE_FLAG_TYPE_MASK;

    if (hdr->size < VN_WIRE_HDR_SIZE) {
        return -EINVAL;
    }
    if (hdr->size > VN_MAX_MSG_SIZE) {
        return -EMSGSIZE;
    }
    if (type != VN_WIRE_FLAG_COMMAND && type != VN_WIRE_FLAG_REPLY) {
        return -EINVAL;
    }
    return 0;
}

bool vn_wire_page_aligned(uint64_t v)
{
    return (v & (VN_WIRE_PAGE_SIZE - 1)) == 0;
}

static int decode_version(const uint8_t *body, size_t len, VnWireRequest *req)
{
    VnWireVersion v;
    size_t json_len;

    if (len < sizeof(v)) {
        return -EINVAL;
    }
    memcpy(&v, body, sizeof(v));
    req->u.version.major = v.major;
    req->u.version.minor = v.minor;
    json_len = len - sizeof(v);
    if (json_len == 0) {
        req->u.version.json = NULL;
        return 0;
    }
    /* vfio-user.rst: VERSION: the JSON string is NUL-terminated */
    if (json_len > VN_MAX_VERSION_JSON || body[len - 1] != '\0' ||
        memchr(body + sizeof(v), '\0', json_len) != body + len - 1) {
        return -EINVAL;
    }
    req->u.version.json = (const char *)body + sizeof(v);
    return 0;
}

static int decode_dma_map(const uint8_t *body, size_t len, unsigned nfds, VnWireRequest *req)
{
    VnWireDmaMap *m = &req->u.dma_map;

    if (len != sizeof(*m) || nfds > 1) {
        return -EINVAL;
    }
    memcpy(m, body, sizeof(*m));
    if (m->argsz != sizeof(*m) ||
        (m->flags & ~(uint32_t)(VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE)) ||
        m->size == 0 || m->iova + m->size < m->iova || m->offset + m->size < m->offset ||
        !vn_wire_page_aligned(m->iova) || !vn_wire_page_aligned(m->size)) {
        return -EINVAL;
    }
    return 0;
}

static int decode_dma_unmap(const uint8_t *body, size_t len, unsigned nfds, VnWireRequest *req)
{
    VnWireDmaUnmap *u = &req->u.dma_unmap;

    if (len != sizeof(*u) || nfds != 0) {
        return -EINVAL;
    }
    memcpy(u, body, sizeof(*u));
    if (u->argsz < sizeof(*u)) {
        return -EINVAL;
    }
    if (u->flags & VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP) {
        return -ENOTSUP;
    }
    if (u->flags & ~(uint32_t)VFIO_DMA_UNMAP_FLAG_ALL) {
        return -EINVAL;
    }
    if (u->flags & VFIO_DMA_UNMAP_FLAG_ALL) {
        /* linux/vfio.h: iova and size must be 0 with FLAG_ALL */
        return (u->iova == 0 && u->size == 0) ? 0 : -EINVAL;
    }
    /* A range may end at 2^64: QEMU unmaps a 64-bit IOMMU space in two halves. */
    if (u->size == 0 || u->iova + (u->size - 1) < u->iova) {
        return -EINVAL;
    }
    return 0;
}

static int decode_irq_set(const uint8_t *body, size_t len, unsigned nfds, VnWireRequest *req)
{
    VnWireIrqSet *s = &req->u.irq_set.set;
    uint32_t data, action;

    if (len < VN_WIRE_IRQ_SET_SIZE) {
        return -EINVAL;
    }
    memcpy(s, body, VN_WIRE_IRQ_SET_SIZE);
    data = s->flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
    action = s->flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
    if (s->argsz < VN_WIRE_IRQ_SET_SIZE ||
        (s->flags & ~(uint32_t)(VFIO_IRQ_SET_DATA_TYPE_MASK | VFIO_IRQ_SET_ACTION_TYPE_MASK)) ||
        data == 0 || (data & (data - 1)) != 0 || action == 0 || (action & (action - 1)) != 0) {
        return -EINVAL;
    }
    if (s->count > VN_MAX_IRQ_VECTORS || (uint64_t)s->start + s->count > VN_MAX_IRQ_VECTORS) {
        return -EINVAL;
    }
    req->u.irq_set.bools = NULL;
    switch (data) {
    case VFIO_IRQ_SET_DATA_NONE:
        return (len == VN_WIRE_IRQ_SET_SIZE && nfds == 0) ? 0 : -EINVAL;
    case VFIO_IRQ_SET_DATA_BOOL:
        if (len != VN_WIRE_IRQ_SET_SIZE + (size_t)s->count || nfds != 0) {
            return -EINVAL;
        }
        req->u.irq_set.bools = body + VN_WIRE_IRQ_SET_SIZE;
        return 0;
    default: /* VFIO_IRQ_SET_DATA_EVENTFD */
        /* vfio-user.rst: SET_IRQS: the fds travel as SCM_RIGHTS; none at all
         * means every vector in the range is de-assigned. */
        if (len != VN_WIRE_IRQ_SET_SIZE || (nfds != 0 && nfds != s->count)) {
            return -EINVAL;
        }
        return 0;
    }
}

static int decode_region_rw(const uint8_t *body, size_t len, unsigned nfds, bool write,
                            VnWireRequest *req)
{
    VnWireRegionRw *rw = &req->u.region.rw;

    if (len < sizeof(*rw) || nfds != 0) {
        return -EINVAL;
    }
    memcpy(rw, body, sizeof(*rw));
    if (rw->count > VN_MAX_DATA_XFER) {
        return -E2BIG;
    }
    if (rw->count == 0 || rw->offset + rw->count < rw->offset) {
        return -EINVAL;
    }
    if (len != sizeof(*rw) + (write ? (size_t)rw->count : 0)) {
        return -EINVAL;
    }
    req->u.region.data = write ? body + sizeof(*rw) : NULL;
    return 0;
}

int vn_wire_decode_request(const uint8_t *msg, size_t len, unsigned nfds, VnWireRequest *req)
{
    const uint8_t *body;
    size_t blen;
    int ret;

    if (len < VN_WIRE_HDR_SIZE) {
        return -EINVAL;
    }
    memset(req, 0, sizeof(*req));
    memcpy(&req->hdr, msg, VN_WIRE_HDR_SIZE);
    ret = vn_wire_check_hdr(&req->hdr);
    if (ret < 0) {
        return ret;
    }
    if (req->hdr.size != len || (req->hdr.flags & VN_WIRE_FLAG_TYPE_MASK) != VN_WIRE_FLAG_COMMAND ||
        (req->hdr.flags & VN_WIRE_FLAG_ERROR)) {
        return -EINVAL;
    }
    body = msg + VN_WIRE_HDR_SIZE;
    blen = len - VN_WIRE_HDR_SIZE;

    switch (req->hdr.cmd) {
    case VN_CMD_VERSION:
        return nfds == 0 ? decode_version(body, blen, req) : -EINVAL;
    case VN_CMD_DMA_MAP:
        return decode_dma_map(body, blen, nfds, req);
    case VN_CMD_DMA_UNMAP:
        return decode_dma_unmap(body, blen, nfds, req);
    case VN_CMD_DEVICE_GET_INFO:
        if (blen < sizeof(req->u.device_info) || nfds != 0) {
            return -EINVAL;
        }
        memcpy(&req->u.device_info, body, sizeof(req->u.device_info));
        return req->u.device_info.argsz >= sizeof(req->u.device_info) ? 0 : -EINVAL;
    case VN_CMD_DEVICE_GET_REGION_INFO:
        if (blen < sizeof(req->u.region_info) || nfds != 0) {
            return -EINVAL;
        }
        memcpy(&req->u.region_info, body, sizeof(req->u.region_info));
        if (req->u.region_info.argsz < sizeof(req->u.region_info) ||
            req->u.region_info.argsz > VN_MAX_REGION_INFO_ARGSZ) {
            return -EINVAL;
        }
        return 0;
    case VN_CMD_DEVICE_GET_IRQ_INFO:
        if (blen < sizeof(req->u.irq_info) || nfds != 0) {
            return -EINVAL;
        }
        memcpy(&req->u.irq_info, body, sizeof(req->u.irq_info));
        return req->u.irq_info.argsz >= sizeof(req->u.irq_info) ? 0 : -EINVAL;
    case VN_CMD_DEVICE_SET_IRQS:
        return decode_irq_set(body, blen, nfds, req);
    case VN_CMD_REGION_READ:
        return decode_region_rw(body, blen, nfds, false, req);
    case VN_CMD_REGION_WRITE:
        return decode_region_rw(body, blen, nfds, true, req);
    case VN_CMD_DEVICE_RESET:
        return (blen == 0 && nfds == 0) ? 0 : -EINVAL;
    default:
        return -ENOTSUP;
    }
}

void vn_wire_begin(GByteArray *buf, uint16_t id, uint16_t cmd, uint32_t flags)
{
    VnWireHdr hdr = { .id = id, .cmd = cmd, .flags = flags };

    g_byte_array_set_size(buf, 0);
    g_byte_array_append(buf, (const guint8 *)&hdr, sizeof(hdr));
}

void vn_wire_finish(GByteArray *buf)
{
    VnWireHdr *hdr = (VnWireHdr *)buf->data;

    hdr->size = buf->len;
}

void vn_wire_begin_reply(GByteArray *buf, const VnWireHdr *req)
{
    vn_wire_begin(buf, req->id, req->cmd, VN_WIRE_FLAG_REPLY);
}

void vn_wire_error_reply(GByteArray *buf, const VnWireHdr *req, int err)
{
    VnWireHdr *hdr;

    vn_wire_begin(buf, req->id, req->cmd, VN_WIRE_FLAG_REPLY | VN_WIRE_FLAG_ERROR);
    hdr = (VnWireHdr *)buf->data;
    hdr->error = (uint32_t)(err < 0 ? -err : err);
    vn_wire_finish(buf);
}

char *vn_wire_caps_json(void)
{
    /* Short on purpose: QEMU's receive buffer for the VERSION reply is the
     * size of its own request, so our reply must not be longer. */
    return g_strdup_printf("{\"capabilities\":{\"max_msg_fds\":%u,"
                           "\"max_data_xfer_size\":%u,\"pgsizes\":%u,"
                           "\"max_dma_maps\":%u}}",
                           VN_MAX_MSG_FDS, VN_MAX_DATA_XFER, VN_WIRE_PAGE_SIZE, VN_MAX_DMA_MAPS);
}

static bool caps_uint(JsonObject *obj, const char *name, uint64_t *out, GError **error)
{
    JsonNode *node = json_object_get_member(obj, name);

    if (node == NULL) {
        return true;
    }
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64 ||
        json_node_get_int(node) < 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "capability %s is not a non-negative integer", name);
        return false;
    }
    *out = (uint64_t)json_node_get_int(node);
    return true;
}

static bool caps_bool(JsonObject *obj, const char *name, bool *out, GError **error)
{
    JsonNode *node = json_object_get_member(obj, name);

    if (node == NULL) {
        return true;
    }
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "capability %s is not a boolean",
                    name);
        return false;
    }
    *out = json_node_get_boolean(node);
    return true;
}

bool vn_wire_parse_caps(const char *json, VnWireCaps *caps, GError **error)
{
    g_autoptr(JsonObject) obj = NULL;
    JsonObject *cap;
    JsonNode *capn;

    /* vfio-user.rst: VERSION: defaults when a capability is absent */
    caps->max_msg_fds = 1;
    caps->max_data_xfer_size = VN_MAX_DATA_XFER;
    caps->pgsizes = VN_WIRE_PAGE_SIZE;
    caps->max_dma_maps = 65535;
    caps->region_map = false;
    if (json == NULL || json[0] == '\0') {
        return true;
    }
    obj = vn_json_parse_object(json, -1, VN_MAX_MSG_SIZE, error);
    if (obj == NULL) {
        g_prefix_error(error, "capabilities: ");
        return false;
    }
    capn = json_object_get_member(obj, "capabilities");
    if (capn == NULL) {
        return true;
    }
    if (!JSON_NODE_HOLDS_OBJECT(capn)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "capabilities: \"capabilities\" is not an object");
        return false;
    }
    cap = json_node_get_object(capn); /* borrowed from obj */
    return caps_uint(cap, "max_msg_fds", &caps->max_msg_fds, error) &&
           caps_uint(cap, "max_data_xfer_size", &caps->max_data_xfer_size, error) &&
           caps_uint(cap, "pgsizes", &caps->pgsizes, error) &&
           caps_uint(cap, "max_dma_maps", &caps->max_dma_maps, error) &&
           caps_bool(cap, VN_WIRE_CAP_REGION_MAP, &caps->region_map, error);
}
