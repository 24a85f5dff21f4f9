/*
 * The lender's requests, one at a time and in the order the borrower sent them (it relies
 * on that: an unmap after its map, a read after the write before it).  A request whose
 * handler waits on the fabric (a window onto the borrower's memory, an interrupt route)
 * does not hold the worker's loop: it is a VnLenderWait, the requests after it wait in a
 * queue here (as many as the fabric lets a peer have in flight, VN_LENDER_MAX_QUEUED_BYTES
 * at most), and they are handled once it is answered.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"

#include <errno.h>
#include <string.h>

/* A request that came while another waited. */
typedef struct VnLenderQueued {
    VnFabricMsg *msg;
    uint64_t token;
    size_t bytes; /* what it holds: its JSON and data */
} VnLenderQueued;

void vn_lender_request(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    size_t bytes = (msg->json != NULL ? strlen(msg->json) : 0) + msg->data_len;
    VnLenderQueued *q;

    if (l->wait == NULL && g_queue_is_empty(&l->queued)) {
        l->up->handle(l, msg, token);
        return;
    }
    if (bytes > VN_LENDER_MAX_QUEUED_BYTES - l->queued_bytes) {
        l->stats.requests++;
        l->stats.refused_busy++;
        vn_lender_fail(l, token, EBUSY,
                       "%u requests of %zu bytes already wait for the one before them; with "
                       "this one's %zu that is past the %u bytes a borrower may have waiting",
                       g_queue_get_length(&l->queued), l->queued_bytes, bytes,
                       VN_LENDER_MAX_QUEUED_BYTES);
        return;
    }
    q = g_new0(VnLenderQueued, 1);
    q->msg = vn_fabric_msg_dup(msg);
    q->token = token;
    q->bytes = bytes;
    l->queued_bytes += bytes;
    g_queue_push_tail(&l->queued, q);
    l->stats.queued++;
}

static void queued_free(VnLenderQueued *q)
{
    vn_fabric_msg_free(q->msg);
    g_free(q);
}

/* Handle what waits, in order, until one waits again.  Not nested: a wait that ends inside
 * a handler's own call (an error found at once) leaves the rest to the loop below. */
static void lender_next(VnLender *l)
{
    VnLenderQueued *q;

    if (l->draining) {
        return;
    }
    l->draining = true;
    while (l->wait == NULL && (q = g_queue_pop_head(&l->queued)) != NULL) {
        l->queued_bytes -= q->bytes;
        l->up->handle(l, q->msg, q->token);
        queued_free(q);
    }
    l->draining = false;
}

void vn_lender_wait_begin(VnLender *l, VnLenderWait *w, uint64_t token)
{
    g_assert(l->wait == NULL);
    w->l = l;
    w->fab = l->fab;
    w->token = token;
    w->device_gen = l->device_gen;
    g_strlcpy(w->corr, l->corr != NULL ? l->corr : "-", sizeof(w->corr));
    l->wait = w;
}

VnLender *vn_lender_wait_end(VnLenderWait *w)
{
    VnLender *l = w->l;

    if (l == NULL) {
        return NULL; /* the lender went meanwhile */
    }
    g_assert(l->wait == w);
    l->wait = NULL;
    w->l = NULL;
    l->corr = w->corr;
    return l;
}

bool vn_lender_wait_current(VnLender *l, const VnLenderWait *w)
{
    return l->device != NULL && l->device_gen == w->device_gen;
}

void vn_lender_wait_next(VnLender *l)
{
    l->corr = NULL;
    lender_next(l);
}

void vn_lender_queue_close(VnLender *l)
{
    VnLenderQueued *q;

    if (l->wait != NULL) {
        l->wait->l = NULL; /* its answer finds nobody, and cleans up after itself */
        l->wait = NULL;
    }
    while ((q = g_queue_pop_head(&l->queued)) != NULL) {
        l->queued_bytes -= q->bytes;
        vn_lender_fail(l, q->token, ESHUTDOWN, "the lender is closing");
        queued_free(q);
    }
}
