/*
 * The fabric's message frame: pure encode/decode, no I/O (see frame.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "frame.h"
#include "common/json.h"
#include "common/util.h"

#include <errno.h>
#include <json-glib/json-glib.h>
#include <string.h>

G_STATIC_ASSERT(G_BYTE_ORDER == G_LITTLE_ENDIAN);
G_STATIC_ASSERT(sizeof(VnFabricFrameHdr) == 40);
G_STATIC_ASSERT(VN_FABRIC_FRAME_HDR_SIZE + VN_FABRIC_MAX_PAYLOAD <= VN_FABRIC_MAX_FRAME);
G_STATIC_ASSERT(VN_FABRIC_MAX_PAYLOAD < G_MAXUINT32);

const char *vn_fabric_type_to_string(uint32_t type)
{
    switch (type) {
    case VN_FABRIC_TYPE_DOORBELL:
        return "DOORBELL";
    default:
        return type < VN_FABRIC_TYPE_RESERVED ? "user" : "unknown";
    }
}

const char *vn_fabric_kind_to_string(uint16_t flags)
{
    switch (flags & VN_FABRIC_FLAG_KIND_MASK) {
    case VN_FABRIC_FLAG_REQUEST:
        return "request";
    case VN_FABRIC_FLAG_REPLY:
        return (flags & VN_FABRIC_FLAG_ERROR) ? "error-reply" : "reply";
    case VN_FABRIC_FLAG_EVENT:
        return "event";
    default:
        return "bad-kind";
    }
}

int vn_fabric_frame_encode(GByteArray *out, uint16_t flags, uint32_t type, uint64_t id,
                           int32_t error, const char *json, const void *data, size_t len)
{
    size_t json_len = json != NULL ? strlen(json) + 1 : 0;
    VnFabricFrameHdr hdr = {
        .magic = VN_FABRIC_FRAME_MAGIC,
        .version = VN_FABRIC_FRAME_VERSION,
        .flags = flags,
        .type = type,
        .id = id,
        .error = error,
    };

    /* Each term is checked before the sum so it cannot wrap. */
    if (json_len > VN_FABRIC_MAX_PAYLOAD || len > VN_FABRIC_MAX_PAYLOAD ||
        json_len + len > VN_FABRIC_MAX_PAYLOAD) {
        return -EMSGSIZE;
    }
    hdr.json_len = (uint32_t)json_len;
    hdr.data_len = (uint32_t)len;
    g_byte_array_set_size(out, 0);
    g_byte_array_append(out, (const guint8 *)&hdr, sizeof(hdr));
    if (json_len > 0) {
        g_byte_array_append(out, (const guint8 *)json, (guint)json_len);
    }
    if (len > 0) {
        g_byte_array_append(out, data, (guint)len);
    }
    return 0;
}

/* @s is @len bytes followed by a NUL (checked by the caller). */
static bool json_object_ok(const char *s, size_t len)
{
    g_autoptr(JsonObject) o = NULL;

    if (!g_utf8_validate(s, (gssize)len, NULL)) {
        return false;
    }
    o = vn_json_parse_object(s, (gssize)len, VN_FABRIC_MAX_PAYLOAD, NULL);
    return o != NULL;
}

static int check_kind(const VnFabricFrameHdr *h)
{
    uint16_t kind = h->flags & VN_FABRIC_FLAG_KIND_MASK;

    if (h->flags & ~(VN_FABRIC_FLAG_KIND_MASK | VN_FABRIC_FLAG_ERROR)) {
        return -EINVAL;
    }
    if (kind != VN_FABRIC_FLAG_REQUEST && kind != VN_FABRIC_FLAG_REPLY &&
        kind != VN_FABRIC_FLAG_EVENT) {
        return -EINVAL;
    }
    if (h->flags & VN_FABRIC_FLAG_ERROR) {
        if (kind != VN_FABRIC_FLAG_REPLY || h->error <= 0 || h->error > VN_FABRIC_MAX_ERRNO) {
            return -EINVAL;
        }
    } else if (h->error != 0) {
        return -EINVAL;
    }
    /* Requests and replies carry an id; id 0 is never issued. */
    if (kind != VN_FABRIC_FLAG_EVENT && h->id == 0) {
        return -EINVAL;
    }
    /* A reply's type echoes its request and is not interpreted. */
    if (kind != VN_FABRIC_FLAG_REPLY && h->type >= VN_FABRIC_TYPE_RESERVED) {
        if (h->type == VN_FABRIC_TYPE_DOORBELL) {
            return kind == VN_FABRIC_FLAG_EVENT ? 0 : -EINVAL;
        }
        return -ENOTSUP;
    }
    return 0;
}

int vn_fabric_frame_decode(const uint8_t *buf, size_t len, VnFabricFrame *f)
{
    const VnFabricFrameHdr *h = &f->hdr;
    uint64_t body;
    int ret;

    memset(f, 0, sizeof(*f));
    if (len < VN_FABRIC_FRAME_HDR_SIZE) {
        return -EINVAL;
    }
    memcpy(&f->hdr, buf, sizeof(f->hdr));
    if (h->magic != VN_FABRIC_FRAME_MAGIC) {
        return -EINVAL;
    }
    if (h->version != VN_FABRIC_FRAME_VERSION) {
        return -EPROTONOSUPPORT;
    }
    if (h->reserved0 != 0 || h->reserved != 0) {
        return -EINVAL;
    }
    if (h->json_len > VN_FABRIC_MAX_PAYLOAD || h->data_len > VN_FABRIC_MAX_PAYLOAD ||
        (uint64_t)h->json_len + h->data_len > VN_FABRIC_MAX_PAYLOAD) {
        return -EMSGSIZE;
    }
    body = (uint64_t)h->json_len + h->data_len;
    if (len - VN_FABRIC_FRAME_HDR_SIZE != body) {
        return -EINVAL;
    }
    ret = check_kind(h);
    if (ret < 0) {
        return ret;
    }
    if (h->json_len > 0) {
        const char *json = (const char *)buf + VN_FABRIC_FRAME_HDR_SIZE;
        size_t n = h->json_len - 1;

        /* NUL-terminated exactly at the end, no NUL inside. */
        if (json[n] != '\0' || memchr(json, '\0', n) != NULL || !json_object_ok(json, n)) {
            return -EINVAL;
        }
        f->json = json;
    }
    if (h->data_len > 0) {
        f->data = buf + VN_FABRIC_FRAME_HDR_SIZE + h->json_len;
    }
    return 0;
}

bool vn_fabric_frame_replyable(const VnFabricFrame *f)
{
    return f->hdr.magic == VN_FABRIC_FRAME_MAGIC && f->hdr.id != 0 &&
           (f->hdr.flags & VN_FABRIC_FLAG_KIND_MASK) == VN_FABRIC_FLAG_REQUEST &&
           !(f->hdr.flags & ~(VN_FABRIC_FLAG_KIND_MASK | VN_FABRIC_FLAG_ERROR));
}
