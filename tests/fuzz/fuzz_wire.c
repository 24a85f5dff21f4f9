/*
 * libFuzzer target for the vfio-user decoder: any bytes, any fd count, must
 * decode or be refused with -errno, never crash or read out of bounds.
 * The first byte picks the fd count; the rest is the message.
 */
#include "vfio-user/wire.h"

#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    VnWireRequest req;
    VnWireCaps caps;
    uint8_t *copy;
    unsigned nfds;

    if (size < 1) {
        return 0;
    }
    nfds = data[0] % (VN_MAX_MSG_FDS + 2);
    /* An exact-size heap copy so ASan sees any read past the message. */
    copy = malloc(size - 1 ? size - 1 : 1);
    memcpy(copy, data + 1, size - 1);
    if (vn_wire_decode_request(copy, size - 1, nfds, &req) == 0) {
        if (req.hdr.cmd == VN_CMD_VERSION && req.u.version.json != NULL) {
            vn_wire_parse_caps(req.u.version.json, &caps, NULL);
        }
        if (req.hdr.cmd == VN_CMD_REGION_WRITE) {
            volatile uint8_t sink = 0;

            for (uint32_t i = 0; i < req.u.region.rw.count; i++) {
                sink ^= req.u.region.data[i];
            }
            (void)sink;
        }
    }
    free(copy);
    return 0;
}
