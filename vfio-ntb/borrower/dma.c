/*
 * The guest memory the lent device may reach (borrower-int.h): QEMU's
 * DMA_MAP and DMA_UNMAP, each answered when the lender has mapped or
 * unmapped it (vn_borrower_ask_later), and the guest-memory segments behind
 * them, exported to the lender once per file.
 *
 * Not waited for: the maps of one memory transaction (QEMU sends them without
 * waiting) travel to the lender together; it takes them, and anything we
 * send after them, in order, so an unmap QEMU sends before a map's answer
 * still reaches the lender after that map.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower-int.h"

#include <errno.h>
#include <gio/gio.h>
#include <sys/stat.h>

typedef VnBorrowerSegment Segment;
typedef VnBorrowerMapping Mapping;

static void segment_put(VnBorrower *b, Segment *seg)
{
    if (--seg->refs > 0) {
        return;
    }
    vn_fabric_segment_unexport(b->fab, seg->id);
    b->segments = g_list_remove(b->segments, seg);
    g_free(seg);
}

static Segment *segment_for_fd(VnBorrower *b, int fd, int *err)
{
    g_autoptr(GError) error = NULL;
    struct stat st;
    Segment *seg;

    if (fstat(fd, &st) < 0) {
        *err = -errno;
        return NULL;
    }
    for (GList *l = b->segments; l != NULL; l = l->next) {
        seg = l->data;
        if (seg->dev == st.st_dev && seg->ino == st.st_ino) {
            return seg;
        }
    }
    seg = g_new0(Segment, 1);
    seg->dev = st.st_dev;
    seg->ino = st.st_ino;
    seg->id = vn_fabric_segment_export(b->fab, fd, (uint64_t)st.st_size, b->lender, &error);
    if (seg->id == 0) {
        g_info("borrower %s: cannot export guest memory: %s", b->device, error->message);
        g_free(seg);
        *err = -ENOSPC;
        return NULL;
    }
    b->segments = g_list_prepend(b->segments, seg);
    return seg;
}

static void map_refused(VnBorrower *b, const Mapping *m, int err, const char *why)
{
    /* The VM's device cannot reach that memory: the guest's I/O to it fails, so say
     * which range, at the default level (a guest maps a bounded number of ranges). */
    b->stats.dma_maps_refused++;
    g_message(
        "borrower %s: the lender refused DMA_MAP of [0x%" G_GINT64_MODIFIER
        "x, +0x%" G_GINT64_MODIFIER "x) (segment offset 0x%" G_GINT64_MODIFIER "x, prot %u): %s",
        b->device, m->iova, m->size, m->offset, m->prot, why != NULL ? why : g_strerror(-err));
}

static void mapping_drop(VnBorrower *b, Mapping *m)
{
    vn_borrower_asks_forget(b, m); /* a map on its way: its answer finds it gone */
    b->mappings = g_list_remove(b->mappings, m);
    segment_put(b, m->seg);
    g_free(m);
}

/* The lender's answer to a DMA_MAP of @opaque (a Mapping, NULL when QEMU unmapped it
 * meanwhile). */
static int on_mapped(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    Mapping *m = opaque;
    g_autofree char *why = NULL;

    if (err == 0) {
        b->stats.dma_maps++;
        return 0;
    }
    why = reply != NULL ? vn_fabric_error_message(reply) : NULL;
    if (m != NULL) {
        map_refused(b, m, err, why);
        mapping_drop(b, m);
        vn_borrower_keep_state(b, false);
    }
    return err;
}

int vn_borrower_dma_mapped(VnBorrower *b, const VnDmaMapping *dm)
{
    VnProtoDmaMap pm = {
        .iova = dm->iova, .size = dm->size, .offset = dm->offset, .prot = dm->prot
    };
    g_autofree char *json = NULL;
    Segment *seg;
    Mapping *m;
    int ret = 0;

    if (dm->fd < 0) {
        /* QEMU maps the device's own BARs without an fd (peer-to-peer
         * offers): nothing the device could reach, nothing to forward. */
        return 0;
    }
    seg = segment_for_fd(b, dm->fd, &ret);
    if (seg == NULL) {
        return ret;
    }
    seg->refs++;
    pm.segment = seg->id;
    json = vn_proto_dma_map_to_json(b->device, &pm);
    /* Listed now: an unmap QEMU sends before the answer must reach the lender too. */
    m = g_new0(Mapping, 1);
    *m = (Mapping){
        .iova = dm->iova, .size = dm->size, .offset = dm->offset, .prot = dm->prot, .seg = seg
    };
    b->mappings = g_list_prepend(b->mappings, m);
    vn_borrower_keep_state(b, false);
    return vn_borrower_ask_later(b, VN_PROTO_DMA_MAP, json, NULL, 0, 0, on_mapped, m, NULL);
}

typedef struct Unmap {
    uint64_t iova, size;
    bool all;
} Unmap;

/* The lender's answer to a DMA_UNMAP: QEMU's unmap succeeds either way (the lender gone
 * or refusing, there is nothing more to undo), but a miss is said. */
static int on_unmapped(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    const Unmap *u = opaque;

    if (err == 0) {
        b->stats.dma_unmaps++;
    } else {
        b->stats.unmaps_missed++;
        g_message("borrower %s: DMA_UNMAP of [0x%" G_GINT64_MODIFIER "x, +0x%" G_GINT64_MODIFIER
                  "x)%s did not reach the lender: %s",
                  b->device, u->iova, u->size, u->all ? " (all)" : "", g_strerror(-err));
    }
    return 0;
}

void vn_borrower_dma_unmapping(VnBorrower *b, uint64_t iova, uint64_t size, bool all)
{
    VnProtoDmaUnmap pu = { .iova = iova, .size = size, .all = all };
    g_autofree char *json = vn_proto_dma_unmap_to_json(b->device, &pu);
    bool forwarded = false;
    GList *l = b->mappings;
    Unmap *u;

    while (l != NULL) {
        GList *next = l->next;
        Mapping *m = l->data;

        if (all || (m->iova >= iova && m->iova + m->size <= iova + size)) {
            forwarded = true;
            mapping_drop(b, m);
        }
        l = next;
    }
    if (!forwarded) {
        return;
    }
    vn_borrower_keep_state(b, false);
    /* QEMU's unmap completes only after the lender's device has lost access. */
    u = g_new(Unmap, 1);
    *u = (Unmap){ .iova = iova, .size = size, .all = all };
    vn_borrower_ask_later(b, VN_PROTO_DMA_UNMAP, json, NULL, 0, 0, on_unmapped, u, g_free);
}

void vn_borrower_dma_forget(VnBorrower *b)
{
    g_list_free_full(g_steal_pointer(&b->mappings), g_free);
    for (GList *l = b->segments; l != NULL; l = l->next) {
        vn_fabric_segment_unexport(b->fab, ((Segment *)l->data)->id);
    }
    g_list_free_full(g_steal_pointer(&b->segments), g_free);
}
