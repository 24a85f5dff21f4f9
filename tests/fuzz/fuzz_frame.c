/*
 * libFuzzer target for the fabric frame decoder (fabric/frame.c): header,
 * JSON payload and fd count from a peer daemon.  Any bytes must decode or
 * be refused with -errno; what decodes must lie inside the buffer.
 * The first byte picks the fd count; the rest is the frame.
 */
#include "fabric/frame.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    VnFabricFrame f;
    uint8_t *copy;
    unsigned nfds;

    if (size < 1) {
        return 0;
    }
    nfds = data[0] % (VN_FABRIC_MAX_FDS + 2);
    /* An exact-size heap copy so ASan sees any read past the frame. */
    copy = malloc(size - 1 ? size - 1 : 1);
    memcpy(copy, data + 1, size - 1);
    if (vn_fabric_frame_decode(copy, size - 1, nfds, &f) == 0) {
        volatile uint8_t sink = 0;

        if (f.json != NULL) {
            sink ^= (uint8_t)strlen(f.json);
        }
        for (uint32_t i = 0; f.data != NULL && i < f.hdr.data_len; i++) {
            sink ^= f.data[i];
        }
        (void)sink;
    } else {
        (void)vn_fabric_frame_replyable(&f);
    }
    (void)vn_fabric_type_to_string(f.hdr.type);
    (void)vn_fabric_kind_to_string(f.hdr.flags);
    free(copy);
    return 0;
}
