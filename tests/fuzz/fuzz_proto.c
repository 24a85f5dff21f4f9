/*
 * libFuzzer target for the lending protocol's decoders (lending/proto.c):
 * the JSON a borrower or lender gets from its peer.  The first byte picks
 * the decoder, the rest is the JSON text.  Whatever decodes must encode and
 * decode again to the same thing (re-encoding is compared as text).
 */
#include "lending/proto.h"
#include "fuzz-round-trip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef char *(*Codec)(const char *json, GError **error);

#define CODEC(name, type)                                    \
    static char *name##_rt(const char *json, GError **error) \
    {                                                        \
        type v;                                              \
        char dev[VN_MAX_DEVICE_NAME + 1] = "dev";            \
                                                             \
        memset(&v, 0, sizeof(v));                            \
        if (!vn_proto_##name##_from_json(json, &v, error)) { \
            return NULL;                                     \
        }                                                    \
        (void)vn_proto_device_name(json, dev, NULL);         \
        return vn_proto_##name##_to_json(dev, &v);           \
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

static char *codec(unsigned pick, const char *json, GError **error)
{
    return codecs[pick](json, error);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return vn_fuzz_round_trip(codec, G_N_ELEMENTS(codecs), data, size);
}
