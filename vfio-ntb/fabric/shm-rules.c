/*
 * The shm backend's pure parts (see shm.h): its parameters, the fabric
 * directory's rule, and the records a connection starts with.  No sockets:
 * what a peer or a config file can get wrong is decided here, and fuzzed.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "shm.h"

#include "common/name.h"

#include <errno.h>
#include <gio/gio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint32_t vn_shm_record_max(VnShmRecordKind kind)
{
    switch (kind) {
    case VN_SHM_RECORD_FIRST:
        return sizeof(VnShmFetch);
    case VN_SHM_RECORD_FETCH_REPLY:
        return sizeof(VnShmFetchReply);
    default:
        return VN_FABRIC_MAX_FRAME;
    }
}

char *vn_shm_hello_check(const uint8_t *buf, size_t len, unsigned nfds, bool overflow,
                         const char *self, char peer[VN_MAX_NODE_NAME + 1], VnShmFetch *fetch)
{
    VnShmHello h;

    memset(fetch, 0, sizeof(*fetch));
    if ((len != sizeof(h) && len != sizeof(*fetch)) || nfds > 0 || overflow) {
        return g_strdup_printf("a HELLO of %zu bytes with %u fds", len, nfds);
    }
    memcpy(&h, buf, sizeof(h));
    if ((h.magic != (len == sizeof(h) ? VN_SHM_HELLO_MAGIC : VN_SHM_FETCH_MAGIC)) ||
        h.version != VN_SHM_HELLO_VERSION) {
        return g_strdup_printf("a HELLO of %zu bytes, magic 0x%x version %u", len, h.magic,
                               h.version);
    }
    if (memchr(h.node, '\0', sizeof(h.node)) == NULL || !vn_name_valid(VN_NAME_NODE, h.node) ||
        strcmp(h.node, self) == 0) {
        return g_strdup("a HELLO naming an invalid node");
    }
    if (len == sizeof(*fetch)) {
        VnShmFetch f;

        memcpy(&f, buf, sizeof(f));
        if ((f.kind != VN_SHM_FETCH_SEGMENT && f.kind != VN_SHM_FETCH_ROUTE) || f.reserved != 0 ||
            f.id == 0) {
            return g_strdup_printf("a FETCH of kind %u id %" G_GUINT64_FORMAT, f.kind, f.id);
        }
        *fetch = f;
    }
    g_strlcpy(peer, h.node, VN_MAX_NODE_NAME + 1);
    return NULL;
}

/* @bad (may be NULL) names the parameter at fault. */
static bool param_u64(GHashTable *params, const char *key, uint64_t min, bool pow2, uint64_t max,
                      uint64_t *out, const char **bad, GError **error)
{
    const char *s = g_hash_table_lookup(params, key);
    guint64 v;

    if (s == NULL) {
        return true;
    }
    if (bad != NULL) {
        *bad = key;
    }
    if (!g_ascii_string_to_unsigned(s, 10, min, max, &v, error)) {
        g_prefix_error(error, "shm fabric: %s: ", key);
        return false;
    }
    if (pow2 && (v & (v - 1)) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "shm fabric: %s: %s is not a power of two", key, s);
        return false;
    }
    *out = v;
    return true;
}

bool vn_shm_params_parse(GHashTable *params, VnFabricLimits *l, uint64_t *delay_ns,
                         const char **bad, GError **error)
{
    static const char *const known[] = { "dir",          "max-windows",      "max-window-size",
                                         "window-align", "xlat-granularity", "crossing-delay-ns",
                                         "doorbells",    "max-segments",     NULL };
    GHashTableIter it;
    gpointer key;
    uint64_t windows, doorbells, segments;

    g_hash_table_iter_init(&it, params);
    while (g_hash_table_iter_next(&it, &key, NULL)) {
        if (!g_strv_contains((const char *const *)known, key) || !g_utf8_validate(key, -1, NULL)) {
            if (bad != NULL) {
                *bad = key;
            }
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "shm fabric: unknown parameter \"%s\" (known: dir, max-windows, "
                        "max-window-size, window-align, xlat-granularity, crossing-delay-ns, "
                        "doorbells, max-segments)",
                        (char *)key);
            return false;
        }
    }
    vn_fabric_limits_default(l);
    windows = l->max_windows;
    doorbells = l->doorbells;
    segments = l->max_segments;
    if (!param_u64(params, "max-windows", 1, false, VN_SHM_MAX_WINDOWS, &windows, bad, error) ||
        !param_u64(params, "max-window-size", VN_SHM_MIN_WINDOW_SIZE, true, VN_SHM_MAX_WINDOW_SIZE,
                   &l->max_window_size, bad, error) ||
        !param_u64(params, "window-align", VN_SHM_MIN_WINDOW_SIZE, true, VN_SHM_MAX_WINDOW_SIZE,
                   &l->window_align, bad, error) ||
        !param_u64(params, "xlat-granularity", VN_SHM_MIN_WINDOW_SIZE, true, VN_SHM_MAX_WINDOW_SIZE,
                   &l->xlat_granularity, bad, error) ||
        !param_u64(params, "crossing-delay-ns", 0, false, VN_SHM_MAX_CROSSING_DELAY_NS, delay_ns,
                   bad, error) ||
        !param_u64(params, "doorbells", 1, false, VN_FABRIC_MAX_DOORBELLS, &doorbells, bad,
                   error) ||
        !param_u64(params, "max-segments", 1, false, VN_FABRIC_MAX_SEGMENTS, &segments, bad,
                   error)) {
        return false;
    }
    l->max_windows = (uint32_t)windows;
    l->doorbells = (uint32_t)doorbells;
    l->max_segments = (uint32_t)segments;
    if (l->xlat_granularity > l->max_window_size || l->window_align > l->max_window_size) {
        if (bad != NULL) {
            *bad = l->window_align > l->max_window_size ? "window-align" : "xlat-granularity";
        }
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "shm fabric: window-align and xlat-granularity must not exceed "
                    "max-window-size");
        return false;
    }
    return true;
}

bool vn_shm_params_check(GHashTable *params, const char **bad, GError **error)
{
    const char *dir = g_hash_table_lookup(params, "dir");
    VnFabricLimits limits;
    uint64_t delay_ns = 0;

    if (!vn_shm_params_parse(params, &limits, &delay_ns, bad, error)) {
        return false;
    }
    if (dir == NULL || dir[0] != '/') {
        if (bad != NULL) {
            *bad = "dir";
        }
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "shm fabric: the \"dir\" parameter, an absolute path, is required");
        return false;
    }
    return true;
}

bool vn_shm_dir_ok(const char *dir, GError **error)
{
    struct stat st;
    int e;

    if (g_mkdir_with_parents(dir, 0700) < 0 || lstat(dir, &st) < 0) {
        e = errno;
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "shm fabric: %s: %s", dir,
                    g_strerror(e));
        return false;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_PERMISSION_DENIED,
                    "shm fabric: %s must be a directory of ours that group and others "
                    "cannot write",
                    dir);
        return false;
    }
    return true;
}
