/*
 * Region maps the server asks of its client (VN_CMD_X_REGION_MAP; see vn_server_region_map()
 * in server.h): sent at once, answered in the server's loop, each ask ended exactly once.
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "server-int.h"

#include "trace-vfio-user.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

typedef struct Ask {
    uint16_t id;
    uint32_t region;
    uint64_t offset;
    bool map; /* else a trap: the area taken back */
    VnServerAnsweredFn done;
    void *opaque;
} Ask;

/* @ext in order of at, apart, page aligned, inside an area of @size. */
static bool extents_ok(const VnWireRegionExtent *ext, unsigned n, uint64_t size)
{
    uint64_t end = 0;

    for (unsigned i = 0; i < n; i++) {
        const VnWireRegionExtent *e = &ext[i];

        if (e->len == 0 || !vn_wire_page_aligned(e->at | e->len | e->fd_offset) || e->at < end ||
            e->at + e->len < e->at || e->at + e->len > size ||
            e->fd_offset + e->len < e->fd_offset) {
            return false;
        }
        end = e->at + e->len;
    }
    return true;
}

int vn_server_region_map(VnServer *s, uint32_t index, uint64_t offset, uint64_t size, int fd,
                         const VnWireRegionExtent *ext, unsigned n, VnServerAnsweredFn done,
                         void *opaque)
{
    VnWireRegionMap body = { .region = index,
                             .flags = fd >= 0 ? VN_WIRE_REGION_MAP_FLAG_MAP : 0,
                             .offset = offset,
                             .size = size,
                             .nr_extents = fd >= 0 ? n : 0 };
    g_autoptr(GByteArray) m = g_byte_array_new();
    Ask *a;
    int ret;

    if (s->client == NULL || !s->versioned) {
        return -ENOTCONN;
    }
    if (!s->caps.region_map) {
        return -EOPNOTSUPP;
    }
    if (n > VN_WIRE_REGION_MAP_MAX_EXTENTS) {
        return -E2BIG;
    }
    if (index >= s->info.num_regions || index > VFIO_PCI_BAR5_REGION_INDEX || size == 0 ||
        !vn_wire_page_aligned(offset) || !vn_wire_page_aligned(size) || offset + size < offset ||
        offset + size > s->info.regions[index].size || (fd >= 0) != (n > 0) ||
        !extents_ok(ext, fd >= 0 ? n : 0, size)) {
        return -EINVAL;
    }
    if (s->asked.length >= VN_SERVER_MAX_ASKED) {
        return -EBUSY;
    }
    vn_wire_begin(m, ++s->dma_id, VN_CMD_X_REGION_MAP, VN_WIRE_FLAG_COMMAND);
    g_byte_array_append(m, (const guint8 *)&body, sizeof(body));
    if (fd >= 0) {
        g_byte_array_append(m, (const guint8 *)ext, (guint)(n * sizeof(*ext)));
    }
    vn_wire_finish(m);
    ret = vn_transport_send(s->client, m->data, m->len, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
    trace_server_region_map(s->path, s->dma_id, index, offset, size, fd >= 0 ? n : 0, ret);
    if (ret < 0) {
        return ret; /* the loop drops the client when it next reads it */
    }
    a = g_new0(Ask, 1);
    *a = (Ask){ .id = s->dma_id,
                .region = index,
                .offset = offset,
                .map = fd >= 0,
                .done = done,
                .opaque = opaque };
    g_queue_push_tail(&s->asked, a);
    s->stats.region_maps++;
    return 0;
}

bool vn_server_asked_is_answer(const VnWireHdr *h)
{
    return (h->flags & VN_WIRE_FLAG_TYPE_MASK) == VN_WIRE_FLAG_REPLY &&
           h->cmd == VN_CMD_X_REGION_MAP;
}

int vn_server_asked_answer(VnServer *s, const VnWireHdr *h)
{
    Ask *a = NULL;
    int err = 0;

    for (GList *l = s->asked.head; l != NULL; l = l->next) {
        if (((Ask *)l->data)->id == h->id) {
            a = l->data;
            g_queue_delete_link(&s->asked, l);
            break;
        }
    }
    if (a == NULL) {
        g_info("socket %s: an answer to region map id %u, which we did not ask", s->path, h->id);
        return -EPROTO;
    }
    if (h->flags & VN_WIRE_FLAG_ERROR) {
        err = h->error > 0 && h->error < 4096 ? -(int)h->error : -EIO;
        s->stats.region_map_failures++;
        g_info("socket %s: the client did not %s region %u at 0x%" G_GINT64_MODIFIER "x: %s",
               s->path, a->map ? "map" : "take back", a->region, a->offset, g_strerror(-err));
    }
    if (err < 0 && !a->map) {
        /* A client that keeps an area it was asked to give back cannot be trusted to have
         * let go of that memory: it is dropped (a QEMU traps every area when its server
         * goes), and the ask ends as the client's going ends it. */
        err = -ENOTCONN;
    }
    if (a->done != NULL) {
        a->done(a->opaque, err);
    }
    g_free(a);
    return err == -ENOTCONN ? -EPROTO : 0;
}

void vn_server_asked_fail(VnServer *s)
{
    Ask *a;

    while ((a = g_queue_pop_head(&s->asked)) != NULL) {
        if (a->done != NULL) {
            a->done(a->opaque, -ENOTCONN);
        }
        g_free(a);
    }
}
