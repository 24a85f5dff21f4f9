/*
 * libFuzzer target for the lending protocol's decoders (lending/proto.c):
 * the JSON a borrower or lender gets from its peer.  The first byte picks
 * the decoder, the rest is the JSON text.  Whatever decodes must encode and
 * decode again to the same thing (re-encoding is compared as text).
 */
#include "lending/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef char *(*Codec)(const char *json, GError **error);

#define CODEC(name, type)                                                          \
    static char *name##_rt(const char *json, GError **error)                       \
    {                                                                              \
        type v;                                                                    \
        char dev[VN_MAX_DEVICE_NAME + 1] = "dev";                           \
                                                                                   \
        memset(&v, 0, sizeof(v));                                                  \
        if (!vn_proto_##name##_from_json(json, &v, error)) {                       \
            return NULL;                                                           \
        }                                                                          \
        (void)vn_proto_device_name(json, dev, NULL);                               \
        return vn_proto_##name##_to_json(dev, &v);                                 \
    }

CODEC(region_rw, VnProtoRegionRw)
CODEC(dma_map, VnProtoDmaMap)
CODEC(dma_unmap, VnProtoDmaUnmap)
CODEC(set_irqs, VnProtoSetIrqs)

static char *device_rt(const char *json, GError **error)
{
    VnProtoDevice d;

    return vn_proto_device_from_json(json, &d, error) ? vn_proto_device_to_json(&d) : NULL;
}

static char *attach_rt(const char *json, GError **error)
{
    VnProtoAttach a;

    return vn_proto_attach_from_json(json, &a, error) ? vn_proto_attach_to_json(&a) : NULL;
}

static char *device_name_rt(const char *json, GError **error)
{
    char dev[VN_MAX_DEVICE_NAME + 1];

    return vn_proto_device_name(json, dev, error) ? vn_proto_device_only_to_json(dev) : NULL;
}

static const Codec codecs[] = {
    device_rt, device_name_rt, attach_rt, region_rw_rt, dma_map_rt, dma_unmap_rt, set_irqs_rt,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Codec codec;
    char *json, *once, *twice;
    GError *error = NULL;

    if (size < 1) {
        return 0;
    }
    codec = codecs[data[0] % G_N_ELEMENTS(codecs)];
    json = g_strndup((const char *)data + 1, size - 1);
    once = codec(json, &error);
    if (once != NULL) {
        twice = codec(once, NULL);
        if (twice == NULL || strcmp(once, twice) != 0) {
            abort();             /* our own encoding must decode to itself */
        }
        g_free(twice);
    } else if (error == NULL) {
        abort();                 /* a refusal says why */
    }
    g_clear_error(&error);
    g_free(once);
    g_free(json);
    return 0;
}
