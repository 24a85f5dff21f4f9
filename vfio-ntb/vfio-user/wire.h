/*
 * vfio-user wire format: message layouts, limits, and a pure decoder/encoder.
 *
 * Nothing here does I/O.  Decoders take the bytes and the number of file
 * descriptors that arrived with a message and either fill a typed view or
 * return -errno; encoders append to a GByteArray.  The layouts follow
 * QEMU's docs/interop/vfio-user.rst; integers are little-endian on the wire
 * and vfio-ntb only builds for little-endian hosts (checked in wire.c).
 */
#ifndef VN_WIRE_H
#define VN_WIRE_H

#include <glib.h>
#include <linux/vfio.h>
#include <stdbool.h>
#include <stdint.h>

/* vfio-user.rst: Header */
typedef struct VnWireHdr {
    uint16_t id;
    uint16_t cmd;
    uint32_t size; /* whole message, header included */
    uint32_t flags;
    uint32_t error; /* errno of an error reply */
} VnWireHdr;

#define VN_WIRE_HDR_SIZE ((uint32_t)sizeof(VnWireHdr))

#define VN_WIRE_FLAG_TYPE_MASK 0xfu
#define VN_WIRE_FLAG_COMMAND 0x0u
#define VN_WIRE_FLAG_REPLY 0x1u
#define VN_WIRE_FLAG_NO_REPLY 0x10u
#define VN_WIRE_FLAG_ERROR 0x20u

typedef enum VnWireCmd {
    VN_CMD_INVALID = 0,
    VN_CMD_VERSION = 1,
    VN_CMD_DMA_MAP = 2,
    VN_CMD_DMA_UNMAP = 3,
    VN_CMD_DEVICE_GET_INFO = 4,
    VN_CMD_DEVICE_GET_REGION_INFO = 5,
    VN_CMD_DEVICE_GET_REGION_IO_FDS = 6,
    VN_CMD_DEVICE_GET_IRQ_INFO = 7,
    VN_CMD_DEVICE_SET_IRQS = 8,
    VN_CMD_REGION_READ = 9,
    VN_CMD_REGION_WRITE = 10,
    VN_CMD_DMA_READ = 11,
    VN_CMD_DMA_WRITE = 12,
    VN_CMD_DEVICE_RESET = 13,
    VN_CMD_LAST
} VnWireCmd;

const char *vn_wire_cmd_to_string(uint32_t cmd);

/* A multiple of the page size DMA and region maps are made in (4096, advertised as pgsizes). */
bool vn_wire_page_aligned(uint64_t v);

/*
 * vfio-ntb's one extension (docs/qemu-patches.md, patch 0008): the server asks the client
 * to map an area, [offset, offset + size) of a BAR region, onto an fd it sends (MAP: each
 * extent that follows puts [fd_offset, fd_offset + len) of the fd at [at, at + len) of the
 * area, and what no extent covers reads all ones), or to go back to sending the area's
 * accesses as messages (no MAP flag, no extents, no fd).  An area keeps its offset and size
 * for the client's session (no two overlap).  A client that takes it says so in VERSION
 * (VN_WIRE_CAP_REGION_MAP: true); no server sends it otherwise.  Its number is far above the
 * spec's commands so that it never meets one of theirs.
 */
#define VN_CMD_X_REGION_MAP 0x100u
#define VN_WIRE_CAP_REGION_MAP "x-vfio-ntb-region-map"
#define VN_WIRE_REGION_MAP_FLAG_MAP 0x1u
#define VN_WIRE_REGION_MAP_MAX_EXTENTS 1024u

typedef struct VnWireRegionMap {
    uint32_t region;
    uint32_t flags;      /* VN_WIRE_REGION_MAP_FLAG_MAP: the fd and extents that come with it */
    uint64_t offset;     /* in the region, page aligned */
    uint64_t size;       /* page aligned, not 0 */
    uint32_t nr_extents; /* MAP: 1 to VN_WIRE_REGION_MAP_MAX_EXTENTS */
    uint32_t reserved;
    /* followed by nr_extents VnWireRegionExtent, in order of at, apart, page aligned */
} VnWireRegionMap;

typedef struct VnWireRegionExtent {
    uint64_t at; /* in the area */
    uint64_t fd_offset;
    uint64_t len;
} VnWireRegionExtent;

/*
 * Limits.  Every size, count and index that a peer sends is checked against
 * one of these before it is used.
 */
/* Largest message we accept or send: a max_data_xfer_size transfer plus its
 * header and REGION_READ/WRITE fields, rounded up. */
#define VN_MAX_DATA_XFER (1024u * 1024u)
#define VN_MAX_MSG_SIZE (VN_MAX_DATA_XFER + 4096u)
/* fds in one message: QEMU sends up to 16 eventfds per SET_IRQS chunk. */
#define VN_MAX_MSG_FDS 16u
/* A VERSION capabilities string; QEMU's is ~250 bytes. */
#define VN_MAX_VERSION_JSON 4096u
/* DMA mappings per client; guest RAM is a handful of sections, QEMU's
 * default is 65535 but we advertise this smaller value in VERSION. */
#define VN_MAX_DMA_MAPS 1024u
/* Regions and irq indexes of a PCI device (vfio: 9 and 5). */
#define VN_MAX_REGIONS 16u
#define VN_MAX_IRQ_INDEXES 8u
/* Vectors per irq index: MSI-X allows 2048. */
#define VN_MAX_IRQ_VECTORS 2048u
/* Sparse mmap areas per region. */
#define VN_MAX_SPARSE_AREAS 8u
/* GET_REGION_INFO argsz a client may ask with (caps included). */
#define VN_MAX_REGION_INFO_ARGSZ 4096u

/* vfio-user.rst: VFIO_USER_VERSION; we speak 0.0 like QEMU 10+. */
#define VN_WIRE_VERSION_MAJOR 0
#define VN_WIRE_VERSION_MINOR 0

typedef struct VnWireVersion {
    uint16_t major;
    uint16_t minor;
    /* followed by a NUL-terminated JSON capabilities string */
} VnWireVersion;

/* vfio-user.rst: VFIO_USER_DMA_MAP */
typedef struct VnWireDmaMap {
    uint32_t argsz;
    uint32_t flags;  /* VFIO_DMA_MAP_FLAG_READ | _WRITE */
    uint64_t offset; /* into the fd */
    uint64_t iova;
    uint64_t size;
} VnWireDmaMap;

/* vfio-user.rst: VFIO_USER_DMA_UNMAP */
typedef struct VnWireDmaUnmap {
    uint32_t argsz;
    uint32_t flags; /* VFIO_DMA_UNMAP_FLAG_ALL */
    uint64_t iova;
    uint64_t size;
} VnWireDmaUnmap;

/* vfio-user.rst: VFIO_USER_DEVICE_GET_INFO (vfio_device_info without caps) */
typedef struct VnWireDeviceInfo {
    uint32_t argsz;
    uint32_t flags;
    uint32_t num_regions;
    uint32_t num_irqs;
} VnWireDeviceInfo;

/* vfio-user.rst: VFIO_USER_REGION_READ / _WRITE */
typedef struct VnWireRegionRw {
    uint64_t offset;
    uint32_t region;
    uint32_t count;
    /* followed by count data bytes (write request, read reply) */
} VnWireRegionRw;

/* vfio-user.rst: VFIO_USER_DEVICE_SET_IRQS: vfio_irq_set without data[]
 * (a flexible array member cannot sit inside our request union). */
typedef struct VnWireIrqSet {
    uint32_t argsz;
    uint32_t flags;
    uint32_t index;
    uint32_t start;
    uint32_t count;
} VnWireIrqSet;

#define VN_WIRE_IRQ_SET_SIZE ((uint32_t)sizeof(VnWireIrqSet))

/* A decoded request.  Pointers point into the message buffer. */
typedef struct VnWireRequest {
    VnWireHdr hdr;
    union {
        struct {
            uint16_t major;
            uint16_t minor;
            const char *json; /* NUL-terminated, validated length */
        } version;
        VnWireDmaMap dma_map;
        VnWireDmaUnmap dma_unmap;
        VnWireDeviceInfo device_info;
        struct vfio_region_info region_info;
        struct vfio_irq_info irq_info;
        struct {
            VnWireIrqSet set;
            const uint8_t *bools; /* DATA_BOOL: set.count bytes */
        } irq_set;
        struct {
            VnWireRegionRw rw;
            const uint8_t *data; /* REGION_WRITE: rw.count bytes */
        } region;
    } u;
} VnWireRequest;

/*
 * Check a header as it arrives, before the body is read.  Returns 0, or
 * -EINVAL for a size below the header or a type other than command/reply,
 * or -EMSGSIZE for a size above VN_MAX_MSG_SIZE.
 */
int vn_wire_check_hdr(const VnWireHdr *hdr);

/*
 * Decode a command message: @msg is the whole message (@len bytes, header
 * included, len == hdr->size) and @nfds the number of fds that came with it.
 * Checks sizes, argsz, flags, fd counts, and integer overflow for the
 * command; what depends on the device (region index, ranges) is the
 * server's.  Returns 0 and fills @req, or -errno: -EINVAL for malformed
 * input, -ENOTSUP for a command we do not implement, -E2BIG for a transfer
 * above VN_MAX_DATA_XFER.
 */
int vn_wire_decode_request(const uint8_t *msg, size_t len, unsigned nfds, VnWireRequest *req);

/* Start a message in @buf (cleared first); returns the header to fill. */
void vn_wire_begin(GByteArray *buf, uint16_t id, uint16_t cmd, uint32_t flags);
/* Set the header's size field to the buffer's length. */
void vn_wire_finish(GByteArray *buf);
/* Start a reply to @req. */
void vn_wire_begin_reply(GByteArray *buf, const VnWireHdr *req);
/* A complete error reply (header only) to @req with a positive errno. */
void vn_wire_error_reply(GByteArray *buf, const VnWireHdr *req, int err);

/* Build the JSON capabilities string we advertise in VERSION. */
char *vn_wire_caps_json(void);

/* Parsed capabilities of a peer's VERSION message. */
typedef struct VnWireCaps {
    uint64_t max_msg_fds;
    uint64_t max_data_xfer_size;
    uint64_t pgsizes;
    uint64_t max_dma_maps;
    bool region_map; /* a client's VN_WIRE_CAP_REGION_MAP */
} VnWireCaps;

/*
 * Parse a capabilities JSON string (json-glib).  Missing members keep the
 * spec's defaults.  Returns false with @error set for malformed JSON, a
 * non-object, or a member of the wrong type.
 */
bool vn_wire_parse_caps(const char *json, VnWireCaps *caps, GError **error);

#endif /* VN_WIRE_H */
