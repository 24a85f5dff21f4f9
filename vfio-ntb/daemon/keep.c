/*
 * A borrower worker's kept fds and state (see keep.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "keep.h"

#include "common/util.h"

#include <gio/gio.h>
#include <unistd.h>

struct VnKeep {
    GTree *fds; /* key (uint64_t, boxed) -> fd (int, boxed) */
    GBytes *state;
};

static gint key_cmp(gconstpointer a, gconstpointer b, gpointer unused)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y ? 1 : 0;
}

static void fd_close(gpointer p)
{
    int *fd = p;

    vn_util_close_fd(fd);
    g_free(fd);
}

VnKeep *vn_keep_new(void)
{
    VnKeep *k = g_new0(VnKeep, 1);

    k->fds = g_tree_new_full(key_cmp, NULL, g_free, fd_close);
    return k;
}

void vn_keep_free(VnKeep *k)
{
    if (k == NULL) {
        return;
    }
    g_tree_destroy(k->fds);
    g_clear_pointer(&k->state, g_bytes_unref);
    g_free(k);
}

bool vn_keep_fd(VnKeep *k, uint64_t key, int fd, GError **error)
{
    uint64_t *boxed;
    int *value;

    if (key == 0 ||
        (g_tree_nnodes(k->fds) >= (gint)VN_KEEP_MAX_FDS && g_tree_lookup(k->fds, &key) == NULL)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    key == 0 ? "an fd kept under key 0 (the state's)" : "more than %u fds kept",
                    VN_KEEP_MAX_FDS);
        vn_util_close_fd(&fd);
        return false;
    }
    boxed = g_new(uint64_t, 1);
    *boxed = key;
    value = g_new(int, 1);
    *value = fd;
    g_tree_replace(k->fds, boxed, value);
    /* Both are the tree's now: its destroy functions free them. */
    /* cppcheck-suppress memleak */
    return true;
}

bool vn_keep_state(VnKeep *k, const void *data, size_t len, GError **error)
{
    if (len == 0 || len > VN_KEEP_MAX_STATE) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE,
                    "a state of %zu bytes (1 to %u)", len, VN_KEEP_MAX_STATE);
        return false;
    }
    g_clear_pointer(&k->state, g_bytes_unref);
    k->state = g_bytes_new(data, len);
    return true;
}

typedef struct Range {
    uint64_t first, last;
    GArray *found;
} Range;

static gboolean in_range(gpointer key, gpointer value, gpointer data)
{
    Range *r = data;
    uint64_t k = *(uint64_t *)key;

    if (k > r->last) {
        return TRUE; /* ascending: nothing further is in range */
    }
    if (k >= r->first) {
        g_array_append_val(r->found, k);
    }
    return FALSE;
}

void vn_keep_forget(VnKeep *k, uint64_t first, uint64_t last)
{
    Range r = { first, last, g_array_new(FALSE, FALSE, sizeof(uint64_t)) };

    if (first == 0) {
        g_clear_pointer(&k->state, g_bytes_unref);
    }
    g_tree_foreach(k->fds, in_range, &r);
    for (guint i = 0; i < r.found->len; i++) {
        g_tree_remove(k->fds, &g_array_index(r.found, uint64_t, i));
    }
    g_array_free(r.found, TRUE);
}

int vn_keep_get_fd(VnKeep *k, uint64_t key)
{
    int *fd = g_tree_lookup(k->fds, &key);

    return fd != NULL ? *fd : -1;
}

GBytes *vn_keep_get_state(VnKeep *k)
{
    return k->state != NULL ? g_bytes_ref(k->state) : NULL;
}

typedef struct Keys {
    uint64_t *keys;
    guint n, max;
} Keys;

static gboolean collect(gpointer key, gpointer value, gpointer data)
{
    Keys *ks = data;

    if (ks->n >= ks->max) {
        return TRUE;
    }
    ks->keys[ks->n++] = *(uint64_t *)key;
    return FALSE;
}

guint vn_keep_keys(VnKeep *k, uint64_t *keys, guint max)
{
    Keys ks = { keys, 0, max };

    g_tree_foreach(k->fds, collect, &ks);
    return ks.n;
}
