/*
 * Link keys of the `ntb` backend ([fabric] key-file): a host proves at each session that it
 * holds the key of the link it is cabled to, so a host that names itself after another (one
 * that is down, say) is refused even on the port where that host was.
 *
 * The key file holds one line per peer, "NODE HEX" (16 to 64 bytes of key as hex; blank
 * lines and lines starting with '#' ignored); both ends of a link hold the same key, each
 * under the other's name.  It must be a regular file that only its owner (root, or the
 * daemon's user) can read or write.
 *
 * The exchange (ntb.h): after its HELLO each side sends a CHALLENGE with a nonce of its own
 * (16 random bytes); each answers the peer's CHALLENGE with a PROOF, an HMAC-SHA256 under
 * the link's key of both names, both epochs and both nonces; the link is up once the peer's
 * PROOF is right.  A PROOF made for another session (other nonces) proves nothing, so one
 * recorded on the link cannot be played back.
 */
#ifndef VN_NTB_AUTH_H
#define VN_NTB_AUTH_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#define VN_NTB_AUTH_NONCE_LEN 16u
#define VN_NTB_AUTH_PROOF_LEN 32u /* SHA-256 */
#define VN_NTB_AUTH_MIN_KEY 16u
#define VN_NTB_AUTH_MAX_KEY 64u
/* Lines a key file may have (peers of one host, with room), and its largest size. */
#define VN_NTB_AUTH_MAX_KEYS 256u
#define VN_NTB_AUTH_MAX_FILE (64u * 1024u)

typedef struct VnNtbKeys VnNtbKeys;

/* Read and check the key file at @path (see above).  NULL with @error saying which line
 * and why. */
VnNtbKeys *vn_ntb_keys_load(const char *path, GError **error);
void vn_ntb_keys_free(VnNtbKeys *keys);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnNtbKeys, vn_ntb_keys_free)

/* The key of the link to @node (@len its bytes), or NULL: the file has none for it. */
const uint8_t *vn_ntb_keys_get(const VnNtbKeys *keys, const char *node, size_t *len);

/* The PROOF @from sends @to in the session of epochs @from_epoch and @to_epoch, where @from
 * sent @from_nonce and @to sent @to_nonce. */
void vn_ntb_auth_proof(const uint8_t *key, size_t key_len, const char *from, const char *to,
                       uint16_t from_epoch, uint16_t to_epoch,
                       const uint8_t from_nonce[VN_NTB_AUTH_NONCE_LEN],
                       const uint8_t to_nonce[VN_NTB_AUTH_NONCE_LEN],
                       uint8_t out[VN_NTB_AUTH_PROOF_LEN]);

#endif /* VN_NTB_AUTH_H */
