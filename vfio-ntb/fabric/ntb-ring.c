/*
 * The `ntb` backend's message ring over plain memory (ntb.h): no port, no
 * I/O, so the fuzzer and the unit suite reach every check a peer's bytes
 * meet.
 */
#include "ntb.h"

#include <errno.h>
#include <string.h>

uint16_t vn_ntb_tag(uint16_t a, uint16_t b)
{
    /* Symmetric, and never 0: 0 is a word nobody has written yet. */
    uint16_t t = (uint16_t)(a ^ b);

    return t != 0 ? t : 0xffffu;
}

uint32_t vn_ntb_rec_max(uint64_t ring)
{
    /* A quarter: a record always fits once the reader has caught up with
     * three quarters of the ring, so a writer never waits on itself. */
    return (uint32_t)(ring / 4 - sizeof(VnNtbRec));
}

uint64_t vn_ntb_ring_of(uint64_t bytes)
{
    uint64_t ring = VN_NTB_MAX_RING;

    if (bytes < VN_NTB_RING_DATA + VN_NTB_MIN_RING) {
        return 0;
    }
    while (ring > bytes - VN_NTB_RING_DATA) {
        ring /= 2;
    }
    return ring;
}

void vn_ntb_ring_put(uint8_t *data, uint64_t ring, uint64_t pos, const void *src, size_t len)
{
    uint64_t at = pos & (ring - 1);
    size_t first = (size_t)MIN((uint64_t)len, ring - at);

    memcpy(data + at, src, first);
    memcpy(data, (const uint8_t *)src + first, len - first);
}

static void ring_get(const uint8_t *data, uint64_t ring, uint64_t pos, void *dst, size_t len)
{
    uint64_t at = pos & (ring - 1);
    size_t first = (size_t)MIN((uint64_t)len, ring - at);

    memcpy(dst, data + at, first);
    memcpy((uint8_t *)dst + first, data, len - first);
}

int64_t vn_ntb_ring_take(const uint8_t *data, uint64_t ring, uint64_t pos, uint64_t avail,
                         VnNtbRec *rec, uint8_t *payload)
{
    uint64_t size;

    if (avail < sizeof(*rec) || (pos & 7) != 0) {
        return -EBADMSG;
    }
    ring_get(data, ring, pos, rec, sizeof(*rec));
    if (rec->len > vn_ntb_rec_max(ring) || rec->kind == 0 || rec->kind >= VN_NTB_REC_LAST ||
        (rec->flags & ~VN_NTB_REC_MORE) != 0) {
        return -EBADMSG;
    }
    size = sizeof(*rec) + (((uint64_t)rec->len + 7) & ~UINT64_C(7));
    if (size > avail) {
        return -EBADMSG;
    }
    ring_get(data, ring, pos + sizeof(*rec), payload, rec->len);
    return (int64_t)size;
}
