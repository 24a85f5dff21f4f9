/*
 * Link keys of the `ntb` backend: the key file and the PROOF (ntb-auth.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntb-auth.h"

#include "common/name.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct NtbKey {
    char node[VN_MAX_NODE_NAME + 1];
    size_t len;
    uint8_t key[VN_NTB_AUTH_MAX_KEY];
} NtbKey;

struct VnNtbKeys {
    GArray *keys; /* NtbKey */
};

void vn_ntb_keys_free(VnNtbKeys *keys)
{
    if (keys == NULL) {
        return;
    }
    /* Keys do not outlive their use in freed memory. */
    if (keys->keys->len > 0) {
        memset(keys->keys->data, 0, keys->keys->len * sizeof(NtbKey));
    }
    g_array_unref(keys->keys);
    g_free(keys);
}

const uint8_t *vn_ntb_keys_get(const VnNtbKeys *keys, const char *node, size_t *len)
{
    for (guint i = 0; keys != NULL && i < keys->keys->len; i++) {
        const NtbKey *k = &g_array_index(keys->keys, NtbKey, i);

        if (strcmp(k->node, node) == 0) {
            *len = k->len;
            return k->key;
        }
    }
    return NULL;
}

static bool fail(GError **error, const char *path, unsigned line, const char *why)
{
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "key-file %s: line %u: %s", path, line,
                why);
    return false;
}

/* One line "NODE HEX" into @k. */
static bool parse_line(const char *path, unsigned n, char *line, NtbKey *k, GError **error)
{
    g_auto(GStrv) words = g_strsplit_set(g_strstrip(line), " \t", -1);
    char **w = words;
    const char *node = NULL, *hex = NULL;
    size_t digits;

    for (; *w != NULL; w++) {
        if (**w == '\0') {
            continue;
        }
        if (node == NULL) {
            node = *w;
        } else if (hex == NULL) {
            hex = *w;
        } else {
            return fail(error, path, n, "expected \"NODE KEY\" (more words than that)");
        }
    }
    if (hex == NULL) {
        return fail(error, path, n, "expected \"NODE KEY\" (the key in hex)");
    }
    if (strlen(node) > VN_MAX_NODE_NAME || !vn_name_valid(VN_NAME_NODE, node)) {
        return fail(error, path, n, "the first word is not a node name");
    }
    digits = strlen(hex);
    if (digits % 2 != 0 || digits < 2 * VN_NTB_AUTH_MIN_KEY || digits > 2 * VN_NTB_AUTH_MAX_KEY) {
        return fail(error, path, n, "a key is 16 to 64 bytes written as 32 to 128 hex digits");
    }
    for (size_t i = 0; i < digits; i += 2) {
        int hi = g_ascii_xdigit_value(hex[i]), lo = g_ascii_xdigit_value(hex[i + 1]);

        if (hi < 0 || lo < 0) {
            return fail(error, path, n, "the key is not hex");
        }
        k->key[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    k->len = digits / 2;
    g_strlcpy(k->node, node, sizeof(k->node));
    return true;
}

/* The file's bytes, if only its owner (root or us) can read or write it. */
static char *read_private(const char *path, GError **error)
{
    g_autofree char *text = g_malloc(VN_NTB_AUTH_MAX_FILE + 1);
    struct stat st;
    size_t got = 0;
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "key-file %s: %s", path,
                    g_strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > VN_NTB_AUTH_MAX_FILE) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "key-file %s: not a regular file of at most %u bytes", path,
                    VN_NTB_AUTH_MAX_FILE);
        close(fd);
        return NULL;
    }
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0 || (st.st_uid != 0 && st.st_uid != geteuid())) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED,
                    "key-file %s: others than its owner may read or change it, or its owner is "
                    "neither root nor us (mode %04o, uid %u): chmod 600 it",
                    path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        close(fd);
        return NULL;
    }
    while (got < VN_NTB_AUTH_MAX_FILE &&
           (n = read(fd, text + got, VN_NTB_AUTH_MAX_FILE - got)) != 0) {
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "key-file %s: %s", path,
                        g_strerror(errno));
            close(fd);
            return NULL;
        }
        got += (size_t)n;
    }
    close(fd);
    text[got] = '\0';
    if (strlen(text) != got) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "key-file %s: not text", path);
        return NULL;
    }
    return g_steal_pointer(&text);
}

VnNtbKeys *vn_ntb_keys_load(const char *path, GError **error)
{
    g_autoptr(VnNtbKeys) keys = g_new0(VnNtbKeys, 1);
    g_autofree char *text = read_private(path, error);
    g_auto(GStrv) lines = NULL;
    size_t dummy;

    keys->keys = g_array_new(FALSE, TRUE, sizeof(NtbKey));
    if (text == NULL) {
        return NULL;
    }
    lines = g_strsplit(text, "\n", -1);
    memset(text, 0, strlen(text));
    for (unsigned i = 0; lines[i] != NULL; i++) {
        NtbKey k = { 0 };
        char *line = g_strstrip(lines[i]);

        if (line[0] == '\0' || line[0] == '#') {
            continue;
        }
        if (keys->keys->len == VN_NTB_AUTH_MAX_KEYS) {
            memset(lines[i], 0, strlen(lines[i]));
            fail(error, path, i + 1, "more keys than a host has links");
            return NULL;
        }
        if (!parse_line(path, i + 1, line, &k, error)) {
            return NULL;
        }
        memset(lines[i], 0, strlen(lines[i]));
        if (vn_ntb_keys_get(keys, k.node, &dummy) != NULL) {
            fail(error, path, i + 1, "a second key for the same node");
            return NULL;
        }
        g_array_append_val(keys->keys, k);
        memset(&k, 0, sizeof(k));
    }
    return g_steal_pointer(&keys);
}

void vn_ntb_auth_proof(const uint8_t *key, size_t key_len, const char *from, const char *to,
                       uint16_t from_epoch, uint16_t to_epoch,
                       const uint8_t from_nonce[VN_NTB_AUTH_NONCE_LEN],
                       const uint8_t to_nonce[VN_NTB_AUTH_NONCE_LEN],
                       uint8_t out[VN_NTB_AUTH_PROOF_LEN])
{
    static const char label[] = "vfio-ntb link proof 1";
    GHmac *mac = g_hmac_new(G_CHECKSUM_SHA256, key, key_len);
    uint8_t epochs[4] = { from_epoch >> 8, from_epoch & 0xff, to_epoch >> 8, to_epoch & 0xff };
    gsize len = VN_NTB_AUTH_PROOF_LEN;

    /* Names with their NUL, so that no two pairs of names read the same. */
    g_hmac_update(mac, (const guchar *)label, sizeof(label));
    g_hmac_update(mac, (const guchar *)from, (gssize)strlen(from) + 1);
    g_hmac_update(mac, (const guchar *)to, (gssize)strlen(to) + 1);
    g_hmac_update(mac, epochs, sizeof(epochs));
    g_hmac_update(mac, from_nonce, VN_NTB_AUTH_NONCE_LEN);
    g_hmac_update(mac, to_nonce, VN_NTB_AUTH_NONCE_LEN);
    g_hmac_get_digest(mac, out, &len);
    g_hmac_unref(mac);
}
