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

/* The segment of @fd's file, exported already, or NULL (*file: what identifies it). */
static Segment *segment_of(VnBorrower *b, int fd, struct stat *file, int *err)
{
    if (fstat(fd, file) < 0) {
        *err = -errno;
        return NULL;
    }
    for (GList *l = b->segments; l != NULL; l = l->next) {
        Segment *seg = l->data;

        if (seg->dev == file->st_dev && seg->ino == file->st_ino) {
            return seg;
        }
    }
    return NULL;
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

/* Ranges are compared by their last bytes: QEMU's may end at 2^64 (mappings do not). */
static bool overlaps(const Mapping *m, uint64_t iova, uint64_t size)
{
    return m->iova <= iova + (size - 1) && iova <= m->iova + (m->size - 1);
}

static bool inside(const Mapping *m, uint64_t iova, uint64_t size)
{
    return m->iova >= iova && m->iova + (m->size - 1) <= iova + (size - 1);
}

/* QEMU mapped @m again: it stops lingering. */
static void linger_end(VnBorrower *b, Mapping *m)
{
    if (m->lingering) {
        if (m->link.data != NULL) { /* restored lingering: queued once served */
            g_queue_unlink(&b->lingering, &m->link);
        }
        m->lingering = false;
        vn_borrower_state_lingers(b, m, false);
    }
}

static void mapping_drop(VnBorrower *b, Mapping *m)
{
    linger_end(b, m);
    vn_borrower_state_unlisted(b, m);
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
        if (m != NULL) {
            m->confirmed = true;
        }
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

typedef struct Unmap {
    uint64_t iova, size;
    bool all;
    bool posted; /* nobody waits: counted in b->unmaps_posted until answered */
} Unmap;

/* The lender's answer to a DMA_UNMAP: QEMU's unmap succeeds either way (the lender gone
 * or refusing, there is nothing more to undo), but a miss is said. */
static int on_unmapped(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    const Unmap *u = opaque;

    if (u->posted) {
        b->unmaps_posted--;
    }
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

/* The lender unmaps [@iova, +@size) (@all: everything), after everything asked before;
 * QEMU's reply to the command being handled waits for it when @qemu_waits. */
static void unmap_send(VnBorrower *b, uint64_t iova, uint64_t size, bool all, bool qemu_waits)
{
    VnProtoDmaUnmap pu = { .iova = iova, .size = size, .all = all };
    g_autofree char *json = vn_proto_dma_unmap_to_json(b->device, &pu);
    Unmap *u = g_new(Unmap, 1);

    *u = (Unmap){ .iova = iova, .size = size, .all = all, .posted = !qemu_waits };
    if (qemu_waits) {
        vn_borrower_ask_later(b, VN_PROTO_DMA_UNMAP, json, NULL, 0, 0, on_unmapped, u, g_free);
    } else {
        b->unmaps_posted++; /* on_unmapped is told even when it cannot be sent */
        vn_borrower_ask_posted(b, VN_PROTO_DMA_UNMAP, json, on_unmapped, u, g_free);
    }
}

static gint by_iova(gconstpointer a, gconstpointer b)
{
    const Mapping *x = *(Mapping *const *)a, *y = *(Mapping *const *)b;

    return x->iova < y->iova ? -1 : x->iova > y->iova;
}

/* The mappings in @ms (any order) go at the lender, nobody waiting, one unmap per run of
 * them that follow each other (QEMU's pages of one I/O mostly do), while fewer than
 * VN_BORROWER_MAX_UNMAPS_POSTED such unmaps are on their way (a burst past what the lender takes
 * from one peer would be refused, and the mappings left there); the rest stay.  Whether
 * any went is returned (the caller keeps the state). */
static bool unmap_runs(VnBorrower *b, GPtrArray *ms)
{
    guint i = 0;

    g_ptr_array_sort(ms, by_iova);
    while (i < ms->len && b->unmaps_posted < VN_BORROWER_MAX_UNMAPS_POSTED) {
        const Mapping *first = g_ptr_array_index(ms, i);
        uint64_t end = first->iova + first->size;
        guint j = i + 1;

        while (j < ms->len && ((Mapping *)g_ptr_array_index(ms, j))->iova == end) {
            end += ((Mapping *)g_ptr_array_index(ms, j))->size;
            j++;
        }
        unmap_send(b, first->iova, end - first->iova, false, false);
        for (; i < j; i++) {
            mapping_drop(b, g_ptr_array_index(ms, i));
        }
    }
    return i > 0;
}

static void linger_arm(VnBorrower *b);

/* Lingering mappings whose time is up go, with those halfway there (an unmap sent early is
 * only stricter, and QEMU's pages of one I/O then go in one run), and the oldest past
 * linger_max, at most VN_BORROWER_MAX_RELEASE at a time. */
#define VN_BORROWER_MAX_RELEASE 256
static void linger_release(VnBorrower *b)
{
    g_autoptr(GPtrArray) due = g_ptr_array_new();
    gint64 now = g_get_monotonic_time();
    gint64 half = (gint64)b->linger_ms * G_TIME_SPAN_MILLISECOND / 2;

    if (b->stats.lender_lost) {
        return; /* they wait for it (vn_borrower_dma_lender_back) */
    }
    for (GList *l = b->lingering.head; l != NULL && due->len < VN_BORROWER_MAX_RELEASE;
         l = l->next) {
        const Mapping *m = l->data;

        if (b->lingering.length - due->len <= b->linger_max && m->unmapped_at + half > now) {
            break; /* the queue is oldest first */
        }
        g_ptr_array_add(due, l->data);
    }
    if (unmap_runs(b, due)) {
        vn_borrower_keep_state(b, false);
    }
}

static gboolean on_linger_timer(gpointer data)
{
    VnBorrower *b = data;

    g_clear_pointer(&b->linger_src, g_source_unref); /* the source ends with this call */
    linger_release(b);
    linger_arm(b);
    return G_SOURCE_REMOVE;
}

/* A timer for the oldest lingering mapping, unless one is set, none lingers or the lender
 * is away (vn_borrower_dma_lender_back).  Past its time (unmaps held back by the ones on
 * their way), again in a millisecond. */
static void linger_arm(VnBorrower *b)
{
    const Mapping *oldest;
    gint64 left;

    if (b->linger_src != NULL || b->lingering.head == NULL || b->stats.lender_lost) {
        return;
    }
    oldest = b->lingering.head->data;
    left = oldest->unmapped_at + (gint64)b->linger_ms * G_TIME_SPAN_MILLISECOND -
           g_get_monotonic_time();
    if (b->lingering.length > b->linger_max) {
        left = 0;
    }
    b->linger_src = g_timeout_source_new((guint)(MAX(left, 0) / G_TIME_SPAN_MILLISECOND + 1));
    g_source_set_callback(b->linger_src, on_linger_timer, b, NULL);
    g_source_attach(b->linger_src, b->ctx);
}

/* QEMU unmapped @m (confirmed by the lender): it lingers there. */
static void linger_start(VnBorrower *b, Mapping *m)
{
    m->lingering = true;
    m->unmapped_at = g_get_monotonic_time();
    m->link = (GList){ .data = m };
    g_queue_push_tail_link(&b->lingering, &m->link);
    vn_borrower_state_lingers(b, m, true);
    linger_arm(b);
}

void vn_borrower_set_dma_linger(VnBorrower *b, unsigned ms, unsigned max)
{
    b->linger_ms = ms;
    b->linger_max = ms > 0 ? MIN(max, VN_BORROWER_MAX_LINGERING) : 0;
    if (b->linger_src != NULL) { /* set for the old time: the timer lets go of what is due */
        g_source_destroy(b->linger_src);
        g_clear_pointer(&b->linger_src, g_source_unref);
    }
    linger_arm(b);
}

void vn_borrower_dma_lender_back(VnBorrower *b)
{
    linger_arm(b);
}

void vn_borrower_dma_taken_over(VnBorrower *b)
{
    for (GList *l = b->mappings; l != NULL; l = l->next) {
        Mapping *m = l->data;

        if (m->lingering && m->link.data == NULL) { /* restored so, not queued yet */
            m->lingering = false;
            linger_start(b, m);
        }
    }
}

static bool same_mapping(const Mapping *m, const VnDmaMapping *dm, const Segment *seg)
{
    return m->iova == dm->iova && m->size == dm->size && m->offset == dm->offset &&
           m->prot == dm->prot && m->seg == seg;
}

/* Forward QEMU's map @dm of @seg's memory, answering its reply @reply_id (0: the command
 * being handled, answered later). */
static int map_send(VnBorrower *b, const VnDmaMapping *dm, Segment *seg, uint64_t reply_id)
{
    VnProtoDmaMap pm = {
        .iova = dm->iova, .size = dm->size, .offset = dm->offset, .prot = dm->prot
    };
    g_autofree char *json = NULL;
    uint64_t first = UINT64_MAX, end = 0;
    unsigned over = 0;
    Mapping *m, *same = NULL;

    /* QEMU maps nothing over what it has mapped, so what overlaps this is what it unmapped
     * and still lingers at the lender: the same mapping is taken back here; anything else
     * goes there first, in one unmap before this map (everything between the first and
     * the last of them overlaps this map too). */
    for (GList *l = b->mappings; l != NULL; l = l->next) {
        m = l->data;
        if (overlaps(m, dm->iova, dm->size)) {
            over++;
            same = m->confirmed && same_mapping(m, dm, seg) ? m : same;
            first = MIN(first, m->iova);
            end = MAX(end, m->iova + m->size);
        }
    }
    if (same != NULL && over == 1 && reply_id == 0) {
        linger_end(b, same);
        b->stats.dma_maps_here++;
        vn_borrower_keep_state(b, false);
        return 0;
    }
    seg->refs++; /* before what overlaps goes (it may hold the segment's last reference) */
    if (over > 0) {
        unmap_send(b, first, end - first, false, false);
        for (GList *l = b->mappings; l != NULL;) {
            GList *next = l->next;

            if (overlaps(l->data, dm->iova, dm->size)) {
                mapping_drop(b, l->data);
            }
            l = next;
        }
    }
    pm.segment = seg->id;
    json = vn_proto_dma_map_to_json(b->device, &pm);
    /* Listed now: an unmap QEMU sends before the answer must reach the lender too. */
    m = g_new0(Mapping, 1);
    *m = (Mapping){
        .iova = dm->iova, .size = dm->size, .offset = dm->offset, .prot = dm->prot, .seg = seg
    };
    b->mappings = g_list_prepend(b->mappings, m);
    vn_borrower_state_listed(b, m);
    vn_borrower_keep_state(b, false);
    return reply_id != 0
               ? vn_borrower_ask_answering(b, reply_id, VN_PROTO_DMA_MAP, json, NULL, 0, on_mapped,
                                           m, NULL)
               : vn_borrower_ask_later(b, VN_PROTO_DMA_MAP, json, NULL, 0, 0, on_mapped, m, NULL);
}

/* A map of a file not exported yet: its export asked of the fabric (the daemon's, for a
 * worker), QEMU's commands after it wait (vn_server_pause), and the map goes once the
 * segment is there. */
typedef struct Exporting {
    VnBorrowerPending pending;
    VnDmaMapping dm; /* its fd not kept: the fabric has its own */
    dev_t dev;
    ino_t ino;
    uint64_t reply_id, pause;
} Exporting;

static void segment_exported(void *opaque, uint64_t id, const GError *error)
{
    Exporting *e = opaque;
    VnBorrower *b = vn_borrower_pending_end(&e->pending);
    bool here = b != NULL && b->server != NULL && vn_server_resume(b->server, e->pause);
    Segment *seg;

    if (!here || id == 0) {
        if (id != 0) {
            vn_fabric_segment_unexport(e->pending.fab, id); /* QEMU (or we) went meanwhile */
        } else if (b != NULL) {
            g_info("borrower %s: cannot export guest memory: %s", b->device, error->message);
        }
        if (here) {
            vn_server_complete(b->server, e->reply_id, -ENOSPC);
        }
        g_free(e);
        return;
    }
    seg = g_new0(Segment, 1);
    seg->dev = e->dev;
    seg->ino = e->ino;
    seg->id = id;
    b->segments = g_list_prepend(b->segments, seg);
    map_send(b, &e->dm, seg, e->reply_id);
    g_free(e);
}

int vn_borrower_dma_mapped(VnBorrower *b, const VnDmaMapping *dm)
{
    struct stat file;
    Exporting *e;
    Segment *seg;
    int ret = 0;

    if (dm->fd < 0) {
        /* QEMU maps device BARs without an fd (vfio-user.rst: peer-to-peer offers): told to
         * the daemon, which knows whether another device of the VM is there (p2p.c). */
        vn_borrower_p2p_offer(b, dm->iova, dm->size);
        return 0;
    }
    seg = segment_of(b, dm->fd, &file, &ret);
    if (seg != NULL || ret < 0) {
        return seg != NULL ? map_send(b, dm, seg, 0) : ret;
    }
    e = g_new0(Exporting, 1);
    e->dm = *dm;
    e->dm.fd = -1;
    e->dev = file.st_dev;
    e->ino = file.st_ino;
    e->reply_id = vn_server_later(b->server);
    e->pause = vn_server_pause(b->server);
    vn_borrower_pending_begin(b, &e->pending);
    vn_fabric_segment_export_async(b->fab, dm->fd, 0, (uint64_t)file.st_size, b->lender,
                                   segment_exported, e);
    return 0;
}

void vn_borrower_dma_unmapping(VnBorrower *b, uint64_t iova, uint64_t size, bool all)
{
    bool p2p = vn_borrower_p2p_unmapping(b, iova, size, all);
    bool ours = p2p, can_linger = !p2p && !all && b->linger_ms > 0;
    unsigned more = 0;

    /* Lingering needs every mapping inside confirmed (one on its way: the unmap follows
     * it to the lender, which unmaps the whole range then), and room: past linger_max,
     * QEMU waits for the lender again. */
    for (GList *l = b->mappings; l != NULL; l = l->next) {
        const Mapping *m = l->data;

        if (all || inside(m, iova, size)) {
            ours = ours || all || !m->lingering;
            can_linger = can_linger && m->confirmed;
            more += !m->lingering;
        }
    }
    if (!ours) {
        return; /* nothing QEMU has mapped there is ours: nothing to forward */
    }
    can_linger = can_linger && b->lingering.length + more <= b->linger_max;
    for (GList *l = b->mappings; l != NULL;) {
        GList *next = l->next;
        Mapping *m = l->data;

        if (all || inside(m, iova, size)) {
            if (!can_linger) {
                mapping_drop(b, m);
            } else if (!m->lingering) {
                linger_start(b, m);
            }
        }
        l = next;
    }
    vn_borrower_keep_state(b, false);
    if (can_linger) {
        b->stats.dma_unmaps_here++;
        return;
    }
    /* QEMU's unmap completes only after the lender's device has lost access. */
    unmap_send(b, iova, size, all, true);
}

void vn_borrower_dma_forget(VnBorrower *b)
{
    if (b->linger_src != NULL) {
        g_source_destroy(b->linger_src);
        g_clear_pointer(&b->linger_src, g_source_unref);
    }
    g_queue_init(&b->lingering); /* its links are in the mappings freed next */
    g_list_free_full(g_steal_pointer(&b->mappings), g_free);
    vn_borrower_state_clear(b);
    for (GList *l = b->segments; l != NULL; l = l->next) {
        vn_fabric_segment_unexport(b->fab, ((Segment *)l->data)->id);
    }
    g_list_free_full(g_steal_pointer(&b->segments), g_free);
}
