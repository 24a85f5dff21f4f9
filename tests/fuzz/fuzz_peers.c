/*
 * libFuzzer target for the daemon-to-daemon codec (daemon/peers.c): what one
 * host's vfio-ntbd gets from another.  The first byte picks the decoder (an
 * announcement from "hosta", or one of the requests), the rest is the JSON
 * text.  Whatever decodes must encode and decode again to the same text,
 * and a refusal must say why.
 */
#include "daemon/peers.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The decoders, in the order the first byte picks them. */
static const VnPeersType types[] = {
    VN_PEERS_ANNOUNCE, VN_PEERS_BORROW, VN_PEERS_RETURN, VN_PEERS_REVOKE, VN_PEERS_AUTHORIZE,
};

static char *round_trip(VnPeersType type, const char *json, GError **error)
{
    if (type == VN_PEERS_ANNOUNCE) {
        g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);

        return vn_peers_announce_from_json(json, "hosta", a, error)
                   ? vn_peers_announce_to_json(a) : NULL;
    } else {
        VnPeersRequest r;

        return vn_peers_request_from_json(type, json, &r, error)
                   ? vn_peers_request_to_json(type, &r) : NULL;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    VnPeersType type;
    char *json, *once, *twice;
    GError *error = NULL;

    if (size < 1) {
        return 0;
    }
    type = types[data[0] % G_N_ELEMENTS(types)];
    json = g_strndup((const char *)data + 1, size - 1);
    once = round_trip(type, json, &error);
    if (once != NULL) {
        twice = round_trip(type, once, NULL);
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
