/*
 * libFuzzer target for the daemon-to-daemon codec (daemon/peers.c): what one
 * host's vfio-ntbd gets from another.  The first byte picks the decoder (an
 * announcement from "hosta", or one of the requests), the rest is the JSON
 * text.  Whatever decodes must encode and decode again to the same text,
 * and a refusal must say why.
 */
#include "daemon/peers.h"
#include "fuzz-round-trip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The decoders, in the order the first byte picks them. */
static const VnPeersType types[] = {
    VN_PEERS_ANNOUNCE,
    VN_PEERS_BORROW,
    VN_PEERS_RETURN,
    VN_PEERS_REVOKE,
};

static char *round_trip(VnPeersType type, const char *json, GError **error)
{
    if (type == VN_PEERS_ANNOUNCE) {
        g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);

        return vn_peers_announce_from_json(json, "hosta", a, error) ? vn_peers_announce_to_json(a)
                                                                    : NULL;
    } else {
        VnPeersRequest r;

        return vn_peers_request_from_json(type, json, &r, error)
                   ? vn_peers_request_to_json(type, &r)
                   : NULL;
    }
}

static char *codec(unsigned pick, const char *json, GError **error)
{
    return round_trip(types[pick], json, error);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return vn_fuzz_round_trip(codec, G_N_ELEMENTS(types), data, size);
}
