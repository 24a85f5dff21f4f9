/*
 * libFuzzer target for the fabric frame decoder (fabric/frame.c): header,
 * JSON payload from a peer daemon.  Any bytes must decode or be refused
 * with -errno; what decodes must lie inside the buffer.
 */
#include "fabric/frame.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    VnFabricFrame f;
    /* An exact-size heap copy so ASan sees any read past the frame. */
    uint8_t *copy = malloc(size ? size : 1);

    memcpy(copy, data, size);
    if (vn_fabric_frame_decode(copy, size, &f) == 0) {
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
