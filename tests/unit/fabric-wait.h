/*
 * The fabric's calls answered later, waited for the way a test may: the asker's context
 * (the fabric's) is iterated until the answer comes.  Only a test waits like this; no
 * loop of ours does.  Call from the thread that runs the fabric's context.
 */
#ifndef VN_CHECK_FABRIC_WAIT_H
#define VN_CHECK_FABRIC_WAIT_H

#include "fabric/fabric.h"

#include <errno.h>
#include <gio/gio.h>

/* Longer than any request timeout a test sets: the fabric answers first. */
#define FW_WAIT_MS 30000

typedef struct FwAnswer {
    bool done;
    int err;
    VnFabricMsg *reply;
    VnFabricWindow *w;
    int fd;
    uint64_t id; /* an export's; a join's offset */
    GError *error;
} FwAnswer;

static inline void fw_until(VnFabric *fab, const FwAnswer *a)
{
    GMainContext *ctx = vn_fabric_backend_context(fab);
    gint64 end = g_get_monotonic_time() + (gint64)FW_WAIT_MS * 1000;

    while (!a->done && g_get_monotonic_time() < end) {
        g_main_context_iteration(ctx, TRUE);
    }
}

static inline void fw_replied(void *opaque, VnFabricMsg *reply, int err)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->err = err;
    a->reply = reply != NULL ? vn_fabric_msg_dup(reply) : NULL;
}

/* vn_fabric_request(), and its answer: 0 or -errno, the reply (an error reply too) in
 * *@reply when not NULL. */
static inline int fw_request(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                             const void *data, size_t len, VnFabricMsg **reply)
{
    FwAnswer a = { 0 };
    int ret = vn_fabric_request(fab, peer, type, json, data, len, fw_replied, &a);

    if (reply != NULL) {
        *reply = NULL;
    }
    if (ret < 0) {
        return ret;
    }
    fw_until(fab, &a);
    if (!a.done) {
        return -ETIMEDOUT; /* the fabric has it still: never the case within FW_WAIT_MS */
    }
    if (reply != NULL) {
        *reply = a.reply;
    } else {
        vn_fabric_msg_free(a.reply);
    }
    return a.err;
}

static inline void fw_mapped(void *opaque, VnFabricWindow *w, const GError *error)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->w = w;
    a->error = error != NULL ? g_error_copy(error) : NULL;
}

/* vn_fabric_window_map_async(), and its answer: the window, or NULL with @error. */
static inline VnFabricWindow *fw_window_map(VnFabric *fab, const char *peer, uint64_t id,
                                            GError **error)
{
    FwAnswer a = { 0 };

    vn_fabric_window_map_async(fab, peer, id, fw_mapped, &a);
    fw_until(fab, &a);
    if (a.error != NULL) {
        g_propagate_error(error, a.error);
    }
    return a.w;
}

static inline void fw_opened(void *opaque, int fd, const GError *error)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->fd = fd;
    a->error = error != NULL ? g_error_copy(error) : NULL;
}

/* vn_fabric_route_open_async(), and its answer: the fd, or -errno with @error. */
static inline int fw_route_open(VnFabric *fab, const char *peer, uint64_t id, GError **error)
{
    FwAnswer a = { .fd = -ETIMEDOUT };

    vn_fabric_route_open_async(fab, peer, id, fw_opened, &a);
    fw_until(fab, &a);
    if (a.error != NULL) {
        g_propagate_error(error, a.error);
    }
    return a.fd;
}

static inline void fw_exported(void *opaque, uint64_t id, const GError *error)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->id = id;
    a->error = error != NULL ? g_error_copy(error) : NULL;
}

/* vn_fabric_segment_export_async() (a route's, @size 0: vn_fabric_route_export_async()),
 * and its answer: the id, or 0 with @error. */
static inline uint64_t fw_export(VnFabric *fab, int fd, uint64_t offset, uint64_t size,
                                 const char *peer, GError **error)
{
    FwAnswer a = { 0 };

    if (size > 0) {
        vn_fabric_segment_export_async(fab, fd, offset, size, peer, fw_exported, &a);
    } else {
        vn_fabric_route_export_async(fab, fd, peer, fw_exported, &a);
    }
    fw_until(fab, &a);
    if (a.error != NULL) {
        g_propagate_error(error, a.error);
    }
    return a.id;
}

static inline void fw_count(void *opaque, int ret)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->err = ret;
}

/* vn_fabric_segment_withhold_async(), and its answer. */
static inline int fw_withhold(VnFabric *fab, uint64_t id, bool withhold)
{
    FwAnswer a = { .err = -ETIMEDOUT };

    vn_fabric_segment_withhold_async(fab, id, withhold, fw_count, &a);
    fw_until(fab, &a);
    return a.err;
}

static inline void fw_bits(void *opaque, int first, const GError *error)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->err = first;
    a->error = error != NULL ? g_error_copy(error) : NULL;
}

/* vn_fabric_doorbells_alloc_async(), and its answer: the first bit, or -errno with @error. */
static inline int fw_doorbells_alloc(VnFabric *fab, uint32_t count, GError **error)
{
    FwAnswer a = { .err = -ETIMEDOUT };

    vn_fabric_doorbells_alloc_async(fab, count, fw_bits, &a);
    fw_until(fab, &a);
    if (a.error != NULL) {
        g_propagate_error(error, a.error);
    }
    return a.err;
}

static inline void fw_joined(void *opaque, int fd, uint64_t offset, const GError *error)
{
    FwAnswer *a = opaque;

    a->done = true;
    a->fd = fd;
    a->id = offset;
    a->error = error != NULL ? g_error_copy(error) : NULL;
}

/* vn_fabric_windows_join_async(), and its answer: the fd (its offset in *@offset), or
 * -errno with @error. */
static inline int fw_windows_join(VnFabric *fab, VnFabricWindow *const *w, uint32_t n,
                                  uint64_t *offset, GError **error)
{
    FwAnswer a = { .fd = -ETIMEDOUT };

    vn_fabric_windows_join_async(fab, w, n, fw_joined, &a);
    fw_until(fab, &a);
    *offset = a.id;
    if (a.error != NULL) {
        g_propagate_error(error, a.error);
    }
    return a.fd;
}

#endif /* VN_CHECK_FABRIC_WAIT_H */
