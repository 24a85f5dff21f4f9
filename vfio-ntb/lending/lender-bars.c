/*
 * A lent device's BARs exported for its borrower at ATTACH (lender-int.h), without waiting:
 * a worker's exports are its daemon's to make (fabric/host.h), so each slice is asked, and
 * the ATTACH is answered (lender.c) once the last slice's answer came.  The requests after
 * the ATTACH wait meanwhile (lender-queue.c).
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"

#include "common/util.h"
#include "trace-lending.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>

struct VnLenderBars {
    VnLenderWait wait;   /* the ATTACH's */
    unsigned unanswered; /* slices asked and not answered, and 1 while still asking */
    uint32_t slices[VN_MAX_REGIONS];
    uint64_t chunk[VN_MAX_REGIONS];
    GError *why[VN_MAX_REGIONS]; /* a region's first slice refused */
    VnLenderBarsDone done;
};

/* One slice asked: where its id goes. */
typedef struct BarSlice {
    VnLenderBars *bars;
    uint32_t region, k;
} BarSlice;

VnLenderBars *vn_lender_bars_begin(VnLender *l, uint64_t token, VnLenderBarsDone done)
{
    VnLenderBars *bars = g_new0(VnLenderBars, 1);

    bars->unanswered = 1;
    bars->done = done;
    vn_lender_wait_begin(l, &bars->wait, token);
    return bars;
}

static void bars_answered(VnLenderBars *bars)
{
    VnLender *l;

    if (--bars->unanswered > 0) {
        return;
    }
    l = vn_lender_wait_end(&bars->wait);
    if (l != NULL && bars->done != NULL) {
        bars->done(l, bars, bars->wait.token, vn_lender_wait_current(l, &bars->wait));
    }
    for (uint32_t i = 0; i < VN_MAX_REGIONS; i++) {
        g_clear_error(&bars->why[i]);
    }
    g_free(bars);
    if (l != NULL) {
        vn_lender_wait_next(l);
    }
}

static void slice_exported(void *opaque, uint64_t id, const GError *error)
{
    BarSlice *s = opaque;
    VnLenderBars *bars = s->bars;
    VnLender *l = bars->wait.l;

    if (id != 0 && (l == NULL || !vn_lender_wait_current(l, &bars->wait))) {
        /* The attachment went while it was asked: nobody may map it. */
        vn_fabric_segment_unexport(bars->wait.fab, id);
    } else if (id != 0) {
        l->dev.regions[s->region].segments[s->k] = id;
    } else if (bars->why[s->region] == NULL) {
        bars->why[s->region] = g_error_copy(error);
    }
    g_free(s);
    bars_answered(bars);
}

int vn_lender_bars_ask(VnLenderBars *bars, VnLender *l, uint32_t i, int fd, uint64_t offset,
                       uint64_t size, const char *peer, uint64_t max_window, GError **error)
{
    VnProtoRegion *r = &l->dev.regions[i];
    uint64_t chunk = size;
    uint32_t n;

    if (max_window != 0 && size > max_window) {
        chunk = UINT64_C(1) << (63 - __builtin_clzll(max_window));
        if (chunk < vn_fabric_limits(l->fab)->window_align) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "region %u: the borrower's windows (%" PRIu64 " bytes) are smaller "
                        "than a page",
                        i, max_window);
            return -1;
        }
    }
    n = (uint32_t)MIN((size + chunk - 1) / chunk, (uint64_t)VN_PROTO_MAX_REGION_SEGMENTS + 1);
    if (n > VN_PROTO_MAX_REGION_SEGMENTS) {
        g_autofree char *total = vn_util_size_text(size);
        g_autofree char *each = vn_util_size_text(chunk);

        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                    "region %u (%s) needs more than %u of the borrower's %s windows (its "
                    "max-window-size)",
                    i, total, VN_PROTO_MAX_REGION_SEGMENTS, each);
        return -1;
    }
    bars->slices[i] = n;
    bars->chunk[i] = chunk;
    r->nr_segments = n; /* 0 until answered: release() withdraws what came */
    for (uint32_t k = 0; k < n; k++) {
        BarSlice *s = g_new0(BarSlice, 1);

        *s = (BarSlice){ .bars = bars, .region = i, .k = k };
        r->segments[k] = 0;
        bars->unanswered++;
        vn_fabric_segment_export_async(l->fab, fd, offset + (uint64_t)k * chunk,
                                       MIN(chunk, size - (uint64_t)k * chunk), peer, slice_exported,
                                       s);
    }
    return 0;
}

void vn_lender_bars_asked(VnLenderBars *bars, bool answered)
{
    if (answered) {
        bars->done = NULL; /* refused while asking: nobody is told again */
    }
    bars_answered(bars);
}

bool vn_lender_bars_settle(VnLender *l, const VnLenderBars *bars, GError **error)
{
    for (uint32_t i = 0; i < l->dev.num_regions && i < VN_MAX_REGIONS; i++) {
        VnProtoRegion *r = &l->dev.regions[i];
        uint32_t n = bars->slices[i];

        if (n == 0) {
            continue;
        }
        if (bars->why[i] == NULL) {
            trace_lender_region_export(l->name, i, r->size, n, n == 1 ? "" : "s", r->segments[0],
                                       l->borrower);
        } else if (n == 1) {
            /* One segment refused: the region stays trapped (its accesses forwarded). */
            g_info("lender %s: region %u stays trapped: %s", l->name, i, bars->why[i]->message);
            r->flags &= ~(uint32_t)VFIO_REGION_INFO_FLAG_MMAP;
            r->nr_sparse = 0;
            r->nr_segments = 0;
        } else {
            g_autofree char *total = vn_util_size_text(r->size);
            g_autofree char *each = vn_util_size_text(bars->chunk[i]);

            g_set_error(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE,
                        "region %u (%s) needs %u windows of %s: %s", i, total, n, each,
                        bars->why[i]->message);
            return false;
        }
    }
    return true;
}
