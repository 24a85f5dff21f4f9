/*
 * The fabric's message frame: layout, limits and a pure encoder/decoder.
 *
 * Nothing here does I/O.  A frame is this header, then json_len bytes of
 * NUL-terminated JSON object text (json_len 0: none), then data_len bytes of
 * binary data.  No file descriptor rides along: an NTB carries bytes, and
 * what it carries besides (memory, doorbells, interrupt routes) goes through
 * the backend's own ops (fabric.h).  Integers are little-endian; vfio-ntb builds for little-endian
 * hosts only (checked in frame.c), so the header is used as laid out.
 */
#ifndef VN_FABRIC_FRAME_H
#define VN_FABRIC_FRAME_H

#include "fabric.h"

#include <glib.h>
#include <stdint.h>

#define VN_FABRIC_FRAME_MAGIC 0x4246564eu /* "NVFB" on the wire */
#define VN_FABRIC_FRAME_VERSION 2u

typedef struct VnFabricFrameHdr {
    uint32_t magic;
    uint16_t version;
    uint16_t flags;     /* one kind (VN_FABRIC_FLAG_KIND_MASK) + ERROR */
    uint32_t type;      /* user type, or a VnFabricOwnType */
    uint32_t reserved0; /* 0 */
    uint64_t id;        /* request id; a reply carries its request's */
    uint32_t json_len;  /* JSON text with its NUL, or 0 */
    uint32_t data_len;
    int32_t error;     /* positive errno of an error reply, else 0 */
    uint32_t reserved; /* 0 */
} VnFabricFrameHdr;

#define VN_FABRIC_FRAME_HDR_SIZE ((uint32_t)sizeof(VnFabricFrameHdr))

#define VN_FABRIC_FLAG_REQUEST 0x1u
#define VN_FABRIC_FLAG_REPLY 0x2u
#define VN_FABRIC_FLAG_EVENT 0x4u
#define VN_FABRIC_FLAG_KIND_MASK 0x7u
#define VN_FABRIC_FLAG_ERROR 0x8u /* only with REPLY */

/* The fabric's own message types (at or above VN_FABRIC_TYPE_RESERVED). */
typedef enum VnFabricOwnType {
    /* event: data = u32 doorbell bit */
    VN_FABRIC_TYPE_DOORBELL = VN_FABRIC_TYPE_RESERVED + 1,
    VN_FABRIC_TYPE_LAST
} VnFabricOwnType;

/* Largest errno value an error reply may carry (MAX_ERRNO in Linux). */
#define VN_FABRIC_MAX_ERRNO 4095

const char *vn_fabric_type_to_string(uint32_t type);
const char *vn_fabric_kind_to_string(uint16_t flags);

/* A decoded frame: pointers into the buffer it was decoded from. */
typedef struct VnFabricFrame {
    VnFabricFrameHdr hdr;
    const char *json;    /* NULL when json_len is 0 */
    const uint8_t *data; /* NULL when data_len is 0 */
} VnFabricFrame;

/*
 * Build a whole frame in @out (replacing its contents).  @json may be NULL.
 * Returns 0, or -EMSGSIZE when the payload exceeds VN_FABRIC_MAX_PAYLOAD.
 */
int vn_fabric_frame_encode(GByteArray *out, uint16_t flags, uint32_t type, uint64_t id,
                           int32_t error, const char *json, const void *data, size_t len);

/*
 * Check a received frame of @len bytes, and fill
 * @f.  Returns 0, or -errno for the first fault found (-EMSGSIZE lengths
 * over the limits, -EPROTONOSUPPORT another version, -ENOTSUP an unknown
 * fabric type, -EINVAL anything else).  Whenever @len covers a header, f->hdr
 * holds it even on failure, so the caller can answer a bad request.
 */
int vn_fabric_frame_decode(const uint8_t *buf, size_t len, VnFabricFrame *f);

/* True when a frame whose decode failed still deserves an error reply: its
 * header is ours and says it is a request. */
bool vn_fabric_frame_replyable(const VnFabricFrame *f);

#endif /* VN_FABRIC_FRAME_H */
