/*
 * The driver the codec fuzz targets share (fuzz_proto.c, fuzz_peers.c): the
 * first byte picks one of @n decoders, the rest is the JSON text.  Whatever
 * decodes must encode and decode again to the same text, and a refusal must
 * say why; anything else aborts, which libFuzzer reports.
 */
#ifndef VN_FUZZ_ROUND_TRIP_H
#define VN_FUZZ_ROUND_TRIP_H

#include <glib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Decode @json with decoder @pick and encode it again (new text), or NULL
 * with @error. */
typedef char *(*VnFuzzCodec)(unsigned pick, const char *json, GError **error);

static inline int vn_fuzz_round_trip(VnFuzzCodec codec, unsigned n, const uint8_t *data,
                                     size_t size)
{
    char *json, *once, *twice;
    GError *error = NULL;
    unsigned pick;

    if (size < 1) {
        return 0;
    }
    pick = data[0] % n;
    json = g_strndup((const char *)data + 1, size - 1);
    once = codec(pick, json, &error);
    if (once != NULL) {
        twice = codec(pick, once, NULL);
        if (twice == NULL || strcmp(once, twice) != 0) {
            abort(); /* our own encoding must decode to itself */
        }
        g_free(twice);
    } else if (error == NULL) {
        abort(); /* a refusal says why */
    }
    g_clear_error(&error);
    g_free(once);
    g_free(json);
    return 0;
}

#endif /* VN_FUZZ_ROUND_TRIP_H */
