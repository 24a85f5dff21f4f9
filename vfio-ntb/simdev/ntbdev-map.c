/*
 * The simulated NTB's windows mapped by their clients where they reach the peer's RAM (see
 * ntbdev-int.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "ntbdev-int.h"

#include "common/util.h"

#include <errno.h>
#include <linux/vfio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A DMA_UNMAP of port @port's client, answered once no window of the other port's reaches
 * [first, last] any more. */
typedef struct NtbOwed {
    unsigned port;
    uint64_t id;
    uint64_t first, last;
} NtbOwed;

/* An ask on its way: what it asked for. */
typedef struct NtbAsk {
    NtbWindowMap *map;
    NtbTarget target;
} NtbAsk;

static const NtbTarget TRAPPED = { .on = false };

static bool target_eq(const NtbTarget *a, const NtbTarget *b)
{
    return a->on == b->on &&
           (!a->on || (a->iova == b->iova && a->len == b->len && a->dev == b->dev &&
                       a->ino == b->ino && a->extents == b->extents && a->where == b->where));
}

/* FNV-1a over the extents: a target that moved in the peer's file is another target. */
static uint64_t extents_hash(const GArray *ext)
{
    const uint8_t *p = (const uint8_t *)ext->data;
    uint64_t h = UINT64_C(0xcbf29ce484222325);

    for (size_t i = 0; i < ext->len * sizeof(VnDmaExtent); i++) {
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    }
    return h;
}

static bool target_hits(const NtbTarget *t, uint64_t first, uint64_t last)
{
    return t->on && t->iova <= last && first <= t->iova + (t->len - 1);
}

/* Where @p's window @mw can be mapped now: its target, the pieces of the peer's file it is
 * in (@ext, VnDmaExtent), and an fd of that file (the caller closes it); -1 with a trapped
 * target where it cannot. */
static int target_of(NtbPort *p, unsigned mw, NtbTarget *t, GArray *ext)
{
    VnNtbDev *d = p->dev;
    NtbPort *q = &d->port[p->index ^ 1];
    uint64_t addr, size;
    struct stat st;
    int fd;

    *t = TRAPPED;
    g_array_set_size(ext, 0);
    if (d->trap_all || p->server == NULL || q->dma == NULL ||
        !vn_server_client_maps_regions(p->server) ||
        !vn_epf_window_reach(d->epf, p->index, mw, &addr, &size)) {
        return -1;
    }
    size &= ~(uint64_t)(VN_SERVER_REGION_MAP_ALIGN - 1);
    if (size == 0 || !vn_wire_page_aligned(addr)) {
        return -1;
    }
    /* Only memory the peer's IOMMU gives its function for both reading and writing: what
     * the window may not write stays trapped, where each write is checked. */
    fd = vn_dma_file_extents(q->dma, addr, size, VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
                             ext, VN_WIRE_REGION_MAP_MAX_EXTENTS);
    if (fd < 0) {
        g_debug("NTB model: port %u: window %u stays trapped: the peer's [0x%" G_GINT64_MODIFIER
                "x, +0x%" G_GINT64_MODIFIER "x) is not in its RAM (%u mappings): %s",
                p->index, mw, addr, size, vn_dma_count(q->dma), g_strerror(-fd));
        return -1;
    }
    for (guint i = 0; i < ext->len; i++) {
        if (!vn_wire_page_aligned(g_array_index(ext, VnDmaExtent, i).offset)) {
            close(fd);
            return -1;
        }
    }
    if (fstat(fd, &st) < 0) {
        close(fd);
        return -1;
    }
    *t = (NtbTarget){ .on = true,
                      .iova = addr,
                      .len = size,
                      .dev = st.st_dev,
                      .ino = st.st_ino,
                      .extents = ext->len,
                      .where = extents_hash(ext) };
    return fd;
}

static void settle(VnNtbDev *d);
static void sync_window(NtbPort *p, unsigned mw);

static void answered(void *opaque, int err)
{
    NtbAsk *a = opaque;
    NtbWindowMap *m = a->map;
    NtbPort *p = m->port;

    m->asked--;
    if (err == -ENOTCONN) {
        m->now = TRAPPED; /* the client went, and its mappings with it */
    } else if (err < 0 && a->target.on) {
        m->refusals++;
        if (target_eq(&a->target, &m->now)) {
            m->refused = m->now; /* it traps the window then; not asked again */
            m->now = TRAPPED;
        }
        g_info("NTB model: port %u: window %u stays trapped: its client did not map it: %s",
               p->index, m->mw, g_strerror(-err));
    }
    g_free(a);
    if (err != -ENOTCONN) {
        sync_window(p, m->mw); /* what moved meanwhile, or could not be asked then */
    }
    settle(p->dev);
}

/* Ask @m's client for @t (@fd its file's and its @n extents @ext, or -1 to trap). */
static void ask(NtbWindowMap *m, const NtbTarget *t, int fd, const VnDmaExtent *ext, unsigned n)
{
    NtbPort *p = m->port;
    VnNtbDev *d = p->dev;
    g_autofree VnWireRegionExtent *wire = g_new0(VnWireRegionExtent, MAX(n, 1));
    NtbAsk *a = g_new0(NtbAsk, 1);
    int ret;

    n = t->on ? n : 0;
    for (unsigned i = 0; i < n; i++) {
        wire[i] =
            (VnWireRegionExtent){ .at = ext[i].at, .fd_offset = ext[i].offset, .len = ext[i].len };
    }
    a->map = m;
    a->target = *t;
    ret = vn_server_region_map(p->server, VFIO_PCI_BAR0_REGION_INDEX + d->layout.window_bar[m->mw],
                               d->layout.window_offset[m->mw], vn_epf_window_size(d->epf, m->mw),
                               t->on ? fd : -1, wire, n, answered, a);
    if (ret < 0) {
        /* -EBUSY: asked again when an answer comes; -ENOTCONN, -EOPNOTSUPP: nothing mapped. */
        g_free(a);
        if (ret != -EBUSY && ret != -ENOTCONN && ret != -EOPNOTSUPP) {
            g_info("NTB model: port %u: window %u: asking its client failed: %s", p->index, m->mw,
                   g_strerror(-ret));
        }
        return;
    }
    m->asked++;
    m->now = *t;
    if (t->on) {
        m->maps++;
        g_info(
            "NTB model: port %u: window %u mapped onto the peer's memory at 0x%" G_GINT64_MODIFIER
            "x (0x%" G_GINT64_MODIFIER "x bytes in %u pieces)",
            p->index, m->mw, t->iova, t->len, t->extents);
    } else {
        m->traps++;
        g_info("NTB model: port %u: window %u trapped", p->index, m->mw);
    }
}

static void sync_window(NtbPort *p, unsigned mw)
{
    NtbWindowMap *m = &p->map[mw];
    g_autoptr(GArray) ext = g_array_new(FALSE, FALSE, sizeof(VnDmaExtent));
    NtbTarget t;
    int fd = target_of(p, mw, &t, ext);

    if (p->server != NULL && vn_server_client_maps_regions(p->server)) {
        p->dev->looked[p->index][mw] = p->dev->epoch;
    }
    if (!target_eq(&t, &m->refused)) {
        m->refused = TRAPPED; /* the target moved: worth asking again */
    }
    if (!target_eq(&t, &m->now) && !(t.on && target_eq(&t, &m->refused))) {
        ask(m, &t, fd, (const VnDmaExtent *)(void *)ext->data, ext->len);
    }
    vn_util_close_fd(&fd);
}

void vn_ntbdev_map_sync(VnNtbDev *d)
{
    d->epoch++;
    for (unsigned p = 0; p < 2; p++) {
        for (unsigned mw = 0; mw < vn_epf_windows(d->epf); mw++) {
            sync_window(&d->port[p], mw);
        }
    }
}

void vn_ntbdev_set_mapping(VnNtbDev *d, bool on)
{
    d->trap_all = !on;
    vn_ntbdev_map_sync(d);
}

bool vn_ntbdev_mapping(VnNtbDev *d)
{
    return !d->trap_all;
}

void vn_ntbdev_map_mapped(NtbPort *q, uint64_t iova, uint64_t size)
{
    VnNtbDev *d = q->dev;
    NtbPort *p = &d->port[q->index ^ 1];

    /* Only the windows whose translation it touches: with an IOMMU in the peer, its QEMU
     * maps page by page, and most pages are nobody's window. */
    for (unsigned mw = 0; mw < vn_epf_windows(d->epf); mw++) {
        uint64_t addr, len;

        if (vn_epf_window_reach(d->epf, p->index, mw, &addr, &len) && len > 0 && size > 0 &&
            addr <= iova + (size - 1) && iova <= addr + (len - 1)) {
            sync_window(p, mw);
        }
    }
}

void vn_ntbdev_map_trapped(NtbPort *p, unsigned mw)
{
    if (p->dev->looked[p->index][mw] != p->dev->epoch) {
        sync_window(p, mw);
    }
}

/* No window of @p's reaches [first, last], nor may one still (an ask on its way). */
static bool clear_of(NtbPort *p, uint64_t first, uint64_t last)
{
    for (unsigned mw = 0; mw < VN_EPF_MAX_WINDOWS; mw++) {
        if (p->map[mw].asked > 0 || target_hits(&p->map[mw].now, first, last)) {
            return false;
        }
    }
    return true;
}

static void settle(VnNtbDev *d)
{
    GList *next;

    for (GList *l = d->owed.head; l != NULL; l = next) {
        NtbOwed *o = l->data;
        NtbPort *q = &d->port[o->port];

        next = l->next;
        if (!clear_of(&d->port[o->port ^ 1], o->first, o->last)) {
            continue;
        }
        g_queue_delete_link(&d->owed, l);
        if (q->server != NULL) {
            vn_server_complete(q->server, o->id, 0);
        }
        g_free(o);
    }
}

void vn_ntbdev_map_unmapping(NtbPort *q, uint64_t iova, uint64_t size, bool all)
{
    VnNtbDev *d = q->dev;
    NtbPort *p = &d->port[q->index ^ 1];
    uint64_t first = all ? 0 : iova, last = all ? UINT64_MAX : iova + (size - 1);
    uint64_t id;
    NtbOwed *o;

    if (!all && size == 0) {
        return;
    }
    d->epoch++;
    for (unsigned mw = 0; mw < vn_epf_windows(d->epf); mw++) {
        if (target_hits(&p->map[mw].now, first, last)) {
            ask(&p->map[mw], &TRAPPED, -1, NULL, 0);
        }
    }
    if (clear_of(p, first, last) || q->server == NULL) {
        return;
    }
    id = vn_server_later(q->server);
    if (id == 0) {
        return; /* no command: q's client is going, and nothing waits for an answer */
    }
    o = g_new0(NtbOwed, 1);
    *o = (NtbOwed){ .port = q->index, .id = id, .first = first, .last = last };
    g_queue_push_tail(&d->owed, o);
}

void vn_ntbdev_map_client_gone(NtbPort *p)
{
    VnNtbDev *d = p->dev;
    GList *next;

    for (unsigned mw = 0; mw < VN_EPF_MAX_WINDOWS; mw++) {
        p->map[mw].now = TRAPPED;
        p->map[mw].refused = TRAPPED;
    }
    /* Its unmaps that waited: their answers have nobody to go to. */
    for (GList *l = d->owed.head; l != NULL; l = next) {
        next = l->next;
        if (((NtbOwed *)l->data)->port == p->index) {
            g_free(l->data);
            g_queue_delete_link(&d->owed, l);
        }
    }
    settle(d);
}

void vn_ntbdev_map_clear(VnNtbDev *d)
{
    g_queue_clear_full(&d->owed, g_free);
}

void vn_ntbdev_map_stats(NtbPort *p, GString *s)
{
    uint64_t maps = 0, traps = 0, refusals = 0;
    unsigned mapped = 0, asked = 0;

    for (unsigned mw = 0; mw < VN_EPF_MAX_WINDOWS; mw++) {
        maps += p->map[mw].maps;
        traps += p->map[mw].traps;
        refusals += p->map[mw].refusals;
        mapped += p->map[mw].now.on;
        asked += p->map[mw].asked;
    }
    g_string_append_printf(s,
                           ", \"window_maps\": %" G_GUINT64_FORMAT
                           ", \"window_traps\": %" G_GUINT64_FORMAT
                           ", \"window_map_refusals\": %" G_GUINT64_FORMAT
                           ", \"windows_mapped\": %u, \"window_asks_unanswered\": %u",
                           maps, traps, refusals, mapped, asked);
}
